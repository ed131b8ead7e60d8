//! The incremental snapshots page (`/snapshots`): a cdc source's queue of
//! table snapshots and each one's progress, as its last checkpoint has
//! them ([`crate::cdc::incremental`]), and its recent signals with what
//! became of them. Read-only: snapshots are started and paused with
//! `orderpipe cdc snapshot`, the admin API or a signal row.

use askama::Template;
use axum::Router;
use axum::extract::{Query, State};
use axum::response::Html;
use axum::routing::get;
use serde::Deserialize;

use super::{Chrome, ConsoleError, ConsoleState, Page, Principal, filters};
use crate::cdc::checkpoint::{self, SnapshotState};
use crate::snapshot_signals::{self, Signal};

/// The snapshots page.
pub const PAGE: Page = Page {
    routes,
    nav: Some(("Snapshots", "/snapshots")),
    actions: &[],
};

fn routes() -> Router<ConsoleState> {
    Router::new().route("/snapshots", get(page))
}

#[derive(Debug, Default, Deserialize)]
struct SourceQuery {
    #[serde(default)]
    source: String,
}

/// One table of the queue, as shown.
struct TableRow {
    table: String,
    reading: bool,
    rows: u64,
    estimate: u64,
    /// Per mille done, for the progress bar (the estimate may be low).
    per_mille: u64,
    chunks: u64,
    started_at: String,
}

#[derive(Template)]
#[template(path = "snapshots.html")]
struct SnapshotsPage {
    chrome: Chrome,
    source: String,
    /// When the checkpoint was written; `None`: the source has none.
    committed_at: Option<String>,
    /// Why the checkpoint could not be read.
    error: Option<String>,
    paused: bool,
    tables: Vec<TableRow>,
    signals: Vec<Signal>,
}

async fn page(
    State(state): State<ConsoleState>,
    principal: Principal,
    Query(query): Query<SourceQuery>,
) -> Result<Html<String>, ConsoleError> {
    let settings = state.settings();
    let source = match query.source.trim() {
        "" => settings.cdc.name.clone(),
        named => named.to_string(),
    };
    let (committed_at, state_of, error) =
        match checkpoint::last_committed(&settings.kafka, &settings.cdc.offsets_topic, &source)
            .await
        {
            Ok(last) => (
                last.as_ref().map(|c| c.committed_at.clone()),
                last.and_then(|c| c.snapshot).unwrap_or_default(),
                None,
            ),
            Err(e) => (None, SnapshotState::default(), Some(e.to_string())),
        };
    let signals = snapshot_signals::recent(state.db(), &source, 10)
        .await
        .map_err(crate::db::DbError::from)?;
    let tables = state_of
        .tables
        .iter()
        .enumerate()
        .map(|(i, t)| TableRow {
            table: t.table.clone(),
            reading: i == 0 && !state_of.paused,
            rows: t.rows,
            estimate: t.estimate,
            per_mille: (t.rows * 1000)
                .checked_div(t.estimate)
                .unwrap_or(0)
                .min(1000),
            chunks: t.chunks,
            started_at: t.started_at.clone(),
        })
        .collect();
    super::render(&SnapshotsPage {
        chrome: state
            .chrome(&principal, "Incremental snapshots", "/snapshots")
            .refreshing(&state),
        source,
        committed_at,
        error,
        paused: state_of.paused,
        tables,
        signals,
    })
}
