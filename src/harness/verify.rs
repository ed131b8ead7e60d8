//! The exactly-once check: what the built-in handlers' tables must hold
//! after a set of events was applied exactly once, compared with what they
//! hold, plus a per-order check that effects were applied in the order the
//! events were produced (from `event_dedup.apply_seq`).
//!
//! The demo prints it; the integration tests and `bench-order-check` assert on it.

use std::collections::HashMap;

use serde::Serialize;

use crate::consumer::handlers::points_for;
use crate::db::{Db, DbError};
use crate::envelope::{Envelope, EventData};

/// One counted fact: expected vs found.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Fact {
    /// What is counted.
    pub what: &'static str,
    /// From the produced events.
    pub expected: i64,
    /// From the tables.
    pub actual: i64,
}

/// The outcome of a check.
#[derive(Debug, Clone, Serialize)]
pub struct Verification {
    /// Business table facts.
    pub facts: Vec<Fact>,
    /// Dedup rows of the group vs events.
    pub dedup_rows: Fact,
    /// Orders whose effects were applied out of production order.
    pub out_of_order: Vec<String>,
}

impl Verification {
    /// Everything matched.
    pub fn is_exact(&self) -> bool {
        self.facts.iter().all(|f| f.expected == f.actual)
            && self.dedup_rows.expected == self.dedup_rows.actual
            && self.out_of_order.is_empty()
    }
}

/// Counts over the business tables (all handlers).
const FACTS: [(&str, &str); 9] = [
    (
        "inventory reservations",
        "SELECT COUNT(*) FROM inventory_reservations",
    ),
    (
        "reservations released",
        "SELECT COUNT(*) FROM inventory_reservations WHERE status = 'released'",
    ),
    ("payments", "SELECT COUNT(*) FROM payments"),
    (
        "payments refunded",
        "SELECT COUNT(*) FROM payments WHERE status = 'refunded'",
    ),
    ("shipments", "SELECT COUNT(*) FROM shipments"),
    ("notifications", "SELECT COUNT(*) FROM notifications"),
    (
        "points earned entries",
        "SELECT COUNT(*) FROM points_ledger WHERE entry_type = 'earn'",
    ),
    (
        "points reversed entries",
        "SELECT COUNT(*) FROM points_ledger WHERE entry_type = 'reverse'",
    ),
    ("points balance", "SUM"),
];

fn expected(events: &[Envelope]) -> [i64; 9] {
    let mut e = [0i64; 9];
    for event in events {
        e[5] += 1;
        match &event.data {
            EventData::Created(_) => e[0] += 1,
            EventData::Canceled(_) => e[1] += 1,
            EventData::PaymentSucceeded(d) => {
                e[2] += 1;
                e[6] += 1;
                e[8] += points_for(d.amount);
            }
            EventData::Refunded(d) => {
                e[3] += 1;
                e[7] += 1;
                e[8] -= points_for(d.amount);
            }
            EventData::Shipped(_) => e[4] += 1,
            // Inventory events live on their own topic; no built-in handler writes them.
            // Row changes live on cdc.* topics; no built-in handler writes them either.
            EventData::StockReserved(_) | EventData::StockReleased(_) | EventData::RowChange(_) => {
            }
        }
    }
    e
}

async fn count(db: &Db, sql: &'static str) -> Result<i64, DbError> {
    let sql = if sql == "SUM" {
        // SUM is DECIMAL on MySQL: cast it back to an integer.
        format!(
            "SELECT {} FROM points_ledger",
            db.sql().integer("COALESCE(SUM(points), 0)")
        )
    } else {
        sql.to_owned()
    };
    let (n,): (i64,) = sqlx::query_as(sqlx::AssertSqlSafe(sql))
        .fetch_one(&db.pool)
        .await?;
    Ok(n)
}

/// Compares the tables (every built-in handler applied) and `group`'s dedup
/// rows with `events` applied exactly once, in order per order.
pub async fn verify(db: &Db, group: &str, events: &[Envelope]) -> Result<Verification, DbError> {
    let want = expected(events);
    let mut facts = Vec::with_capacity(FACTS.len());
    for (i, (what, sql)) in FACTS.iter().enumerate() {
        facts.push(Fact {
            what,
            expected: want[i],
            actual: count(db, sql).await?,
        });
    }
    let (dedup_rows, out_of_order) = applied_order(db, group, events).await?;
    Ok(Verification {
        facts,
        dedup_rows,
        out_of_order,
    })
}

/// `group`'s dedup row count vs events, and the orders whose effects were
/// committed in another order than produced.
pub async fn applied_order(
    db: &Db,
    group: &str,
    events: &[Envelope],
) -> Result<(Fact, Vec<String>), DbError> {
    let rows: Vec<(String, String)> = sqlx::query_as(
        "SELECT record_key, event_id FROM applied_events WHERE consumer_group = ? ORDER BY apply_seq",
    )
    .bind(group)
    .fetch_all(&db.pool)
    .await?;
    let dedup = Fact {
        what: "dedup rows",
        expected: events.len() as i64,
        actual: rows.len() as i64,
    };
    let mut applied: HashMap<String, Vec<String>> = HashMap::new();
    for (key, id) in rows {
        applied.entry(key).or_default().push(id);
    }
    let mut produced: HashMap<String, Vec<String>> = HashMap::new();
    for e in events {
        produced
            .entry(e.key())
            .or_default()
            .push(e.event_id.to_string());
    }
    let mut out_of_order: Vec<String> = produced
        .iter()
        .filter(|(key, ids)| applied.get(*key) != Some(ids))
        .map(|(key, _)| key.clone())
        .collect();
    out_of_order.sort();
    Ok((dedup, out_of_order))
}

/// One order's events as `group` applied them: event name and `apply_seq`,
/// in apply order.
pub async fn applied_sequence(
    db: &Db,
    group: &str,
    order: i64,
) -> Result<Vec<(String, i64)>, DbError> {
    Ok(sqlx::query_as(
        "SELECT event_type, apply_seq FROM applied_events WHERE consumer_group = ? AND record_key = ? ORDER BY apply_seq",
    )
    .bind(group)
    .bind(order.to_string())
    .fetch_all(&db.pool)
    .await?)
}

/// Events of orders other than `order` that `group` applied strictly
/// between two `apply_seq` values (what flowed while `order` waited).
pub async fn others_applied_between(
    db: &Db,
    group: &str,
    order: i64,
    from: i64,
    to: i64,
) -> Result<i64, DbError> {
    let (n,): (i64,) = sqlx::query_as(
        "SELECT COUNT(*) FROM applied_events WHERE consumer_group = ? AND record_key <> ? AND apply_seq > ? AND apply_seq < ?",
    )
    .bind(group)
    .bind(order.to_string())
    .bind(from)
    .bind(to)
    .fetch_one(&db.pool)
    .await?;
    Ok(n)
}
