//! `orderpipe search`: the records of a topic matching a key, an event id,
//! a time range and a predicate in the subscriptions' filter language
//! ([`crate::explore::search`]), as JSON lines on stdout; progress on
//! stderr every second; Ctrl-C cancels and prints what was found.

use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Args;

use crate::config::Settings;
use crate::explore::Explorer;
use crate::explore::search::{Progress, SearchSpec};
use crate::masking::FieldMask;

/// `orderpipe search ...`.
#[derive(Debug, Args)]
pub struct SearchArgs {
    /// The topic (every partition). Default: the order topic.
    #[arg(long)]
    topic: Option<String>,
    /// The record key, exactly (an order id).
    #[arg(long)]
    key: Option<String>,
    /// The `event_id` header, exactly.
    #[arg(long)]
    event_id: Option<String>,
    /// Records at or after this time (RFC 3339).
    #[arg(long)]
    from: Option<String>,
    /// Records before this time (RFC 3339).
    #[arg(long)]
    to: Option<String>,
    /// A condition on the decoded body's data, as a subscription filter
    /// (`status:eq:1`, `order_id:in:7,9`, `status:changed:1->2`); repeat for several, all must hold.
    #[arg(long = "where")]
    predicate: Vec<String>,
    /// Read at most this many records (default 1,000,000).
    #[arg(long)]
    max_scan: Option<u64>,
    /// Show the fields of `console.masked_fields` as they are (written to
    /// the audit table); without it they show as •••.
    #[arg(long)]
    reveal: bool,
}

/// Runs `orderpipe search`.
pub async fn run(settings: &Settings, args: SearchArgs) -> anyhow::Result<ExitCode> {
    let topic = args
        .topic
        .unwrap_or_else(|| settings.topics.order_events.name.clone());
    let spec = SearchSpec::parse(
        &topic,
        args.key.as_deref(),
        args.event_id.as_deref(),
        args.from.as_deref(),
        args.to.as_deref(),
        &args.predicate,
        args.max_scan,
    )?;
    let mask = FieldMask::parse(&settings.console.masked_fields).map_err(anyhow::Error::msg)?;
    let mask = match mask.is_empty() {
        true => None,
        false => {
            let db = crate::db::Db::connect(&settings.database, 1)?;
            let target = serde_json::json!({"command": "search", "topic": topic});
            super::output::cli_mask(&db, &mask, args.reveal, target).await?
        }
    };
    let explorer = Explorer::new(&settings.kafka, &settings.producer, &settings.registry)?;
    let progress = Arc::new(Progress::default());
    let started = Instant::now();
    let watcher = {
        let progress = progress.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_secs(1));
            tick.tick().await;
            loop {
                tokio::select! {
                    _ = tick.tick() => eprintln!("{}", line(&progress, started)),
                    _ = tokio::signal::ctrl_c() => {
                        eprintln!("cancelling");
                        progress.cancel();
                    }
                }
            }
        })
    };
    let outcome = explorer.search(&spec, &progress).await;
    watcher.abort();
    let outcome = outcome?;
    for view in explorer.views(&outcome.matches).await {
        let mut view = serde_json::to_value(&view)?;
        if let Some(mask) = &mask {
            mask.apply_under(&mut view, crate::masking::RECORD_VIEW_JSON);
        }
        println!("{view}");
    }
    eprintln!(
        "{}; ended: {:?} in {:.2} s",
        line(&progress, started),
        outcome.ended,
        started.elapsed().as_secs_f64()
    );
    Ok(ExitCode::SUCCESS)
}

/// `scanned 120000 of 1000000 (12 %), 3 matches, 95000 records/s`.
fn line(progress: &Progress, started: Instant) -> String {
    let (scanned, total) = (progress.scanned(), progress.total());
    format!(
        "scanned {scanned} of {total} ({} %), {} matches, {:.0} records/s",
        (100 * scanned).checked_div(total).unwrap_or(100),
        progress.matched(),
        scanned as f64 / started.elapsed().as_secs_f64().max(1e-3)
    )
}
