//! A member whose group handler can no longer find its coordinator,
//! although a broker is up.
//!
//! After a single broker's controlled shutdown and restart, librdkafka's
//! classic-protocol group handler (2.12) can stay in `query-coord` for
//! good: its session timed out during the outage, the revoke waits for
//! offset commits that need a coordinator, and once the broker is back and
//! the client connected again, every coordinator query still finds "no
//! broker available". Nothing inside the client gets it out; a new client
//! does (docs/operations.md, "Broker restarts").
//!
//! The watch reads librdkafka's statistics (every 5 s) and reports the
//! member stuck once the handler has stayed in `query-coord` for
//! [`STUCK_AFTER`] while a broker has been up that long. While a broker is
//! up, a healthy handler sends a coordinator query every 500 ms and any
//! answer moves it out of that state, so this does not happen to a healthy
//! member, nor while the coordinator is only loading (the handler then
//! cycles through `wait-coord`), nor while the cluster is down (no broker
//! is up: the member waits, and reports it on `/health/mq`).

use std::time::Duration;

use rdkafka::Statistics;
use tokio::sync::watch;

/// How long `query-coord` with a broker up counts as stuck: 60 of the
/// handler's coordinator queries.
pub(crate) const STUCK_AFTER: Duration = Duration::from_secs(30);

/// Whether the member's group handler is stuck, and why.
pub(crate) struct CoordinatorWatch {
    stuck: watch::Sender<Option<String>>,
}

impl Default for CoordinatorWatch {
    fn default() -> Self {
        Self {
            stuck: watch::channel(None).0,
        }
    }
}

impl CoordinatorWatch {
    /// Reads one statistics report; the first one that shows the handler
    /// stuck is kept.
    pub(crate) fn observe(&self, stats: &Statistics) {
        if self.stuck.borrow().is_some() {
            return;
        }
        if let Some(why) = stuck_reason(stats, STUCK_AFTER) {
            self.stuck.send_replace(Some(why));
        }
    }

    /// Why the handler is stuck, once it is.
    pub(crate) async fn stuck(&self) -> String {
        let mut seen = self.stuck.subscribe();
        // The sender lives as long as `self`: the wait ends only when stuck.
        let why = seen.wait_for(Option::is_some).await.map(|why| why.clone());
        why.ok().flatten().unwrap_or_default()
    }

    /// Why the handler is stuck, if it is.
    pub(crate) fn reason(&self) -> Option<String> {
        self.stuck.borrow().clone()
    }
}

/// Why the group handler of `stats` is stuck: in `query-coord` for at least
/// `after` while a broker (not a logical one such as the coordinator's
/// handle, whose node id is -1) has been up that long.
fn stuck_reason(stats: &Statistics, after: Duration) -> Option<String> {
    let group = stats.cgrp.as_ref()?;
    // cgrp.stateage is in milliseconds, a broker's stateage in microseconds.
    let in_state = Duration::from_millis(group.stateage.max(0) as u64);
    if group.state != "query-coord" || in_state < after {
        return None;
    }
    let up = stats.brokers.values().find(|b| {
        b.nodeid >= 0 && b.state == "UP" && Duration::from_micros(b.stateage.max(0) as u64) >= after
    })?;
    Some(format!(
        "the group handler has been looking for its coordinator for {} s (state {}, join state {}) \
         although broker {} has been up for {} s",
        in_state.as_secs(),
        group.state,
        group.join_state,
        up.name,
        up.stateage / 1_000_000
    ))
}

#[cfg(test)]
mod tests {
    use rdkafka::statistics::{Broker, ConsumerGroup};

    use super::*;

    fn stats(state: &str, state_ms: i64, broker: (i32, &str, i64)) -> Statistics {
        let (nodeid, broker_state, broker_us) = broker;
        Statistics {
            cgrp: Some(ConsumerGroup {
                state: state.into(),
                stateage: state_ms,
                join_state: "wait-unassign-to-complete".into(),
                ..Default::default()
            }),
            brokers: [(
                "b".to_string(),
                Broker {
                    name: "127.0.0.1:9092/1".into(),
                    nodeid,
                    state: broker_state.into(),
                    stateage: broker_us,
                    ..Default::default()
                },
            )]
            .into(),
            ..Default::default()
        }
    }

    const AFTER: Duration = Duration::from_secs(30);

    #[test]
    fn query_coord_with_a_broker_up_that_long_is_stuck() {
        let why = stuck_reason(&stats("query-coord", 45_000, (1, "UP", 31_000_000)), AFTER);
        let why = why.expect("stuck");
        assert!(
            why.contains("45 s") && why.contains("127.0.0.1:9092/1") && why.contains("31 s"),
            "{why}"
        );
    }

    #[test]
    fn a_member_that_is_up_or_only_briefly_looking_is_not_stuck() {
        assert_eq!(
            stuck_reason(&stats("up", 900_000, (1, "UP", 900_000_000)), AFTER),
            None
        );
        assert_eq!(
            stuck_reason(&stats("query-coord", 29_000, (1, "UP", 900_000_000)), AFTER),
            None
        );
    }

    #[test]
    fn no_broker_up_long_enough_means_waiting_not_stuck() {
        // The cluster is away: the member waits.
        assert_eq!(
            stuck_reason(
                &stats("query-coord", 600_000, (1, "INIT", 600_000_000)),
                AFTER
            ),
            None
        );
        // The broker came back moments ago: the next query will find it.
        assert_eq!(
            stuck_reason(&stats("query-coord", 600_000, (1, "UP", 2_000_000)), AFTER),
            None
        );
        // Only the coordinator's logical handle is up.
        assert_eq!(
            stuck_reason(
                &stats("query-coord", 600_000, (-1, "UP", 600_000_000)),
                AFTER
            ),
            None
        );
    }

    #[tokio::test]
    async fn the_first_stuck_report_is_kept_and_wakes_the_waiter() {
        let watch = CoordinatorWatch::default();
        watch.observe(&stats("up", 1_000, (1, "UP", 1_000_000)));
        assert_eq!(watch.reason(), None);
        watch.observe(&stats("query-coord", 40_000, (1, "UP", 40_000_000)));
        watch.observe(&stats("query-coord", 50_000, (1, "UP", 50_000_000)));
        let why = tokio::time::timeout(Duration::from_secs(1), watch.stuck())
            .await
            .unwrap();
        assert!(why.contains("40 s"), "{why}");
        assert_eq!(watch.reason(), Some(why));
    }
}
