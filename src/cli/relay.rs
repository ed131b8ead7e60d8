//! `orderpipe api` and `orderpipe relay`: the producer side.

use std::net::SocketAddr;
use std::process::ExitCode;
use std::time::Duration;

use clap::Args;

use super::OutputArg;
use super::consume::shutdown_signal;
use super::output::{self, Output};
use crate::cdc::binlog::BinlogPosition;
use crate::config::Settings;
use crate::db::Db;
use crate::health::HealthState;
use crate::outbox::OutboxSource;
use crate::outbox::relay::{CrashPoint, Relay, RelayOptions};
use crate::outbox::wake::{WakeListener, WakeNotifier};

/// Flags of `orderpipe api`.
#[derive(Debug, Args)]
pub struct ApiArgs {
    /// Listen address (port 0 = any free port; the bound one is printed).
    #[arg(long, default_value = "127.0.0.1:8080")]
    addr: SocketAddr,
    /// Wake the relay listening at HOST:PORT after each commit (repeatable or
    /// comma-separated; a name may resolve to every relay pod). Default:
    /// outbox.wake_targets.
    #[arg(long = "wake-relay", value_name = "HOST:PORT", value_delimiter = ',')]
    wake_relay: Vec<String>,
    /// Apply the migrations first.
    #[arg(long)]
    migrate: bool,
}

/// Flags of `orderpipe relay`.
#[derive(Debug, Args)]
pub struct RelayArgs {
    /// Where to read the outbox: binlog (its inserts in the binlog), poll (claim queries), or
    /// auto (binlog when the database allows it, else poll). Default: outbox.source.
    #[arg(long, value_enum)]
    source: Option<OutboxSource>,
    /// Binlog source: where to start when it has no checkpoint yet, FILE:POS (as SHOW MASTER
    /// STATUS prints). Default: the binlog's current end. Ignored once a checkpoint exists.
    #[arg(long, value_parser = BinlogPosition::parse)]
    start_position: Option<BinlogPosition>,
    /// Name of this instance in the shard leases (the pod name); unique among running relays.
    #[arg(long, env = "HOSTNAME", default_value = "relay-0")]
    instance: String,
    /// Prefix of the per-shard `transactional.id`s (<prefix>-shard-<n>): whoever takes a shard fences
    /// its previous owner. Default: producer.transactional_id_prefix (orderpipe-relay).
    #[arg(long)]
    transactional_id_prefix: Option<String>,
    /// Outbox rows per Kafka transaction.
    #[arg(long, default_value_t = 500)]
    batch_size: i64,
    /// Milliseconds between polls of an empty outbox (a wake-up ends the wait early).
    #[arg(long, default_value_t = 100)]
    poll_ms: u64,
    /// Listen for the API's wake-up datagrams at HOST:PORT (UDP; port 0 = any
    /// free port, printed). Default: outbox.wake_listen (empty: do not listen).
    #[arg(long, value_name = "HOST:PORT")]
    wake_listen: Option<String>,
    /// Seconds a shard lease lasts without renewal.
    #[arg(long, default_value_t = 10)]
    lease_ttl: u64,
    /// Purge sent rows older than this.
    #[arg(long, default_value = "7d", value_parser = humantime::parse_duration)]
    sent_retention: Duration,
    /// Exit after this many seconds with nothing to publish.
    #[arg(long, value_name = "SECS")]
    until_idle: Option<u64>,
    /// Test hook: abort the process at this point of the first batch.
    #[arg(long, value_enum, hide = true)]
    crash_at: Option<CrashPoint>,
    /// Serve /metrics and /health/* here (port 0 = any free port).
    #[arg(long)]
    health_addr: Option<SocketAddr>,
    /// Apply the migrations first.
    #[arg(long)]
    migrate: bool,
    #[command(flatten)]
    output: OutputArg,
}

/// Runs `orderpipe api`.
pub async fn api(settings: &Settings, args: ApiArgs) -> anyhow::Result<ExitCode> {
    // Before start-up: a SIGTERM in it stops the API cleanly rather than killing it.
    super::signals::install()?;
    let db = Db::connect(&settings.database, settings.database.pool_size())?;
    if args.migrate {
        db.migrate().await?;
    }
    let health = HealthState::service();
    crate::health::watch_db(db.clone(), health.clone());
    let mut wake = settings.outbox.clone();
    if !args.wake_relay.is_empty() {
        wake.wake_targets = args.wake_relay;
    }
    wake.validate()
        .map_err(|e| anyhow::anyhow!("--wake-relay: {e}"))?;
    let notifier = WakeNotifier::from_settings(&wake)?;
    if let Some(n) = &notifier {
        eprintln!("waking relays at {:?} after each commit", n.targets());
    }
    let limits =
        crate::api::record_limits(&settings.kafka, &settings.producer, &settings.topics).await;
    let service = crate::api::service(&settings.producer, &settings.topics, db)
        .with_wake(notifier)
        .with_record_limits(limits);
    crate::api::serve(
        args.addr,
        service,
        health,
        |bound| eprintln!("order API listening on http://{bound}"),
        shutdown_signal(),
    )
    .await?;
    Ok(ExitCode::SUCCESS)
}

/// Runs `orderpipe relay`.
pub async fn relay(settings: &Settings, args: RelayArgs) -> anyhow::Result<ExitCode> {
    // Before start-up: a SIGTERM in it stops the relay cleanly rather than killing it.
    super::signals::install()?;
    let source = match args.source.unwrap_or(settings.outbox.source) {
        OutboxSource::Auto => {
            match crate::outbox::log_relay::binlog_usable(&settings.database.url).await {
                Ok(()) => OutboxSource::Binlog,
                Err(why) => {
                    tracing::warn!(%why, "relay: outbox.source = auto: polling the outbox, the binlog is not usable");
                    eprintln!(
                        "relay: outbox.source = auto: polling the outbox table, because the binlog is not usable: {why}"
                    );
                    OutboxSource::Poll
                }
            }
        }
        chosen => chosen,
    };
    if source == OutboxSource::Binlog {
        return log_relay(settings, args).await;
    }
    // The shard pipelines share 8 connections: with one per claim and mark
    // (34), the marks of different shards contended on the same
    // clustered-index pages (their ids interleave): 8.0k rows/s against
    // 13.1k with 8 (400k rows, batch 500).
    let db = Db::connect(&settings.database, 8)?;
    if args.migrate {
        db.migrate().await?;
    }
    let wake = match args
        .wake_listen
        .as_deref()
        .unwrap_or(&settings.outbox.wake_listen)
    {
        "" => None,
        addr => {
            let listener = WakeListener::bind(addr)
                .map_err(|e| anyhow::anyhow!("--wake-listen {addr}: {e}"))?;
            eprintln!(
                "relay wake-up listening on udp://{}",
                listener.local_addr()?
            );
            Some(std::sync::Arc::new(listener))
        }
    };
    let options = RelayOptions {
        instance: args.instance,
        transactional_id_prefix: args
            .transactional_id_prefix
            .unwrap_or_else(|| settings.producer.transactional_id_prefix.clone()),
        batch_size: args.batch_size.max(1),
        poll_interval: Duration::from_millis(args.poll_ms),
        lease_ttl: Duration::from_secs(args.lease_ttl.max(1)),
        sent_retention: args.sent_retention,
        until_idle: args.until_idle.map(Duration::from_secs),
        crash_at: args.crash_at,
        wake,
    };
    serve_health(args.health_addr, &db).await?;
    require_topics(settings)?;
    let relay = Relay::new(crate::startup::relay_sections(settings), db, options).await?;
    // A shard producer that keeps failing fatally ends the process non-zero.
    let summary = relay.run(shutdown_signal()).await?;
    match args.output.output {
        Output::Json => println!("{}", serde_json::to_string_pretty(&summary)?),
        Output::Table => print_relay(&summary),
    }
    Ok(ExitCode::SUCCESS)
}

/// `orderpipe relay` reading the outbox from the binlog ([`crate::outbox::log_relay`]).
async fn log_relay(settings: &Settings, args: RelayArgs) -> anyhow::Result<ExitCode> {
    use crate::outbox::log_relay::{self, LogRelayOptions};
    if args.crash_at.is_some() {
        anyhow::bail!(
            "--crash-at belongs to the polling relay; with --source binlog (or outbox.source = \"binlog\") leave it out, or pass --source poll"
        );
    }
    // The wake-up shortens the polling relay's waits; the binlog stream
    // needs none (a chart may pass it for an `auto` that falls back).
    if let Some(addr) = args.wake_listen.as_deref().filter(|a| !a.is_empty()) {
        eprintln!("relay: reading the binlog; --wake-listen {addr} is not needed and not opened");
    }
    let db = Db::connect(&settings.database, 4)?;
    if args.migrate {
        db.migrate().await?;
    }
    crate::metrics::install();
    let health = log_relay::health();
    if let Some(addr) = args.health_addr {
        let bound = crate::health::serve(addr, health.clone()).await?;
        eprintln!("health endpoints on http://{bound}/health/ready");
    }
    require_topics(settings)?;
    let options = LogRelayOptions {
        instance: args.instance,
        transactional_id_prefix: args
            .transactional_id_prefix
            .unwrap_or_else(|| settings.producer.transactional_id_prefix.clone()),
        lease_ttl: Duration::from_secs(args.lease_ttl.max(1)),
        sent_retention: args.sent_retention,
        start_position: args.start_position,
        health: Some(health),
        until_idle: args.until_idle.map(Duration::from_secs),
    };
    let summary = log_relay::run(
        crate::startup::log_relay_sections(settings),
        db,
        options,
        shutdown_signal(),
    )
    .await?;
    match args.output.output {
        Output::Json => println!("{}", serde_json::to_string_pretty(&summary)?),
        Output::Table => println!(
            "relay (binlog): published {} outbox rows in {} Kafka transactions, dead-lettered {}, deleted {} published rows; checkpoint {}",
            summary.published,
            summary.transactions,
            summary.dead_lettered,
            summary.deleted,
            super::cdc::position_text(&summary.checkpoint, &summary.started_at)
        ),
    }
    if args.output.output == Output::Table {
        println!("{}", output::stage_table(&summary.stages_ms));
    }
    Ok(ExitCode::SUCCESS)
}

/// Checks the topics a relay writes exist as declared (read-only rights on
/// topics: it never creates or alters them).
fn require_topics(settings: &Settings) -> anyhow::Result<()> {
    let required = [
        &settings.topics.order_events,
        &settings.topics.inventory_events,
        &settings.topics.dead_letter,
    ]
    .map(crate::topics::Required::declared);
    crate::topics::require_with(
        &settings.kafka,
        &required,
        &crate::topics::ensure_command(None),
    )?;
    Ok(())
}

/// Serves `/metrics` and `/health/*` for a role that does not consume.
pub async fn serve_health(addr: Option<SocketAddr>, db: &Db) -> anyhow::Result<()> {
    crate::metrics::install();
    let Some(addr) = addr else { return Ok(()) };
    let health = HealthState::service();
    crate::health::watch_db(db.clone(), health.clone());
    let bound = crate::health::serve(addr, health).await?;
    eprintln!("health endpoints on http://{bound}/health/ready");
    Ok(())
}

/// `orderpipe relay` (at exit).
fn print_relay(summary: &crate::outbox::relay::RelaySummary) {
    println!(
        "relay: published {} outbox rows in {} Kafka transactions ({} aborted), dead-lettered {}, purged {} sent rows",
        summary.published,
        summary.transactions,
        summary.aborted,
        summary.dead_lettered,
        summary.purged
    );
    let rows = summary
        .by_topic
        .iter()
        .map(|(t, n)| vec![t.clone(), n.to_string()]);
    println!("{}", output::table(&["topic", "records"], rows));
    println!("{}", output::stage_table(&summary.stages_ms));
}
