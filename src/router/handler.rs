//! The handler of one router group: the subscriptions of a (consumer,
//! bind_key) [`Binding`], decided per change, delivered with
//! [`crate::delivery::post_all`] outside the database transaction
//! (up to [`DEFAULT_IN_FLIGHT`] records of a partition at once, never two
//! of one key: see `crate::consumer::worker`).

use std::sync::{Arc, RwLock};

use async_trait::async_trait;
use metrics::counter;

use crate::consumer::handler::{Effect, EventResult, Handler, HandlerError, MAJOR_1};
use crate::db::Tx;
use crate::delivery::{DEFAULT_IN_FLIGHT, Endpoint, OUTSIDE_ONLY, post_all};
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

    fn acts_outside(&self) -> bool {
        true
    }

    /// Never called by the worker (the POST runs in `apply_outside`, with no
    /// transaction open).
    async fn apply(&self, _: &mut Tx, _: &Envelope) -> Result<Effect, HandlerError> {
        Err(HandlerError::Fatal(OUTSIDE_ONLY.into()))
    }

    async fn apply_outside(&self, events: &[&Envelope]) -> Vec<EventResult> {
        // A snapshot: a reload during these deliveries does not change them.
        let binding = self.binding.read().expect("binding lock").clone();
        let consumer = &binding.consumer;
        let endpoint = Endpoint {
            url: &consumer.url,
            method: &consumer.method,
            timeout_ms: u64::try_from(consumer.timeout_ms).unwrap_or(0),
            channel_id: &consumer.channel_id,
            success: consumer.success,
        };
        // Order events carry no previous values; `changed` filters see none.
        let deliver = |envelope: &Envelope| {
            let (data, old) = envelope.data.data_and_old();
            match binding.decide(envelope.event_name.as_str(), &data, &old) {
                Decision::NotSubscribed => false,
                Decision::Filtered => {
                    counter!(FILTERED, "group" => binding.group.clone()).increment(1);
                    false
                }
                Decision::Deliver { .. } => true,
            }
        };
        let results = post_all(&self.client, endpoint, events, DEFAULT_IN_FLIGHT, deliver).await;
        let delivered = results
            .iter()
            .filter(|r| matches!(r, Ok(Effect::Applied)))
            .count();
        counter!(DELIVERED, "group" => binding.group.clone()).increment(delivered as u64);
        results
    }
}
