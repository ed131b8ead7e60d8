//! The audit trail: one `console_audit` row per state change made through
//! the console (who, role, action, the filter or target as JSON, how many
//! items, the outcome, when), and the `/audit` page that lists them.
//!
//! Every action handler calls [`record`] once it knows the outcome
//! (`"ok"` or why it failed), before it answers.

use askama::Template;
use axum::Router;
use axum::extract::{Query, State};
use axum::response::Html;
use axum::routing::get;
use serde::{Deserialize, Serialize};
use sqlx::Row;

use super::auth::Principal;
use super::{Chrome, ConsoleError, ConsoleState, Page, filters};
use crate::db::{Db, DbError};

/// Longest `outcome` kept (the column is VARCHAR(255)).
const OUTCOME_CHARS: usize = 255;

/// One audit row.
#[derive(Debug, Clone, Serialize)]
pub struct AuditRow {
    /// Row id (increasing).
    pub id: i64,
    /// When, ms since the epoch.
    pub at_ms: i64,
    /// Who: the proxy's user, or `viewer-token` / `operator-token`.
    pub who: String,
    /// Their role then.
    pub role: String,
    /// What, e.g. `dlq.replay`, `dlq.ignore`, `held.release`, `subs.update`.
    pub action: String,
    /// The filter or the item acted on, as JSON.
    pub target: String,
    /// How many items the action covered.
    pub item_count: i64,
    /// `ok`, or why it failed.
    pub outcome: String,
}

/// Writes one audit row for `principal`'s `action` on `target` covering `count` items.
pub async fn record(
    db: &Db,
    principal: &Principal,
    action: &str,
    target: &serde_json::Value,
    count: u64,
    outcome: &str,
) -> Result<(), DbError> {
    record_as(
        db,
        &principal.who,
        principal.role.as_str(),
        action,
        target,
        count,
        outcome,
    )
    .await
}

/// [`record`] for someone who is not signed in to the console: the CLI's
/// user (`role` = `cli`), as `orderpipe dlq show --reveal` writes it.
pub async fn record_as(
    db: &Db,
    who: &str,
    role: &str,
    action: &str,
    target: &serde_json::Value,
    count: u64,
    outcome: &str,
) -> Result<(), DbError> {
    let outcome: String = outcome.chars().take(OUTCOME_CHARS).collect();
    sqlx::query(
        "INSERT INTO console_audit (at_ms, who, role, action, target, item_count, outcome) VALUES (?, ?, ?, ?, ?, ?, ?)",
    )
    .bind(crate::clock::now_ms())
    .bind(who)
    .bind(role)
    .bind(action)
    .bind(target.to_string())
    .bind(count as i64)
    .bind(outcome)
    .execute(&db.pool)
    .await?;
    metrics::counter!(crate::metrics::name::CONSOLE_ACTIONS, "action" => action.to_string())
        .increment(1);
    Ok(())
}

/// The newest rows, newest first; `action` (exact) narrows them.
pub async fn recent(db: &Db, action: Option<&str>, limit: i64) -> Result<Vec<AuditRow>, DbError> {
    let mut q = sqlx::QueryBuilder::<sqlx::Any>::new(
        "SELECT id, at_ms, who, role, action, target, item_count, outcome FROM console_audit",
    );
    if let Some(action) = action {
        q.push(" WHERE action = ").push_bind(action.to_string());
    }
    q.push(" ORDER BY id DESC LIMIT ").push_bind(limit);
    let rows = q.build().fetch_all(&db.pool).await?;
    rows.iter()
        .map(|r| {
            Ok(AuditRow {
                id: r.try_get(0)?,
                at_ms: r.try_get(1)?,
                who: r.try_get(2)?,
                role: r.try_get(3)?,
                action: r.try_get(4)?,
                target: r.try_get(5)?,
                item_count: r.try_get(6)?,
                outcome: r.try_get(7)?,
            })
        })
        .collect::<Result<_, sqlx::Error>>()
        .map_err(DbError::from)
}

/// The `/audit` page.
pub const PAGE: Page = Page {
    routes,
    nav: Some(("Audit", "/audit")),
    actions: &[],
};

fn routes() -> Router<ConsoleState> {
    Router::new().route("/audit", get(show))
}

/// Rows on the page unless `limit` says otherwise, and the most it may say.
const PAGE_ROWS: i64 = 200;
const MAX_ROWS: i64 = 5000;

#[derive(Debug, Deserialize)]
struct AuditQuery {
    #[serde(default)]
    action: Option<String>,
    #[serde(default)]
    limit: Option<String>,
}

#[derive(Template)]
#[template(path = "audit.html")]
struct AuditPage {
    chrome: Chrome,
    action: String,
    limit: i64,
    rows: Vec<AuditRow>,
}

async fn show(
    State(state): State<ConsoleState>,
    principal: Principal,
    query: Result<Query<AuditQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Html<String>, ConsoleError> {
    let Query(query) = query.map_err(|e| ConsoleError::BadInput {
        field: "query".into(),
        message: e.body_text(),
    })?;
    let action = query.action.filter(|a| !a.trim().is_empty());
    let limit = match query
        .limit
        .as_deref()
        .map(str::trim)
        .filter(|l| !l.is_empty())
    {
        None => PAGE_ROWS,
        Some(text) => text
            .parse::<i64>()
            .ok()
            .filter(|n| (1..=MAX_ROWS).contains(n))
            .ok_or_else(|| {
                ConsoleError::bad_input(
                    "limit",
                    format!("`{text}` is not a whole number from 1 to {MAX_ROWS}"),
                )
            })?,
    };
    let rows = recent(state.db(), action.as_deref(), limit).await?;
    let page = AuditPage {
        chrome: state.chrome(&principal, "Audit", "/audit"),
        action: action.unwrap_or_default(),
        limit,
        rows,
    };
    super::render(&page)
}
