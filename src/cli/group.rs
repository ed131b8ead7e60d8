//! `orderpipe group pause|resume|list`: an operator's pause of a consumer
//! group (a `consume` group, a subscription's `deliver` group or a router
//! group), followed by its members within a second; see
//! [`crate::consumer::group_pause`].

use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Subcommand};

use super::OutputArg;
use super::output::{self, Output};
use crate::clock::now_ms;
use crate::config::Settings;
use crate::consumer::group_pause::{self, GroupPause};
use crate::db::Db;

/// `orderpipe group ...`.
#[derive(Debug, Subcommand)]
pub enum GroupCommand {
    /// Pause a group: its members stop fetching and keep their partitions
    /// and backlog; lag keeps being reported. Survives restarts.
    Pause {
        /// The consumer group.
        group: String,
        #[command(flatten)]
        pause: PauseArgs,
        #[command(flatten)]
        output: OutputArg,
    },
    /// Resume a paused group: its members go on in order within a second.
    Resume {
        /// The consumer group.
        group: String,
        #[command(flatten)]
        output: OutputArg,
    },
    /// The groups paused now: by whom, since when, until when, why.
    List {
        #[command(flatten)]
        output: OutputArg,
    },
}

/// How long, why and by whom: the flags of `group pause` and `subs pause`.
#[derive(Debug, Clone, Args)]
pub struct PauseArgs {
    /// End the pause by itself after this long (e.g. 30m, 2h).
    #[arg(long = "for", value_parser = humantime::parse_duration)]
    duration: Option<Duration>,
    /// Why, for whoever looks next (shown by `group list` and in the members' logs).
    #[arg(long, default_value = "")]
    pub reason: String,
    /// Who pauses it (default: $USER).
    #[arg(long)]
    by: Option<String>,
}

impl PauseArgs {
    /// Who: `--by`, else $USER, else `cli`.
    pub fn by(&self) -> String {
        super::who(self.by.clone())
    }

    /// When the pause ends by itself (ms since the epoch), if `--for` was given.
    pub fn until_ms(&self) -> Option<i64> {
        self.duration.map(|d| now_ms() + d.as_millis() as i64)
    }
}

/// Runs `orderpipe group ...`.
pub async fn run(settings: &Settings, command: GroupCommand) -> anyhow::Result<ExitCode> {
    let db = Db::connect(&settings.database, 1)?;
    match command {
        GroupCommand::Pause {
            group,
            pause,
            output,
        } => {
            if !crate::db::fits_column(&group, crate::db::CONSUMER_GROUP_CHARS) {
                anyhow::bail!(
                    "group: `{group}` is longer than {} characters",
                    crate::db::CONSUMER_GROUP_CHARS
                );
            }
            let (by, until, reason) = (pause.by(), pause.until_ms(), pause.reason);
            let pause = group_pause::pause(&db, &group, until, &by, &reason).await?;
            tracing::info!(group, paused_by = by, reason, until_ms = ?until, "group paused");
            print(&[pause], output.output, "paused");
        }
        GroupCommand::Resume { group, output } => {
            let was = group_pause::resume(&db, &group).await?;
            tracing::info!(group, was_paused = was, "group resumed");
            if output.output == Output::Json {
                output::json(&serde_json::json!({"group": group, "was_paused": was}));
            } else if was {
                println!("{group}: resumed; its members go on within a second, in order");
            } else {
                println!("{group}: was not paused");
            }
        }
        GroupCommand::List { output } => {
            let pauses = group_pause::list(&db).await?;
            if pauses.is_empty() && output.output == Output::Table {
                println!("no group is paused");
            } else {
                print(&pauses, output.output, "paused");
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// A pause's time as `YYYY-MM-DD HH:MM:SS UTC`.
pub(crate) fn utc(ms: i64) -> String {
    chrono::DateTime::from_timestamp_millis(ms).map_or_else(
        || ms.to_string(),
        |t| t.format("%Y-%m-%d %H:%M:%S UTC").to_string(),
    )
}

/// Pauses as a table or JSON (`{"<key>": [...]}`).
fn print(pauses: &[GroupPause], format: Output, key: &str) {
    if format == Output::Json {
        return output::json(&serde_json::json!({ key: pauses }));
    }
    let rows = pauses.iter().map(|p| {
        vec![
            p.group.clone(),
            utc(p.paused_at_ms),
            p.until_ms.map_or_else(|| "until resumed".into(), utc),
            p.paused_by.clone(),
            p.reason.clone(),
        ]
    });
    println!(
        "{}",
        output::table(&["group", "paused at", "until", "by", "reason"], rows)
    );
}
