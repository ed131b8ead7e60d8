//! orderpipe: a Kafka-native order event pipeline.
//!
//! Order services record business changes and an outbox row in one
//! transaction; a relay publishes them as Avro envelopes to
//! `order.events.v1`, keyed by `order_id`; consumer groups apply each event
//! exactly once in effect. See `README.md` and `docs/architecture.md` for
//! the whole picture.
//!
//! Layout, one module per concept of the design:
//!
//! | module | what it is |
//! |---|---|
//! | [`clock`] | the one time source: `now_ms()` |
//! | [`backoff`] | the one retry-until-available helper: capped exponential backoff, a stop condition |
//! | [`hex`] | the one hex encoding: digests, ids, binary values shown as text |
//! | [`kafka`] | the Kafka floor: client settings and options, the measured producer, record headers |
//! | [`envelope`] | the event envelope, event names and payloads (seed 000) |
//! | [`schema`] | the Avro schemas in `schemas/`, registering and compatibility checks |
//! | [`codec`] | Confluent wire format and the registry client (below `schema`) |
//! | [`api`] | the reference order service: state machine + outbox in one transaction |
//! | [`outbox`] | the transactional outbox and its relay (transactional producer) |
//! | [`cdc`] | `orderpipe cdc`: the binlog source, row changes as envelopes on `cdc.<db>.<table>`, checkpoints in the same Kafka transaction |
//! | [`producer`] | the idempotent keyed producer |
//! | [`consumer`] | consumer groups applying events exactly once in effect |
//! | [`ordering`] | per-order ordering through retries, the DLQ and replay: parked keys, held records |
//! | [`retry`] | the error tier: local retries, retry topic, dead-letter topic |
//! | [`dlq`] | dead-letter persister, listing, replay and ignore |
//! | [`delivery`] | config-driven HTTP delivery to downstream services |
//! | [`dedup`] | the `event_dedup` guard and its retention cleanup |
//! | [`explore`] | the topic explorer's reading: records at an offset or time, an order's records by key and partitioner, decoding through the registry; the registry's subjects, versions and diffs (the console's read-only pages) |
//! | [`lag`] | consumer group lag as the broker sees it (`orderpipe lag`, the persister's exporter) |
//! | [`masking`] | the field paths shown as `•••` in the console and the CLI unless revealed |
//! | [`reconcile`] | produced-vs-applied reconciliation of a group over a window (`orderpipe reconcile`, `reconcile_runs`, its gauges) |
//! | [`rewind`] | rewind a stopped group by time (`consume --reset-to`, `deliver --reset-to`): offsets per partition, the dedup rows of what is read again |
//! | [`router`] | `deliver` without `--subscription`: one consumer group per (consumer, bind_key) of the subscription tables, reloaded live, reconciled |
//! | [`snapshot_signals`] | `cdc_signals`: the rows that start, stop, pause and resume a cdc source's incremental snapshots (CLI, admin API, SQL) |
//! | [`subscriptions`] | subscriptions as data (seed 003's control plane): tables, property filters, desired bindings, the admin API |
//! | [`table_name`] | `<database>.<table>` names as `cdc` captures tables, shared by every table-keyed setting |
//! | [`db`] | database pool, the one place for MySQL/SQLite statement differences, migrations from `sql/` |
//! | [`health`] | `/metrics` and `/health/*` endpoints |
//! | [`stages`] | where a pipeline's time goes: per-stage histograms and a run's p50/p99 per stage (relay, cdc) |
//! | [`metrics`] | metric names, the recorder and `/metrics` rendering, the internal-event pattern, owned series (no domain imports) |
//! | [`topics`] | topic reconcile (`topics ensure` / `describe`) |
//! | [`config`] | layered settings: defaults, file, environment, flags; composes the components' sections |
//! | [`startup`] | builds the roles from the settings: the sections each one reads |
//! | [`stopping`] | a stop that cannot hang: the phase a stopping process is in, the deadline past which it exits anyway |
//! | [`telemetry`] | logging setup |
//! | `harness` | demo, benchmarks, generator, exactly-once verification, the `chaos` handler: only with the cargo feature `harness` |
//! | [`console`] | `orderpipe console`: the operator's web UI (overview, dead letters, held orders, topics, schemas, subscriptions), roles, CSRF, audit |
//! | [`cli`] | the `orderpipe` command line; `src/bin/orderpipe.rs` only calls it |

pub mod api;
pub mod backoff;
pub mod cdc;
pub mod cli;
pub mod clock;
pub mod codec;
pub mod config;
pub mod console;
pub mod consumer;
pub mod db;
pub mod dedup;
pub mod delivery;
pub mod dlq;
pub mod envelope;
pub mod explore;
#[cfg(feature = "harness")]
pub mod harness;
pub mod health;
pub mod hex;
pub mod kafka;
pub mod lag;
pub mod masking;
pub mod metrics;
pub mod ordering;
pub mod outbox;
pub mod producer;
pub mod reconcile;
pub mod retry;
pub mod rewind;
pub mod router;
pub mod schema;
pub mod snapshot_signals;
pub mod stages;
pub mod startup;
pub mod stopping;
pub mod subscriptions;
pub mod table_name;
pub mod telemetry;
pub mod topics;
