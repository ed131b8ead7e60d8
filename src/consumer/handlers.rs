//! The built-in handlers, one per downstream service of the order flow
//! (seed 004): inventory, payment, logistics, notification, points.
//!
//! Each is set-based: a batch's events are written with one multi-row
//! insert per table, and a state change reads the orders' states in one
//! statement and moves the legal ones in another ([`crate::db::rows`]);
//! `apply` is `apply_batch` of one event.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use async_trait::async_trait;

use sqlx::Row as _;

use super::handler::{Effect, EventResult, Handler, HandlerError, MAJOR_1};
use crate::db::Tx;
use crate::db::rows::{self, Bound};
use crate::envelope::{Envelope, EventData, EventName};

/// Names accepted by `--handler` (a `harness` build adds `chaos`).
pub const BUILT_IN: [&str; 5] = [
    "inventory",
    "payment",
    "logistics",
    "notification",
    "points",
];

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
    format!(
        "unknown handler `{name}`; built-in handlers: {}",
        known.join(", ")
    )
}

/// Major 1 of the event names a built-in handler acts on (`handled`),
/// nothing of the others: a new major of an event it ignores does not stop it.
fn major_1_of(event_name: &EventName, handled: &[&str]) -> &'static [u32] {
    if handled.contains(&event_name.as_str()) {
        MAJOR_1
    } else {
        &[]
    }
}

/// The one result of a batch of one event (a handler's [`Handler::apply`]
/// is its [`Handler::apply_batch`] on that event alone).
fn only(results: Vec<EventResult>) -> Result<Effect, HandlerError> {
    results.into_iter().next().expect("one result per event")
}

/// A row one event of the batch writes: the event's position in the
/// batch, its order id (unique within the batch: see [`Handler::apply_batch`])
/// and the row's values.
struct Row<'a> {
    at: usize,
    order_id: i64,
    values: Vec<Bound<'a>>,
}

impl<'a> Row<'a> {
    fn new(at: usize, order_id: i64, values: Vec<Bound<'a>>) -> Self {
        Self {
            at,
            order_id,
            values,
        }
    }
}

/// Results for a batch of `n` events, all `Ignored` until a handler sets them.
fn ignored(n: usize) -> Vec<EventResult> {
    vec![Ok(Effect::Ignored); n]
}

/// Inserts `rows` into `into` (`table (columns)`, with `order_id` among
/// them) with `INSERT IGNORE ... RETURNING order_id`: `Applied` for each
/// row written, `AlreadyDone` where a unique key kept it out (the effect
/// was written before).
async fn insert_rows(
    tx: &mut Tx,
    into: &str,
    rows: &[Row<'_>],
    results: &mut [EventResult],
) -> Result<(), HandlerError> {
    if rows.is_empty() {
        return Ok(());
    }
    let verb = tx.sql().insert_ignore_verb();
    let written =
        rows::insert_returning(tx, verb, into, "order_id", rows, |row| row.values.clone()).await?;
    let written: HashSet<i64> = written
        .iter()
        .map(|r| r.try_get::<i64, _>(0))
        .collect::<Result<_, _>>()?;
    for row in rows {
        results[row.at] = Ok(if written.contains(&row.order_id) {
            Effect::Applied
        } else {
            Effect::AlreadyDone
        });
    }
    Ok(())
}

/// A state change of `table`'s rows (keyed by `order_id`, with a `status`
/// column) from `from` to `to`, setting `columns` to each row's values.
struct Transition {
    table: &'static str,
    from: &'static str,
    to: &'static str,
    columns: &'static [&'static str],
    /// What the change does, for the error: "release stock", "refund".
    what: &'static str,
}

impl Transition {
    /// Reads the orders' states in one statement, then moves those in
    /// `from` to `to` in one statement. Already in `to` is `AlreadyDone`
    /// (idempotent); any other state, or no row, is an illegal transition:
    /// that event fails (fatal) and nothing is written for it.
    async fn apply(
        &self,
        tx: &mut Tx,
        rows: &[Row<'_>],
        results: &mut [EventResult],
    ) -> Result<(), HandlerError> {
        if rows.is_empty() {
            return Ok(());
        }
        let orders: Vec<i64> = rows.iter().map(|r| r.order_id).collect();
        let select = format!("SELECT order_id, status FROM {}", self.table);
        let mut states = HashMap::with_capacity(rows.len());
        for row in rows::select_in(tx, &select, "order_id", "", &orders).await? {
            states.insert(row.try_get::<i64, _>(0)?, row.try_get::<String, _>(1)?);
        }
        let mut moves = Vec::with_capacity(rows.len());
        for row in rows {
            let (order_id, what) = (row.order_id, self.what);
            results[row.at] = match states.get(&order_id).map(String::as_str) {
                Some(s) if s == self.from => {
                    moves.push((order_id, row.values.clone()));
                    Ok(Effect::Applied)
                }
                Some(s) if s == self.to => Ok(Effect::AlreadyDone),
                Some(s) => Err(HandlerError::Fatal(format!(
                    "order {order_id}: cannot {what} from state `{s}`"
                ))),
                None => Err(HandlerError::Fatal(format!(
                    "order {order_id}: cannot {what}, no record of the order"
                ))),
            };
        }
        if !moves.is_empty() {
            let set = format!("status = '{}'", self.to);
            let condition = format!("status = '{}'", self.from);
            rows::update_each(
                tx,
                self.table,
                &set,
                self.columns,
                "order_id",
                &condition,
                &moves,
            )
            .await?;
        }
        Ok(())
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
        self.apply_batch(tx, &[envelope]).await.map(only)?
    }

    async fn apply_batch(
        &self,
        tx: &mut Tx,
        events: &[&Envelope],
    ) -> Result<Vec<EventResult>, HandlerError> {
        let (mut reserve, mut release) = (Vec::new(), Vec::new());
        for (at, envelope) in events.iter().enumerate() {
            match &envelope.data {
                EventData::Created(d) => reserve.push(Row::new(
                    at,
                    d.order_id,
                    vec![
                        Bound::Int(d.order_id),
                        Bound::Text(&d.sku),
                        Bound::Int(d.quantity.into()),
                        Bound::Text("reserved"),
                        Bound::Text(&d.created_at),
                    ],
                )),
                EventData::Canceled(d) => {
                    release.push(Row::new(at, d.order_id, vec![Bound::Text(&d.canceled_at)]))
                }
                _ => {}
            }
        }
        let mut results = ignored(events.len());
        let into = "inventory_reservations (order_id, sku, quantity, status, reserved_at)";
        insert_rows(tx, into, &reserve, &mut results).await?;
        let transition = Transition {
            table: "inventory_reservations",
            from: "reserved",
            to: "released",
            columns: &["released_at"],
            what: "release stock",
        };
        transition.apply(tx, &release, &mut results).await?;
        Ok(results)
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
        self.apply_batch(tx, &[envelope]).await.map(only)?
    }

    async fn apply_batch(
        &self,
        tx: &mut Tx,
        events: &[&Envelope],
    ) -> Result<Vec<EventResult>, HandlerError> {
        let (mut paid, mut refunded) = (Vec::new(), Vec::new());
        for (at, envelope) in events.iter().enumerate() {
            match &envelope.data {
                EventData::PaymentSucceeded(d) => paid.push(Row::new(
                    at,
                    d.order_id,
                    vec![
                        Bound::Int(d.order_id),
                        Bound::Text(&d.payment_id),
                        Bound::Int(d.amount),
                        Bound::Text("paid"),
                        Bound::Text(&d.paid_at),
                    ],
                )),
                EventData::Refunded(d) => refunded.push(Row::new(
                    at,
                    d.order_id,
                    vec![Bound::Text(&d.refund_id), Bound::Text(&d.refunded_at)],
                )),
                _ => {}
            }
        }
        let mut results = ignored(events.len());
        insert_rows(
            tx,
            "payments (order_id, payment_id, amount, status, paid_at)",
            &paid,
            &mut results,
        )
        .await?;
        let transition = Transition {
            table: "payments",
            from: "paid",
            to: "refunded",
            columns: &["refund_id", "refunded_at"],
            what: "refund",
        };
        transition.apply(tx, &refunded, &mut results).await?;
        Ok(results)
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
        self.apply_batch(tx, &[envelope]).await.map(only)?
    }

    async fn apply_batch(
        &self,
        tx: &mut Tx,
        events: &[&Envelope],
    ) -> Result<Vec<EventResult>, HandlerError> {
        let shipped: Vec<Row> = events
            .iter()
            .enumerate()
            .filter_map(|(at, envelope)| match &envelope.data {
                EventData::Shipped(d) => Some(Row::new(
                    at,
                    d.order_id,
                    vec![
                        Bound::Int(d.order_id),
                        Bound::Text(&d.shipment_id),
                        Bound::Text(&d.carrier),
                        Bound::Text(&d.shipped_at),
                    ],
                )),
                _ => None,
            })
            .collect();
        let mut results = ignored(events.len());
        insert_rows(
            tx,
            "shipments (order_id, shipment_id, carrier, shipped_at)",
            &shipped,
            &mut results,
        )
        .await?;
        Ok(results)
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
        self.apply_batch(tx, &[envelope]).await.map(only)?
    }

    async fn apply_batch(
        &self,
        tx: &mut Tx,
        events: &[&Envelope],
    ) -> Result<Vec<EventResult>, HandlerError> {
        let ids: Vec<String> = events.iter().map(|e| e.event_id.to_string()).collect();
        let rows: Vec<Row> = events
            .iter()
            .enumerate()
            .map(|(at, e)| {
                let order_id = e.data.order_id();
                Row::new(
                    at,
                    order_id,
                    vec![
                        Bound::Text(&ids[at]),
                        Bound::Int(order_id),
                        Bound::Text(e.event_name.as_str()),
                    ],
                )
            })
            .collect();
        let mut results = ignored(events.len());
        insert_rows(
            tx,
            "notifications (event_id, order_id, kind)",
            &rows,
            &mut results,
        )
        .await?;
        Ok(results)
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
        self.apply_batch(tx, &[envelope]).await.map(only)?
    }

    async fn apply_batch(
        &self,
        tx: &mut Tx,
        events: &[&Envelope],
    ) -> Result<Vec<EventResult>, HandlerError> {
        let ids: Vec<String> = events.iter().map(|e| e.event_id.to_string()).collect();
        let mut entries = Vec::new();
        for (at, envelope) in events.iter().enumerate() {
            let (order_id, entry, points) = match &envelope.data {
                EventData::PaymentSucceeded(d) => (d.order_id, "earn", points_for(d.amount)),
                EventData::Refunded(d) => (d.order_id, "reverse", -points_for(d.amount)),
                _ => continue,
            };
            entries.push(Row::new(
                at,
                order_id,
                vec![
                    Bound::Int(order_id),
                    Bound::Text(entry),
                    Bound::Int(points),
                    Bound::Text(&ids[at]),
                ],
            ));
        }
        let mut results = ignored(events.len());
        // A reversal needs points earned before: read them for every refund at once.
        let refunds: Vec<i64> = entries
            .iter()
            .filter(|r| matches!(r.values[1], Bound::Text("reverse")))
            .map(|r| r.order_id)
            .collect();
        let mut earned = HashSet::new();
        if !refunds.is_empty() {
            let select = "SELECT order_id FROM points_ledger";
            for row in rows::select_in(tx, select, "order_id", " AND entry_type = 'earn'", &refunds)
                .await?
            {
                earned.insert(row.try_get::<i64, _>(0)?);
            }
        }
        entries.retain(|r| {
            let reversal = matches!(r.values[1], Bound::Text("reverse"));
            if reversal && !earned.contains(&r.order_id) {
                results[r.at] = Err(HandlerError::Fatal(format!(
                    "order {}: cannot reverse points, none were earned",
                    r.order_id
                )));
                return false;
            }
            true
        });
        insert_rows(
            tx,
            "points_ledger (order_id, entry_type, points, event_id)",
            &entries,
            &mut results,
        )
        .await?;
        Ok(results)
    }
}
