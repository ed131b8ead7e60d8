//! A stop that cannot hang: the phase a stopping process is in, and the
//! deadline after which it exits anyway.
//!
//! On SIGTERM a long-running command finishes its in-flight work (a
//! consumer's batches and their offsets) and exits 0. A stop waiting on
//! something that never answers (a row lock held by another session,
//! librdkafka's close waiting on a group thread, librdkafka #4041) would
//! otherwise hang until the kubelet's SIGKILL, or forever outside
//! Kubernetes, with no word of why. So the first signal also starts a
//! watchdog ([`arm`]): past the stop timeout it prints the phase the stop
//! was in ([`phase`]) and exits with status [`EXIT_STOP_TIMEOUT`]. Nothing
//! is lost by that exit: what was not committed is rolled back by the
//! database and redelivered by Kafka, and skipped as a duplicate where it
//! had been applied.

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// The exit status of a stop that overran its timeout (as `timeout(1)`).
pub const EXIT_STOP_TIMEOUT: i32 = 124;

/// The stop timeout's default: under the chart's 30 s
/// `terminationGracePeriodSeconds`, so the line saying why reaches the log
/// before the kubelet's SIGKILL.
pub const DEFAULT_STOP_TIMEOUT: Duration = Duration::from_secs(25);

/// The stop timeout, in milliseconds.
static TIMEOUT_MS: AtomicU64 = AtomicU64::new(DEFAULT_STOP_TIMEOUT.as_millis() as u64);

/// What the stop is doing now.
static PHASE: Mutex<&str> = Mutex::new("stopping");

/// Sets the stop timeout (`--stop-timeout`), before any signal comes.
pub fn set_timeout(timeout: Duration) {
    TIMEOUT_MS.store(timeout.as_millis() as u64, Ordering::Relaxed);
}

/// Records what the stop waits on now, for the watchdog's line.
pub fn phase(name: &'static str) {
    *PHASE.lock().unwrap_or_else(|e| e.into_inner()) = name;
}

/// Starts the watchdog: the process exits with [`EXIT_STOP_TIMEOUT`] once
/// the stop timeout has passed, whatever it is doing. A plain thread, so a
/// stalled async runtime cannot hold it up.
pub fn arm() {
    let timeout = Duration::from_millis(TIMEOUT_MS.load(Ordering::Relaxed));
    std::thread::spawn(move || {
        std::thread::sleep(timeout);
        let phase = *PHASE.lock().unwrap_or_else(|e| e.into_inner());
        let line = format!(
            "the stop did not finish within {} s (--stop-timeout) while {phase}; exiting with status {EXIT_STOP_TIMEOUT}: \
             uncommitted work is rolled back and redelivered",
            timeout.as_secs_f64()
        );
        // The line is written by a thread of its own: a full stderr pipe
        // must not keep the process alive.
        std::thread::spawn(move || tracing::error!(phase, "{line}"));
        std::thread::sleep(Duration::from_millis(500));
        // SAFETY: `_exit` ends the process without running destructors or
        // atexit handlers, which are what may be hanging.
        unsafe { libc::_exit(EXIT_STOP_TIMEOUT) }
    });
}
