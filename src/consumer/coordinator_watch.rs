//! A member whose group handler can no longer find its coordinator,
//! although the cluster answers.
//!
//! After a single broker's controlled shutdown and restart, librdkafka's
//! classic-protocol group handler (2.12) can stay in `query-coord` for
//! good: its session timed out during the outage, and once the broker is
//! back every coordinator query still finds "no broker available". The
//! client never leaves that state by itself; a new client rejoins at once
//! (docs/operations.md, "Broker restarts").
//!
//! The stats callback records the handler's state (librdkafka's statistics,
//! every 5 s) and [`watch`] checks it: once the handler has been in
//! `query-coord` for [`LOOKING_AFTER`], it asks the cluster for metadata
//! through the member's own client (which also connects it, if it only
//! lacked a connection), and if the cluster answers and the handler is
//! still looking [`CONFIRM_AFTER`] later, the member is stuck. A healthy
//! handler with a broker to ask sends a coordinator query every 500 ms and
//! any answer moves it out of `query-coord` (while the coordinator only
//! loads, it cycles through `wait-coord`), and while the cluster is away
//! the metadata request fails: the member waits, as before.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use rdkafka::Statistics;
use rdkafka::consumer::Consumer;
use tokio::sync::watch;

use super::Shared;

/// How long in `query-coord` makes the watch ask the cluster.
const LOOKING_AFTER: Duration = Duration::from_secs(30);
/// How much longer, with the cluster answering, makes it stuck.
const CONFIRM_AFTER: Duration = Duration::from_secs(15);
/// How often the watch looks (librdkafka reports every 5 s).
const EVERY: Duration = Duration::from_secs(5);

/// The group handler's last reported state, and whether it is stuck.
pub(crate) struct CoordinatorWatch {
    /// (state, join state, time in that state) of the last statistics.
    handler: Mutex<Option<(String, String, Duration)>>,
    stuck: watch::Sender<Option<String>>,
}

impl Default for CoordinatorWatch {
    fn default() -> Self {
        Self {
            handler: Mutex::new(None),
            stuck: watch::channel(None).0,
        }
    }
}

impl CoordinatorWatch {
    /// Records the group handler's state of one statistics report.
    pub(crate) fn observe(&self, stats: &Statistics) {
        if let Some(group) = &stats.cgrp {
            // cgrp.stateage is in milliseconds.
            let age = Duration::from_millis(group.stateage.max(0) as u64);
            *self.handler.lock().expect("watch lock") =
                Some((group.state.clone(), group.join_state.clone(), age));
        }
    }

    /// The handler's state if it has been looking for its coordinator for
    /// at least `after`.
    fn looking_for(&self, after: Duration) -> Option<String> {
        let handler = self.handler.lock().expect("watch lock");
        let (state, join_state, age) = handler.as_ref()?;
        (state == "query-coord" && *age >= after).then(|| {
            format!(
                "the group handler has looked for its coordinator for {} s (state {state}, join state {join_state})",
                age.as_secs()
            )
        })
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

/// Watches the member's group handler until it is stuck (see the module doc).
pub(crate) async fn watch(shared: Arc<Shared>, coordinator: Arc<CoordinatorWatch>) {
    loop {
        tokio::time::sleep(EVERY).await;
        if coordinator.looking_for(LOOKING_AFTER).is_none() {
            continue;
        }
        let Some(brokers) = cluster_answers(&shared).await else {
            continue;
        };
        tokio::time::sleep(CONFIRM_AFTER).await;
        // Still looking, without a change in between (its time in the state grew).
        if let Some(looking) = coordinator.looking_for(LOOKING_AFTER + CONFIRM_AFTER) {
            coordinator.stuck.send_replace(Some(format!(
                "{looking}, although the cluster answers this client ({brokers} broker(s) in its metadata)"
            )));
            return;
        }
    }
}

/// The number of brokers in the metadata of the group's topic, asked
/// through the member's own client; None if the cluster does not answer.
async fn cluster_answers(shared: &Arc<Shared>) -> Option<usize> {
    let shared = shared.clone();
    tokio::task::spawn_blocking(move || {
        shared
            .consumer
            .fetch_metadata(Some(&shared.options.topic), Duration::from_secs(10))
            .ok()
            .map(|m| m.brokers().len())
    })
    .await
    .ok()
    .flatten()
}

#[cfg(test)]
mod tests {
    use rdkafka::statistics::ConsumerGroup;

    use super::*;

    fn stats(state: &str, state_ms: i64) -> Statistics {
        Statistics {
            cgrp: Some(ConsumerGroup {
                state: state.into(),
                stateage: state_ms,
                join_state: "wait-unassign-to-complete".into(),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn a_handler_in_query_coord_that_long_is_looking() {
        let watch = CoordinatorWatch::default();
        watch.observe(&stats("query-coord", 45_000));
        let looking = watch.looking_for(LOOKING_AFTER).expect("looking");
        assert!(
            looking.contains("45 s") && looking.contains("wait-unassign-to-complete"),
            "{looking}"
        );
        // Not yet long enough to confirm.
        assert_eq!(watch.looking_for(Duration::from_secs(46)), None);
    }

    #[test]
    fn a_handler_up_or_briefly_looking_or_never_reported_is_not_looking() {
        let watch = CoordinatorWatch::default();
        assert_eq!(watch.looking_for(LOOKING_AFTER), None);
        watch.observe(&stats("up", 900_000));
        assert_eq!(watch.looking_for(LOOKING_AFTER), None);
        watch.observe(&stats("query-coord", 29_000));
        assert_eq!(watch.looking_for(LOOKING_AFTER), None);
        // A report without a group handler keeps the last one.
        watch.observe(&Statistics::default());
        assert_eq!(watch.looking_for(LOOKING_AFTER), None);
    }

    #[tokio::test]
    async fn stuck_wakes_the_waiter_with_the_reason() {
        let watch = CoordinatorWatch::default();
        assert_eq!(watch.reason(), None);
        watch.stuck.send_replace(Some("why".into()));
        let why = tokio::time::timeout(Duration::from_secs(1), watch.stuck())
            .await
            .unwrap();
        assert_eq!(why, "why");
        assert_eq!(watch.reason().as_deref(), Some("why"));
    }
}
