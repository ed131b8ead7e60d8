//! The one time source: wall-clock milliseconds since the Unix epoch.
//!
//! Due times, failure times, outbox ages and dead-letter timestamps are all
//! kept in these milliseconds; everything that needs "now" as a number asks
//! here, so there is one place to change (or fake) it.

use std::time::{SystemTime, UNIX_EPOCH};

/// Milliseconds since the epoch, now (0 if the clock is before 1970).
pub fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

/// Microseconds since the epoch, now (0 if the clock is before 1970): the
/// benchmarks' commit stamps ([`CommitStamps`]).
pub fn now_us() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as i64)
}

/// Told the event ids of each committed transaction right after its commit
/// returned: the order API's and a consumer's stamps, joined by the
/// benchmarks into an honest commit-to-commit latency. Only a `harness`
/// build sets one (`harness::latency`); production code holds `None` and
/// pays one branch per commit.
pub trait CommitStamps: Send + Sync {
    /// `event_ids` were committed (now).
    fn committed(&self, event_ids: &[uuid::Uuid]);

    /// A consumer's batch was committed (now): each event with its record's
    /// Kafka timestamp (ms; the relay's produce time), where the benchmark
    /// splits the latency. By default only the ids count.
    fn applied(&self, events: &[(uuid::Uuid, Option<i64>)]) {
        let ids: Vec<uuid::Uuid> = events.iter().map(|(id, _)| *id).collect();
        self.committed(&ids);
    }
}
