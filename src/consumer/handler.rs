//! The [`Handler`] trait: one downstream effect of an event.
//!
//! A handler runs inside the transaction that also holds the event's dedup
//! row, so its writes commit or roll back with it. Handlers still keep their
//! own business idempotency (unique keys, state machines): dedup is not the
//! only guard, and an effect that was already done reports
//! [`Effect::AlreadyDone`] instead of doing it twice.

use async_trait::async_trait;

use crate::db::{DbError, Dialect, Tx};
use crate::envelope::Envelope;

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

/// Why a handler failed.
#[derive(Debug, Clone, thiserror::Error)]
pub enum HandlerError {
    /// May succeed later (database down, lock timeout, downstream timeout).
    #[error("retryable: {0}")]
    Retryable(String),
    /// Never will (the event is invalid for the business state).
    #[error("fatal: {0}")]
    Fatal(String),
}

impl HandlerError {
    /// True for [`HandlerError::Retryable`].
    pub fn is_retryable(&self) -> bool {
        matches!(self, Self::Retryable(_))
    }
}

impl From<DbError> for HandlerError {
    fn from(e: DbError) -> Self {
        if e.is_retryable() {
            Self::Retryable(e.to_string())
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

/// One downstream effect. Implement it to plug your own service's effect
/// into `orderpipe consume`.
#[async_trait]
pub trait Handler: Send + Sync {
    /// Stable name, used by `--handler` and in summaries.
    fn name(&self) -> &'static str;

    /// Applies the event's effect inside `tx`.
    async fn apply(&self, tx: &mut Tx, dialect: Dialect, envelope: &Envelope) -> Result<Effect, HandlerError>;
}
