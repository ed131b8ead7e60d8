//! Assertions over `orderpipe::harness::verify`: the business tables and
//! `event_dedup` against the events as produced.

use orderpipe::db::Db;
use orderpipe::envelope::Envelope;
use orderpipe::harness::verify::{applied_order, verify};

/// Every handler, as `--handler` takes them.
pub const ALL_HANDLERS: &str = "inventory,payment,logistics,notification,points";

/// Asserts the tables equal the exactly-once expectation, that `group`
/// applied every event once, and each order's events in production order.
pub async fn assert_exactly_once(db: &Db, group: &str, events: &[Envelope]) {
    let v = verify(db, group, events).await.unwrap();
    assert!(v.is_exact(), "not exactly once:\n{v:#?}");
}

/// Asserts `group`'s dedup rows hold every event once, in production order per order.
pub async fn assert_applied_in_order(db: &Db, group: &str, events: &[Envelope]) {
    let (rows, out_of_order) = applied_order(db, group, events).await.unwrap();
    assert_eq!(rows.expected, rows.actual, "dedup rows of {group}");
    assert!(
        out_of_order.is_empty(),
        "{group}: orders applied out of order: {out_of_order:?}"
    );
}
