//! The HTTP endpoints of long-running roles: `/metrics` (Prometheus),
//! `/health/live` (the process and its event loop answer), `/health/ready`
//! (the role can work: database reachable, partitions assigned) and
//! `/health/mq` (seed 000: the consumer polls and its lag is under the
//! threshold). Unhealthy answers are 503 with a JSON body saying why.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicUsize, Ordering};

use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;
use axum::{Json, Router};
use serde_json::json;
use tokio::sync::Mutex;

use crate::clock::now_ms;

/// What a role reports about itself; updated by the role, read by the endpoints.
#[derive(Debug)]
pub struct HealthState {
    db_ok: AtomicBool,
    db_error: Mutex<Option<String>>,
    assigned_partitions: AtomicUsize,
    /// Whether this role consumes (readiness then needs partitions, `/health/mq` applies).
    consumer: bool,
    last_poll_ms: AtomicI64,
    lag: AtomicI64,
    lag_threshold: i64,
    /// An operator paused the group: its lag grows by design, not a fault.
    paused: AtomicBool,
    max_poll_gap_ms: i64,
    /// Whether readiness needs the database (`false` for cdc, whose source
    /// is its own condition).
    needs_db: bool,
    /// The role's own conditions of readiness, by name: `None` when met,
    /// else why not (e.g. cdc's `binlog_stream`, `kafka_producer`).
    conditions: std::sync::Mutex<Vec<(&'static str, Option<String>)>>,
}

impl HealthState {
    /// A consumer's state: `/health/mq` fails past `lag_threshold` records of
    /// lag or `max_poll_gap` without polling.
    pub fn consumer(lag_threshold: i64, max_poll_gap: std::time::Duration) -> Arc<Self> {
        Arc::new(Self::new(
            true,
            lag_threshold,
            max_poll_gap.as_millis() as i64,
        ))
    }

    /// A role that does not consume (relay, API, persister).
    pub fn service() -> Arc<Self> {
        Arc::new(Self::new(false, i64::MAX, i64::MAX))
    }

    /// A role ready when each named condition is met (no database, no
    /// partitions); every condition starts unmet with its `why`.
    pub fn conditions(unmet: &[(&'static str, &str)]) -> Arc<Self> {
        let mut state = Self::new(false, i64::MAX, i64::MAX);
        state.needs_db = false;
        state.conditions = std::sync::Mutex::new(
            unmet
                .iter()
                .map(|(name, why)| (*name, Some(why.to_string())))
                .collect(),
        );
        Arc::new(state)
    }

    /// Marks condition `name` met (`None`) or unmet, saying why (`Some`).
    pub fn set_condition(&self, name: &'static str, unmet: Option<String>) {
        let mut conditions = self.conditions.lock().expect("conditions lock");
        match conditions.iter_mut().find(|(n, _)| *n == name) {
            Some((_, why)) => *why = unmet,
            None => conditions.push((name, unmet)),
        }
    }

    fn new(consumer: bool, lag_threshold: i64, max_poll_gap_ms: i64) -> Self {
        Self {
            db_ok: AtomicBool::new(false),
            db_error: Mutex::new(None),
            assigned_partitions: AtomicUsize::new(0),
            consumer,
            last_poll_ms: AtomicI64::new(now_ms()),
            lag: AtomicI64::new(0),
            lag_threshold,
            paused: AtomicBool::new(false),
            max_poll_gap_ms,
            needs_db: true,
            conditions: std::sync::Mutex::new(Vec::new()),
        }
    }

    /// Records that the database answered.
    pub async fn db_up(&self) {
        if !self.db_ok.swap(true, Ordering::Relaxed) {
            *self.db_error.lock().await = None;
        }
    }

    /// Records that the database failed, and why.
    pub async fn db_down(&self, why: &str) {
        self.db_ok.store(false, Ordering::Relaxed);
        *self.db_error.lock().await = Some(why.to_string());
    }

    /// Sets the number of assigned partitions.
    pub fn set_assigned(&self, n: usize) {
        self.assigned_partitions.store(n, Ordering::Relaxed);
    }

    /// The consumer's loop is alive (called on every poll turn).
    pub fn polled(&self) {
        self.last_poll_ms.store(now_ms(), Ordering::Relaxed);
    }

    /// Total lag over the assigned partitions.
    pub fn set_lag(&self, lag: i64) {
        self.lag.store(lag, Ordering::Relaxed);
    }

    /// Whether an operator's pause of the group is in force: `/health/mq`
    /// then stays healthy whatever the lag, and says paused.
    pub fn set_paused(&self, paused: bool) {
        self.paused.store(paused, Ordering::Relaxed);
    }

    /// Whether the database is up.
    pub fn db_is_up(&self) -> bool {
        self.db_ok.load(Ordering::Relaxed)
    }

    async fn readiness(&self) -> (bool, serde_json::Value) {
        let db_ok = self.db_ok.load(Ordering::Relaxed);
        let assigned = self.assigned_partitions.load(Ordering::Relaxed);
        let mut reasons = Vec::new();
        if self.needs_db && !db_ok {
            let why = self.db_error.lock().await.clone();
            reasons.push(format!(
                "database unavailable: {}",
                why.unwrap_or_else(|| "not yet reached".into())
            ));
        }
        if self.consumer && assigned == 0 {
            reasons.push("no partitions assigned".to_string());
        }
        let mut conditions = serde_json::Map::new();
        for (name, unmet) in self.conditions.lock().expect("conditions lock").iter() {
            if let Some(why) = unmet {
                reasons.push(format!("{name}: {why}"));
            }
            conditions.insert(name.to_string(), unmet.is_none().into());
        }
        let ready = reasons.is_empty();
        let mut body = json!({"ready": ready, "database": db_ok, "assigned_partitions": assigned, "reasons": reasons});
        if !self.needs_db {
            body = json!({"ready": ready, "conditions": conditions, "reasons": reasons});
        } else if !conditions.is_empty() {
            body["conditions"] = conditions.into();
        }
        (ready, body)
    }

    fn mq(&self) -> (bool, serde_json::Value) {
        let lag = self.lag.load(Ordering::Relaxed);
        let since_poll = now_ms() - self.last_poll_ms.load(Ordering::Relaxed);
        let mut reasons = Vec::new();
        if since_poll > self.max_poll_gap_ms {
            reasons.push(format!(
                "consumer has not polled for {since_poll} ms (limit {} ms)",
                self.max_poll_gap_ms
            ));
        }
        let paused = self.paused.load(Ordering::Relaxed);
        if lag > self.lag_threshold && !paused {
            reasons.push(format!(
                "lag {lag} records is over the threshold {}",
                self.lag_threshold
            ));
        }
        let healthy = reasons.is_empty();
        (
            healthy,
            json!({"healthy": healthy, "paused": paused, "lag": lag, "lag_threshold": self.lag_threshold, "ms_since_poll": since_poll, "reasons": reasons}),
        )
    }
}

async fn live() -> Json<serde_json::Value> {
    Json(json!({"live": true}))
}

fn answer(ok: bool, body: serde_json::Value) -> (StatusCode, Json<serde_json::Value>) {
    let status = if ok {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (status, Json(body))
}

async fn ready(State(state): State<Arc<HealthState>>) -> (StatusCode, Json<serde_json::Value>) {
    let (ok, body) = state.readiness().await;
    answer(ok, body)
}

async fn mq(State(state): State<Arc<HealthState>>) -> (StatusCode, Json<serde_json::Value>) {
    let (ok, body) = state.mq();
    answer(ok, body)
}

/// Pings the database every 5 s and records whether it answered.
pub fn watch_db(db: crate::db::Db, state: Arc<HealthState>) {
    tokio::spawn(ping_db_forever(db, state));
}

/// The loop of [`watch_db`], for a caller that ends it (a consumer run
/// aborts it when it returns). Without it an idle process never touches
/// the database and keeps reporting the last state it saw.
pub async fn ping_db_forever(db: crate::db::Db, state: Arc<HealthState>) {
    loop {
        match db.ping().await {
            Ok(()) => state.db_up().await,
            Err(e) => state.db_down(&e.to_string()).await,
        }
        tokio::time::sleep(std::time::Duration::from_secs(5)).await;
    }
}

/// The endpoints as routes (the API merges them into its own router).
pub fn routes(state: Arc<HealthState>) -> Router {
    let metrics = crate::metrics::install();
    Router::new()
        .route(
            "/metrics",
            get(move || std::future::ready(metrics.render())),
        )
        .route("/health/live", get(live))
        .route("/health/ready", get(ready))
        .route("/health/mq", get(mq))
        .with_state(state)
}

/// Serves `app` with the health endpoints merged in on `addr` (port 0 picks
/// one) until `shutdown`; reports the bound address through `bound`. The
/// order API, the admin API and the console are served this way.
pub async fn serve_app(
    addr: SocketAddr,
    app: axum::Router,
    health: Arc<HealthState>,
    bound: impl FnOnce(SocketAddr),
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let listener = tokio::net::TcpListener::bind(addr).await?;
    bound(listener.local_addr()?);
    axum::serve(listener, app.merge(routes(health)))
        .with_graceful_shutdown(shutdown)
        .await
}

/// Serves the endpoints on `addr` (port 0 picks one); returns the bound address.
pub async fn serve(addr: SocketAddr, state: Arc<HealthState>) -> std::io::Result<SocketAddr> {
    let listener = tokio::net::TcpListener::bind(addr).await?;
    let bound = listener.local_addr()?;
    let app = routes(state);
    tokio::spawn(async move {
        if let Err(e) = axum::serve(listener, app).await {
            tracing::error!(error = %e, "health endpoint stopped");
        }
    });
    Ok(bound)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_role_with_conditions_is_ready_only_when_each_is_met_and_says_which_is_not() {
        let state = HealthState::conditions(&[
            ("binlog_stream", "not yet connected"),
            ("kafka_producer", "not yet initialised"),
        ]);
        let (ready, body) = state.readiness().await;
        assert!(!ready);
        assert_eq!(
            body["reasons"],
            json!([
                "binlog_stream: not yet connected",
                "kafka_producer: not yet initialised"
            ])
        );
        state.set_condition("kafka_producer", None);
        state.set_condition(
            "binlog_stream",
            Some("connection refused; retrying in 400 ms".into()),
        );
        let (ready, body) = state.readiness().await;
        assert!(!ready);
        assert_eq!(
            body["conditions"],
            json!({"binlog_stream": false, "kafka_producer": true})
        );
        assert_eq!(
            body["reasons"],
            json!(["binlog_stream: connection refused; retrying in 400 ms"])
        );
        state.set_condition("binlog_stream", None);
        let (ready, body) = state.readiness().await;
        assert!(ready, "no database needed: {body}");
        // A service without conditions still needs its database.
        assert!(!HealthState::service().readiness().await.0);
    }

    #[test]
    fn a_paused_group_is_healthy_whatever_its_lag_but_not_when_it_stops_polling() {
        let state = HealthState::consumer(100, std::time::Duration::from_secs(30));
        state.set_lag(5_000);
        assert!(!state.mq().0, "lagging");
        state.set_paused(true);
        let (healthy, body) = state.mq();
        assert!(healthy, "{body}");
        assert_eq!(body["paused"], true);
        state
            .last_poll_ms
            .store(now_ms() - 60_000, Ordering::Relaxed);
        assert!(!state.mq().0, "a paused member still polls");
        state.polled();
        state.set_paused(false);
        assert!(!state.mq().0, "resumed: the lag counts again");
    }
}
