//! Subscriptions as data: the control plane of seed 003 (issue 16, item 2).
//!
//! Seed 003 keeps its routing in MySQL tables that an admin console and an
//! admin API change at run time. orderpipe keeps the same five tables
//! (`sql/*/0012_subscriptions.sql`), in the house naming:
//!
//! | table | seed 003 | what a row is |
//! |---|---|---|
//! | `cdc_sources` | `maxwell_instance` | a MySQL/MariaDB binlog source (no password) |
//! | `event_definitions` | `event` | a routing key `<db>.<table>.<insert\|update\|delete>` (or an order event name) and its topic |
//! | `downstream_consumers` | `consumer` | an HTTP endpoint: URL, method, timeout, retry schedule, enabled |
//! | `subscriptions` | `sub_event` | event -> consumer, `bind_key`, enabled |
//! | `property_filters` | `event_property_setting` | a subscription's condition: `eq`, `ne`, `in`, `changed` from X to Y |
//!
//! plus `control_requests`, the refresh/reload requests routers poll.
//!
//! Who uses what:
//!
//! * [`store::Store`] reads and writes the tables; every change also writes
//!   a [`store::ControlRequest`] in its transaction, so routers notice it.
//! * [`bindings`]: the desired state ([`bindings::Binding`], one consumer group
//!   per (consumer, bind_key), from [`store::Store::desired`]), the decision for one
//!   change ([`bindings::Binding::decide`]: deliver, filtered out, not
//!   subscribed), and the actual state a router reports
//!   ([`bindings::ActualState`]) with the difference between the two.
//! * [`filter`]: the property filters, a pure function of `data` and `old`.
//! * [`admin`]: the admin HTTP API (CRUD, `POST /refresh`, `GET /bindings`,
//!   `POST /reload`), bearer token for every state change.
//! * `orderpipe subs ...` ([`crate::cli::subs`]) is the same CRUD on the command line.
//! * [`pause`]: a subscription's or a consumer's pause, as the pause of the
//!   groups serving it.
//! * [`record::Record`]: the four kinds behind one trait, so the API and the
//!   CLI handle show, add, update, enable/disable and remove once for all kinds.

pub mod admin;
pub mod bindings;
pub mod filter;
pub mod model;
pub mod pause;
pub mod record;
pub mod store;
pub mod watch;

pub use bindings::{ActualBinding, ActualState, Binding, Decision};
pub use filter::{Condition, FilterSpec, PropertyFilter};
pub use model::{Consumer, EventDefinition, Source, Subscription};
pub use store::{ControlRequest, Store};

use crate::db::DbError;

/// A value that cannot be used: which field, and why (with the accepted values).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {reason}")]
pub struct Invalid {
    /// The field, as the CLI flag's or the JSON body's name (`url`, `filters[0].op`).
    pub field: String,
    /// What is wrong and what is accepted.
    pub reason: String,
}

impl Invalid {
    /// `field: reason`.
    pub fn new(field: impl Into<String>, reason: impl Into<String>) -> Self {
        Self {
            field: field.into(),
            reason: reason.into(),
        }
    }
}

/// What the control plane's operations can fail with.
#[derive(Debug, thiserror::Error)]
pub enum SubsError {
    /// Bad input; names the field.
    #[error(transparent)]
    Invalid(#[from] Invalid),
    /// No such record.
    #[error("{kind} `{key}` not found{known}")]
    NotFound {
        /// `consumer`, `event`, `source`, `subscription`.
        kind: &'static str,
        /// Its name, routing key or id.
        key: String,
        /// `; known: a, b` when the kind has few enough names to list.
        known: String,
    },
    /// A record with this key exists already.
    #[error("{kind} `{key}` exists already{detail}")]
    Exists {
        /// The kind.
        kind: &'static str,
        /// Its key.
        key: String,
        /// Which record, when it helps.
        detail: String,
    },
    /// Other records still refer to it.
    #[error("{kind} `{key}` is used by {by}: remove those first")]
    InUse {
        /// The kind.
        kind: &'static str,
        /// Its key.
        key: String,
        /// Who refers to it.
        by: String,
    },
    /// The database failed.
    #[error(transparent)]
    Db(#[from] DbError),
}

impl From<sqlx::Error> for SubsError {
    fn from(e: sqlx::Error) -> Self {
        Self::Db(DbError::from(e))
    }
}
