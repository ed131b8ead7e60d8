//! One partition's worker: applies its records in offset order, in batches,
//! and sends failures through the error tier.
//!
//! # States
//!
//! A worker serves its partition until the channel closes or the partition
//! is revoked. Revocation is the one way out of every step: each step that
//! can notice it returns `Result<_, Revoked>`, and `?` carries it up to
//! [`PartitionWorker::run`], which hands what is still queued back (the next
//! owner re-reads every record whose offset was not stored). A step that
//! waits for the database, the registry or the broker does so through
//! [`crate::backoff::until_available`], which checks ownership after each wait.
//!
//! # A batch
//!
//! A batch is every record already waiting (up to `consumer.batch_size`):
//!
//! 1. decode: a record that cannot be decoded or validated is poison, sent
//!    straight to the dead-letter topic with its reason (no retries can fix
//!    it); so is a record of an `event_version` major the handlers do not
//!    declare (`unsupported_version`, see [`super::version`]); the registry
//!    being down is waited out in place;
//! 2. effects outside the database (HTTP deliveries), with no transaction
//!    open (`worker/outside.rs`);
//! 3. apply, in one DB transaction (`worker/apply.rs`): the *gate*
//!    (per-key ordering), then waves of set-based *dedup* and *handlers*
//!    (a fixed, small number of statements whatever the batch's size),
//!    then *commit* and *bookkeeping* (counts, the parked set, metrics);
//! 4. store the offset of the last record, and release what waited behind
//!    the heads the batch applied ([`PartitionWorker::release`]).
//!
//! Failures while applying:
//!
//! * the infrastructure being down (database unavailable, lock timeout)
//!   rolls back and retries the same batch in place with exponential
//!   backoff; the offset does not move, health reports it, and the records
//!   keep their retry budget;
//! * a record a handler fails is taken out of the transaction (its wave
//!   rolls back to a savepoint and runs again without it), together with
//!   the later records of its key; the rest of the batch commits. Then the
//!   failed record gets `retry.local_retries` immediate retries (if
//!   retryable) and goes to the group's retry topic or, when fatal or out
//!   of attempts, to the dead-letter topic; then the records behind it are
//!   applied (or held behind it). The batch's offset is stored only once
//!   all of that is done and the broker acknowledged every forward.
//!
//! A worker of the group's retry topic waits for each record's due time
//! with its partition paused (no busy polling), then processes it the same way.
//!
//! With `consumer.ordering = key` (see [`crate::ordering`]) a forwarded
//! record parks its key; later records of a parked key are held in the
//! batch's transaction instead of applied, and released in order once the
//! head is applied (`worker/parking.rs` keeps the parked keys and the held
//! records; the driver applies what it releases).
//!
//! # Layout
//!
//! One file per stage, each a type with its own fields over the shared
//! `PartitionState`; the driver owns the stages and is the only
//! one that calls more than one of them:
//!
//! * `partition.rs`: [`PartitionWorker`], the driver: serve, process, the
//!   error tier (local retries, forward, park) and release;
//! * `state.rs`: the partition's state every stage reads (ownership,
//!   counts, spans, the offset store, the unit of order), `Item`
//!   and `Revoked`;
//! * `decode.rs`: the decode stage, bytes to a checked envelope or poison;
//! * `apply.rs`: the batch-transaction stage (gate, waves, commit,
//!   bookkeeping);
//! * `outside.rs`: the effects outside the database, run before that
//!   transaction opens; `waves.rs`: the waves both cut a batch into;
//! * `parking.rs`: the parking stage: parked keys, held records, park.

mod apply;
mod decode;
mod outside;
mod parking;
mod partition;
mod state;
mod waves;

pub use decode::MAX_VALUE_BYTES;
pub use partition::PartitionWorker;
