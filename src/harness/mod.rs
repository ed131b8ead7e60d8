//! The test and demo harness, compiled only with the cargo feature
//! `harness` (`make run`, `make test` and `make bench-*` turn it on; the
//! release image leaves it off, so production binaries carry none of it).
//!
//! | module | what it is |
//! |---|---|
//! | [`demo`] | the embedded end-to-end run behind `make run` (`orderpipe demo`) |
//! | [`generator`] | synthetic order lifecycles: envelopes for `produce --count`, or driven through the order API |
//! | [`verify`] | the exactly-once and per-order apply-order checks over the handlers' tables |
//! | [`chaos`] | the `chaos` fault-injection handler and its `[chaos]` settings |
//! | [`bench`] | benchmark peers (the naive consumer baseline, the database ceiling) |
//! | [`bench_report`] | the `make bench` report: Markdown table and SVG plots from `target/bench/results.tsv` |
//! | [`latency`] | after-commit stamps of the API and the consumer, for the end-to-end latency benchmark |
//!
//! It sits on top of the library: it may use every module, and no module
//! below it uses it (only `cli`, for the harness commands).

pub mod bench;
pub mod bench_report;
pub mod chaos;
pub mod demo;
pub mod generator;
pub mod latency;
pub mod verify;
