//! The built-in handlers, one per downstream service of the order flow
//! (seed 004): inventory, payment, logistics, notification, points.

use std::sync::Arc;

use async_trait::async_trait;

use super::handler::{Effect, Handler, HandlerError};
use super::version::MAJOR_1;
use crate::db::Tx;
use crate::envelope::{Envelope, EventData, EventName};

/// Names accepted by `--handler` (a `harness` build adds `chaos`).
pub const BUILT_IN: [&str; 5] = ["inventory", "payment", "logistics", "notification", "points"];

/// The built-in handler called `name`, if there is one.
pub fn by_name(name: &str) -> Option<Arc<dyn Handler>> {
    Some(match name {
        "inventory" => Arc::new(Inventory),
        "payment" => Arc::new(Payment),
        "logistics" => Arc::new(Logistics),
        "notification" => Arc::new(Notification),
        "points" => Arc::new(Points),
        _ => return None,
    })
}

/// The error for a `--handler` that names no handler: the built-in ones
/// and `more` (handlers this build adds) are listed.
pub fn unknown(name: &str, more: &[&str]) -> String {
    let known: Vec<&str> = BUILT_IN.iter().chain(more).copied().collect();
    format!("unknown handler `{name}`; built-in handlers: {}", known.join(", "))
}

/// Major 1 of the event names a built-in handler acts on (`handled`),
/// nothing of the others: a new major of an event it ignores does not stop it.
fn major_1_of(event_name: &EventName, handled: &[&str]) -> &'static [u32] {
    if handled.contains(&event_name.as_str()) { MAJOR_1 } else { &[] }
}

/// `Applied` when a row was written, `AlreadyDone` when a unique key or
/// state condition kept it from being written again.
fn written(rows: u64) -> Effect {
    if rows > 0 { Effect::Applied } else { Effect::AlreadyDone }
}

/// Moves a row from `from` to the next state, or explains why it cannot:
/// already in `to` is idempotent success, anything else is an illegal transition.
async fn transition(
    tx: &mut Tx,
    rows: u64,
    current: &'static str,
    order_id: i64,
    to: &str,
    what: &str,
) -> Result<Effect, HandlerError> {
    if rows > 0 {
        return Ok(Effect::Applied);
    }
    let state: Option<(String,)> = sqlx::query_as(current).bind(order_id).fetch_optional(&mut **tx).await?;
    match state {
        Some((s,)) if s == to => Ok(Effect::AlreadyDone),
        Some((s,)) => Err(HandlerError::Fatal(format!("order {order_id}: cannot {what} from state `{s}`"))),
        None => Err(HandlerError::Fatal(format!("order {order_id}: cannot {what}, no record of the order"))),
    }
}

/// Reserves stock on `order.created`, releases it on `order.canceled`.
pub struct Inventory;

#[async_trait]
impl Handler for Inventory {
    fn name(&self) -> &'static str {
        "inventory"
    }

    fn supported_majors(&self, event_name: &EventName) -> &[u32] {
        major_1_of(event_name, &["order.created", "order.canceled"])
    }

    async fn apply(&self, tx: &mut Tx, envelope: &Envelope) -> Result<Effect, HandlerError> {
        match &envelope.data {
            EventData::Created(d) => {
                let sql = tx.sql().insert_ignore("INTO inventory_reservations (order_id, sku, quantity, status, reserved_at) \
                     VALUES (?, ?, ?, 'reserved', ?)");
                let r = sqlx::query(sql)
                    .bind(d.order_id)
                    .bind(&d.sku)
                    .bind(d.quantity)
                    .bind(&d.created_at)
                    .execute(&mut **tx)
                    .await?;
                Ok(written(r.rows_affected()))
            }
            EventData::Canceled(d) => {
                let r = sqlx::query(
                    "UPDATE inventory_reservations SET status = 'released', released_at = ? \
                     WHERE order_id = ? AND status = 'reserved'",
                )
                .bind(&d.canceled_at)
                .bind(d.order_id)
                .execute(&mut **tx)
                .await?;
                let current = "SELECT status FROM inventory_reservations WHERE order_id = ?";
                transition(tx, r.rows_affected(), current, d.order_id, "released", "release stock").await
            }
            _ => Ok(Effect::Ignored),
        }
    }
}

/// Records payments and refunds.
pub struct Payment;

#[async_trait]
impl Handler for Payment {
    fn name(&self) -> &'static str {
        "payment"
    }

    fn supported_majors(&self, event_name: &EventName) -> &[u32] {
        major_1_of(event_name, &["order.payment.succeeded", "order.refunded"])
    }

    async fn apply(&self, tx: &mut Tx, envelope: &Envelope) -> Result<Effect, HandlerError> {
        match &envelope.data {
            EventData::PaymentSucceeded(d) => {
                let sql = tx.sql().insert_ignore("INTO payments (order_id, payment_id, amount, status, paid_at) VALUES (?, ?, ?, 'paid', ?)");
                let r = sqlx::query(sql)
                    .bind(d.order_id)
                    .bind(&d.payment_id)
                    .bind(d.amount)
                    .bind(&d.paid_at)
                    .execute(&mut **tx)
                    .await?;
                Ok(written(r.rows_affected()))
            }
            EventData::Refunded(d) => {
                let r = sqlx::query(
                    "UPDATE payments SET status = 'refunded', refund_id = ?, refunded_at = ? \
                     WHERE order_id = ? AND status = 'paid'",
                )
                .bind(&d.refund_id)
                .bind(&d.refunded_at)
                .bind(d.order_id)
                .execute(&mut **tx)
                .await?;
                let current = "SELECT status FROM payments WHERE order_id = ?";
                transition(tx, r.rows_affected(), current, d.order_id, "refunded", "refund").await
            }
            _ => Ok(Effect::Ignored),
        }
    }
}

/// Creates a shipment on `order.shipped`.
pub struct Logistics;

#[async_trait]
impl Handler for Logistics {
    fn name(&self) -> &'static str {
        "logistics"
    }

    fn supported_majors(&self, event_name: &EventName) -> &[u32] {
        major_1_of(event_name, &["order.shipped"])
    }

    async fn apply(&self, tx: &mut Tx, envelope: &Envelope) -> Result<Effect, HandlerError> {
        let EventData::Shipped(d) = &envelope.data else {
            return Ok(Effect::Ignored);
        };
        let sql = tx.sql().insert_ignore("INTO shipments (order_id, shipment_id, carrier, shipped_at) VALUES (?, ?, ?, ?)");
        let r = sqlx::query(sql)
            .bind(d.order_id)
            .bind(&d.shipment_id)
            .bind(&d.carrier)
            .bind(&d.shipped_at)
            .execute(&mut **tx)
            .await?;
        Ok(written(r.rows_affected()))
    }
}

/// One notification per user-visible event (all order events are).
pub struct Notification;

#[async_trait]
impl Handler for Notification {
    fn name(&self) -> &'static str {
        "notification"
    }

    async fn apply(&self, tx: &mut Tx, envelope: &Envelope) -> Result<Effect, HandlerError> {
        let sql = tx.sql().insert_ignore("INTO notifications (event_id, order_id, kind) VALUES (?, ?, ?)");
        let r = sqlx::query(sql)
            .bind(envelope.event_id.to_string())
            .bind(envelope.data.order_id())
            .bind(envelope.event_name.as_str())
            .execute(&mut **tx)
            .await?;
        Ok(written(r.rows_affected()))
    }
}

/// Points: one per whole currency unit paid; reversed on refund.
pub struct Points;

/// Points earned for an amount in cents.
pub fn points_for(amount_cents: i64) -> i64 {
    amount_cents / 100
}

#[async_trait]
impl Handler for Points {
    fn name(&self) -> &'static str {
        "points"
    }

    fn supported_majors(&self, event_name: &EventName) -> &[u32] {
        major_1_of(event_name, &["order.payment.succeeded", "order.refunded"])
    }

    async fn apply(&self, tx: &mut Tx, envelope: &Envelope) -> Result<Effect, HandlerError> {
        let (order_id, entry, points) = match &envelope.data {
            EventData::PaymentSucceeded(d) => (d.order_id, "earn", points_for(d.amount)),
            EventData::Refunded(d) => {
                let earned: Option<(i64,)> = sqlx::query_as(
                    "SELECT points FROM points_ledger WHERE order_id = ? AND entry_type = 'earn'",
                )
                .bind(d.order_id)
                .fetch_optional(&mut **tx)
                .await?;
                if earned.is_none() {
                    return Err(HandlerError::Fatal(format!(
                        "order {}: cannot reverse points, none were earned",
                        d.order_id
                    )));
                }
                (d.order_id, "reverse", -points_for(d.amount))
            }
            _ => return Ok(Effect::Ignored),
        };
        let sql = tx.sql().insert_ignore("INTO points_ledger (order_id, entry_type, points, event_id) VALUES (?, ?, ?, ?)");
        let r = sqlx::query(sql)
            .bind(order_id)
            .bind(entry)
            .bind(points)
            .bind(envelope.event_id.to_string())
            .execute(&mut **tx)
            .await?;
        Ok(written(r.rows_affected()))
    }
}
