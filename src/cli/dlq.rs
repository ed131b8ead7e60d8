//! `orderpipe dlq ...`: the operator's commands for dead letters.

use crate::masking::FieldMask;
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
use crate::dlq::ignore::{self, Followers, IgnoreError};
use crate::dlq::progress::{Origin, Tracker};
use crate::dlq::replay::{self, ReplayOptions};
use crate::dlq::store::{self, Filter, Selection, Status};
use crate::dlq::{gauges, persist};
use crate::schema::SchemaCatalog;

/// `orderpipe dlq` subcommands.
#[derive(Debug, Subcommand)]
pub enum DlqCommand {
    /// Consume the dead-letter topic into the `dead_letters` table; export
    /// the broker-side lag of the `lag.groups` consumer groups on /metrics.
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
    /// List dead letters (oldest first); `--status held` lists the records
    /// held behind parked keys instead, with the head each waits behind.
    List {
        #[command(flatten)]
        filter: FilterArgs,
        /// At most this many rows.
        #[arg(long, default_value_t = 100)]
        limit: i64,
        #[command(flatten)]
        output: OutputArg,
    },
    /// One dead letter in full: decoded envelope, headers, error, history,
    /// and the records held behind it if it heads a parked key.
    Show {
        /// Row id.
        id: i64,
        /// ID is a held record (`dlq list --status held`): show it and the
        /// head it waits behind.
        #[arg(long)]
        held: bool,
        /// Show the fields of `console.masked_fields` as they are (written
        /// to the audit table); without it they show as •••.
        #[arg(long)]
        reveal: bool,
        #[command(flatten)]
        output: OutputArg,
    },
    /// Duplicates skipped whose content differed from the event first
    /// applied under the same id (a producer reused an event id), newest first.
    Conflicts {
        /// Only this consumer group.
        #[arg(long)]
        group: Option<String>,
        /// At most this many rows.
        #[arg(long, default_value_t = 100)]
        limit: i64,
        #[command(flatten)]
        output: OutputArg,
    },
    /// Counts by group, event name, error class and status.
    Stats {
        #[command(flatten)]
        filter: FilterArgs,
        #[command(flatten)]
        output: OutputArg,
    },
    /// Republish dead letters (to the failing group's retry topic) and mark them replayed.
    Replay(ReplayArgs),
    /// Delete old dead letters, a small batch per statement: replayed and
    /// ignored ones by default; pending ones only when named with --status.
    /// The head of a parked key is never deleted (records wait behind it).
    Purge(PurgeArgs),
    /// Close dead letters without replaying them.
    Ignore {
        #[command(flatten)]
        filter: FilterArgs,
        /// Why (kept with each row).
        #[arg(long)]
        reason: String,
        /// For a dead letter heading a parked key: apply the records held
        /// behind it now, in their original order.
        #[arg(long, conflicts_with = "keep_held")]
        release_followers: bool,
        /// For a dead letter heading a parked key: keep the records behind it held.
        #[arg(long)]
        keep_held: bool,
        /// Do not ask for confirmation (without a terminal, needed to act on a filter).
        #[arg(long)]
        yes: bool,
        #[command(flatten)]
        output: OutputArg,
    },
}

/// `--id --group --event --status --since --until --error`: which rows a
/// command touches (the store's [`Filter`]).
#[derive(Debug, Clone, Args)]
pub struct FilterArgs {
    /// Row ids (repeatable or comma-separated).
    #[arg(long = "id", value_delimiter = ',')]
    ids: Vec<i64>,
    /// Consumer group that failed the record.
    #[arg(long)]
    group: Option<String>,
    /// Event name, e.g. order.payment.succeeded.
    #[arg(long = "event")]
    event_name: Option<String>,
    /// Status (`held`: the records held behind parked keys instead).
    #[arg(long, value_enum)]
    status: Option<StatusArg>,
    /// Last failure at or after this time (RFC 3339, or an age like 2h).
    #[arg(long, value_parser = store::parse_time)]
    since: Option<i64>,
    /// Last failure before this time (RFC 3339, or an age like 30m).
    #[arg(long, value_parser = store::parse_time)]
    until: Option<i64>,
    /// Error class or message contains this text.
    #[arg(long = "error")]
    error_text: Option<String>,
    /// Error class is one of these (repeatable or comma-separated), e.g.
    /// handler_retryable,unavailable.
    #[arg(long = "class", value_delimiter = ',', value_parser = crate::dlq::known_class)]
    classes: Vec<String>,
    /// Last failure at least this long ago (an age: 10m, 2h, 7d); the same as --until AGE.
    #[arg(long, value_parser = store::parse_age, conflicts_with = "until", value_name = "AGE")]
    older_than: Option<i64>,
    /// Record key: the order id.
    #[arg(long)]
    key: Option<String>,
}

/// Flags of `dlq purge`.
#[derive(Debug, Args)]
pub struct PurgeArgs {
    /// Delete rows whose last change (failure, replay or ignore) is older than this, e.g. 7d, 36h.
    #[arg(long, value_parser = humantime::parse_duration, value_name = "AGE")]
    older_than: Duration,
    /// Statuses to delete (repeatable or comma-separated; default: replayed, ignored).
    /// Pending rows are deleted only when named here.
    #[arg(long = "status", value_enum, value_delimiter = ',')]
    statuses: Vec<StatusArg>,
    /// Only this consumer group.
    #[arg(long)]
    group: Option<String>,
    /// Rows per DELETE statement.
    #[arg(long, value_name = "ROWS", default_value_t = 1000, value_parser = clap::value_parser!(u32).range(1..=100_000))]
    batch: u32,
    /// Count what would be deleted; delete nothing.
    #[arg(long)]
    dry_run: bool,
    #[command(flatten)]
    output: OutputArg,
}

impl PurgeArgs {
    /// The store's [`store::Purge`]: held records are no dead letters, and
    /// are never purged.
    fn selection(&self) -> Result<store::Purge, store::SelectionError> {
        let mut statuses = Vec::new();
        for status in &self.statuses {
            match Selection::from(*status) {
                Selection::Status(s) if !statuses.contains(&s) => statuses.push(s),
                Selection::Status(_) => {}
                Selection::Held => return Err(store::SelectionError::HeldNotPurged),
            }
        }
        if statuses.is_empty() {
            statuses = vec![Status::Replayed, Status::Ignored];
        }
        Ok(store::Purge {
            statuses,
            group: self.group.clone(),
            before_ms: crate::clock::now_ms() - self.older_than.as_millis() as i64,
            batch: self.batch,
        })
    }
}

/// `--status`: a dead-letter status, or `held`.
#[derive(Debug, Clone, Copy, clap::ValueEnum)]
enum StatusArg {
    // The dead-letter statuses, as stored.
    Pending,
    Replayed,
    Ignored,
    /// records held behind parked keys (not dead letters)
    Held,
}

impl From<StatusArg> for Selection {
    fn from(status: StatusArg) -> Self {
        match status {
            StatusArg::Pending => Status::Pending.into(),
            StatusArg::Replayed => Status::Replayed.into(),
            StatusArg::Ignored => Status::Ignored.into(),
            StatusArg::Held => Selection::Held,
        }
    }
}

impl From<FilterArgs> for Filter {
    fn from(args: FilterArgs) -> Self {
        Filter {
            ids: args.ids,
            group: args.group,
            event_name: args.event_name,
            status: args.status.map(Selection::from),
            since: args.since,
            until: args.until.or(args.older_than),
            error_text: args.error_text,
            classes: args.classes,
            key: args.key,
        }
    }
}

/// Flags of `dlq replay`.
#[derive(Debug, Args)]
pub struct ReplayArgs {
    #[command(flatten)]
    filter: FilterArgs,
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
    /// Rows read from the table per query (replay streams them by id).
    #[arg(long, value_name = "ROWS", default_value_t = replay::PAGE_SIZE as u32,
          value_parser = clap::value_parser!(u32).range(1..=100_000))]
    page_size: u32,
    /// Records sent and not yet acknowledged by the broker, at most.
    #[arg(long, value_name = "RECORDS", default_value_t = replay::IN_FLIGHT as u32,
          value_parser = clap::value_parser!(u32).range(1..=100_000))]
    in_flight: u32,
    /// Do not ask for confirmation (without a terminal, needed to act on a filter).
    #[arg(long)]
    yes: bool,
    #[command(flatten)]
    output: OutputArg,
}

/// Whether to go ahead with `what` ("Replay", "Ignore") on `rows` dead letters.
///
/// On a terminal: asks before touching more than one row. Without one
/// (scripts, CI, `kubectl exec` without `-t`) a selection by filter is
/// refused unless `--yes` says so: a filter that matches three rows today
/// may match a million tomorrow. A list of `--id`s is explicit and runs.
fn confirm(what: &str, filter: &Filter, rows: usize, yes: bool) -> anyhow::Result<bool> {
    let terminal = std::io::stdin().is_terminal();
    if yes || (!terminal && !filter.ids.is_empty()) {
        return Ok(true);
    }
    if !terminal {
        anyhow::bail!(
            "{what} by filter acts on every matching dead letter ({rows} now) and there is no terminal to confirm: \
             nothing changed. Check the selection with `orderpipe dlq list` (or `dlq replay --dry-run`) and run again \
             with --yes, or name the rows with --id"
        );
    }
    if rows <= 1 {
        return Ok(true);
    }
    eprint!("{what} {rows} dead letters? [y/N] ");
    let _ = std::io::stderr().flush();
    let mut answer = String::new();
    let _ = std::io::stdin().lock().read_line(&mut answer);
    Ok(matches!(answer.trim(), "y" | "Y" | "yes"))
}

/// Runs a `dlq` subcommand.
pub async fn run(settings: &Settings, command: DlqCommand) -> anyhow::Result<ExitCode> {
    let db = Db::connect(&settings.database, 4)?;
    match command {
        DlqCommand::Persist {
            until_idle,
            health_addr,
            migrate,
            output,
        } => {
            super::signals::install()?;
            if migrate {
                db.migrate().await?;
            }
            super::relay::serve_health(health_addr, &db).await?;
            // Every group's dead-letter gauges; each consume/deliver exports its own group's too.
            let gauges = tokio::spawn(gauges::export(
                Db::connect(&settings.database, 1)?,
                gauges::Scope::AllGroups,
                Duration::from_secs(settings.dlq.gauge_interval_secs),
            ));
            // Runs anyway, so it watches the groups: their lag is exported with every member down.
            let lag_export = tokio::spawn(crate::lag::export(
                settings.kafka.clone(),
                settings.lag.clone(),
                settings.topics.order_events.name.clone(),
            ));
            let summary = persist::run(
                &settings.kafka,
                &settings.dlq,
                &settings.topics.dead_letter,
                Some(&settings.cdc.dead_letter_topic()),
                &db,
                until_idle.map(Duration::from_secs),
                shutdown_signal(),
            )
            .await;
            lag_export.abort();
            gauges.abort();
            let summary = summary?;
            match output.output {
                Output::Json => println!("{}", serde_json::to_string_pretty(&summary)?),
                Output::Table => println!(
                    "dead letters read {}, batches committed {}, write failures (retried) {}",
                    summary.read, summary.batches, summary.write_failures
                ),
            }
        }
        DlqCommand::List {
            filter,
            limit,
            output,
        } => {
            let filter = Filter::from(filter);
            if filter.status == Some(Selection::Held) {
                let views =
                    crate::dlq::held::held_views(&db, filter.group.as_deref(), limit).await?;
                held_records(&views, output.output);
            } else {
                dead_letters(&store::list(&db, &filter, limit).await?, output.output);
            }
        }
        DlqCommand::Show {
            id,
            held: true,
            output,
            ..
        } => {
            let Some(view) = crate::dlq::held::held_view(&db, id).await? else {
                anyhow::bail!(
                    "no held record with id {id} (released already, or see `orderpipe dlq list --status held`)"
                );
            };
            held_record(&view, output.output);
        }
        DlqCommand::Show {
            id,
            held: false,
            reveal,
            output,
        } => {
            let filter = Filter {
                ids: vec![id],
                ..Default::default()
            };
            let Some(record) = store::records(&db, &filter, 1).await?.into_iter().next() else {
                anyhow::bail!("no dead letter with id {id}");
            };
            let codec = Codec::new(
                &settings.registry,
                &record.row.original_topic,
                SchemaCatalog::embedded().order_events(),
                false,
            )?;
            let mut decoded = match (
                record.json_value(),
                codec.decode(record.payload.as_deref()).await,
            ) {
                (Some(json), _) => json,
                (None, Ok(envelope)) => serde_json::to_value(&envelope)?,
                (None, Err(e)) => json!({"undecodable": e.to_string()}),
            };
            let mask =
                FieldMask::parse(&settings.console.masked_fields).map_err(anyhow::Error::msg)?;
            let target = json!({"dead_letter": id, "command": "dlq show"});
            if let Some(mask) = super::output::cli_mask(&db, &mask, reveal, target).await? {
                mask.apply(&mut decoded);
            }
            let heads = ignore::heading(&db, &record).await?;
            dead_letter(&record, &decoded, heads.as_ref(), output.output);
        }
        DlqCommand::Conflicts {
            group,
            limit,
            output,
        } => {
            conflicts(
                &crate::dedup::conflicts(&db, group.as_deref(), limit).await?,
                output.output,
            );
        }
        DlqCommand::Stats { filter, output } => {
            dlq_stats(&store::stats(&db, &filter.into()).await?, output.output);
        }
        DlqCommand::Replay(args) => {
            let filter = Filter::from(args.filter).for_replay()?;
            // Fixed now: rows persisted meanwhile wait for the next replay.
            let bound = store::bound(&db, &filter, args.limit).await?;
            let options = ReplayOptions {
                to_original: args.to_original,
                rate: args.rate,
                page_size: args.page_size as usize,
                in_flight: args.in_flight as usize,
            };
            if args.dry_run {
                let plan = replay::dry_run(
                    &db,
                    &settings.topics.dead_letter.name,
                    &filter,
                    bound,
                    options,
                )
                .await?;
                replay_plan(&plan, args.output.output);
                return Ok(ExitCode::SUCCESS);
            }
            if !confirm("Replay", &filter, bound.rows as usize, args.yes)? {
                eprintln!("nothing replayed");
                return Ok(ExitCode::FAILURE);
            }
            let bar = output::progress_bar(Some(bound.rows as u64), "replayed");
            // The same progress a console shows (dlq_replays), for this run too.
            let who = super::who(None);
            let tracker =
                Tracker::start(&db, Origin::Cli, &who, &filter.to_json(), bound.rows as u64)
                    .await?;
            let summary = replay::replay(
                &settings.kafka,
                &settings.producer,
                &settings.topics.dead_letter.name,
                &db,
                &filter,
                bound,
                options,
                || {
                    bar.inc(1);
                    tracker.settle();
                },
            )
            .await;
            tracker.finish(&summary).await?;
            let summary = summary?;
            bar.finish_and_clear();
            tracing::info!(
                replayed = summary.replayed,
                failed = summary.failed.len(),
                by_class = ?summary.by_class,
                by_topic = ?summary.by_topic,
                "dlq replay done"
            );
            replayed(&summary, args.output.output);
            if !summary.failed.is_empty() {
                return Ok(ExitCode::FAILURE);
            }
        }
        DlqCommand::Purge(args) => {
            let purge = args.selection()?;
            let mut last_progress = std::time::Instant::now();
            let summary = store::purge(&db, &purge, args.dry_run, |status, deleted, done| {
                // A CronJob's log has no terminal for a bar: a line per
                // status, and one a second at most while a status runs.
                if done {
                    eprintln!("dlq purge: {deleted} {status} dead letters deleted");
                } else if last_progress.elapsed() >= Duration::from_secs(1) {
                    last_progress = std::time::Instant::now();
                    eprintln!("dlq purge: {deleted} {status} dead letters deleted so far");
                }
            })
            .await?;
            tracing::info!(
                deleted = summary.total(),
                by_status = ?summary.deleted,
                kept_heads = summary.kept_heads,
                dry_run = args.dry_run,
                older_than = %humantime::format_duration(args.older_than),
                group = purge.group.as_deref().unwrap_or("(all)"),
                "dlq purge done"
            );
            purged(&summary, args.older_than, args.output.output);
        }
        DlqCommand::Ignore {
            filter,
            reason,
            release_followers,
            keep_held,
            yes,
            output,
        } => {
            let filter = Filter::from(filter).for_ignore(&reason)?;
            let rows = store::records(&db, &filter, i64::MAX).await?;
            if !confirm("Ignore", &filter, rows.len(), yes)? {
                eprintln!("nothing ignored");
                return Ok(ExitCode::FAILURE);
            }
            let followers = match (release_followers, keep_held) {
                (true, _) => Some(Followers::Release),
                (_, true) => Some(Followers::KeepHeld),
                _ => None,
            };
            let summary = match ignore::ignore(&db, &rows, &reason, followers).await {
                Err(IgnoreError::ChoiceNeeded(why)) => {
                    eprintln!("nothing ignored: {why}");
                    return Ok(ExitCode::from(2));
                }
                other => other?,
            };
            ignored(&summary, &reason, output.output);
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn time_ms(ms: i64) -> String {
    chrono::DateTime::from_timestamp_millis(ms)
        .map(|t| t.format("%Y-%m-%d %H:%M:%S").to_string())
        .unwrap_or_else(|| ms.to_string())
}

fn short(text: &str, max: usize) -> String {
    if text.chars().count() <= max {
        text.to_string()
    } else {
        format!("{}…", text.chars().take(max).collect::<String>())
    }
}

/// `orderpipe dlq list` (and the demo's dead letters).
pub fn dead_letters(rows: &[crate::dlq::store::DeadLetter], format: Output) {
    if format == Output::Json {
        return output::json(&rows);
    }
    let table_rows = rows.iter().map(|r| {
        vec![
            r.id.to_string(),
            r.status.clone(),
            r.consumer_group.clone(),
            r.event_name.clone().unwrap_or_else(|| "-".into()),
            format!(
                "{}/{}@{}",
                r.original_topic, r.original_partition, r.original_offset
            ),
            r.error_class.clone(),
            short(&r.error_message, 60),
            r.attempts.to_string(),
            time_ms(r.last_failure_ms),
            r.replay_count.to_string(),
        ]
    });
    println!(
        "{}",
        output::table(
            &[
                "id",
                "status",
                "group",
                "event",
                "origin",
                "class",
                "error",
                "attempts",
                "last failure (UTC)",
                "replays"
            ],
            table_rows
        )
    );
    println!("{} dead letters", rows.len());
}

/// `orderpipe dlq show`.
fn dead_letter(
    record: &crate::dlq::store::DeadLetterRecord,
    decoded: &serde_json::Value,
    heads: Option<&(crate::ordering::Parked, i64)>,
    format: Output,
) {
    let r = &record.row;
    let headers: serde_json::Value = serde_json::from_str(&record.headers).unwrap_or_default();
    let doc = serde_json::json!({
        "dead_letter": r,
        "heads_parked_key": heads.map(|(p, held)| serde_json::json!({"parked": p, "held_records": held})),
        "key": record.key.as_ref().map(|k| String::from_utf8_lossy(k).into_owned()),
        "value_bytes": record.payload.as_ref().map_or(0, Vec::len),
        "headers": headers,
        "envelope": decoded,
    });
    if format == Output::Json {
        return output::json(&doc);
    }
    println!(
        "dead letter {} — {} (group {})",
        r.id, r.status, r.consumer_group
    );
    println!(
        "origin:   {} partition {} offset {}",
        r.original_topic, r.original_partition, r.original_offset
    );
    println!(
        "event:    {} {}",
        r.event_name.as_deref().unwrap_or("-"),
        r.event_id.as_deref().unwrap_or("-")
    );
    println!("error:    [{}] {}", r.error_class, r.error_message);
    println!(
        "history:  {} attempts, first failure {}, last failure {}, replayed {} times{}",
        r.attempts,
        time_ms(r.first_failure_ms),
        time_ms(r.last_failure_ms),
        r.replay_count,
        r.last_replayed_ms
            .map(|t| format!(" (last {})", time_ms(t)))
            .unwrap_or_default()
    );
    if let Some(reason) = &r.ignored_reason {
        println!("ignored:  {reason}");
    }
    if let Some((parked, held)) = heads {
        println!(
            "parked:   heads key {} (parked {}, {}): {held} records held behind it (dlq list --status held --group {})",
            parked.key,
            time_ms(parked.parked_ms),
            parked.state,
            r.consumer_group
        );
    }
    println!("key:      {}", doc["key"]);
    println!(
        "headers:\n{}",
        serde_json::to_string_pretty(&headers).unwrap_or_default()
    );
    println!(
        "envelope:\n{}",
        serde_json::to_string_pretty(decoded).unwrap_or_default()
    );
}

/// Where a parked key's head is: its dead-letter row, or the retry topic.
fn head_place(view: &crate::dlq::held::HeldView) -> String {
    match (&view.head, view.head_dead_letter) {
        (None, _) => "- (unparked; being released)".into(),
        (Some(h), Some(id)) => format!(
            "dead letter {id} ({}, {})",
            h.head_event_name.as_deref().unwrap_or("undecodable"),
            h.state
        ),
        (Some(h), None) => format!(
            "{} at {} ({})",
            h.head_event_name.as_deref().unwrap_or("undecodable"),
            h.head_origin,
            h.state
        ),
    }
}

/// `orderpipe dlq list --status held`.
fn held_records(views: &[crate::dlq::held::HeldView], format: Output) {
    if format == Output::Json {
        return output::json(&views);
    }
    let rows = views.iter().map(|v| {
        let h = &v.held;
        vec![
            h.id.to_string(),
            h.consumer_group.clone(),
            h.key.clone(),
            h.key_topic.clone(),
            h.event_name.clone().unwrap_or_else(|| "undecodable".into()),
            format!(
                "{}/{}@{}",
                h.source_topic, h.source_partition, h.source_offset
            ),
            time_ms(h.held_ms),
            head_place(v),
        ]
    });
    // A key is parked per topic: order 7 and row 7 of a table are two keys.
    println!(
        "{}",
        output::table(
            &[
                "id",
                "group",
                "key",
                "key's topic",
                "event",
                "source",
                "held since (UTC)",
                "waiting behind"
            ],
            rows
        )
    );
    println!("{} held records", views.len());
}

/// `orderpipe dlq conflicts`.
fn conflicts(conflicts: &[crate::dedup::Conflict], format: Output) {
    if format == Output::Json {
        return output::json(&conflicts);
    }
    let rows = conflicts.iter().map(|c| {
        vec![
            c.id.to_string(),
            c.consumer_group.clone(),
            c.event_id.clone(),
            c.event_name.clone(),
            format!(
                "{}/{}@{} ({})",
                c.first_topic,
                c.first_partition,
                c.first_offset,
                &c.first_digest[..12.min(c.first_digest.len())]
            ),
            format!(
                "{}/{}@{} ({})",
                c.topic,
                c.partition,
                c.offset,
                &c.digest[..12.min(c.digest.len())]
            ),
            time_ms(c.detected_ms),
        ]
    });
    println!(
        "{}",
        output::table(
            &[
                "id",
                "group",
                "event id",
                "event",
                "applied (digest)",
                "skipped (digest)",
                "detected (UTC)"
            ],
            rows
        )
    );
    println!(
        "{} conflicting duplicates: an event id reused with different content; only the applied one took effect",
        conflicts.len()
    );
}

/// `orderpipe dlq show --held`.
fn held_record(view: &crate::dlq::held::HeldView, format: Output) {
    if format == Output::Json {
        return output::json(view);
    }
    let h = &view.held;
    println!(
        "held record {} — group {}, key {} of {}",
        h.id, h.consumer_group, h.key, h.key_topic
    );
    println!(
        "event:    {} {}",
        h.event_name.as_deref().unwrap_or("undecodable"),
        h.event_id.as_deref().unwrap_or("-")
    );
    println!(
        "source:   {} partition {} offset {}",
        h.source_topic, h.source_partition, h.source_offset
    );
    println!("held:     since {}", time_ms(h.held_ms));
    println!("behind:   {}", head_place(view));
    if let Some(id) = view.head_dead_letter {
        println!(
            "release:  orderpipe dlq replay --id {id}   (or: orderpipe dlq ignore --id {id} --reason ... --release-followers)"
        );
    }
}

/// `orderpipe dlq ignore`.
fn ignored(summary: &crate::dlq::ignore::IgnoreSummary, reason: &str, format: Output) {
    if format == Output::Json {
        return output::json(summary);
    }
    println!("ignored {} dead letters: {reason}", summary.ignored);
    for (group, key, held) in &summary.released {
        println!(
            "  key {key} of {group}: released, {held} held records will be applied in order by the group's consumer"
        );
    }
    for (group, key, held) in &summary.kept_held {
        println!("  key {key} of {group}: stays parked, {held} records kept held");
    }
}

/// `orderpipe dlq stats`.
fn dlq_stats(counts: &[crate::dlq::store::Count], format: Output) {
    if format == Output::Json {
        return output::json(&counts);
    }
    let rows = counts
        .iter()
        .map(|c| vec![c.by.to_string(), c.value.clone(), c.rows.to_string()]);
    println!("{}", output::table(&["by", "value", "dead letters"], rows));
}

/// `orderpipe dlq replay --dry-run`.
fn replay_plan(plan: &[crate::dlq::replay::Planned], format: Output) {
    if format == Output::Json {
        return output::json(&plan);
    }
    // An absent event name or id prints as JSON's null, as it always has.
    let or_null = |v: &Option<String>| v.clone().unwrap_or_else(|| "null".into());
    let table_rows = plan.iter().map(|p| {
        vec![
            p.id.to_string(),
            p.group.clone(),
            or_null(&p.event_name),
            or_null(&p.event_id),
            p.to.clone(),
        ]
    });
    println!(
        "{}",
        output::table(
            &["id", "group", "event", "event id", "would go to"],
            table_rows
        )
    );
    println!(
        "dry run: {} dead letters would be replayed; nothing changed",
        plan.len()
    );
}

/// `orderpipe dlq purge`.
fn purged(summary: &store::PurgeSummary, older_than: Duration, format: Output) {
    if format == Output::Json {
        return output::json(summary);
    }
    let rows = summary
        .deleted
        .iter()
        .map(|(status, n)| vec![status.to_string(), n.to_string()]);
    let verb = if summary.dry_run {
        "would delete"
    } else {
        "deleted"
    };
    println!("{}", output::table(&["status", verb], rows));
    println!(
        "{verb} {} dead letters whose last change is older than {}{}",
        summary.total(),
        humantime::format_duration(older_than),
        if summary.dry_run {
            " (dry run: nothing changed)"
        } else {
            ""
        }
    );
    if summary.kept_heads > 0 {
        println!(
            "kept {} that head parked keys (records are held behind them: replay or ignore them first)",
            summary.kept_heads
        );
    }
}

/// `orderpipe dlq replay`.
fn replayed(summary: &crate::dlq::replay::ReplaySummary, format: Output) {
    if format == Output::Json {
        return output::json(summary);
    }
    for (topic, n) in &summary.by_topic {
        println!("replayed {n} to {topic}");
    }
    for (class, n) in &summary.by_class {
        println!("replayed {n} of class {class}");
    }
    println!(
        "replayed {}, failed {}",
        summary.replayed,
        summary.failed.len()
    );
    for f in &summary.failed {
        println!("  failed: {f}");
    }
}
