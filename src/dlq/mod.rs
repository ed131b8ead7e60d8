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

pub mod ignore;
pub mod persist;
pub mod replay;
pub mod store;
