//! `orderpipe lag`: consumer group lag as the broker sees it, so a group
//! with every member down still shows how far behind it is.

use std::process::ExitCode;

use clap::Args;

use super::OutputArg;
use super::output::{self, Output};
use crate::config::Settings;
use crate::consumer::group_pause::GroupPause;
use crate::lag::{self, GroupLag};

/// Flags of `orderpipe lag`.
#[derive(Debug, Args)]
pub struct LagArgs {
    /// Consumer group (repeatable or comma-separated; default: lag.groups,
    /// else every group the broker lists with offsets on the topic).
    #[arg(long = "group", value_delimiter = ',')]
    groups: Vec<String>,
    /// Topic the groups read (default: topics.order_events.name); each
    /// group's retry topic is shown too.
    #[arg(long)]
    topic: Option<String>,
    #[command(flatten)]
    output: OutputArg,
}

/// Runs `orderpipe lag`.
pub async fn run(settings: &Settings, args: LagArgs) -> anyhow::Result<ExitCode> {
    let topic = args
        .topic
        .unwrap_or_else(|| settings.topics.order_events.name.clone());
    let (groups, named) = lag::groups_to_measure(
        &settings.kafka,
        &settings.lag,
        &settings.dlq.persister_group,
        &args.groups,
    )
    .await?;
    let measured = lag::measure(&settings.kafka, &topic, &groups, named).await?;
    // The operators' pauses, from the database; lag is the broker's, so a
    // database that does not answer costs only this column.
    let paused = match paused_groups(settings).await {
        Ok(paused) => Some(paused),
        Err(e) => {
            tracing::warn!(error = %e, "paused groups not read; the lag is shown without them");
            None
        }
    };
    print(&measured, paused.as_deref(), args.output.output);
    Ok(ExitCode::SUCCESS)
}

/// The pauses in force now.
async fn paused_groups(settings: &Settings) -> anyhow::Result<Vec<GroupPause>> {
    let db = crate::db::Db::connect(&settings.database, 1)?;
    Ok(crate::consumer::group_pause::list(&db).await?)
}

fn age(seconds: Option<f64>) -> String {
    seconds.map_or_else(
        || "-".into(),
        |s| {
            humantime::format_duration(std::time::Duration::from_secs(s.round() as u64)).to_string()
        },
    )
}

fn print(groups: &[GroupLag], paused: Option<&[GroupPause]>, format: Output) {
    if format == Output::Json {
        #[derive(serde::Serialize)]
        struct Report<'a> {
            groups: &'a [GroupLag],
            /// `null` when the database did not answer.
            paused: Option<&'a [GroupPause]>,
        }
        return output::json(&Report { groups, paused });
    }
    if groups.is_empty() {
        println!("no consumer group with committed offsets on this topic");
        return;
    }
    let rows = groups.iter().flat_map(|g| {
        g.partitions.iter().map(|p| {
            vec![
                g.group.clone(),
                p.topic.clone(),
                p.partition.to_string(),
                p.committed_offset
                    .map_or_else(|| "none".into(), |o| o.to_string()),
                p.log_end_offset.to_string(),
                p.lag.to_string(),
                age(p.oldest_unconsumed_age_seconds),
                p.open_transaction_age_seconds.map_or_else(
                    || "-".into(),
                    |s| format!("{} {}", age(Some(s)), p.open_transaction_holder()),
                ),
            ]
        })
    });
    let header = [
        "group",
        "topic",
        "partition",
        "committed",
        "log end",
        "lag",
        "oldest unconsumed",
        "open transaction",
    ];
    if groups.iter().any(|g| !g.partitions.is_empty()) {
        println!("{}", output::table(&header, rows));
    }
    let rows = groups.iter().map(|g| {
        let oldest = g
            .partitions
            .iter()
            .filter_map(|p| p.oldest_unconsumed_age_seconds)
            .reduce(f64::max);
        let pause = paused.and_then(|p| p.iter().find(|p| p.group == g.group));
        let status = match g.status {
            _ if pause.is_some() => "PAUSED by an operator (orderpipe group list)",
            lag::GroupStatus::Consuming => "consuming",
            lag::GroupStatus::NoMembers => "NO MEMBERS (nobody consumes it)",
            lag::GroupStatus::NoCommittedOffsets => "no committed offsets on this topic",
            lag::GroupStatus::Unknown => {
                "UNKNOWN to the broker (never ran, or its offsets expired)"
            }
        };
        vec![
            g.group.clone(),
            status.into(),
            g.state.clone(),
            g.members.to_string(),
            g.total_lag.to_string(),
            age(oldest),
        ]
    });
    println!(
        "{}",
        output::table(
            &[
                "group",
                "status",
                "broker state",
                "members",
                "total lag",
                "oldest unconsumed"
            ],
            rows
        )
    );
}
