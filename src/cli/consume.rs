//! `orderpipe consume`: one consumer group member with the chosen handlers.

use std::net::SocketAddr;
use std::process::ExitCode;
use std::time::Duration;

use clap::Args;

use super::OutputArg;
use super::output;
use crate::config::Settings;
use crate::consumer::{self, ConsumeOptions, StartFrom, handlers};
use crate::db::Db;

/// Flags of `orderpipe consume`.
#[derive(Debug, Args)]
pub struct ConsumeArgs {
    /// Consumer group id, e.g. `inventory-service.order.created.consumer`.
    #[arg(long)]
    group: String,
    /// Handler(s) to apply, in order (repeatable or comma-separated):
    /// inventory, payment, logistics, notification, points.
    #[arg(long = "handler", required = true, value_delimiter = ',')]
    handlers: Vec<String>,
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
    /// Benchmark baseline only: no retry topic or DLQ; failures wait in place.
    #[arg(long, hide = true)]
    without_error_tier: bool,
    #[command(flatten)]
    output: OutputArg,
}

/// Runs the command.
pub async fn run(settings: &Settings, args: ConsumeArgs) -> anyhow::Result<ExitCode> {
    let handlers = args
        .handlers
        .iter()
        .map(|name| handlers::by_name(name.trim(), settings))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| anyhow::anyhow!("--handler: {e}"))?;
    let db = Db::connect(&settings.database, settings.database.max_connections)?;
    if args.migrate {
        db.migrate().await?;
    }
    let options = ConsumeOptions {
        group: args.group,
        handlers,
        topic: args.topic.unwrap_or_else(|| settings.topics.order_events.name.clone()),
        start_from: args.start_from,
        until_idle: args.until_idle.map(Duration::from_secs),
        health_addr: args.health_addr,
        ensure_topics: true,
        error_tier: !args.without_error_tier,
    };
    let summary = consumer::run(settings, db, options, shutdown_signal()).await?;
    output::consume(&summary, args.output.output);
    Ok(ExitCode::SUCCESS)
}

/// Flags of `orderpipe deliver`.
#[derive(Debug, Args)]
pub struct DeliverArgs {
    /// The `[[http.subscriptions]]` entry to deliver.
    #[arg(long)]
    subscription: String,
    /// Consumer group (default: http.<subscription>).
    #[arg(long)]
    group: Option<String>,
    /// Topic to read (default: topics.order_events.name).
    #[arg(long)]
    topic: Option<String>,
    /// Exit after this many seconds without new records and print a summary.
    #[arg(long, value_name = "SECS")]
    until_idle: Option<u64>,
    /// Serve /health/live and /health/ready here.
    #[arg(long)]
    health_addr: Option<SocketAddr>,
    /// Apply the migrations before consuming.
    #[arg(long)]
    migrate: bool,
    #[command(flatten)]
    output: OutputArg,
}

/// Runs `orderpipe deliver`: a consumer group delivering one subscription.
pub async fn deliver(settings: &Settings, config: Option<std::path::PathBuf>, args: DeliverArgs) -> anyhow::Result<ExitCode> {
    let subscription = crate::delivery::find(settings, &args.subscription).map_err(anyhow::Error::msg)?;
    let mut settings = settings.clone();
    // The subscription's retry profile is its group's schedule.
    settings.retry.profile = subscription.retry_profile.clone();
    let (handler, shared) = crate::delivery::HttpDelivery::new(subscription);
    crate::delivery::watch(config, shared);
    let db = Db::connect(&settings.database, settings.database.max_connections)?;
    if args.migrate {
        db.migrate().await?;
    }
    let options = ConsumeOptions {
        group: args.group.unwrap_or_else(|| format!("http.{}", args.subscription)),
        handlers: vec![std::sync::Arc::new(handler)],
        topic: args.topic.unwrap_or_else(|| settings.topics.order_events.name.clone()),
        start_from: StartFrom::Earliest,
        until_idle: args.until_idle.map(Duration::from_secs),
        health_addr: args.health_addr,
        ensure_topics: true,
        error_tier: true,
    };
    let summary = consumer::run(&settings, db, options, shutdown_signal()).await?;
    output::consume(&summary, args.output.output);
    Ok(ExitCode::SUCCESS)
}

/// Resolves on SIGINT or SIGTERM.
pub async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            .expect("SIGTERM handler installs");
        tokio::select! {
            _ = ctrl_c => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    let _ = ctrl_c.await;
}
