//! `orderpipe consume`: consumer groups with exactly-once effects.
//!
//! The processing contract (see `DESIGN.md`):
//!
//! 1. Poll; decode (Confluent frame + Avro + envelope validation).
//! 2. In one DB transaction: insert the `event_dedup` row; if it existed,
//!    skip the record (a duplicate); else run every handler's effect. Commit.
//! 3. Only then store the Kafka offset; librdkafka commits stored offsets
//!    every second, on rebalance and on close. A crash between 2 and 3
//!    redelivers records whose dedup rows already exist: they are skipped.
//!
//! Layout:
//!
//! * `group` runs one member of the group ([`run`]): checks, the shared
//!   state (`shared`), the background tasks (`background`: lag, release of
//!   parked keys), the dispatcher, the final commit;
//! * `settings` is the `[consumer]` section and the librdkafka config,
//!   `options` what one run is asked to do, `summary` what it did;
//! * `dispatch` runs the dispatcher: one `StreamConsumer`, records routed
//!   to one [`worker`] per assigned partition, so partitions run in
//!   parallel and each partition's records are applied in offset order
//!   (one order's events share a partition, so per-order order holds); it
//!   never waits on a worker: a partition whose worker's queue is full is
//!   paused instead;
//! * `pause` keeps why each partition is paused (the dispatcher's full
//!   queue, a worker's wait for a retry record's due time, an operator's
//!   pause of the group): it is resumed when no reason is left;
//! * [`group_pause`] is the operator's pause of a whole group (`orderpipe
//!   group pause|resume`), stored in `group_pauses` and followed by every
//!   member within a second;
//! * [`worker`] batches a partition's records into one DB transaction and
//!   retries database failures with backoff without committing past them;
//! * [`assignment`] tracks which partitions this member owns, so a worker
//!   never commits work for a partition that was revoked;
//! * `coordinator_watch` notices a group handler that can no longer find
//!   its coordinator although the cluster answers (after a broker
//!   restart): the member then stops with an error, and a new client rejoins;
//! * [`handler`] is the trait for effects, [`handlers`] the built-in ones;
//! * [`version`] checks `event_version` against the majors the handlers declare;
//! * [`events`] are the consumer's internal events (a log line and a metric each).
//! * [`naming`] checks a group name against the house pattern
//!   `{service}.{event}.consumer` (a warning at start).
//!
//! [`ConsumerSettings`] is the `[consumer]` section of the configuration.

pub mod assignment;
mod background;
mod coordinator_watch;
mod dispatch;
mod error;
pub mod events;
mod group;
pub mod group_pause;
pub mod handler;
pub mod handlers;
pub mod naming;
mod options;
mod pause;
mod settings;
mod shared;
mod summary;
pub mod version;
pub mod worker;

pub use error::ConsumerError;
pub use group::run;
pub use options::{ConsumeOptions, StartFrom, required_topics};
pub use settings::{
    ConsumerSections, ConsumerSettings, connections_needed, connections_needed_for, consumer_config,
};
pub(crate) use shared::Shared;
pub use summary::{ConsumeSummary, HandlerCounts};
