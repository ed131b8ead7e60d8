//! The [`Handler`] trait: one downstream effect of an event.
//!
//! A handler runs inside the transaction that also holds the event's dedup
//! row, so its writes commit or roll back with it. Handlers still keep their
//! own business idempotency (unique keys, state machines): dedup is not the
//! only guard, and an effect that was already done reports
//! [`Effect::AlreadyDone`] instead of doing it twice.
//!
//! A handler whose effect lies outside the database (an HTTP delivery)
//! says so with [`Handler::acts_outside`]: the worker then runs
//! [`Handler::apply_outside`] with no transaction open, before the batch's
//! transaction claims the records' dedup rows and commits (see
//! `crate::delivery` for why that order is safe).

use async_trait::async_trait;

use crate::db::{DbError, Tx};
use crate::envelope::{Envelope, EventName};

/// What a handler did with an event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Effect {
    /// The effect was written.
    Applied,
    /// The handler does not act on this event name.
    Ignored,
    /// The business state already holds the effect (caught by a unique key or state).
    AlreadyDone,
}

/// Why a handler failed. The class decides the path through the error tier.
#[derive(Debug, Clone, thiserror::Error)]
pub enum HandlerError {
    /// The infrastructure every record needs is down (database unavailable,
    /// lock timeout, deadlock): the partition waits with backoff in place and
    /// reports unhealthy; the record keeps its retry budget.
    #[error("unavailable: {0}")]
    Unavailable(String),
    /// This record may succeed later (a downstream timeout): local retries,
    /// then the retry topic, then the DLQ.
    #[error("retryable: {0}")]
    Retryable(String),
    /// Like [`HandlerError::Retryable`], with the downstream's own hint of
    /// when to try again (an HTTP `Retry-After` on a 429 or 503): no
    /// immediate local retries, and the retry topic's delay for the next
    /// attempt is the hint, bounded by the schedule
    /// ([`crate::retry::RetryPolicy::hinted_delay`]).
    #[error("retryable: {reason} (asked to retry after {} ms)", after.as_millis())]
    RetryAfter {
        /// What went wrong.
        reason: String,
        /// How long the downstream asked to wait.
        after: std::time::Duration,
    },
    /// This record never will (invalid for the business state): the DLQ at once.
    #[error("fatal: {0}")]
    Fatal(String),
    /// A downstream refused the record for good (an HTTP 4xx other than
    /// 408 and 429): the DLQ at once, as `downstream_rejected`.
    #[error("rejected: {0}")]
    Rejected(String),
}

impl HandlerError {
    /// Class name for metrics and dead-letter headers.
    pub fn class(&self) -> &'static str {
        match self {
            Self::Unavailable(_) => "unavailable",
            Self::Retryable(_) | Self::RetryAfter { .. } => "handler_retryable",
            Self::Fatal(_) => "handler_fatal",
            Self::Rejected(_) => "downstream_rejected",
        }
    }
}

impl From<DbError> for HandlerError {
    fn from(e: DbError) -> Self {
        if e.is_retryable() {
            Self::Unavailable(e.to_string())
        } else {
            Self::Fatal(e.to_string())
        }
    }
}

impl From<sqlx::Error> for HandlerError {
    fn from(e: sqlx::Error) -> Self {
        DbError::from(e).into()
    }
}

/// Majors understood by handlers that keep the default of
/// [`Handler::supported_majors`]: major 1 of every event name.
pub const MAJOR_1: &[u32] = &[1];

/// What a handler did with one event of a batch: its effect, or why it failed.
pub type EventResult = Result<Effect, HandlerError>;

/// One downstream effect. Implement it to plug your own service's effect
/// into `orderpipe consume`: [`Handler::apply`] is enough;
/// [`Handler::apply_batch`] is the faster, set-based entry point.
#[async_trait]
pub trait Handler: Send + Sync {
    /// Stable name, used by `--handler` and in summaries.
    fn name(&self) -> &'static str;

    /// The major `event_version`s of `event_name` this handler understands;
    /// empty when it does not act on that event name. A record of a major
    /// that a handler acting on it does not list goes to the dead-letter
    /// topic as `unsupported_version`, before any handler runs (see
    /// [`super::version`]). Default: major 1 of every event name. Add a
    /// major here only once `apply` handles that major's payload.
    fn supported_majors(&self, event_name: &EventName) -> &[u32] {
        let _ = event_name;
        MAJOR_1
    }

    /// Applies the event's effect inside `tx`. Statements whose text
    /// differs between MariaDB and SQLite come from `tx.sql()` (e.g.
    /// `tx.sql().insert_ignore("INTO t (a) VALUES (?)")`).
    async fn apply(&self, tx: &mut Tx, envelope: &Envelope) -> Result<Effect, HandlerError>;

    /// Whether the effect lies outside the database (an HTTP POST). Such a
    /// handler's [`Handler::apply_outside`] runs before the batch's
    /// transaction opens, and the worker never calls its `apply` or
    /// `apply_batch`: no transaction is held open while it waits on a
    /// downstream. Default: false.
    fn acts_outside(&self) -> bool {
        false
    }

    /// The effect outside the database of a set of events of distinct keys
    /// (the worker cuts a batch into such waves, in offset order, and calls
    /// it with no transaction open); one result per event, in order. Only
    /// for handlers that [`Handler::acts_outside`]; the events may run at
    /// once (their order among each other does not matter). A redelivery
    /// after a crash before the commit runs it again for the same event.
    /// Default: every event [`Effect::Ignored`].
    async fn apply_outside(&self, events: &[&Envelope]) -> Vec<EventResult> {
        events.iter().map(|_| Ok(Effect::Ignored)).collect()
    }

    /// Applies a set of events inside `tx`; one result per event, in order.
    ///
    /// The worker calls it with events of distinct orders (it splits a
    /// batch into such *waves*, in offset order), so their order among
    /// each other does not matter and a handler can write them with
    /// multi-row statements ([`crate::db::rows`]). A failing event does
    /// not stop the others: the worker rolls the wave back to a savepoint
    /// and applies it again without the failed events, so what a failed
    /// event wrote needs no undoing here. `Err` for the whole set is only
    /// for [`HandlerError::Unavailable`] (the batch waits and is retried).
    ///
    /// Default: [`Handler::apply`] for each event.
    async fn apply_batch(
        &self,
        tx: &mut Tx,
        events: &[&Envelope],
    ) -> Result<Vec<EventResult>, HandlerError> {
        let mut results = Vec::with_capacity(events.len());
        for envelope in events {
            match self.apply(tx, envelope).await {
                Err(HandlerError::Unavailable(reason)) => {
                    return Err(HandlerError::Unavailable(reason));
                }
                result => results.push(result),
            }
        }
        Ok(results)
    }
}
