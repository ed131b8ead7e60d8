//! What a consume run did: the counts every worker adds to.

use std::collections::BTreeMap;

use serde::Serialize;

use super::handler::Effect;

/// Counts per handler.
#[derive(Debug, Default, Clone, Serialize)]
pub struct HandlerCounts {
    /// Effects written.
    pub applied: u64,
    /// Events the handler does not act on.
    pub ignored: u64,
    /// Effects the business state already held.
    pub already_done: u64,
}

/// What a consume run did.
#[derive(Debug, Default, Clone, Serialize)]
pub struct ConsumeSummary {
    /// Consumer group.
    pub group: String,
    /// Records received from Kafka.
    pub consumed: u64,
    /// Events applied (dedup row inserted, handlers run, committed).
    pub applied: u64,
    /// Events skipped because this group had applied them already.
    pub duplicates: u64,
    /// Records that could not be decoded or validated (poison).
    pub decode_failures: u64,
    /// Of those, records of an `event_version` the handlers do not understand
    /// (dead-lettered as `unsupported_version`).
    pub unsupported_versions: u64,
    /// Duplicates whose content differs from the event first applied under
    /// the same id (a producer reused an id; see `orderpipe dlq conflicts`).
    pub conflicting_duplicates: u64,
    /// Failed attempts to apply (batch or record; none committed past).
    pub apply_failures: u64,
    /// Records that failed, then succeeded on a local retry.
    pub recovered_locally: u64,
    /// Records sent to the group's retry topic.
    pub sent_to_retry: u64,
    /// Records sent to the dead-letter topic.
    pub dead_lettered: u64,
    /// Records held behind a parked key (mode `key`).
    pub held: u64,
    /// Held records applied after their head.
    pub released: u64,
    /// Times a partition was paused because its worker's queue was full
    /// (the dispatcher never waits on a worker).
    pub queue_full_pauses: u64,
    /// Per handler.
    pub handlers: BTreeMap<String, HandlerCounts>,
    /// Seconds from the first record received to the last batch settled
    /// (committed, or its failed records forwarded).
    pub active_secs: f64,
}

impl ConsumeSummary {
    /// Adds the counts of one committed batch.
    pub(super) fn merge(&mut self, delta: ConsumeSummary) {
        self.applied += delta.applied;
        self.duplicates += delta.duplicates;
        self.conflicting_duplicates += delta.conflicting_duplicates;
        self.held += delta.held;
        self.released += delta.released;
        for (name, counts) in delta.handlers {
            let total = self.handlers.entry(name).or_default();
            total.applied += counts.applied;
            total.ignored += counts.ignored;
            total.already_done += counts.already_done;
        }
    }

    pub(super) fn record_effect(&mut self, handler: &str, effect: Effect) {
        let counts = self.handlers.entry(handler.to_string()).or_default();
        match effect {
            Effect::Applied => counts.applied += 1,
            Effect::Ignored => counts.ignored += 1,
            Effect::AlreadyDone => counts.already_done += 1,
        }
    }
}
