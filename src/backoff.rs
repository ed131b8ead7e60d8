//! Waiting for something to become available again: the one
//! retry-until-available helper ([`until_available`]) and the capped
//! exponential delay under it ([`Backoff`]).
//!
//! Used wherever a step must eventually succeed and nothing may be skipped
//! meanwhile: the partition worker (database steps, the schema registry,
//! forwards to the retry tier), the DLQ persister (writing dead letters) and
//! the outbox relay (its cycles; it renews leases between attempts, so it
//! drives a [`Backoff`] itself). Imports nothing of the domain.

use std::fmt::Display;
use std::time::Duration;

/// The first wait after a failure.
const FIRST: Duration = Duration::from_millis(100);
/// The longest wait, by default.
const CAP: Duration = Duration::from_secs(30);

/// Capped exponential delay: 100 ms, doubling after each wait, up to a cap
/// (30 s unless [`Backoff::capped`]).
#[derive(Debug, Clone)]
pub struct Backoff {
    next: Duration,
    cap: Duration,
}

impl Default for Backoff {
    fn default() -> Self {
        Self::new()
    }
}

impl Backoff {
    /// 100 ms doubling up to 30 s.
    pub fn new() -> Self {
        Self::capped(CAP)
    }

    /// 100 ms doubling up to `cap` (at least 100 ms).
    pub fn capped(cap: Duration) -> Self {
        Self {
            next: FIRST,
            cap: cap.max(FIRST),
        }
    }

    /// How long the next [`Backoff::wait`] sleeps.
    pub fn delay(&self) -> Duration {
        self.next
    }

    /// Sleeps the current delay, then doubles it (up to the cap).
    pub async fn wait(&mut self) {
        tokio::time::sleep(self.next).await;
        self.next = (self.next * 2).min(self.cap);
    }

    /// Back to the first delay (after a success).
    pub fn reset(&mut self) {
        self.next = FIRST;
    }
}

/// Runs `attempt` until it succeeds, waiting with a [`Backoff`] (100 ms
/// doubling to 30 s) between attempts.
///
/// After each failure, `failed` sees the error first: it reports it (health,
/// counters) and returns `Ok(error)` to retry, or `Err(stop)` when the error
/// is fatal (retrying cannot fix it). A retried failure is logged as
/// `"{what}; retrying"` with the error and the wait. After each wait, `stop`
/// may end the loop (the partition was revoked, shutdown) with its `Err`.
pub async fn until_available<T, E, S, Fut, Failed>(
    what: impl Display,
    mut attempt: impl FnMut() -> Fut,
    mut failed: impl FnMut(E) -> Failed,
    mut stop: impl FnMut() -> Result<(), S>,
) -> Result<T, S>
where
    Fut: Future<Output = Result<T, E>>,
    Failed: Future<Output = Result<E, S>>,
    E: Display,
{
    let mut backoff = Backoff::new();
    loop {
        match attempt().await {
            Ok(value) => return Ok(value),
            Err(error) => {
                let error = failed(error).await?;
                tracing::warn!(error = %error, retry_in_ms = backoff.delay().as_millis() as u64, "{what}; retrying");
                backoff.wait().await;
                stop()?;
            }
        }
    }
}

/// A `failed` hook that only retries: every error is worth another attempt.
pub async fn retry<E, S>(error: E) -> Result<E, S> {
    Ok(error)
}

/// A `stop` condition that never stops: retry until the step succeeds.
pub fn never() -> Result<(), std::convert::Infallible> {
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::cell::Cell;

    use super::*;

    #[tokio::test]
    async fn the_delay_doubles_up_to_the_cap_and_resets() {
        let mut b = Backoff::capped(Duration::from_millis(350));
        let mut slept = Vec::new();
        for _ in 0..4 {
            let started = tokio::time::Instant::now();
            b.wait().await;
            slept.push(started.elapsed());
        }
        for (slept, want) in slept.iter().zip([100, 200, 350, 350]) {
            let want = Duration::from_millis(want);
            assert!(
                *slept >= want && *slept < want + Duration::from_millis(90),
                "slept {slept:?}, wanted {want:?}"
            );
        }
        b.reset();
        assert_eq!(b.delay(), FIRST);
        assert_eq!(
            Backoff::capped(Duration::ZERO).cap,
            FIRST,
            "a cap below the first delay is the first delay"
        );
        assert_eq!(Backoff::new().cap, CAP);
    }

    #[tokio::test]
    async fn retries_until_the_attempt_succeeds_and_reports_each_failure() {
        let calls = Cell::new(0);
        let mut reported = Vec::new();
        let result: Result<u32, ()> = until_available(
            "step",
            || {
                calls.set(calls.get() + 1);
                let n = calls.get();
                async move {
                    if n < 4 {
                        Err(format!("down {n}"))
                    } else {
                        Ok(n)
                    }
                }
            },
            |e: String| {
                reported.push(e.clone());
                async { Ok(e) }
            },
            || Ok(()),
        )
        .await;
        assert_eq!(result, Ok(4));
        assert_eq!(reported, ["down 1", "down 2", "down 3"]);
    }

    #[tokio::test]
    async fn a_fatal_error_ends_at_once_and_a_stop_after_the_wait() {
        let calls = Cell::new(0);
        let attempt = || {
            calls.set(calls.get() + 1);
            async { Err::<(), _>("refused") }
        };
        let fatal = until_available(
            "step",
            attempt,
            |e: &str| async move { Err(format!("fatal: {e}")) },
            || Ok(()),
        )
        .await;
        assert_eq!(fatal, Err("fatal: refused".to_string()));
        assert_eq!(calls.get(), 1, "a fatal error is not retried");

        calls.set(0);
        let started = tokio::time::Instant::now();
        let stopped = until_available("step", attempt, retry, || {
            if calls.get() >= 2 {
                Err("revoked")
            } else {
                Ok(())
            }
        })
        .await;
        assert_eq!(stopped, Err("revoked"));
        assert_eq!(
            calls.get(),
            2,
            "the stop condition is checked after each wait"
        );
        assert!(
            started.elapsed() >= Duration::from_millis(300),
            "waited 100 ms, then 200 ms: {:?}",
            started.elapsed()
        );
    }
}
