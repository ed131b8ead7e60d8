//! `orderpipe cdc`: the binlog source (see [`crate::cdc`]).

use std::net::SocketAddr;
use std::process::ExitCode;

use clap::Args;

use super::OutputArg;
use super::consume::shutdown_signal;
use super::output::Output;
use crate::cdc::binlog::BinlogPosition;
use crate::cdc::catalogue::{Capture, Watch, capture, source_url};
use crate::cdc::{CdcOptions, CdcSections, CdcSummary};
use crate::config::Settings;
use crate::subscriptions::store::Origin;

/// Flags of `orderpipe cdc`; each overrides its `[cdc]` key.
#[derive(Debug, Args)]
pub struct CdcArgs {
    /// Table to capture, <database>.<table> (repeatable or comma-separated). Default: cdc.tables.
    #[arg(long = "table", value_delimiter = ',')]
    tables: Vec<String>,
    /// Capture the cdc_sources row NAME instead: its host, port and user, and the tables of
    /// its event definitions (password: cdc.source / database.url). Default: cdc.source_name.
    #[arg(long = "source", value_name = "NAME")]
    source_name: Option<String>,
    /// Source name: key of its checkpoint, part of its transactional.id. Default: cdc.name.
    #[arg(long)]
    name: Option<String>,
    /// The replica's server_id, unique among the source's replicas. Default: cdc.server_id.
    #[arg(long)]
    server_id: Option<u32>,
    /// Where to start when the source has no checkpoint yet, FILE:POS (as SHOW MASTER STATUS
    /// prints). Default: the binlog's current end. Ignored once a checkpoint exists.
    #[arg(long, value_parser = BinlogPosition::parse)]
    start_position: Option<BinlogPosition>,
    /// How to resume from the checkpoint: auto (by position on the server that wrote it, by
    /// GTID on another one), position, or gtid. Default: cdc.resume.
    #[arg(long, value_enum)]
    resume: Option<crate::cdc::binlog::ResumeMode>,
    /// Serve /metrics, /health/live and /health/ready here (port 0 = any free
    /// port); ready once the binlog stream is open and the Kafka
    /// transactional producer initialised.
    #[arg(long)]
    health_addr: Option<SocketAddr>,
    #[command(flatten)]
    output: OutputArg,
    #[command(subcommand)]
    command: Option<CdcCommand>,
}

/// `orderpipe cdc snapshot`.
#[derive(Debug, clap::Subcommand)]
enum CdcCommand {
    /// Snapshots of tables' existing rows. Incremental (start|stop|pause|resume|status):
    /// the running `cdc` reads them in key chunks beside the stream, as `read` records
    /// (docs/cdc.md, "Incremental snapshots"). `--blocking --table T`: the whole table as
    /// inserts in one Kafka transaction, with the stream stopped (small tables). With a
    /// source row (`cdc --source NAME snapshot`, or cdc.source_name), from that row's
    /// database, and only a table its event definitions capture.
    Snapshot {
        #[command(subcommand)]
        action: Option<super::snapshot::SnapshotAction>,
        /// The blocking snapshot of --table: stop the running `cdc` of the same name
        /// first, start it after.
        #[arg(long)]
        blocking: bool,
        /// The table of --blocking, <database>.<table>.
        #[arg(long)]
        table: Option<String>,
        /// Source name (whose checkpoint it continues, whose signals it sends). Default: cdc.name.
        #[arg(long, global = true)]
        name: Option<String>,
        /// The replica's server_id for catching up to the snapshot (--blocking). Default: cdc.server_id.
        #[arg(long)]
        server_id: Option<u32>,
        #[command(flatten)]
        output: OutputArg,
    },
}

/// Runs `orderpipe cdc` until SIGTERM or Ctrl-C.
pub async fn run(settings: &Settings, args: CdcArgs) -> anyhow::Result<ExitCode> {
    if let Some(CdcCommand::Snapshot {
        action,
        blocking,
        table,
        name,
        server_id,
        output,
    }) = args.command
    {
        return match (action, blocking, table) {
            (Some(action), false, None) => {
                let name = name.unwrap_or_else(|| settings.cdc.name.clone());
                super::snapshot::run(settings, &name, action, output.output).await
            }
            (None, true, Some(table)) => {
                snapshot(settings, table, name, args.source_name, server_id, output).await
            }
            (None, true, None) => {
                anyhow::bail!("--blocking needs --table <database>.<table>, the table to snapshot")
            }
            (None, false, _) => anyhow::bail!(
                "cdc snapshot: name an action (start, stop, pause, resume, status: the incremental \
                 snapshot beside the running stream), or --blocking --table <database>.<table> \
                 for the old blocking snapshot with the stream stopped"
            ),
            (Some(_), _, _) => anyhow::bail!(
                "cdc snapshot: --blocking and --table go without an action \
                 (cdc snapshot start --table T queues an incremental one)"
            ),
        };
    }
    // Before start-up: a SIGTERM in it stops the process cleanly rather than killing it.
    super::signals::install()?;
    let mut cdc = settings.cdc.clone();
    let tables_by = if args.tables.is_empty() {
        "cdc.tables"
    } else {
        "--table"
    };
    if !args.tables.is_empty() {
        cdc.tables = args.tables;
    }
    if let Some(name) = args.name {
        cdc.name = name;
    }
    if let Some(id) = args.server_id {
        cdc.server_id = id;
    }
    if let Some(resume) = args.resume {
        cdc.resume = resume;
    }
    let source_by = if args.source_name.is_some() {
        "--source"
    } else {
        "cdc.source_name"
    };
    if let Some(name) = args.source_name {
        cdc.source_name = Some(name);
    }
    // The process's own source URL: the password of a cdc_sources row's user.
    let own_source = cdc.source.clone();
    // The settings before a row's are applied: its own column rules, which
    // the row's may not name again (checked when the capture is read).
    let own = cdc.clone();
    let mut watch = None;
    if let Some(name) = cdc.source_name.clone() {
        if !cdc.tables.is_empty() {
            anyhow::bail!(
                "{source_by} {name} and {tables_by} both say what to capture: use one \
                 (the source's event definitions, or a list of tables)"
            );
        }
        let (w, capture) = Watch::start(control_plane(settings)?, &name, &own).await?;
        apply(settings, &mut cdc, own_source.as_ref(), &capture)?;
        watch = Some((w, capture));
    }
    crate::metrics::install();
    let health = crate::cdc::health();
    if let Some(addr) = args.health_addr {
        let bound = crate::health::serve(addr, health.clone()).await?;
        eprintln!("health endpoints on http://{bound}/health/ready");
    }
    let mut summary = CdcSummary::default();
    loop {
        let options = CdcOptions {
            start_position: args.start_position.clone(),
            health: Some(health.clone()),
        };
        // Stops the stream at a signal, or (--source) when the control
        // plane changes what it captures: then it starts again from its checkpoint.
        let mut next = None;
        let stop = async {
            match watch.as_mut() {
                Some((w, current)) => tokio::select! {
                    () = shutdown_signal() => {}
                    capture = w.changed(&own, current) => next = Some(capture),
                },
                None => shutdown_signal().await,
            }
        };
        let run = crate::cdc::run(sections(settings, &cdc), options, stop).await?;
        summary.changes += run.changes;
        summary.binlog_transactions += run.binlog_transactions;
        summary.kafka_transactions += run.kafka_transactions;
        summary.started_at = summary.started_at.or(run.started_at);
        summary.checkpoint = run.checkpoint.or(summary.checkpoint);
        // Percentiles do not add up across streams: the last one's.
        if !run.stages_ms.is_empty() {
            summary.stages_ms = run.stages_ms;
        }
        let (Some(capture), Some((_, current))) = (next, watch.as_mut()) else {
            break;
        };
        apply(settings, &mut cdc, own_source.as_ref(), &capture)?;
        *current = capture;
    }
    match args.output.output {
        Output::Json => println!("{}", serde_json::to_string_pretty(&summary)?),
        Output::Table => println!(
            "cdc {}: published {} row changes of {} binlog transactions in {} Kafka transactions; checkpoint {}",
            cdc.name,
            summary.changes,
            summary.binlog_transactions,
            summary.kafka_transactions,
            position_text(&summary.checkpoint, &summary.started_at)
        ),
    }
    if args.output.output == Output::Table {
        println!("{}", super::output::stage_table(&summary.stages_ms));
    }
    Ok(ExitCode::SUCCESS)
}

/// The control-plane tables, which cdc only reads (the origin labels writes).
fn control_plane(settings: &Settings) -> anyhow::Result<crate::subscriptions::Store> {
    let db = crate::db::Db::connect(&settings.database, 1)?;
    Ok(crate::subscriptions::Store::new(db, Origin::Cli))
}

/// Points `cdc` at the source row of `capture` and its tables (see
/// [`crate::cdc::catalogue`]) and says so; `own_source` (or `database.url`)
/// gives the password.
fn apply(
    settings: &Settings,
    cdc: &mut crate::cdc::CdcSettings,
    own_source: Option<&secrecy::SecretString>,
    capture: &Capture,
) -> anyhow::Result<()> {
    let (secret, field) = match own_source {
        Some(url) => (url, "cdc.source"),
        None => (&settings.database.url, "database.url"),
    };
    cdc.source = Some(source_url(&capture.source, secret, field)?);
    cdc.tables = capture.tables.clone();
    // The process's own rules, then the row's (again at each change of the
    // row); `capture` refused a table both name.
    cdc.redact = settings.cdc.redact.clone();
    cdc.redact.extend(capture.redact.clone());
    eprintln!(
        "cdc {}: source `{}` ({}:{} as {}) from cdc_sources captures {}",
        cdc.name,
        capture.source.name,
        capture.source.db_host,
        capture.source.db_port,
        capture.source.db_user,
        capture.tables.join(", ")
    );
    Ok(())
}

/// Runs `orderpipe cdc snapshot --blocking`. With a source row (`cdc --source NAME
/// snapshot`, or `cdc.source_name`) it reads from that row's host, port and
/// user, as the stream does, and only a table the row's event definitions
/// capture: a snapshot of another database than the stream's would splice
/// two histories.
async fn snapshot(
    settings: &Settings,
    table: String,
    name: Option<String>,
    source_name: Option<String>,
    server_id: Option<u32>,
    output: OutputArg,
) -> anyhow::Result<ExitCode> {
    let mut cdc = settings.cdc.clone();
    if let Some(name) = name {
        cdc.name = name;
    }
    if let Some(id) = server_id {
        cdc.server_id = id;
    }
    if let Some(source) = source_name.or_else(|| cdc.source_name.clone()) {
        let capture = capture(&control_plane(settings)?, &source, &cdc).await?;
        if !capture.tables.contains(&table) {
            anyhow::bail!(
                "--table {table}: source `{source}` does not capture it; its event definitions capture {}",
                capture.tables.join(", ")
            );
        }
        let own_source = cdc.source.clone();
        apply(settings, &mut cdc, own_source.as_ref(), &capture)?;
    }
    let sections = sections(settings, &cdc);
    let summary = crate::cdc::snapshot::run(sections, &table).await?;
    match output.output {
        Output::Json => println!("{}", serde_json::to_string_pretty(&summary)?),
        Output::Table => println!(
            "cdc {} snapshot of {}: {} rows as of {} ({} changes before it published first); the checkpoint is there",
            cdc.name, summary.table, summary.rows, summary.position, summary.caught_up_changes
        ),
    }
    Ok(ExitCode::SUCCESS)
}

/// The sections `cdc` reads, with its `[cdc]` after the flags.
fn sections<'a>(settings: &'a Settings, cdc: &'a crate::cdc::CdcSettings) -> CdcSections<'a> {
    CdcSections {
        cdc,
        kafka: &settings.kafka,
        producer: &settings.producer,
        registry: &settings.registry,
        database_url: &settings.database.url,
    }
}

/// The last checkpoint of a run, else where it started, else `-`.
pub(super) fn position_text(
    checkpoint: &Option<BinlogPosition>,
    started_at: &Option<BinlogPosition>,
) -> String {
    checkpoint
        .as_ref()
        .or(started_at.as_ref())
        .map_or("-".to_string(), ToString::to_string)
}
