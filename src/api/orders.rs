//! Orders: validation, the state machine, and the transaction that writes
//! the change and its outbox events together.

use serde::{Deserialize, Serialize};
use sqlx::Row;
use uuid::Uuid;

use crate::db::{Db, DbError, Tx};
use crate::envelope::{
    Envelope, EventData, InventoryStockReleased, InventoryStockReserved, OrderCanceled,
    OrderCreated, OrderPaymentSucceeded, OrderRefunded, OrderShipped, format_utc, new_trace_id,
};
use crate::outbox;
use crate::outbox::limits::{Limits, record_size_of};
use crate::outbox::wake::WakeNotifier;
use crate::producer::ProducerSettings;
use crate::schema::SchemaCatalog;
use crate::topics::TopicsSettings;

/// A request the service refuses, or cannot serve.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// Bad input; names the field.
    #[error("{field}: {reason}")]
    Invalid {
        /// The field (or `<body>`).
        field: String,
        /// What is wrong.
        reason: String,
    },
    /// No such order.
    #[error("order {0} not found")]
    NotFound(i64),
    /// The state machine forbids it.
    #[error("order {order_id} is {from}: cannot {action} (allowed from: {allowed})")]
    IllegalTransition {
        /// The order.
        order_id: i64,
        /// Its status.
        from: String,
        /// What was asked.
        action: &'static str,
        /// Statuses the action is allowed from.
        allowed: String,
    },
    /// The database is down; try again.
    #[error("database unavailable: {0}")]
    Unavailable(String),
    /// The transaction kept losing deadlocks; try again.
    #[error("busy, try again: {0}")]
    Conflict(String),
    /// An event of the request would be a record over its topic's limit:
    /// it could never be published, so nothing is written.
    #[error(
        "{field}: the {event_name} event would be a record of {size} bytes, over the limit of {limit} bytes for topic {topic} \
         ({from}); nothing was changed"
    )]
    TooLarge {
        /// The request field that makes the event big (its longest text).
        field: String,
        /// The event.
        event_name: String,
        /// Its topic.
        topic: String,
        /// The record's size ([`crate::kafka::size_limit::RecordLimit::record_size`]).
        size: usize,
        /// The limit.
        limit: usize,
        /// Where the limit comes from.
        from: String,
    },
    /// Something else failed; nothing was written.
    #[error("internal error, nothing was changed: {0}")]
    Internal(String),
}

impl From<DbError> for ApiError {
    fn from(e: DbError) -> Self {
        match e {
            DbError::Conflict(reason) => Self::Conflict(reason),
            e if e.is_retryable() => Self::Unavailable(e.to_string()),
            e => Self::Internal(e.to_string()),
        }
    }
}

/// Runs a transaction again (up to 5 times) when it lost a deadlock: the
/// database rolled it back whole, so running it again is safe.
async fn with_conflict_retry<T, F, Fut>(mut attempt: F) -> Result<T, ApiError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, ApiError>>,
{
    let mut tries = 0;
    loop {
        match attempt().await {
            Err(ApiError::Conflict(_)) if tries < 5 => {
                tries += 1;
                tokio::time::sleep(std::time::Duration::from_millis(5 * tries)).await;
            }
            other => return other,
        }
    }
}

impl From<sqlx::Error> for ApiError {
    fn from(e: sqlx::Error) -> Self {
        DbError::from(e).into()
    }
}

fn invalid(field: &str, reason: impl Into<String>) -> ApiError {
    ApiError::Invalid {
        field: field.into(),
        reason: reason.into(),
    }
}

/// `POST /orders` body.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NewOrder {
    /// Buyer.
    pub user_id: i64,
    /// Stock-keeping unit.
    pub sku: String,
    /// Units.
    pub quantity: i32,
    /// Total in cents.
    pub amount: i64,
    /// ISO 4217 code (default CNY).
    #[serde(default)]
    pub currency: Option<String>,
}

/// An order as stored and returned.
#[derive(Debug, Clone, Serialize)]
pub struct Order {
    /// Id.
    pub order_id: i64,
    /// Buyer.
    pub user_id: i64,
    /// SKU.
    pub sku: String,
    /// Units.
    pub quantity: i32,
    /// Total in cents.
    pub amount: i64,
    /// Currency.
    pub currency: String,
    /// created, paid, shipped, canceled or refunded.
    pub status: String,
}

/// A state change of an existing order.
#[derive(Debug, Clone)]
pub enum Action {
    /// created → paid.
    Pay {
        /// Provider reference.
        payment_id: String,
        /// Must equal the order total.
        amount: i64,
    },
    /// paid → shipped.
    Ship {
        /// Logistics reference.
        shipment_id: String,
        /// Carrier.
        carrier: String,
    },
    /// created → canceled.
    Cancel {
        /// Why.
        reason: String,
    },
    /// paid or shipped → refunded.
    Refund {
        /// Refund reference.
        refund_id: String,
        /// At most the order total.
        amount: i64,
    },
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PayBody {
    payment_id: String,
    amount: i64,
}
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ShipBody {
    shipment_id: String,
    carrier: String,
}
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CancelBody {
    reason: String,
}
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RefundBody {
    refund_id: String,
    amount: i64,
}

fn parse_body<T: serde::de::DeserializeOwned>(value: serde_json::Value) -> Result<T, ApiError> {
    serde_json::from_value(value).map_err(|e| invalid("<body>", e.to_string()))
}

fn text(value: &str, field: &str) -> Result<(), ApiError> {
    if value.trim().is_empty() || value.len() > 64 {
        return Err(invalid(field, "must be 1 to 64 characters"));
    }
    Ok(())
}

fn cents(amount: i64, field: &str) -> Result<(), ApiError> {
    if amount < 0 {
        return Err(invalid(
            field,
            format!("{amount} is negative; amounts are integer cents >= 0"),
        ));
    }
    Ok(())
}

impl Action {
    /// Parses `POST /orders/{id}/{action}` with its body.
    pub fn parse(action: &str, body: serde_json::Value) -> Result<Self, ApiError> {
        let action = match action {
            "pay" => {
                let b: PayBody = parse_body(body)?;
                text(&b.payment_id, "payment_id")?;
                cents(b.amount, "amount")?;
                Self::Pay {
                    payment_id: b.payment_id,
                    amount: b.amount,
                }
            }
            "ship" => {
                let b: ShipBody = parse_body(body)?;
                text(&b.shipment_id, "shipment_id")?;
                text(&b.carrier, "carrier")?;
                Self::Ship {
                    shipment_id: b.shipment_id,
                    carrier: b.carrier,
                }
            }
            "cancel" => {
                let b: CancelBody = parse_body(body)?;
                text(&b.reason, "reason")?;
                Self::Cancel { reason: b.reason }
            }
            "refund" => {
                let b: RefundBody = parse_body(body)?;
                text(&b.refund_id, "refund_id")?;
                cents(b.amount, "amount")?;
                Self::Refund {
                    refund_id: b.refund_id,
                    amount: b.amount,
                }
            }
            other => {
                return Err(invalid(
                    "action",
                    format!("`{other}` is not one of pay, ship, cancel, refund"),
                ));
            }
        };
        Ok(action)
    }

    fn name(&self) -> &'static str {
        match self {
            Self::Pay { .. } => "pay",
            Self::Ship { .. } => "ship",
            Self::Cancel { .. } => "cancel",
            Self::Refund { .. } => "refund",
        }
    }

    /// Statuses this action may start from, and the status it leads to.
    fn transition(&self) -> (&'static [&'static str], &'static str) {
        match self {
            Self::Pay { .. } => (&["created"], "paid"),
            Self::Ship { .. } => (&["paid"], "shipped"),
            Self::Cancel { .. } => (&["created"], "canceled"),
            Self::Refund { .. } => (&["paid", "shipped"], "refunded"),
        }
    }
}

/// The order service over a database.
pub struct OrderService {
    db: Db,
    producer: String,
    order_topic: String,
    inventory_topic: String,
    /// Wakes the relays after each commit (see [`crate::outbox::wake`]).
    wake: Option<WakeNotifier>,
    /// The record limits of the topics it writes events for.
    limits: std::sync::Arc<Limits>,
    /// The schemas the relay writes them with, by topic.
    schemas: std::collections::BTreeMap<String, apache_avro::Schema>,
    /// Benchmarks only: told each transaction's event ids after its commit.
    stamps: Option<std::sync::Arc<dyn crate::clock::CommitStamps>>,
}

impl OrderService {
    /// A service writing events for the declared `topics`, as the
    /// producer's `service_name`.
    /// Until [`Self::with_record_limits`], events are sized against the
    /// producer's `message.max.bytes` only.
    pub fn new(db: Db, producer: &ProducerSettings, topics: &TopicsSettings) -> Self {
        let catalog = SchemaCatalog::embedded();
        let mut schemas = std::collections::BTreeMap::new();
        schemas.insert(
            topics.order_events.name.clone(),
            catalog.order_events().parsed.clone(),
        );
        if let Ok(inventory) = catalog.inventory_events() {
            schemas.insert(
                topics.inventory_events.name.clone(),
                inventory.parsed.clone(),
            );
        }
        Self {
            db,
            producer: producer.service_name.clone(),
            order_topic: topics.order_events.name.clone(),
            inventory_topic: topics.inventory_events.name.clone(),
            wake: None,
            limits: std::sync::Arc::new(Limits::new(None, producer.options.clone())),
            schemas,
            stamps: None,
        }
    }

    /// The same service, refusing events over `limits` (the topics' own
    /// limits as the broker describes them, see [`super::record_limits`]).
    pub fn with_record_limits(mut self, limits: std::sync::Arc<Limits>) -> Self {
        self.limits = limits;
        self
    }

    /// The same service, telling `stamps` each transaction's event ids
    /// right after its commit (the benchmarks' latency stamps).
    pub fn with_commit_stamps(
        mut self,
        stamps: std::sync::Arc<dyn crate::clock::CommitStamps>,
    ) -> Self {
        self.stamps = Some(stamps);
        self
    }

    /// The same service, waking the relays through `wake` after each
    /// committed transaction.
    pub fn with_wake(mut self, wake: Option<WakeNotifier>) -> Self {
        self.wake = wake;
        self
    }

    /// Commits `tx`, then wakes the relays: the rows are visible to their
    /// claim by then, and a wake-up is sent only for rows that exist.
    async fn commit(&self, tx: Tx, event_ids: &[Uuid]) -> Result<(), ApiError> {
        tx.commit().await?;
        if let Some(stamps) = &self.stamps {
            stamps.committed(event_ids);
        }
        if let Some(wake) = &self.wake {
            wake.notify();
        }
        Ok(())
    }

    /// Creates an order and records `order.created` + `inventory.stock.reserved`.
    pub async fn create(&self, new: NewOrder, trace_id: Option<String>) -> Result<Order, ApiError> {
        if new.user_id <= 0 {
            return Err(invalid("user_id", "must be > 0"));
        }
        text(&new.sku, "sku")?;
        if new.quantity <= 0 {
            return Err(invalid("quantity", "must be > 0"));
        }
        cents(new.amount, "amount")?;
        let currency = new.currency.clone().unwrap_or_else(|| "CNY".into());
        if currency.len() != 3 || !currency.bytes().all(|b| b.is_ascii_uppercase()) {
            return Err(invalid(
                "currency",
                format!("`{currency}` is not an ISO 4217 code like CNY"),
            ));
        }
        let trace_id = trace_id.unwrap_or_else(new_trace_id);
        with_conflict_retry(|| self.create_once(&new, &currency, &trace_id)).await
    }

    async fn create_once(
        &self,
        new: &NewOrder,
        currency: &str,
        trace_id: &str,
    ) -> Result<Order, ApiError> {
        let new = new.clone();
        let currency = currency.to_string();
        let now = format_utc(&chrono::Utc::now());
        let mut tx = self.db.begin().await?;
        let (order_id,): (i64,) = sqlx::query_as(
            "INSERT INTO orders (user_id, sku, quantity, amount, currency, status, created_at, updated_at) \
             VALUES (?, ?, ?, ?, ?, 'created', ?, ?) RETURNING order_id",
        )
        .bind(new.user_id)
        .bind(&new.sku)
        .bind(new.quantity)
        .bind(new.amount)
        .bind(&currency)
        .bind(&now)
        .bind(&now)
        .fetch_one(&mut *tx)
        .await?;
        let order = Order {
            order_id,
            user_id: new.user_id,
            sku: new.sku,
            quantity: new.quantity,
            amount: new.amount,
            currency,
            status: "created".into(),
        };
        let created = EventData::Created(OrderCreated {
            order_id,
            user_id: order.user_id,
            sku: order.sku.clone(),
            quantity: order.quantity,
            amount: order.amount,
            currency: order.currency.clone(),
            created_at: now.clone(),
        });
        let reserved = EventData::StockReserved(InventoryStockReserved {
            order_id,
            sku: order.sku.clone(),
            quantity: order.quantity,
            reserved_at: now,
        });
        let event_ids = self
            .record(
                &mut tx,
                trace_id,
                vec![
                    (&self.order_topic, created),
                    (&self.inventory_topic, reserved),
                ],
            )
            .await?;
        self.commit(tx, &event_ids).await?;
        Ok(order)
    }

    /// The order `id`.
    pub async fn get(&self, id: i64) -> Result<Order, ApiError> {
        let row = sqlx::query(
            "SELECT order_id, user_id, sku, quantity, amount, currency, status FROM orders WHERE order_id = ?",
        )
        .bind(id)
        .fetch_optional(&self.db.pool)
        .await?
        .ok_or(ApiError::NotFound(id))?;
        order_of(&row)
    }

    /// Applies `action` to order `id` under the state machine and records its event(s).
    pub async fn act(
        &self,
        id: i64,
        action: Action,
        trace_id: Option<String>,
    ) -> Result<Order, ApiError> {
        let trace_id = trace_id.unwrap_or_else(new_trace_id);
        with_conflict_retry(|| self.act_once(id, action.clone(), &trace_id)).await
    }

    async fn act_once(&self, id: i64, action: Action, trace_id: &str) -> Result<Order, ApiError> {
        let mut tx = self.db.begin().await?;
        let sql = tx.sql().locking("SELECT order_id, user_id, sku, quantity, amount, currency, status FROM orders WHERE order_id = ?");
        let row = sqlx::query(sql)
            .bind(id)
            .fetch_optional(&mut *tx)
            .await?
            .ok_or(ApiError::NotFound(id))?;
        let mut order = order_of(&row)?;
        let (from, to) = action.transition();
        if !from.contains(&order.status.as_str()) {
            return Err(ApiError::IllegalTransition {
                order_id: id,
                from: order.status,
                action: action.name(),
                allowed: from.join(", "),
            });
        }
        let now = format_utc(&chrono::Utc::now());
        let events = match action {
            Action::Pay { payment_id, amount } => {
                if amount != order.amount {
                    return Err(invalid(
                        "amount",
                        format!("{amount} is not the order total {}", order.amount),
                    ));
                }
                vec![(
                    &self.order_topic,
                    EventData::PaymentSucceeded(OrderPaymentSucceeded {
                        order_id: id,
                        payment_id,
                        amount,
                        paid_at: now.clone(),
                    }),
                )]
            }
            Action::Ship {
                shipment_id,
                carrier,
            } => {
                vec![(
                    &self.order_topic,
                    EventData::Shipped(OrderShipped {
                        order_id: id,
                        shipment_id,
                        carrier,
                        shipped_at: now.clone(),
                    }),
                )]
            }
            Action::Cancel { reason } => vec![
                (
                    &self.order_topic,
                    EventData::Canceled(OrderCanceled {
                        order_id: id,
                        reason,
                        canceled_at: now.clone(),
                    }),
                ),
                (
                    &self.inventory_topic,
                    EventData::StockReleased(InventoryStockReleased {
                        order_id: id,
                        sku: order.sku.clone(),
                        quantity: order.quantity,
                        released_at: now.clone(),
                    }),
                ),
            ],
            Action::Refund { refund_id, amount } => {
                if amount > order.amount {
                    return Err(invalid(
                        "amount",
                        format!("{amount} is more than the order total {}", order.amount),
                    ));
                }
                vec![(
                    &self.order_topic,
                    EventData::Refunded(OrderRefunded {
                        order_id: id,
                        refund_id,
                        amount,
                        refunded_at: now.clone(),
                    }),
                )]
            }
        };
        sqlx::query("UPDATE orders SET status = ?, updated_at = ? WHERE order_id = ?")
            .bind(to)
            .bind(&now)
            .bind(id)
            .execute(&mut *tx)
            .await?;
        let event_ids = self.record(&mut tx, trace_id, events).await?;
        self.commit(tx, &event_ids).await?;
        order.status = to.to_string();
        Ok(order)
    }

    /// Writes the events of one business transaction into the outbox;
    /// returns their ids.
    async fn record(
        &self,
        tx: &mut Tx,
        trace_id: &str,
        events: Vec<(&String, EventData)>,
    ) -> Result<Vec<Uuid>, ApiError> {
        let tx_id = Uuid::new_v4();
        let mut ids = Vec::with_capacity(events.len());
        for (topic, data) in events {
            let mut envelope = Envelope::new(&self.producer, data);
            envelope.trace_id = trace_id.to_string();
            envelope
                .validate()
                .map_err(|e| invalid("<event>", e.to_string()))?;
            self.check_size(topic, &envelope)?;
            outbox::record(tx, tx_id, topic, &envelope).await?;
            ids.push(envelope.event_id);
        }
        Ok(ids)
    }
}

impl OrderService {
    /// Refuses an event whose record would be over its topic's limit:
    /// returned inside the transaction, it rolls the whole request back.
    fn check_size(&self, topic: &str, envelope: &Envelope) -> Result<(), ApiError> {
        let Some(schema) = self.schemas.get(topic) else {
            return Ok(());
        };
        let size = record_size_of(envelope, schema).map_err(ApiError::Internal)?;
        let limit = self.limits.cached(topic);
        if limit.fits(size) {
            return Ok(());
        }
        let error = ApiError::TooLarge {
            field: longest_text_field(envelope),
            event_name: envelope.event_name.as_str().to_string(),
            topic: topic.to_string(),
            size,
            limit: limit.max_bytes,
            from: limit.from,
        };
        tracing::warn!(error = %error, "order request refused: its event would be over the record limit");
        Err(error)
    }
}

/// The field of the event's payload with the longest text (the one the
/// caller sent that makes the record big).
fn longest_text_field(envelope: &Envelope) -> String {
    let data = serde_json::to_value(&envelope.data).unwrap_or_default();
    let mut fields: Vec<(&String, &serde_json::Value)> =
        data.as_object().into_iter().flatten().collect();
    // A payload nested in its variant's name: its fields.
    if let [(_, serde_json::Value::Object(inner))] = fields.as_slice() {
        fields = inner.iter().collect();
    }
    fields
        .into_iter()
        .filter_map(|(name, value)| value.as_str().map(|text| (text.len(), name)))
        .max()
        .map_or_else(|| "<body>".to_string(), |(_, name)| name.clone())
}

fn order_of(row: &sqlx::any::AnyRow) -> Result<Order, ApiError> {
    Ok(Order {
        order_id: row.try_get(0)?,
        user_id: row.try_get(1)?,
        sku: row.try_get(2)?,
        quantity: row.try_get(3)?,
        amount: row.try_get(4)?,
        currency: row.try_get(5)?,
        status: row.try_get(6)?,
    })
}
