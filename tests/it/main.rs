//! Integration tests against the real stack: Kafka (KRaft), Apicurio
//! Registry and MariaDB, started by `make dev-up` (and by `make test`).
//!
//! Every test gets its own topic names (a random prefix) through
//! [`helpers::TestEnv`], so tests run in parallel without seeing each
//! other's records.

mod helpers;
mod producer;
mod schema;
mod topics;
