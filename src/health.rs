//! Health endpoints of long-running roles: `/health/live` (the event loop
//! answers) and `/health/ready` (the role can do its work: database
//! reachable, partitions assigned). Each says why in a JSON body.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;
use axum::{Json, Router};
use serde_json::json;
use tokio::sync::Mutex;

/// What a role reports about itself; updated by the role, read by the endpoints.
#[derive(Debug, Default)]
pub struct HealthState {
    db_ok: AtomicBool,
    db_error: Mutex<Option<String>>,
    assigned_partitions: AtomicUsize,
}

impl HealthState {
    /// A new state: database not yet confirmed, nothing assigned.
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
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

    /// Whether the database is up.
    pub fn db_is_up(&self) -> bool {
        self.db_ok.load(Ordering::Relaxed)
    }

    async fn readiness(&self) -> (bool, serde_json::Value) {
        let db_ok = self.db_ok.load(Ordering::Relaxed);
        let assigned = self.assigned_partitions.load(Ordering::Relaxed);
        let mut reasons = Vec::new();
        if !db_ok {
            let why = self.db_error.lock().await.clone();
            reasons.push(format!("database unavailable: {}", why.unwrap_or_else(|| "not yet reached".into())));
        }
        if assigned == 0 {
            reasons.push("no partitions assigned".to_string());
        }
        let ready = reasons.is_empty();
        (ready, json!({"ready": ready, "database": db_ok, "assigned_partitions": assigned, "reasons": reasons}))
    }
}

async fn live() -> Json<serde_json::Value> {
    Json(json!({"live": true}))
}

async fn ready(State(state): State<Arc<HealthState>>) -> (StatusCode, Json<serde_json::Value>) {
    let (ok, body) = state.readiness().await;
    let status = if ok { StatusCode::OK } else { StatusCode::SERVICE_UNAVAILABLE };
    (status, Json(body))
}

/// Serves the endpoints on `addr` (port 0 picks one); returns the bound address.
pub async fn serve(addr: SocketAddr, state: Arc<HealthState>) -> std::io::Result<SocketAddr> {
    let listener = tokio::net::TcpListener::bind(addr).await?;
    let bound = listener.local_addr()?;
    let app = Router::new()
        .route("/health/live", get(live))
        .route("/health/ready", get(ready))
        .with_state(state);
    tokio::spawn(async move {
        if let Err(e) = axum::serve(listener, app).await {
            tracing::error!(error = %e, "health endpoint stopped");
        }
    });
    Ok(bound)
}
