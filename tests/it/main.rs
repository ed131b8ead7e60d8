//! Integration tests against the real stack: Kafka (KRaft), Apicurio
//! Registry and MariaDB, started by `make dev-up` (and by `make test`).
//!
//! Every test gets its own topic names (a random prefix) and, when it needs
//! one, its own database, through [`helpers::TestEnv`], so tests run in
//! parallel without seeing each other's records. Tests that stop shared
//! services or load the machine are `#[ignore]`d and run one at a time in
//! `make test`'s serial phase (`cargo test -- --ignored --test-threads=1`).

mod broker_restart;
mod cdc;
mod cdc_failover;
mod cdc_incremental;
mod cdc_large_tx;
mod cdc_oversize;
mod cdc_redact;
mod cdc_sources;
mod cdc_types;
mod console;
mod console_browser;
mod console_dlq;
mod console_explore;
mod console_history;
mod console_search;
mod consumer;
mod crash;
mod db_rows;
mod dedup_upgrade;
mod delivery;
mod dispatch;
mod dlq;
mod dlq_gauges;
mod dlq_retention;
mod exactly_once;
mod group_pause;
mod helpers;
mod integrity;
mod latency;
mod log_relay;
mod observability;
mod operator;
mod ordering;
mod outbox;
mod outbox_oversize;
mod partitioner;
mod producer;
mod readme;
mod reconcile;
mod replay;
mod retry_schedule;
mod rewind;
mod router;
mod router_cdc;
mod schema;
mod signals;
mod subscriptions;
mod topics;
mod wake;
mod webhook_flow;
mod webhooks;
