//! `orderpipe api`: the reference order service.
//!
//! Each request changes the `orders` row under a state machine and writes
//! the matching event(s) into the outbox **in the same transaction**, so the
//! change and its event exist together or not at all. It is the pattern a
//! team copies into its own service:
//!
//! ```text
//! BEGIN
//!   SELECT ... FROM orders WHERE order_id = ? FOR UPDATE   -- one writer per order
//!   UPDATE orders SET status = 'paid' ...                  -- the business change
//!   INSERT INTO outbox_messages (...)                      -- the event
//! COMMIT
//! ```
//!
//! | request | transition | events |
//! |---|---|---|
//! | `POST /orders` | → created | `order.created` + `inventory.stock.reserved` |
//! | `POST /orders/{id}/pay` | created → paid | `order.payment.succeeded` |
//! | `POST /orders/{id}/ship` | paid → shipped | `order.shipped` |
//! | `POST /orders/{id}/cancel` | created → canceled | `order.canceled` + `inventory.stock.released` |
//! | `POST /orders/{id}/refund` | paid, shipped → refunded | `order.refunded` |
//! | `GET /orders/{id}` | — | — |
//!
//! * [`orders`] holds the state machine and the transactions.

pub mod orders;

use std::net::SocketAddr;
use std::sync::Arc;

use axum::extract::rejection::JsonRejection;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use metrics::counter;
use serde_json::json;

use crate::db::Db;
use crate::metrics::name;
use orders::{Action, ApiError, NewOrder, OrderService};

/// Serves the API on `addr` until `shutdown`; returns the bound address
/// through `bound` as soon as it listens.
pub async fn serve(
    addr: SocketAddr,
    service: OrderService,
    health: Arc<crate::health::HealthState>,
    bound: impl FnOnce(SocketAddr),
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    crate::health::serve_app(addr, router(service), health, bound, shutdown).await
}

/// The order routes, with a request counter by route and status.
pub fn router(service: OrderService) -> Router {
    Router::new()
        .route("/orders", post(create))
        .route("/orders/{id}", get(fetch))
        .route("/orders/{id}/{action}", post(act))
        .layer(axum::middleware::from_fn(count_requests))
        .with_state(Arc::new(service))
}

async fn count_requests(request: axum::extract::Request, next: axum::middleware::Next) -> Response {
    let route = match request.uri().path() {
        "/orders" => "create",
        p if p.matches('/').count() == 2 => "get",
        p if p.ends_with("/pay") => "pay",
        p if p.ends_with("/ship") => "ship",
        p if p.ends_with("/cancel") => "cancel",
        p if p.ends_with("/refund") => "refund",
        _ => "other",
    };
    let response = next.run(request).await;
    count_request(route, response.status().as_u16());
    response
}

/// An API request finished.
fn count_request(route: &'static str, status: u16) {
    counter!(name::API_REQUESTS, "route" => route, "status" => status.to_string()).increment(1);
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = match &self {
            ApiError::Invalid { .. } => StatusCode::BAD_REQUEST,
            ApiError::NotFound(_) => StatusCode::NOT_FOUND,
            ApiError::TooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            ApiError::IllegalTransition { .. } => StatusCode::CONFLICT,
            ApiError::Unavailable(_) | ApiError::Conflict(_) => StatusCode::SERVICE_UNAVAILABLE,
            ApiError::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        };
        let field = match &self {
            ApiError::Invalid { field, .. } | ApiError::TooLarge { field, .. } => {
                Some(field.clone())
            }
            _ => None,
        };
        let mut body = json!({"error": self.to_string(), "field": field});
        if let ApiError::TooLarge {
            topic, size, limit, ..
        } = &self
        {
            body["topic"] = json!(topic);
            body["size_bytes"] = json!(size);
            body["limit_bytes"] = json!(limit);
        }
        (status, Json(body)).into_response()
    }
}

fn body<T>(payload: Result<Json<T>, JsonRejection>) -> Result<T, ApiError> {
    payload.map(|Json(v)| v).map_err(|e| ApiError::Invalid {
        field: "<body>".into(),
        reason: e.body_text(),
    })
}

/// The trace id of the caller's `traceparent`, if it sent one.
fn trace_id(headers: &HeaderMap) -> Option<String> {
    let value = headers.get("traceparent")?.to_str().ok()?;
    let id = value.split('-').nth(1)?;
    (id.len() == 32 && id.bytes().all(|b| b.is_ascii_hexdigit())).then(|| id.to_ascii_lowercase())
}

async fn create(
    State(service): State<Arc<OrderService>>,
    headers: HeaderMap,
    payload: Result<Json<NewOrder>, JsonRejection>,
) -> Result<(StatusCode, Json<orders::Order>), ApiError> {
    let order = service.create(body(payload)?, trace_id(&headers)).await?;
    Ok((StatusCode::CREATED, Json(order)))
}

async fn fetch(
    State(service): State<Arc<OrderService>>,
    Path(id): Path<i64>,
) -> Result<Json<orders::Order>, ApiError> {
    Ok(Json(service.get(id).await?))
}

async fn act(
    State(service): State<Arc<OrderService>>,
    Path((id, action)): Path<(i64, String)>,
    headers: HeaderMap,
    payload: Result<Json<serde_json::Value>, JsonRejection>,
) -> Result<Json<orders::Order>, ApiError> {
    let value = body(payload)?;
    let action = Action::parse(&action, value)?;
    Ok(Json(service.act(id, action, trace_id(&headers)).await?))
}

/// The record limits of the topics the API writes events for: the
/// producer's `message.max.bytes` and each topic's `max.message.bytes`, read
/// from the broker now (up to 10 s; unknown: the producer's limit only) and
/// every minute after, so a limit an operator changes is followed.
pub async fn record_limits(
    kafka: &crate::kafka::client::KafkaSettings,
    producer: &crate::producer::ProducerSettings,
    topics: &crate::topics::TopicsSettings,
) -> Arc<crate::outbox::limits::Limits> {
    let limits = Arc::new(crate::outbox::limits::Limits::new(
        Some(kafka.clone()),
        producer.options.clone(),
    ));
    let names = [
        topics.order_events.name.clone(),
        topics.inventory_events.name.clone(),
    ];
    let load = {
        let (limits, names) = (limits.clone(), names.clone());
        async move { limits.load(&[&names[0], &names[1]]).await }
    };
    if tokio::time::timeout(std::time::Duration::from_secs(10), load)
        .await
        .is_err()
    {
        tracing::warn!(
            "the topics' max.message.bytes not read within 10 s: events are sized against the producer's limit until they are"
        );
    }
    let refresh = limits.clone();
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(std::time::Duration::from_secs(60)).await;
            refresh.load(&[&names[0], &names[1]]).await;
        }
    });
    limits
}

/// A service on `db` writing events for the declared `topics`.
pub fn service(
    producer: &crate::producer::ProducerSettings,
    topics: &crate::topics::TopicsSettings,
    db: Db,
) -> OrderService {
    OrderService::new(db, producer, topics)
}
