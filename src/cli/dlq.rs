//! `orderpipe dlq ...`: the operator's commands for dead letters.

use std::io::{BufRead, IsTerminal, Write};
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Subcommand};
use serde_json::json;

use super::OutputArg;
use super::consume::shutdown_signal;
use super::output::{self, Output};
use crate::codec::Codec;
use crate::config::Settings;
use crate::db::Db;
use crate::dlq::replay::{self, ReplayOptions};
use crate::dlq::store::{self, Filter};
use crate::dlq::persist;
use crate::schema::SchemaCatalog;

/// `orderpipe dlq` subcommands.
#[derive(Debug, Subcommand)]
pub enum DlqCommand {
    /// Consume the dead-letter topic into the `dead_letters` table.
    Persist {
        /// Exit after this many seconds without new dead letters.
        #[arg(long, value_name = "SECS")]
        until_idle: Option<u64>,
        /// Serve /metrics and /health/* here (port 0 = any free port).
        #[arg(long)]
        health_addr: Option<std::net::SocketAddr>,
        /// Apply the migrations first.
        #[arg(long)]
        migrate: bool,
        #[command(flatten)]
        output: OutputArg,
    },
    /// List dead letters (oldest first).
    List {
        #[command(flatten)]
        filter: Filter,
        /// At most this many rows.
        #[arg(long, default_value_t = 100)]
        limit: i64,
        #[command(flatten)]
        output: OutputArg,
    },
    /// One dead letter in full: decoded envelope, headers, error, history.
    Show {
        /// Row id.
        id: i64,
        #[command(flatten)]
        output: OutputArg,
    },
    /// Counts by group, event name, error class and status.
    Stats {
        #[command(flatten)]
        filter: Filter,
        #[command(flatten)]
        output: OutputArg,
    },
    /// Republish dead letters (to the failing group's retry topic) and mark them replayed.
    Replay(ReplayArgs),
    /// Close dead letters without replaying them.
    Ignore {
        #[command(flatten)]
        filter: Filter,
        /// Why (kept with each row).
        #[arg(long)]
        reason: String,
        /// Do not ask for confirmation.
        #[arg(long)]
        yes: bool,
        #[command(flatten)]
        output: OutputArg,
    },
}

/// Flags of `dlq replay`.
#[derive(Debug, Args)]
pub struct ReplayArgs {
    #[command(flatten)]
    filter: Filter,
    /// Show what would be replayed; change nothing.
    #[arg(long)]
    dry_run: bool,
    /// Records per second at most.
    #[arg(long, value_name = "N")]
    rate: Option<u32>,
    /// Republish to the original topic instead of the group's retry topic.
    #[arg(long)]
    to_original: bool,
    /// At most this many rows.
    #[arg(long, default_value_t = 1_000_000)]
    limit: i64,
    /// Do not ask for confirmation.
    #[arg(long)]
    yes: bool,
    #[command(flatten)]
    output: OutputArg,
}

/// Asks on a terminal before touching more than one row; elsewhere (scripts,
/// CI) proceeds. `--yes` skips the question.
fn confirm(what: &str, rows: usize, yes: bool) -> bool {
    if yes || rows <= 1 || !std::io::stdin().is_terminal() {
        return true;
    }
    eprint!("{what} {rows} dead letters? [y/N] ");
    let _ = std::io::stderr().flush();
    let mut answer = String::new();
    let _ = std::io::stdin().lock().read_line(&mut answer);
    matches!(answer.trim(), "y" | "Y" | "yes")
}

/// Runs a `dlq` subcommand.
pub async fn run(settings: &Settings, command: DlqCommand) -> anyhow::Result<ExitCode> {
    let db = Db::connect(&settings.database, 4)?;
    match command {
        DlqCommand::Persist { until_idle, health_addr, migrate, output } => {
            if migrate {
                db.migrate().await?;
            }
            super::relay::serve_health(health_addr, &db).await?;
            if let Ok(pending) = store::pending(&db).await {
                crate::metrics::dead_letters_pending(pending);
            }
            let summary = persist::run(settings, &db, until_idle.map(Duration::from_secs), shutdown_signal()).await?;
            match output.output {
                Output::Json => println!("{}", serde_json::to_string_pretty(&summary)?),
                Output::Table => println!(
                    "dead letters read {}, batches committed {}, write failures (retried) {}",
                    summary.read, summary.batches, summary.write_failures
                ),
            }
        }
        DlqCommand::List { filter, limit, output } => {
            output::dead_letters(&store::list(&db, &filter, limit).await?, output.output);
        }
        DlqCommand::Show { id, output } => {
            let filter = Filter { ids: vec![id], ..Default::default() };
            let Some(record) = store::records(&db, &filter, 1).await?.into_iter().next() else {
                anyhow::bail!("no dead letter with id {id}");
            };
            let codec = Codec::new(
                &settings.registry,
                &record.row.original_topic,
                SchemaCatalog::embedded().order_events(),
                false,
            )?;
            let decoded = match codec.decode(record.payload.as_deref()).await {
                Ok(envelope) => serde_json::to_value(&envelope)?,
                Err(e) => json!({"undecodable": e.to_string()}),
            };
            output::dead_letter(&record, &decoded, output.output);
        }
        DlqCommand::Stats { filter, output } => output::dlq_stats(&store::stats(&db, &filter).await?, output.output),
        DlqCommand::Replay(args) => {
            let mut filter = args.filter;
            if filter.ids.is_empty() && filter.status.is_none() {
                // Without ids, replay what is waiting, not what was already handled.
                filter.status = Some(store::Status::Pending);
            }
            let rows = store::records(&db, &filter, args.limit).await?;
            let options = ReplayOptions {
                to_original: args.to_original,
                rate: args.rate,
            };
            if args.dry_run {
                output::replay_plan(settings, &rows, options, args.output.output);
                return Ok(ExitCode::SUCCESS);
            }
            if !confirm("Replay", rows.len(), args.yes) {
                eprintln!("nothing replayed");
                return Ok(ExitCode::FAILURE);
            }
            let bar = output::progress_bar(Some(rows.len() as u64), "replayed");
            let summary = replay::replay(settings, &db, &rows, options, || bar.inc(1)).await?;
            bar.finish_and_clear();
            output::replayed(&summary, args.output.output);
            if !summary.failed.is_empty() {
                return Ok(ExitCode::FAILURE);
            }
        }
        DlqCommand::Ignore { filter, reason, yes, output } => {
            if reason.trim().is_empty() {
                anyhow::bail!("--reason must say why the dead letters are ignored");
            }
            if filter.is_empty() {
                anyhow::bail!("name the dead letters to ignore: --id, or a filter (--group, --event, --status, --since, --until, --error)");
            }
            let rows = store::list(&db, &filter, i64::MAX).await?;
            if !confirm("Ignore", rows.len(), yes) {
                eprintln!("nothing ignored");
                return Ok(ExitCode::FAILURE);
            }
            for row in &rows {
                store::mark_ignored(&db, row.id, &reason).await?;
            }
            match output.output {
                Output::Json => println!("{}", json!({"ignored": rows.len()})),
                Output::Table => println!("ignored {} dead letters: {reason}", rows.len()),
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}
