//! `orderpipe consume`: one consumer group member with the chosen handlers.

use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use clap::Args;

use super::OutputArg;
use super::output::{self, Output};
use crate::config::Settings;
use crate::consumer::handler::Handler;
use crate::consumer::{self, ConsumeOptions, StartFrom};
use crate::db::Db;

/// Flags of `orderpipe consume`.
#[derive(Debug, Args)]
pub struct ConsumeArgs {
    /// Consumer group id, e.g. `inventory-service.order.created.consumer`.
    #[arg(long)]
    group: String,
    /// Handler(s) to apply, in order (repeatable or comma-separated):
    /// inventory, payment, logistics, notification, points.
    #[arg(
        long = "handler",
        required_unless_present = "reset_to",
        value_delimiter = ','
    )]
    handlers: Vec<String>,
    /// Benchmark baseline only: no retry topic or DLQ; failures wait in place.
    #[arg(long, hide = true)]
    without_error_tier: bool,
    #[command(flatten)]
    run: GroupArgs,
}

/// Flags shared by every command that runs a consumer group.
#[derive(Debug, Args)]
pub struct GroupArgs {
    /// Topic to read (default: topics.order_events.name).
    #[arg(long)]
    topic: Option<String>,
    /// Where a new group starts.
    #[arg(long, value_enum, default_value = "earliest")]
    start_from: StartFrom,
    /// Exit after this many seconds without new records and print a summary.
    #[arg(long, value_name = "SECS")]
    until_idle: Option<u64>,
    /// Serve /health/live and /health/ready here (port 0 = any free port).
    #[arg(long)]
    health_addr: Option<SocketAddr>,
    /// Apply the migrations before consuming.
    #[arg(long)]
    migrate: bool,
    /// Per-key order under failures: `key` holds an order's later events
    /// while one waits in the retry topic or the DLQ; `none` lets them pass
    /// (default: consumer.ordering, which defaults to key).
    #[arg(long, value_enum)]
    ordering: Option<crate::ordering::OrderingMode>,
    /// Rewind the group (it must have no live member) to the first record at
    /// or after this RFC 3339 time (e.g. 2026-12-01T06:30:00Z) on every
    /// partition of the topic, print each partition's old and new offset and
    /// exit without consuming. Needs --dedup: whether the records read again
    /// are applied again.
    #[arg(long, value_name = "RFC3339", value_parser = crate::rewind::parse_time, requires = "dedup")]
    reset_to: Option<chrono::DateTime<chrono::Utc>>,
    /// With --reset-to, the group's dedup rows of the records read again:
    /// `forget` applies (delivers) them again, `keep` skips them as
    /// duplicates. No default: running the handlers twice is asked by name.
    #[arg(long, value_enum, requires = "reset_to")]
    dedup: Option<DedupOnRewind>,
    #[command(flatten)]
    output: OutputArg,
}

/// What `--reset-to` does with the dedup rows of the records read again.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum DedupOnRewind {
    /// Delete them: the records are applied (delivered) again.
    Forget,
    /// Keep them: records the group applied are read again and skipped.
    Keep,
}

impl GroupArgs {
    /// `--reset-to`: rewinds `group` on the topic it reads, forgets the dedup
    /// rows of what it will read again (with `--dedup forget`) and prints
    /// each partition's old and new offset.
    async fn rewind(
        self,
        settings: &Settings,
        group: &str,
        to: chrono::DateTime<chrono::Utc>,
    ) -> anyhow::Result<ExitCode> {
        let topic = self
            .topic
            .unwrap_or_else(|| settings.topics.order_events.name.clone());
        let rewound =
            crate::rewind::rewind(&settings.kafka, group, std::slice::from_ref(&topic), to).await?;
        let forgotten = if self.dedup != Some(DedupOnRewind::Forget) {
            None
        } else {
            let db = Db::connect(&settings.database, 1)?;
            let retry = crate::retry::retry_topic(&topic, group);
            Some(crate::rewind::forget_applied(&db, group, &rewound, &retry, to).await?)
        };
        tracing::info!(group, reset_to = %to.to_rfc3339(), partitions = rewound.len(), dedup_rows_forgotten = ?forgotten, "group rewound");
        rewound_report(group, to, &rewound, forgotten, self.output.output);
        Ok(ExitCode::SUCCESS)
    }

    /// Runs `group` with `handlers` until shutdown (or idle) and prints the summary.
    async fn run(
        self,
        settings: &Settings,
        group: String,
        handlers: Vec<Arc<dyn Handler>>,
        error_tier: bool,
    ) -> anyhow::Result<ExitCode> {
        if let Some(to) = self.reset_to {
            return self.rewind(settings, &group, to).await;
        }
        // Before start-up: a SIGTERM in it stops the group cleanly rather than killing it.
        super::signals::install()?;
        crate::consumer::naming::warn_unless_house_pattern(&group);
        let topic = self
            .topic
            .unwrap_or_else(|| settings.topics.order_events.name.clone());
        let needed = consumer::connections_needed(&settings.topics, &topic, error_tier);
        // Unset, the pool is what the workers need; a value set below that is raised, and said so.
        let pool = match settings.database.max_connections {
            Some(configured) if configured < needed => {
                tracing::warn!(
                    configured,
                    needed,
                    "database.max_connections is below what this consumer's partition workers use at once; the pool is raised to {needed}"
                );
                needed
            }
            Some(configured) => configured,
            None => needed.max(crate::db::DEFAULT_POOL),
        };
        let db = Db::connect(&settings.database, pool)?;
        if self.migrate {
            db.migrate().await?;
        }
        // The group's own dead-letter gauges, on a connection of their own:
        // exported with the persister down too (see crate::dlq::gauges).
        let gauges = tokio::spawn(crate::dlq::gauges::export(
            Db::connect(&settings.database, 1)?,
            crate::dlq::gauges::Scope::Group(group.clone()),
            Duration::from_secs(settings.dlq.gauge_interval_secs),
        ));
        let options = ConsumeOptions {
            group,
            handlers,
            topic,
            reads: Vec::new(),
            start_from: self.start_from,
            until_idle: self.until_idle.map(Duration::from_secs),
            health_addr: self.health_addr,
            error_tier,
            ordering: self.ordering.unwrap_or(settings.consumer.ordering),
            crash_before_forward_ack: crash_before_forward_ack(settings)?,
            commit_stamps: commit_stamps(settings)?,
        };
        let summary = consumer::run(
            crate::startup::consumer_sections(settings),
            db,
            options,
            shutdown_signal(),
        )
        .await;
        gauges.abort();
        consume(&summary?, self.output.output);
        Ok(ExitCode::SUCCESS)
    }
}

/// The handler `--handler NAME` names: a built-in one, or in a `harness`
/// build also `chaos`.
#[cfg(feature = "harness")]
fn handler_by_name(name: &str, settings: &Settings) -> Result<Arc<dyn Handler>, String> {
    crate::harness::chaos::handler_by_name(name, settings)
}

/// The test hook `chaos.crash_before_forward_ack` (a `harness` build only).
#[cfg(feature = "harness")]
fn crash_before_forward_ack(settings: &Settings) -> anyhow::Result<bool> {
    let chaos = crate::harness::chaos::ChaosSettings::from_settings(settings)
        .map_err(anyhow::Error::msg)?;
    Ok(chaos.crash_before_forward_ack)
}

/// Without the harness there is no test hook.
#[cfg(not(feature = "harness"))]
fn crash_before_forward_ack(_settings: &Settings) -> anyhow::Result<bool> {
    Ok(false)
}

/// The benchmark hook `chaos.commit_stamps` (a `harness` build only): the
/// file the applied events' after-commit stamps are appended to.
#[cfg(feature = "harness")]
fn commit_stamps(
    settings: &Settings,
) -> anyhow::Result<Option<Arc<dyn crate::clock::CommitStamps>>> {
    let chaos = crate::harness::chaos::ChaosSettings::from_settings(settings)
        .map_err(anyhow::Error::msg)?;
    let Some(path) = chaos.commit_stamps else {
        return Ok(None);
    };
    let file = crate::harness::latency::StampFile::append(&path)
        .map_err(|e| anyhow::anyhow!("chaos.commit_stamps {}: {e}", path.display()))?;
    Ok(Some(Arc::new(file)))
}

/// Without the harness there are no commit stamps.
#[cfg(not(feature = "harness"))]
fn commit_stamps(
    _settings: &Settings,
) -> anyhow::Result<Option<Arc<dyn crate::clock::CommitStamps>>> {
    Ok(None)
}

/// The built-in handler `--handler NAME` names.
#[cfg(not(feature = "harness"))]
fn handler_by_name(name: &str, _settings: &Settings) -> Result<Arc<dyn Handler>, String> {
    use crate::consumer::handlers;
    handlers::by_name(name).ok_or_else(|| handlers::unknown(name, &[]))
}

/// Runs the command.
pub async fn run(settings: &Settings, args: ConsumeArgs) -> anyhow::Result<ExitCode> {
    let handlers = args
        .handlers
        .iter()
        .map(|name| handler_by_name(name.trim(), settings))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| anyhow::anyhow!("--handler: {e}"))?;
    args.run
        .run(settings, args.group, handlers, !args.without_error_tier)
        .await
}

/// Flags of `orderpipe deliver`.
#[derive(Debug, Args)]
pub struct DeliverArgs {
    /// The `[[http.subscriptions]]` entry to deliver. Without it: the
    /// router, serving every enabled subscription of the subscription tables.
    #[arg(long)]
    subscription: Option<String>,
    /// Router only: time between two reconciliations of the desired groups
    /// with the broker's groups and topics (orphans are reported, never deleted).
    #[arg(long, value_name = "DURATION", default_value = "5m", value_parser = humantime::parse_duration, conflicts_with = "subscription")]
    reconcile_interval: std::time::Duration,
    /// Router only: serve the admin API (`[admin]`, token from
    /// `admin.token`) here too, with this router's groups in `GET /bindings`.
    #[arg(long, value_name = "ADDR", conflicts_with = "subscription")]
    admin_addr: Option<std::net::SocketAddr>,
    /// Consumer group (default: http.<subscription>).
    #[arg(long)]
    group: Option<String>,
    #[command(flatten)]
    run: GroupArgs,
}

/// Runs `orderpipe deliver`: a consumer group delivering one subscription.
pub async fn deliver(
    settings: &Settings,
    config: Option<std::path::PathBuf>,
    args: DeliverArgs,
) -> anyhow::Result<ExitCode> {
    if let Some(to) = args.run.reset_to {
        let group = match (args.group, &args.subscription) {
            (Some(group), _) => group,
            (None, Some(name)) => crate::delivery::default_group(name),
            (None, None) => anyhow::bail!(
                "--reset-to: name the group to rewind with --group G (or --subscription NAME for its group http.NAME)"
            ),
        };
        return args.run.rewind(settings, &group, to).await;
    }
    // Before start-up: a SIGTERM in it stops the process cleanly rather than killing it.
    super::signals::install()?;
    let Some(name) = args.subscription else {
        return route(
            settings,
            args.group,
            args.reconcile_interval,
            args.admin_addr,
            args.run,
        )
        .await;
    };
    let subscription = crate::delivery::find(&settings.http, &name).map_err(anyhow::Error::msg)?;
    let group = args
        .group
        .unwrap_or_else(|| crate::delivery::default_group(&name));
    let mut settings = settings.clone();
    // The subscription's retry table goes on top of its group's layers.
    settings.retry.top = Some(subscription.retry_top().map_err(anyhow::Error::msg)?);
    settings.retry.policy_for(&group)?;
    let (handler, shared) = crate::delivery::HttpDelivery::new(subscription);
    let path =
        config.unwrap_or_else(|| std::path::PathBuf::from(crate::config::DEFAULT_CONFIG_FILE));
    let reload_path = path.clone();
    crate::delivery::watch(path, shared, move || {
        Settings::load(Some(&reload_path))
            .map_err(|e| e.to_string())
            .and_then(|s| crate::delivery::find(&s.http, &name))
    });
    args.run
        .run(&settings, group, vec![Arc::new(handler)], true)
        .await
}

/// `orderpipe deliver` without `--subscription`: the router, until SIGINT or SIGTERM.
async fn route(
    settings: &Settings,
    group: Option<String>,
    reconcile_interval: Duration,
    admin_addr: Option<SocketAddr>,
    run: GroupArgs,
) -> anyhow::Result<ExitCode> {
    if group.is_some() || run.topic.is_some() || run.until_idle.is_some() || run.dedup.is_some() {
        anyhow::bail!(
            "--group, --topic and --until-idle need --subscription NAME: the router (deliver without \
             --subscription) runs one group per consumer and bind_key of the subscription tables, on the order topic"
        );
    }
    if reconcile_interval.is_zero() {
        anyhow::bail!("--reconcile-interval must be at least 1s");
    }
    let db = Db::connect(&settings.database, 2)?;
    if run.migrate {
        db.migrate().await?;
    }
    let options = crate::router::RouterOptions {
        start_from: run.start_from,
        ordering: run.ordering.unwrap_or(settings.consumer.ordering),
        reconcile_interval,
    };
    if let Some(addr) = run.health_addr {
        // /metrics (the router's and its groups' series) and /health/*.
        let health = crate::health::HealthState::service();
        crate::health::watch_db(db.clone(), health.clone());
        let bound = crate::health::serve(addr, health).await?;
        eprintln!("health endpoints on http://{bound}/health/ready");
    }
    let actual = crate::router::Actual::default();
    let admin = match admin_addr {
        None => None,
        Some(addr) => {
            use crate::subscriptions::admin::{self, AdminState};
            let state = AdminState::new(
                db.clone(),
                &settings.topics.order_events.name,
                settings.admin.token.as_ref(),
            )
            .with_actual(Arc::new(actual.clone()));
            let health = crate::health::HealthState::service();
            crate::health::watch_db(db.clone(), health.clone());
            Some(tokio::spawn(admin::serve(
                addr,
                state,
                health,
                |bound| eprintln!("admin API listening on http://{bound}"),
                std::future::pending(),
            )))
        }
    };
    eprintln!("router started: serving every enabled subscription (stop with SIGTERM)");
    crate::router::run(settings.clone(), db, options, actual, shutdown_signal()).await;
    if let Some(admin) = admin {
        admin.abort();
    }
    Ok(ExitCode::SUCCESS)
}

pub use super::signals::shutdown_signal;

/// `--reset-to`: each partition's old and new offset.
fn rewound_report(
    group: &str,
    to: chrono::DateTime<chrono::Utc>,
    rewound: &[crate::rewind::RewoundPartition],
    dedup_rows_forgotten: Option<u64>,
    format: Output,
) {
    if format == Output::Json {
        return output::json(&serde_json::json!({
            "group": group,
            "reset_to": to.to_rfc3339(),
            "partitions": rewound,
            "dedup_rows_forgotten": dedup_rows_forgotten,
        }));
    }
    let rows = rewound.iter().map(|p| {
        let old = p
            .old_offset
            .map_or_else(|| "none".to_string(), |o| o.to_string());
        let moved = p
            .old_offset
            .map_or_else(|| "-".to_string(), |o| format!("{:+}", p.new_offset - o));
        vec![
            p.topic.clone(),
            p.partition.to_string(),
            old,
            p.new_offset.to_string(),
            moved,
        ]
    });
    println!("group {group} rewound to {}:", to.to_rfc3339());
    println!(
        "{}",
        output::table(
            &["topic", "partition", "old offset", "new offset", "moved"],
            rows
        )
    );
    match dedup_rows_forgotten {
        Some(n) => println!("dedup rows forgotten: {n} (the records read again are applied again)"),
        None => println!(
            "dedup rows kept (--dedup keep): records read again that the group applied are skipped as duplicates"
        ),
    }
}

/// `orderpipe consume` (at exit).
fn consume(summary: &crate::consumer::ConsumeSummary, format: Output) {
    if format == Output::Json {
        return output::json(summary);
    }
    println!(
        "group {}: consumed {}, applied {}, duplicates skipped {}, poison {}, failed attempts {}, \
         recovered by local retry {}, sent to retry topic {}, dead-lettered {}, \
         held behind a parked key {}, released in order {}",
        summary.group,
        summary.consumed,
        summary.applied,
        summary.duplicates,
        summary.decode_failures,
        summary.apply_failures,
        summary.recovered_locally,
        summary.sent_to_retry,
        summary.dead_lettered,
        summary.held,
        summary.released
    );
    if summary.unsupported_versions + summary.conflicting_duplicates > 0 {
        println!(
            "unsupported event_version (dead-lettered) {}, conflicting duplicates (event id reused, see `orderpipe dlq conflicts`) {}",
            summary.unsupported_versions, summary.conflicting_duplicates
        );
    }
    let rows = summary.handlers.iter().map(|(name, c)| {
        vec![
            name.clone(),
            c.applied.to_string(),
            c.already_done.to_string(),
            c.ignored.to_string(),
        ]
    });
    println!(
        "{}",
        output::table(
            &["handler", "applied", "already done", "not its event"],
            rows
        )
    );
}
