//! Payloads of the order events: identifiers and necessary facts only
//! (no item lists), snake_case fields, money in integer cents, times as
//! ISO 8601 UTC strings. Each struct mirrors one branch of the `data` union in
//! `schemas/order.events.v1.avsc`.

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use super::{EnvelopeError, EventName, non_empty, parse_utc};

/// `order.created`: an order was placed and stock must be reserved.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OrderCreated {
    /// Order identifier (the Kafka key).
    pub order_id: i64,
    /// Buyer.
    pub user_id: i64,
    /// The stock-keeping unit ordered.
    pub sku: String,
    /// Units ordered (> 0).
    pub quantity: i32,
    /// Order total in cents (>= 0).
    pub amount: i64,
    /// ISO 4217 code.
    #[serde(default = "default_currency")]
    pub currency: String,
    /// ISO 8601 UTC.
    pub created_at: String,
}

/// `order.payment.succeeded`: the order was paid.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OrderPaymentSucceeded {
    /// Order identifier.
    pub order_id: i64,
    /// Payment provider's reference.
    pub payment_id: String,
    /// Amount paid in cents (>= 0).
    pub amount: i64,
    /// ISO 8601 UTC.
    pub paid_at: String,
}

/// `order.shipped`: the order left the warehouse.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OrderShipped {
    /// Order identifier.
    pub order_id: i64,
    /// Logistics reference.
    pub shipment_id: String,
    /// Carrier name.
    pub carrier: String,
    /// ISO 8601 UTC.
    pub shipped_at: String,
}

/// `order.canceled`: the order was canceled before shipping; stock is released.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OrderCanceled {
    /// Order identifier.
    pub order_id: i64,
    /// Why it was canceled.
    pub reason: String,
    /// ISO 8601 UTC.
    pub canceled_at: String,
}

/// `order.refunded`: money went back to the buyer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OrderRefunded {
    /// Order identifier.
    pub order_id: i64,
    /// Refund reference.
    pub refund_id: String,
    /// Amount refunded in cents (>= 0).
    pub amount: i64,
    /// ISO 8601 UTC.
    pub refunded_at: String,
}

/// `inventory.stock.reserved`: stock held for an order (written with `order.created`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct InventoryStockReserved {
    /// Order the stock is held for.
    pub order_id: i64,
    /// The stock-keeping unit.
    pub sku: String,
    /// Units held (> 0).
    pub quantity: i32,
    /// ISO 8601 UTC.
    pub reserved_at: String,
}

/// `inventory.stock.released`: stock given back (written with `order.canceled`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct InventoryStockReleased {
    /// Order the stock was held for.
    pub order_id: i64,
    /// The stock-keeping unit.
    pub sku: String,
    /// Units released (> 0).
    pub quantity: i32,
    /// ISO 8601 UTC.
    pub released_at: String,
}

/// A row change read from the binlog by `orderpipe cdc` (topic
/// `cdc.<db>.<table>`, Avro record `CdcChangeEnvelope`), as the consumer
/// sees it: the row as JSON, and on updates the changed columns' previous
/// values. Its event name is the routing key `<db>.<table>.<insert|update|delete>`
/// ([`EventName::routing_key`]); its Kafka key is the primary key.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RowChange {
    /// Database of the table.
    pub database: String,
    /// Table name.
    pub table: String,
    /// `insert`, `update` or `delete`.
    pub change: String,
    /// The primary key as published (also the Kafka key).
    pub key: String,
    /// The row after the change (the deleted row for a delete), a JSON object.
    pub data: serde_json::Value,
    /// The changed columns' previous values (updates only), a JSON object.
    pub old: Option<serde_json::Value>,
}

impl RowChange {
    /// `<db>.<table>.<change>`: seed 003's routing key.
    pub fn routing_key(&self) -> String {
        format!("{}.{}.{}", self.database, self.table, self.change)
    }
}

fn default_currency() -> String {
    "CNY".to_string()
}

/// The payload of an envelope, one variant per event name.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(untagged)]
pub enum EventData {
    /// `order.created`
    Created(OrderCreated),
    /// `order.payment.succeeded`
    PaymentSucceeded(OrderPaymentSucceeded),
    /// `order.shipped`
    Shipped(OrderShipped),
    /// `order.canceled`
    Canceled(OrderCanceled),
    /// `order.refunded`
    Refunded(OrderRefunded),
    /// `inventory.stock.reserved` (on `inventory.events.v1`)
    StockReserved(InventoryStockReserved),
    /// `inventory.stock.released` (on `inventory.events.v1`)
    StockReleased(InventoryStockReleased),
    /// A row change of a `cdc.<db>.<table>` topic (not an order event: no
    /// order id, no branch of the order schema; the router delivers it).
    RowChange(RowChange),
}

/// Event names with a payload type, and the Avro record of each payload.
pub const KNOWN_EVENTS: [(&str, &str); 7] = [
    ("order.created", "OrderCreated"),
    ("order.payment.succeeded", "OrderPaymentSucceeded"),
    ("order.shipped", "OrderShipped"),
    ("order.canceled", "OrderCanceled"),
    ("order.refunded", "OrderRefunded"),
    ("inventory.stock.reserved", "InventoryStockReserved"),
    ("inventory.stock.released", "InventoryStockReleased"),
];

impl EventData {
    /// The event name this payload belongs to.
    pub fn event_name(&self) -> EventName {
        match self {
            Self::RowChange(c) => EventName::routing_key(&c.routing_key())
                .expect("a row change's routing key is valid"),
            _ => {
                EventName::parse(KNOWN_EVENTS[self.kind_index()].0).expect("known names are valid")
            }
        }
    }

    /// Name of the Avro record of this payload (a branch of the `data`
    /// union; a row change's is the whole `CdcChangeEnvelope`, in no union).
    pub fn record_name(&self) -> &'static str {
        match self {
            Self::RowChange(_) => "CdcChangeEnvelope",
            _ => KNOWN_EVENTS[self.kind_index()].1,
        }
    }

    /// The payload as the seed-003 body's `data` and `old`: a row change's
    /// row and previous values; an order event's payload and null (order
    /// events carry no previous values).
    pub fn data_and_old(&self) -> (serde_json::Value, serde_json::Value) {
        match self {
            Self::RowChange(c) => (
                c.data.clone(),
                c.old.clone().unwrap_or(serde_json::Value::Null),
            ),
            other => (
                serde_json::to_value(other).expect("a payload serializes to JSON"),
                serde_json::Value::Null,
            ),
        }
    }

    /// Index of this payload's event in [`KNOWN_EVENTS`]; a row change
    /// has none and gets `KNOWN_EVENTS.len()` (encoders of the order
    /// schemas refuse it before indexing).
    pub fn kind_index(&self) -> usize {
        match self {
            Self::RowChange(_) => KNOWN_EVENTS.len(),
            Self::Created(_) => 0,
            Self::PaymentSucceeded(_) => 1,
            Self::Shipped(_) => 2,
            Self::Canceled(_) => 3,
            Self::Refunded(_) => 4,
            Self::StockReserved(_) => 5,
            Self::StockReleased(_) => 6,
        }
    }

    /// The order this event is about; 0 for a row change (it is about a
    /// table row, keyed by [`RowChange::key`]).
    pub fn order_id(&self) -> i64 {
        match self {
            Self::RowChange(_) => 0,
            Self::Created(d) => d.order_id,
            Self::PaymentSucceeded(d) => d.order_id,
            Self::Shipped(d) => d.order_id,
            Self::Canceled(d) => d.order_id,
            Self::Refunded(d) => d.order_id,
            Self::StockReserved(d) => d.order_id,
            Self::StockReleased(d) => d.order_id,
        }
    }

    /// Decodes a payload for `name` with any serde deserializer that yields
    /// the payload struct (JSON values, Avro values). `decode` is called with
    /// a marker telling which struct to build.
    pub fn decode_with<E: std::fmt::Display>(
        name: &EventName,
        decoder: impl PayloadDecoder<Error = E>,
    ) -> Result<Self, EnvelopeError> {
        let wrap = |e: E| EnvelopeError::field("data", format!("invalid {name} payload: {e}"));
        Ok(match name.as_str() {
            "order.created" => Self::Created(decoder.decode().map_err(wrap)?),
            "order.payment.succeeded" => Self::PaymentSucceeded(decoder.decode().map_err(wrap)?),
            "order.shipped" => Self::Shipped(decoder.decode().map_err(wrap)?),
            "order.canceled" => Self::Canceled(decoder.decode().map_err(wrap)?),
            "order.refunded" => Self::Refunded(decoder.decode().map_err(wrap)?),
            "inventory.stock.reserved" => Self::StockReserved(decoder.decode().map_err(wrap)?),
            "inventory.stock.released" => Self::StockReleased(decoder.decode().map_err(wrap)?),
            other => {
                let known: Vec<&str> = KNOWN_EVENTS.iter().map(|(name, _)| *name).collect();
                return Err(EnvelopeError::field(
                    "event_name",
                    format!(
                        "`{other}` has no payload schema; known: {}",
                        known.join(", ")
                    ),
                ));
            }
        })
    }

    /// Decodes a JSON payload for `name`.
    pub fn from_json(name: &EventName, data: serde_json::Value) -> Result<Self, EnvelopeError> {
        Self::decode_with(name, JsonPayload(data))
    }

    /// Checks the business rules: positive ids, non-negative money, UTC times.
    pub fn validate(&self) -> Result<(), EnvelopeError> {
        if let Self::RowChange(c) = self {
            if !c.data.is_object() {
                return Err(EnvelopeError::field(
                    "data",
                    "a row change's data is not a JSON object",
                ));
            }
            if c.old.as_ref().is_some_and(|o| !o.is_object()) {
                return Err(EnvelopeError::field(
                    "old",
                    "a row change's old is not a JSON object",
                ));
            }
            return Ok(());
        }
        if self.order_id() <= 0 {
            return Err(EnvelopeError::field("data.order_id", "must be > 0"));
        }
        match self {
            Self::Created(d) => {
                if d.user_id <= 0 {
                    return Err(EnvelopeError::field("data.user_id", "must be > 0"));
                }
                non_empty(&d.sku, "data.sku")?;
                positive(d.quantity, "data.quantity")?;
                cents(d.amount, "data.amount")?;
                let currency_ok =
                    d.currency.len() == 3 && d.currency.bytes().all(|b| b.is_ascii_uppercase());
                if !currency_ok {
                    return Err(EnvelopeError::field(
                        "data.currency",
                        format!("`{}` is not an ISO 4217 code like CNY", d.currency),
                    ));
                }
                parse_utc(&d.created_at, "data.created_at")?;
            }
            Self::PaymentSucceeded(d) => {
                non_empty(&d.payment_id, "data.payment_id")?;
                cents(d.amount, "data.amount")?;
                parse_utc(&d.paid_at, "data.paid_at")?;
            }
            Self::Shipped(d) => {
                non_empty(&d.shipment_id, "data.shipment_id")?;
                non_empty(&d.carrier, "data.carrier")?;
                parse_utc(&d.shipped_at, "data.shipped_at")?;
            }
            Self::Canceled(d) => {
                non_empty(&d.reason, "data.reason")?;
                parse_utc(&d.canceled_at, "data.canceled_at")?;
            }
            Self::Refunded(d) => {
                non_empty(&d.refund_id, "data.refund_id")?;
                cents(d.amount, "data.amount")?;
                parse_utc(&d.refunded_at, "data.refunded_at")?;
            }
            Self::StockReserved(d) => {
                non_empty(&d.sku, "data.sku")?;
                positive(d.quantity, "data.quantity")?;
                parse_utc(&d.reserved_at, "data.reserved_at")?;
            }
            Self::StockReleased(d) => {
                non_empty(&d.sku, "data.sku")?;
                positive(d.quantity, "data.quantity")?;
                parse_utc(&d.released_at, "data.released_at")?;
            }
            Self::RowChange(_) => {}
        }
        Ok(())
    }

    /// A valid `order.created` payload, for tests and examples.
    pub fn sample_created(order_id: i64) -> Self {
        Self::Created(OrderCreated {
            order_id,
            user_id: 42,
            sku: "SKU-1".into(),
            quantity: 1,
            amount: 1999,
            currency: "CNY".into(),
            created_at: super::format_utc(&chrono::Utc::now()),
        })
    }

    /// One valid payload of every order event, in lifecycle order (created,
    /// payment succeeded, shipped, canceled, refunded), for tests and examples.
    pub fn sample_lifecycle(order_id: i64) -> Vec<Self> {
        let at = super::format_utc(&chrono::Utc::now());
        vec![
            Self::sample_created(order_id),
            Self::PaymentSucceeded(OrderPaymentSucceeded {
                order_id,
                payment_id: format!("pay-{order_id}"),
                amount: 1999,
                paid_at: at.clone(),
            }),
            Self::Shipped(OrderShipped {
                order_id,
                shipment_id: format!("shp-{order_id}"),
                carrier: "sf-express".into(),
                shipped_at: at.clone(),
            }),
            Self::Canceled(OrderCanceled {
                order_id,
                reason: "customer_request".into(),
                canceled_at: at.clone(),
            }),
            Self::Refunded(OrderRefunded {
                order_id,
                refund_id: format!("rfd-{order_id}"),
                amount: 1999,
                refunded_at: at,
            }),
        ]
    }
}

fn positive(n: i32, field: &str) -> Result<(), EnvelopeError> {
    if n <= 0 {
        return Err(EnvelopeError::field(field, format!("{n} must be > 0")));
    }
    Ok(())
}

fn cents(amount: i64, field: &str) -> Result<(), EnvelopeError> {
    if amount < 0 {
        return Err(EnvelopeError::field(
            field,
            format!("{amount} is negative; amounts are integer cents >= 0"),
        ));
    }
    Ok(())
}

/// Something that can produce any payload struct (a JSON value, an Avro value).
pub trait PayloadDecoder {
    /// The decoder's error.
    type Error: std::fmt::Display;
    /// Builds the payload struct `T`.
    fn decode<T: DeserializeOwned>(self) -> Result<T, Self::Error>;
}

struct JsonPayload(serde_json::Value);

impl PayloadDecoder for JsonPayload {
    type Error = serde_json::Error;
    fn decode<T: DeserializeOwned>(self) -> Result<T, Self::Error> {
        serde_json::from_value(self.0)
    }
}
