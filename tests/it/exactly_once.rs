//! The exactly-once expectation of a set of produced events, and a check of
//! the business tables and `event_dedup` against it.

use std::collections::HashMap;

use orderpipe::consumer::handlers::points_for;
use orderpipe::envelope::{Envelope, EventData};
use sqlx::MySqlPool;

/// Every handler, as `--handler` takes them.
pub const ALL_HANDLERS: &str = "inventory,payment,logistics,notification,points";

/// What the tables must hold after every event was applied exactly once.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Expected {
    reservations: i64,
    released: i64,
    payments: i64,
    refunded: i64,
    shipments: i64,
    notifications: i64,
    points_earn: i64,
    points_reverse: i64,
    points_total: i64,
}

impl Expected {
    /// Computed from the produced events.
    pub fn from_events(events: &[Envelope]) -> Self {
        let mut e = Self::default();
        for event in events {
            e.notifications += 1;
            match &event.data {
                EventData::Created(_) => e.reservations += 1,
                EventData::Canceled(_) => e.released += 1,
                EventData::PaymentSucceeded(d) => {
                    e.payments += 1;
                    e.points_earn += 1;
                    e.points_total += points_for(d.amount);
                }
                EventData::Refunded(d) => {
                    e.refunded += 1;
                    e.points_reverse += 1;
                    e.points_total -= points_for(d.amount);
                }
                EventData::Shipped(_) => e.shipments += 1,
            }
        }
        e
    }

    /// Read from the business tables.
    pub async fn from_tables(pool: &MySqlPool) -> Self {
        let count = |sql: &'static str| async move {
            let (n,): (i64,) = sqlx::query_as(sql).fetch_one(pool).await.unwrap();
            n
        };
        Self {
            reservations: count("SELECT COUNT(*) FROM inventory_reservations").await,
            released: count("SELECT COUNT(*) FROM inventory_reservations WHERE status = 'released'").await,
            payments: count("SELECT COUNT(*) FROM payments").await,
            refunded: count("SELECT COUNT(*) FROM payments WHERE status = 'refunded'").await,
            shipments: count("SELECT COUNT(*) FROM shipments").await,
            notifications: count("SELECT COUNT(*) FROM notifications").await,
            points_earn: count("SELECT COUNT(*) FROM points_ledger WHERE entry_type = 'earn'").await,
            points_reverse: count("SELECT COUNT(*) FROM points_ledger WHERE entry_type = 'reverse'").await,
            points_total: count("SELECT CAST(COALESCE(SUM(points), 0) AS SIGNED) FROM points_ledger").await,
        }
    }
}

/// Asserts the tables equal the expectation, that `group` applied every
/// event once, and that each order's events were applied in production order.
pub async fn assert_exactly_once(pool: &MySqlPool, group: &str, events: &[Envelope]) {
    assert_eq!(Expected::from_tables(pool).await, Expected::from_events(events), "business tables");
    assert_applied_in_order(pool, group, events).await;
}

/// Asserts `group`'s dedup rows hold every event once, and per order in the
/// order produced (apply_seq is the order the effects were committed).
pub async fn assert_applied_in_order(pool: &MySqlPool, group: &str, events: &[Envelope]) {
    let rows: Vec<(String, String)> = sqlx::query_as(
        "SELECT record_key, event_id FROM event_dedup WHERE consumer_group = ? ORDER BY apply_seq",
    )
    .bind(group)
    .fetch_all(pool)
    .await
    .unwrap();
    assert_eq!(rows.len(), events.len(), "dedup rows of {group}");
    let mut applied: HashMap<String, Vec<String>> = HashMap::new();
    for (key, id) in rows {
        applied.entry(key).or_default().push(id);
    }
    let mut produced: HashMap<String, Vec<String>> = HashMap::new();
    for e in events {
        produced.entry(e.key()).or_default().push(e.event_id.to_string());
    }
    for (key, ids) in &produced {
        assert_eq!(applied.get(key), Some(ids), "order {key}: applied out of produced order");
    }
}
