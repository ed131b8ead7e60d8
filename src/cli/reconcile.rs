//! `orderpipe reconcile`: does a consumer group account for every event
//! of the order topic over a window? Prints the counts per class and per
//! event name and the position of every missing event, stores the run in
//! `reconcile_runs` (exported as gauges by the roles that run anyway) and
//! exits 1 when an event is missing.

use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::Args;

use super::OutputArg;
use super::output::{self, Output};
use crate::config::Settings;
use crate::db::Db;
use crate::dlq::store::parse_time;
use crate::reconcile::{self, Counts, Report, Request};

/// Flags of `orderpipe reconcile`.
#[derive(Debug, Args)]
pub struct ReconcileArgs {
    /// Consumer group to reconcile.
    #[arg(long)]
    group: String,
    /// Window start: an RFC 3339 time or an age (`1h` = an hour ago).
    #[arg(long, default_value = "1h")]
    since: String,
    /// Window end (exclusive): an RFC 3339 time or an age; default now.
    #[arg(long)]
    until: Option<String>,
    /// Unaccounted events younger than this are in flight, not missing
    /// (longer than the group's retry schedule when `consumer.ordering = none`).
    #[arg(long, default_value = "5m", value_parser = humantime::parse_duration)]
    grace: Duration,
    /// Topic the group reads (default: topics.order_events.name).
    #[arg(long)]
    topic: Option<String>,
    /// Missing events (and applied-not-in-topic rows) listed, at most; the counts are exact.
    #[arg(long, default_value_t = 1000)]
    limit: usize,
    #[command(flatten)]
    output: OutputArg,
}

/// Seconds between two progress lines in the log while scanning.
const PROGRESS_LOG_EVERY: Duration = Duration::from_secs(10);

/// Runs `orderpipe reconcile`.
pub async fn run(settings: &Settings, args: ReconcileArgs) -> anyhow::Result<ExitCode> {
    let since_ms = parse_time(&args.since).map_err(|e| anyhow::anyhow!("--since: {e}"))?;
    let until_ms = match &args.until {
        Some(t) => parse_time(t).map_err(|e| anyhow::anyhow!("--until: {e}"))?,
        None => crate::clock::now_ms(),
    };
    if since_ms >= until_ms {
        anyhow::bail!(
            "--since ({}) must be before --until ({})",
            args.since,
            args.until.as_deref().unwrap_or("now")
        );
    }
    if args.group.trim().is_empty() {
        anyhow::bail!("--group is empty: name the consumer group to reconcile");
    }
    let request = Request {
        group: args.group.clone(),
        topic: args
            .topic
            .clone()
            .unwrap_or_else(|| settings.topics.order_events.name.clone()),
        since_ms,
        until_ms,
        grace: args.grace,
        list_limit: args.limit,
    };
    let db = Db::connect(&settings.database, 4)?;
    // A bar on a terminal, a log line every few seconds otherwise (a CronJob's log).
    let bar = output::progress_bar(None, "records");
    let mut last_log = Instant::now();
    let report = reconcile::reconcile(&settings.kafka, &db, &request, |p| {
        if bar.length().is_none() {
            bar.set_length(p.offsets);
        }
        bar.set_position(p.records);
        if last_log.elapsed() >= PROGRESS_LOG_EVERY {
            last_log = Instant::now();
            tracing::info!(
                group = request.group,
                records = p.records,
                offsets = p.offsets,
                "reconcile: reading the topic"
            );
        }
    })
    .await?;
    bar.finish_and_clear();
    if report
        .partitions
        .iter()
        .all(|p| p.committed_offset.is_none())
    {
        // Every record is then "unconsumed": say why, a typo in --group looks the same.
        tracing::warn!(
            group = report.group,
            topic = report.topic,
            "the group has no committed offset on this topic (never ran here, a mistyped --group, or its offsets expired): every record counts as unconsumed"
        );
    }
    reconcile::store::record(&db, &report).await?;
    tracing::info!(
        group = report.group,
        records = report.totals.records,
        missing = report.totals.missing,
        applied_not_in_topic = report.applied_not_in_topic_count,
        took_ms = report.finished_ms - report.started_ms,
        "reconcile finished"
    );
    print(&report, args.output.output);
    Ok(if report.totals.missing > 0 {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    })
}

fn time(ms: i64) -> String {
    chrono::DateTime::from_timestamp_millis(ms).map_or_else(
        || ms.to_string(),
        |t| t.format("%Y-%m-%dT%H:%M:%S%.3fZ").to_string(),
    )
}

fn counts_row(first: String, c: &Counts) -> Vec<String> {
    let mut row = vec![first];
    row.extend(
        [
            c.records,
            c.applied,
            c.dead_lettered,
            c.held,
            c.parked,
            c.unconsumed,
            c.in_flight,
            c.missing,
        ]
        .map(|n| n.to_string()),
    );
    row
}

const COUNT_HEADER: [&str; 8] = [
    "records",
    "applied",
    "dead-lettered",
    "held",
    "parked",
    "unconsumed",
    "in flight",
    "MISSING",
];

fn print(report: &Report, format: Output) {
    if format == Output::Json {
        return output::json(report);
    }
    println!(
        "group {} on {}, {} .. {} (grace {}), read in {:.1} s",
        report.group,
        report.topic,
        time(report.since_ms),
        time(report.until_ms),
        humantime::format_duration(Duration::from_millis(report.grace_ms as u64)),
        (report.finished_ms - report.started_ms) as f64 / 1000.0
    );
    let mut header = vec!["event name"];
    header.extend(COUNT_HEADER);
    let mut rows: Vec<Vec<String>> = report
        .by_event_name
        .iter()
        .map(|(name, c)| counts_row(name.clone(), c))
        .collect();
    rows.push(counts_row("all".into(), &report.totals));
    println!("{}", output::table(&header, rows));
    if !report.missing.is_empty() {
        let now = crate::clock::now_ms();
        let rows = report.missing.iter().map(|m| {
            vec![
                m.partition.to_string(),
                m.offset.to_string(),
                m.event_id.clone().unwrap_or_else(|| "-".into()),
                m.event_name.clone().unwrap_or_else(|| "-".into()),
                time(m.timestamp_ms),
                humantime::format_duration(Duration::from_secs(
                    ((now - m.timestamp_ms).max(0) / 1000) as u64,
                ))
                .to_string(),
            ]
        });
        println!("missing events (applied by nobody, offset committed past them):");
        println!(
            "{}",
            output::table(
                &[
                    "partition",
                    "offset",
                    "event id",
                    "event name",
                    "timestamp",
                    "age"
                ],
                rows
            )
        );
        if (report.missing.len() as u64) < report.totals.missing {
            println!(
                "({} of {} listed; --limit to list more)",
                report.missing.len(),
                report.totals.missing
            );
        }
    }
    if !report.applied_not_in_topic.is_empty() {
        let rows = report.applied_not_in_topic.iter().map(|a| {
            vec![
                a.partition.to_string(),
                a.offset.to_string(),
                a.event_id.clone(),
                a.event_name.clone(),
            ]
        });
        println!("applied but not in the topic (the dedup row's position holds no such event):");
        println!(
            "{}",
            output::table(&["partition", "offset", "event id", "event name"], rows)
        );
        if (report.applied_not_in_topic.len() as u64) < report.applied_not_in_topic_count {
            println!(
                "({} of {} listed)",
                report.applied_not_in_topic.len(),
                report.applied_not_in_topic_count
            );
        }
    }
    println!(
        "{} missing, {} in flight, {} unconsumed, {} applied but not in the topic",
        report.totals.missing,
        report.totals.in_flight,
        report.totals.unconsumed,
        report.applied_not_in_topic_count
    );
}
