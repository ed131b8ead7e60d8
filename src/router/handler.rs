//! The handler of one router group: the subscriptions of a (consumer,
//! bind_key) [`Binding`], decided per change, delivered with
//! [`crate::delivery::post`].

use std::sync::{Arc, RwLock};

use async_trait::async_trait;
use metrics::counter;

use crate::consumer::handler::{Effect, Handler, HandlerError};
use crate::consumer::version::MAJOR_1;
use crate::db::Tx;
use crate::delivery::{Endpoint, post};
use crate::envelope::{Envelope, EventName};
use crate::subscriptions::{Binding, Decision};

/// Changes a group's filters rejected (committed, not delivered, not retried).
pub const FILTERED: &str = "orderpipe_router_filtered_total";
/// Changes a group delivered.
pub const DELIVERED: &str = "orderpipe_router_delivered_total";

/// Delivers the changes its binding's subscriptions match. The router swaps
/// the binding in place on a reload, so a changed URL or filter applies to
/// the next record; a delivery in flight finishes with the one it started with.
pub struct BindingDelivery {
    binding: Arc<RwLock<Binding>>,
    client: reqwest::Client,
}

impl BindingDelivery {
    /// A handler for `binding` (the router keeps the same `Arc` to reload it).
    pub fn new(binding: Arc<RwLock<Binding>>) -> Self {
        Self {
            binding,
            client: crate::delivery::http_client(),
        }
    }
}

#[async_trait]
impl Handler for BindingDelivery {
    fn name(&self) -> &'static str {
        "router"
    }

    /// Major 1 of the events its subscriptions name; another event of the
    /// same topic in a new major does not stop the group.
    fn supported_majors(&self, event_name: &EventName) -> &[u32] {
        let binding = self.binding.read().expect("binding lock");
        if binding
            .routes
            .iter()
            .any(|r| r.routing_key == event_name.as_str())
        {
            MAJOR_1
        } else {
            &[]
        }
    }

    async fn apply(&self, _: &mut Tx, envelope: &Envelope) -> Result<Effect, HandlerError> {
        // A snapshot: a reload during this delivery does not change it.
        let binding = self.binding.read().expect("binding lock").clone();
        // Order events carry no previous values; `changed` filters see none.
        let (data, old) = envelope.data.data_and_old();
        match binding.decide(envelope.event_name.as_str(), &data, &old) {
            Decision::NotSubscribed => Ok(Effect::Ignored),
            Decision::Filtered => {
                counter!(FILTERED, "group" => binding.group.clone()).increment(1);
                Ok(Effect::Ignored)
            }
            Decision::Deliver { .. } => {
                let consumer = &binding.consumer;
                let endpoint = Endpoint {
                    url: &consumer.url,
                    method: &consumer.method,
                    timeout_ms: u64::try_from(consumer.timeout_ms).unwrap_or(0),
                    channel_id: &consumer.channel_id,
                    success: consumer.success,
                };
                let effect = post(&self.client, endpoint, envelope).await?;
                counter!(DELIVERED, "group" => binding.group.clone()).increment(1);
                Ok(effect)
            }
        }
    }
}
