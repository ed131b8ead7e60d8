//! Dead letters: records a consumer group could not apply.
//!
//! The consumer's error tier writes them to `order.events.v1.dlq` (see
//! [`crate::retry`]); [`persist`] stores them in the `dead_letters` table;
//! operators list, inspect, replay or ignore them from the CLI.
//!
//! * [`store`] is the table: upsert, filters, counts, status changes;
//! * [`persist`] is `orderpipe dlq persist`;
//! * [`replay`] is `orderpipe dlq replay`;
//! * [`ignore`] is `orderpipe dlq ignore`, which asks what happens to the
//!   records held behind a head of a parked key.
//! * [`held`] is the operators' view of the records held behind parked
//!   keys (not dead letters: they have their own table and type).
//!
//! [`DlqSettings`] is the `[dlq]` section of the configuration.

pub mod held;
pub mod ignore;
pub mod persist;
pub mod replay;
pub mod store;

use serde::Deserialize;

/// The `[dlq]` section of the configuration: dead letters.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DlqSettings {
    /// Consumer group of the persister.
    pub persister_group: String,
}
