//! `orderpipe cdc snapshot start|stop|pause|resume|status`: the incremental
//! snapshots of a running `cdc` (see [`crate::cdc::incremental`]). The
//! actions write a signal row ([`crate::snapshot_signals`]) that the
//! source applies within a second; `status` reads the queue and progress
//! from the source's last checkpoint, and the recent signals.

use std::process::ExitCode;

use clap::Subcommand;

use super::group::utc;
use super::output::{self, Output};
use crate::cdc::checkpoint;
use crate::cdc::checkpoint::SnapshotState;
use crate::config::Settings;
use crate::db::Db;
use crate::snapshot_signals::{self, Signal, SignalKind};

/// An action on a source's incremental snapshots.
#[derive(Debug, Subcommand)]
pub enum SnapshotAction {
    /// Queue incremental snapshots of tables (captured by the source): read in key
    /// chunks of cdc.snapshot_chunk_rows while the stream runs.
    Start {
        /// Table to snapshot, <database>.<table> (repeatable or comma-separated).
        #[arg(long = "table", value_delimiter = ',', required = true)]
        tables: Vec<String>,
        /// Who asks (default: $USER).
        #[arg(long)]
        by: Option<String>,
    },
    /// Drop tables' snapshots from the queue (all of them without --table).
    Stop {
        /// Table whose snapshot stops, <database>.<table> (repeatable or comma-separated).
        #[arg(long = "table", value_delimiter = ',')]
        tables: Vec<String>,
        /// Who asks (default: $USER).
        #[arg(long)]
        by: Option<String>,
    },
    /// Read no more chunks until resumed; the stream goes on.
    Pause {
        /// Who asks (default: $USER).
        #[arg(long)]
        by: Option<String>,
    },
    /// Read chunks again.
    Resume {
        /// Who asks (default: $USER).
        #[arg(long)]
        by: Option<String>,
    },
    /// The queue and each table's progress as the last checkpoint has them, and the
    /// recent signals with what became of them.
    Status,
}

/// Runs an action for source `name`.
pub async fn run(
    settings: &Settings,
    name: &str,
    action: SnapshotAction,
    format: Output,
) -> anyhow::Result<ExitCode> {
    let db = Db::connect(&settings.database, 1)?;
    let (kind, tables, by) = match action {
        SnapshotAction::Start { tables, by } => (SignalKind::Start, tables, by),
        SnapshotAction::Stop { tables, by } => (SignalKind::Stop, tables, by),
        SnapshotAction::Pause { by } => (SignalKind::Pause, Vec::new(), by),
        SnapshotAction::Resume { by } => (SignalKind::Resume, Vec::new(), by),
        SnapshotAction::Status => return status(settings, &db, name, format).await,
    };
    let by = super::who(by);
    let signal = snapshot_signals::send(&db, name, kind, &tables, &by)
        .await
        .map_err(|e| match e {
            // The field as the flag that sets it.
            snapshot_signals::SendError::Invalid { field, reason } => {
                anyhow::anyhow!("{}: {reason}", field.replacen("tables", "--table", 1))
            }
            e => e.into(),
        })?;
    tracing::info!(
        source = name,
        id = signal.id,
        signal = kind.as_str(),
        ?tables,
        by,
        "cdc snapshot signal sent"
    );
    match format {
        Output::Json => output::json(&signal),
        Output::Table => println!(
            "signal {} ({}) sent to cdc source {name}; it applies it within a second \
             (`orderpipe cdc snapshot status` shows the outcome)",
            signal.id,
            kind.as_str()
        ),
    }
    Ok(ExitCode::SUCCESS)
}

/// `status`: the checkpoint's snapshot state and the recent signals.
async fn status(
    settings: &Settings,
    db: &Db,
    name: &str,
    format: Output,
) -> anyhow::Result<ExitCode> {
    let last =
        checkpoint::last_committed(&settings.kafka, &settings.cdc.offsets_topic, name).await?;
    let state = last
        .as_ref()
        .and_then(|c| c.snapshot.clone())
        .unwrap_or_default();
    let signals = snapshot_signals::recent(db, name, 10).await?;
    if format == Output::Json {
        output::json(&serde_json::json!({
            "source": name,
            "checkpoint": last.as_ref().map(|c| &c.position),
            "committed_at": last.as_ref().map(|c| &c.committed_at),
            "snapshot": state,
            "signals": signals,
        }));
        return Ok(ExitCode::SUCCESS);
    }
    print_state(name, &state);
    print_signals(&signals);
    Ok(ExitCode::SUCCESS)
}

fn print_state(name: &str, state: &SnapshotState) {
    if state.tables.is_empty() {
        println!("cdc {name}: no incremental snapshot queued");
    } else {
        println!(
            "cdc {name}: {} snapshot(s) queued{}",
            state.tables.len(),
            if state.paused { ", PAUSED" } else { "" }
        );
        let rows = state.tables.iter().enumerate().map(|(i, t)| {
            let percent = match t.estimate {
                0 => "-".to_string(),
                e => format!("{:.1} %", (100.0 * t.rows as f64 / e as f64).min(100.0)),
            };
            vec![
                if i == 0 { "reading" } else { "queued" }.to_string(),
                t.table.clone(),
                t.rows.to_string(),
                t.estimate.to_string(),
                percent,
                t.chunks.to_string(),
                t.started_at.clone(),
            ]
        });
        println!(
            "{}",
            output::table(
                &[
                    "state", "table", "rows out", "estimate", "done", "chunks", "started"
                ],
                rows
            )
        );
    }
}

fn print_signals(signals: &[Signal]) {
    if signals.is_empty() {
        return;
    }
    let rows = signals.iter().map(|s| {
        vec![
            s.id.to_string(),
            s.kind.clone(),
            s.tables().map_or_else(|e| e, |t| t.join(", ")),
            s.requested_by.clone(),
            utc(s.created_at_ms),
            s.outcome
                .clone()
                .unwrap_or_else(|| "not applied yet".into()),
        ]
    });
    println!(
        "recent signals:\n{}",
        output::table(&["id", "type", "tables", "by", "at", "outcome"], rows)
    );
}
