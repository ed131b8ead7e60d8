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
