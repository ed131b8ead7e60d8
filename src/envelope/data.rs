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
}

/// Event names with a payload type, in the order of the Avro `data` union.
pub const KNOWN_EVENTS: [&str; 5] = [
    "order.created",
    "order.payment.succeeded",
    "order.shipped",
    "order.canceled",
    "order.refunded",
];

impl EventData {
    /// The event name this payload belongs to.
    pub fn event_name(&self) -> EventName {
        EventName::parse(KNOWN_EVENTS[self.union_index()]).expect("known names are valid")
    }

    /// Position of this payload's branch in the Avro `data` union.
    pub fn union_index(&self) -> usize {
        match self {
            Self::Created(_) => 0,
            Self::PaymentSucceeded(_) => 1,
            Self::Shipped(_) => 2,
            Self::Canceled(_) => 3,
            Self::Refunded(_) => 4,
        }
    }

    /// The order this event is about.
    pub fn order_id(&self) -> i64 {
        match self {
            Self::Created(d) => d.order_id,
            Self::PaymentSucceeded(d) => d.order_id,
            Self::Shipped(d) => d.order_id,
            Self::Canceled(d) => d.order_id,
            Self::Refunded(d) => d.order_id,
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
            other => {
                return Err(EnvelopeError::field(
                    "event_name",
                    format!(
                        "`{other}` has no payload schema on this topic; known: {}",
                        KNOWN_EVENTS.join(", ")
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
        if self.order_id() <= 0 {
            return Err(EnvelopeError::field("data.order_id", "must be > 0"));
        }
        match self {
            Self::Created(d) => {
                if d.user_id <= 0 {
                    return Err(EnvelopeError::field("data.user_id", "must be > 0"));
                }
                non_empty(&d.sku, "data.sku")?;
                if d.quantity <= 0 {
                    return Err(EnvelopeError::field("data.quantity", "must be > 0"));
                }
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
