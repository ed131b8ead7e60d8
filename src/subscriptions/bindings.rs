//! Desired and actual state of the router's consumer groups (seed 003's
//! "aggregation by bind_key" and its `GET /api/bindings`).
//!
//! The desired state is data: every enabled subscription of an enabled
//! consumer, grouped by (consumer, bind_key) into one [`Binding`] each,
//! which one consumer group serves ([`crate::subscriptions::model::group_name`]):
//! several subscriptions with one bind key share one group and one ordered
//! stream, like seed 003's `cdc_{consumer}_{bind_key}` queue bound to
//! several routing keys. [`crate::subscriptions::Store::desired`] builds it.
//!
//! The actual state is what a router runs: it implements [`ActualState`]
//! and hands it to the admin API ([`crate::subscriptions::admin::AdminState`]),
//! whose `GET /bindings` then shows both and their difference ([`diff`]).

use std::collections::BTreeSet;

use serde::Serialize;
use serde_json::Value;

use super::filter::{PropertyFilter, all_match};
use super::model::Consumer;

/// One consumer group's desired work: a consumer, a bind key, and the
/// enabled subscriptions it serves.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Binding {
    /// The consumer group: `<consumer>.<bind_key>.consumer`.
    pub group: String,
    /// The downstream consumer (URL, method, timeout, retry, channel).
    pub consumer: Consumer,
    /// The bind key.
    pub bind_key: String,
    /// The topics the group reads (sorted, each once).
    pub topics: Vec<String>,
    /// Its subscriptions, by id.
    pub routes: Vec<Route>,
}

/// One enabled subscription inside a [`Binding`].
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Route {
    /// The subscription's id.
    pub subscription_id: i64,
    /// The event's routing key (the envelope's `event_name`).
    pub routing_key: String,
    /// The event's topic.
    pub topic: String,
    /// Its filters, all of which must hold.
    pub filters: Vec<PropertyFilter>,
}

/// What the router does with one change in a binding's group.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// POST it once: these subscriptions match (event and filters).
    Deliver {
        /// The matching subscriptions' ids.
        subscriptions: Vec<i64>,
    },
    /// A subscription names the event, but its filters reject this change:
    /// commit the offset, do not POST, do not retry.
    Filtered,
    /// No subscription of the group names this event (another event in the
    /// same topic): commit the offset, do not POST.
    NotSubscribed,
}

impl Binding {
    /// The decision for a change named `routing_key` with `data` (the row
    /// after) and `old` (the changed columns' previous values, `null` if none).
    pub fn decide(&self, routing_key: &str, data: &Value, old: &Value) -> Decision {
        let mut named = false;
        let mut subscriptions = Vec::new();
        for route in self.routes.iter().filter(|r| r.routing_key == routing_key) {
            named = true;
            if all_match(&route.filters, data, old) {
                subscriptions.push(route.subscription_id);
            }
        }
        match (named, subscriptions.is_empty()) {
            (false, _) => Decision::NotSubscribed,
            (true, true) => Decision::Filtered,
            (true, false) => Decision::Deliver { subscriptions },
        }
    }

    /// The routing keys the group serves (sorted, each once).
    pub fn routing_keys(&self) -> Vec<&str> {
        self.routes
            .iter()
            .map(|r| r.routing_key.as_str())
            .collect::<BTreeSet<_>>()
            .into_iter()
            .collect()
    }
}

/// A group as a router runs it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ActualBinding {
    /// The consumer group.
    pub group: String,
    /// The topics it reads.
    pub topics: Vec<String>,
    /// The subscription ids it serves (as of its last reload).
    pub subscriptions: Vec<i64>,
    /// Whether it is running in this router.
    pub running: bool,
    /// Records behind the log end over its partitions, when known.
    pub lag: Option<i64>,
}

/// The actual state of a router, for `GET /bindings`. A router implements
/// it over its running groups and hands it to
/// [`crate::subscriptions::admin::AdminState::with_actual`].
#[async_trait::async_trait]
pub trait ActualState: Send + Sync {
    /// The groups it runs (or has stopped), now.
    async fn actual(&self) -> Result<Vec<ActualBinding>, String>;
}

/// How a group's desired and actual state compare.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum BindingStatus {
    /// Desired and running, with the same topics and subscriptions.
    InSync,
    /// Desired, not running.
    Missing,
    /// Running, with other topics or subscriptions than desired (a reload is due).
    Drifted,
    /// Running, not desired (disabled or removed): to be stopped.
    Orphaned,
}

/// One group of the difference between desired and actual state.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct BindingDiff {
    /// The consumer group.
    pub group: String,
    /// How it compares.
    pub status: BindingStatus,
}

/// The difference, group by group (sorted by group), of `desired` and `actual`.
pub fn diff(desired: &[Binding], actual: &[ActualBinding]) -> Vec<BindingDiff> {
    let mut out = Vec::new();
    for d in desired {
        let status = match actual.iter().find(|a| a.group == d.group && a.running) {
            None => BindingStatus::Missing,
            Some(a) => {
                let mut want: Vec<i64> = d.routes.iter().map(|r| r.subscription_id).collect();
                let mut have = a.subscriptions.clone();
                want.sort_unstable();
                have.sort_unstable();
                let mut topics = a.topics.clone();
                topics.sort();
                topics.dedup();
                if want == have && topics == d.topics {
                    BindingStatus::InSync
                } else {
                    BindingStatus::Drifted
                }
            }
        };
        out.push(BindingDiff {
            group: d.group.clone(),
            status,
        });
    }
    for a in actual
        .iter()
        .filter(|a| a.running && !desired.iter().any(|d| d.group == a.group))
    {
        out.push(BindingDiff {
            group: a.group.clone(),
            status: BindingStatus::Orphaned,
        });
    }
    out.sort_by(|a, b| a.group.cmp(&b.group));
    out.dedup();
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn binding() -> Binding {
        let filter = PropertyFilter::parse("status:changed:1->2", "f").unwrap();
        Binding {
            group: "sms.user.consumer".into(),
            consumer: Consumer {
                id: 1,
                name: "sms".into(),
                method: "POST".into(),
                url: "http://sms/send".into(),
                timeout_ms: 5000,
                retry: None,
                channel_id: "orderpipe".into(),
                success: Default::default(),
                enabled: true,
                description: String::new(),
                created_ms: 0,
                updated_ms: 0,
            },
            bind_key: "user".into(),
            topics: vec!["cdc.db.table_user".into()],
            routes: vec![
                Route {
                    subscription_id: 1,
                    routing_key: "db.table_user.insert".into(),
                    topic: "cdc.db.table_user".into(),
                    filters: vec![],
                },
                Route {
                    subscription_id: 2,
                    routing_key: "db.table_user.update".into(),
                    topic: "cdc.db.table_user".into(),
                    filters: vec![filter],
                },
            ],
        }
    }

    #[test]
    fn a_change_is_delivered_filtered_or_not_subscribed() {
        let b = binding();
        assert_eq!(
            b.decide("db.table_user.insert", &json!({"id": 1}), &json!(null)),
            Decision::Deliver {
                subscriptions: vec![1]
            }
        );
        assert_eq!(
            b.decide(
                "db.table_user.update",
                &json!({"status": 2}),
                &json!({"status": 1})
            ),
            Decision::Deliver {
                subscriptions: vec![2]
            }
        );
        assert_eq!(
            b.decide(
                "db.table_user.update",
                &json!({"status": 3}),
                &json!({"status": 1})
            ),
            Decision::Filtered
        );
        assert_eq!(
            b.decide("db.table_user.delete", &json!({"id": 1}), &json!(null)),
            Decision::NotSubscribed
        );
        assert_eq!(
            b.routing_keys(),
            ["db.table_user.insert", "db.table_user.update"]
        );
    }

    #[test]
    fn desired_and_actual_differ_by_group() {
        let desired = vec![binding()];
        let running = |group: &str, subscriptions: Vec<i64>| ActualBinding {
            group: group.into(),
            topics: vec!["cdc.db.table_user".into()],
            subscriptions,
            running: true,
            lag: Some(0),
        };
        let status = |actual: &[ActualBinding]| {
            diff(&desired, actual)
                .into_iter()
                .map(|d| (d.group, d.status))
                .collect::<Vec<_>>()
        };
        assert_eq!(
            status(&[]),
            [("sms.user.consumer".into(), BindingStatus::Missing)]
        );
        assert_eq!(
            status(&[running("sms.user.consumer", vec![2, 1])]),
            [("sms.user.consumer".into(), BindingStatus::InSync)]
        );
        assert_eq!(
            status(&[running("sms.user.consumer", vec![1])]),
            [("sms.user.consumer".into(), BindingStatus::Drifted)]
        );
        assert_eq!(
            status(&[
                running("sms.user.consumer", vec![1, 2]),
                running("log.old.consumer", vec![7])
            ]),
            [
                ("log.old.consumer".into(), BindingStatus::Orphaned),
                ("sms.user.consumer".into(), BindingStatus::InSync)
            ]
        );
    }
}
