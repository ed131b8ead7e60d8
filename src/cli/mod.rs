//! The `orderpipe` command line.
//!
//! Each subcommand is a thin layer: parse flags, load [`Settings`], call the
//! library, print a table (or JSON with `--output json`) and pick the exit
//! code. Errors are `anyhow` here and typed below.
//!
//! * [`produce`] is `orderpipe produce` (NDJSON file, or synthetic lifecycles in a `harness` build).
//! * [`output`] holds the table/JSON printing shared by the commands.
//! * `harness` (cargo feature `harness` only): `demo` and the hidden `bench-*` commands.

pub mod cdc;
pub mod console;
pub mod consume;
pub mod dlq;
pub mod group;
#[cfg(feature = "harness")]
pub mod harness;
pub mod lag;
pub mod output;
pub mod produce;
pub mod reconcile;
pub mod relay;
pub mod router;
pub mod search;
pub mod signals;
pub mod snapshot;
pub mod subs;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};

use crate::config::Settings;
use crate::db::Db;
use crate::schema;
use crate::schema::{CompatLevel, SchemaCatalog};
use crate::telemetry::{self, LogFormat};
use crate::topics::{self, TopicAdmin};
use output::Output;

/// Kafka-native order event pipeline.
#[derive(Debug, Parser)]
#[command(name = "orderpipe", version, about, propagate_version = true)]
pub struct Cli {
    #[command(flatten)]
    global: GlobalArgs,
    #[command(subcommand)]
    command: Command,
}

/// Flags every subcommand takes; they override the config file and environment.
#[derive(Debug, Args)]
struct GlobalArgs {
    /// Config file (TOML); default ./orderpipe.toml when present.
    #[arg(long, global = true, env = "ORDERPIPE_CONFIG")]
    config: Option<PathBuf>,
    /// Kafka bootstrap servers.
    #[arg(long, global = true)]
    bootstrap_servers: Option<String>,
    /// Schema registry base URL (Confluent-compatible API).
    #[arg(long, global = true)]
    registry_url: Option<String>,
    /// librdkafka producer option KEY=VALUE, layered over the safe defaults (repeatable).
    #[arg(short = 'X', long = "producer-option", global = true, value_parser = parse_key_value)]
    producer_options: Vec<(String, String)>,
    /// Log line format.
    #[arg(long, global = true, value_enum, default_value = "text")]
    log_format: LogFormat,
    /// Default log filter (RUST_LOG wins).
    #[arg(long, global = true, default_value = "warn,orderpipe=info")]
    log_level: String,
    /// Export spans over OTLP/HTTP to this collector URL (needs `--features otlp`).
    #[arg(long, global = true, env = "ORDERPIPE_OTLP_ENDPOINT")]
    otlp_endpoint: Option<String>,
    /// Seconds a stop (SIGTERM) may take before the process exits anyway
    /// with status 124, naming what it waited on; keep it under the pod's
    /// terminationGracePeriodSeconds.
    #[arg(long, global = true, env = "ORDERPIPE_STOP_TIMEOUT_SECS", default_value_t = crate::stopping::DEFAULT_STOP_TIMEOUT.as_secs(), value_parser = clap::value_parser!(u64).range(1..))]
    stop_timeout: u64,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// `demo` and the hidden `bench-*` commands (cargo feature `harness`).
    #[cfg(feature = "harness")]
    #[command(flatten)]
    Harness(harness::HarnessCommand),
    /// Register or check the Avro schemas in the schema registry.
    #[command(subcommand)]
    Schema(SchemaCommand),
    /// Reconcile or describe the declared topics.
    #[command(subcommand)]
    Topics(TopicsCommand),
    /// Produce events from an NDJSON file or a synthetic generator.
    #[cfg_attr(
        not(feature = "harness"),
        command(about = "Produce events from an NDJSON file.")
    )]
    Produce(produce::ProduceArgs),
    /// Apply the database migrations in `sql/` (MariaDB/MySQL or SQLite).
    Migrate {
        /// Stop after this version (e.g. 20: up to `0020_*.sql`), for a
        /// staged upgrade or a rehearsal of one on a copy.
        #[arg(long)]
        to: Option<i64>,
    },
    /// Serve the reference order API (orders + outbox in one transaction).
    Api(relay::ApiArgs),
    /// Publish outbox rows with a transactional producer.
    Relay(relay::RelayArgs),
    /// Read the binlog as a replica and publish each row change of the
    /// configured tables to cdc.<db>.<table> (exactly once, checkpointed).
    Cdc(cdc::CdcArgs),
    /// Serve the operator console: a web UI of lag, dead letters, held
    /// orders, topics, schemas and subscriptions (needs a [console] token
    /// or proxy header; see docs/console.md).
    Console(console::ConsoleArgs),
    /// Run a consumer group applying events exactly once in effect.
    Consume(consume::ConsumeArgs),
    /// Deliver events to a downstream HTTP subscription (a consumer group of its own).
    Deliver(consume::DeliverArgs),
    /// Dead letters: persist, list, show, stats, replay, ignore.
    #[command(subcommand)]
    Dlq(dlq::DlqCommand),
    /// Event dedup table maintenance.
    #[command(subcommand)]
    Dedup(DedupCommand),
    /// Pause or resume a consumer group (members keep their partitions and
    /// backlog; stored, so it survives restarts), or list the paused ones.
    #[command(subcommand)]
    Group(group::GroupCommand),
    /// Find records of a topic by key, event id, time range and a predicate
    /// on the decoded body (the subscriptions' filter language), over a
    /// bounded scan with progress; matches as JSON lines.
    Search(search::SearchArgs),
    /// Consumer group lag from the broker: committed and log-end offsets,
    /// lag and the oldest unconsumed record's age, members or none.
    Lag(lag::LagArgs),
    /// Produced vs applied: the events of the order topic over a window that
    /// a group neither applied nor accounts for (dead letter, held, parked);
    /// exits 1 when one is missing.
    Reconcile(reconcile::ReconcileArgs),
    /// Subscriptions as data (the control plane): consumers,
    /// subscriptions with bind keys and filters, events, sources; bindings,
    /// refresh, reload; `subs serve` runs the admin HTTP API.
    #[command(subcommand)]
    Subs(subs::SubsCommand),
    /// Print the effective configuration as a file `--config` accepts back
    /// (secrets replaced by __REDACTED__; supply them in the file or the environment).
    Config {
        /// File format.
        #[arg(long, value_enum, default_value = "toml")]
        output: ConfigFormat,
    },
}

#[derive(Debug, Subcommand)]
enum DedupCommand {
    /// Delete dedup rows older than a retention window, in small batches.
    Cleanup {
        /// Retention window, e.g. 7d, 36h (must exceed the longest redelivery delay).
        #[arg(long, default_value = "7d", value_parser = humantime::parse_duration)]
        older_than: std::time::Duration,
        /// Rows per DELETE statement.
        #[arg(long, default_value_t = crate::dedup::CLEANUP_BATCH)]
        batch: u32,
        #[command(flatten)]
        output: OutputArg,
    },
    /// Move the dedup rows of before the compact key (migration 0021) into
    /// it, in bounded batches, while consumers run; progress on stderr.
    Upgrade {
        /// Rows moved per transaction.
        #[arg(long, default_value_t = crate::dedup::UPGRADE_BATCH)]
        batch: u32,
        #[command(flatten)]
        output: OutputArg,
    },
}

#[derive(Debug, Subcommand)]
enum SchemaCommand {
    /// Register every schema under `<topic>-value`.
    Register {
        /// Read schemas from this folder instead of the built-in ones.
        #[arg(long)]
        schemas: Option<PathBuf>,
        #[command(flatten)]
        output: OutputArg,
    },
    /// Check the local schemas against the registry; exit 1 if incompatible.
    Check {
        /// Read schemas from this folder instead of the built-in ones.
        #[arg(long)]
        schemas: Option<PathBuf>,
        /// Compatibility level of the local check.
        #[arg(long, value_enum, default_value = "backward")]
        level: CompatLevel,
        #[command(flatten)]
        output: OutputArg,
    },
}

#[derive(Debug, Subcommand)]
enum TopicsCommand {
    /// Create missing topics and fix configs; report the rest. Exits 1 without
    /// changing anything when a topic has fewer partitions than declared.
    Ensure {
        /// Report what would change without changing anything.
        #[arg(long)]
        dry_run: bool,
        /// Grow topics with fewer partitions than declared. Moves keys to
        /// other partitions: drain consumers and stop the relay first.
        #[arg(long)]
        allow_repartition: bool,
        #[command(flatten)]
        groups: GroupsArg,
        #[command(flatten)]
        output: OutputArg,
    },
    /// Show the declared topics as they are on the cluster.
    Describe {
        #[command(flatten)]
        groups: GroupsArg,
        #[command(flatten)]
        output: OutputArg,
    },
}

/// `--group G`: consumer groups whose retry topics are declared too.
#[derive(Debug, Args, Clone)]
struct GroupsArg {
    /// Consumer group whose retry topic (<order topic>.retry.<group>) is
    /// declared too (repeatable or comma-separated). The retry topics of
    /// `[[http.subscriptions]]` (group http.<name>) are always declared.
    #[arg(long = "group", value_delimiter = ',')]
    groups: Vec<String>,
}

/// `orderpipe config --output toml|json`.
#[derive(Debug, Clone, Copy, clap::ValueEnum)]
enum ConfigFormat {
    /// TOML, like `orderpipe.toml`.
    Toml,
    /// JSON (read back from a file named `*.json`).
    Json,
}

/// `--output table|json`.
#[derive(Debug, Args, Clone, Copy)]
pub struct OutputArg {
    /// Output format.
    #[arg(long, value_enum, default_value = "table", global = true)]
    pub output: Output,
}

/// Who runs a command that records it: `--by`, else $USER, else `cli`.
pub(crate) fn who(by: Option<String>) -> String {
    by.or_else(|| std::env::var("USER").ok())
        .unwrap_or_else(|| "cli".into())
}

fn parse_key_value(text: &str) -> Result<(String, String), String> {
    match text.split_once('=') {
        Some((k, v)) if !k.trim().is_empty() => Ok((k.trim().to_string(), v.trim().to_string())),
        _ => Err(format!("`{text}` is not KEY=VALUE (e.g. -X linger.ms=10)")),
    }
}

impl GlobalArgs {
    fn settings(&self) -> anyhow::Result<Settings> {
        let settings = Settings::load_with(self.config.as_deref(), &self.overrides())?;
        // A harness build reads [chaos]: a bad section fails every command
        // at load, like any other section.
        #[cfg(feature = "harness")]
        crate::harness::chaos::ChaosSettings::from_settings(&settings)
            .map_err(|e| anyhow::anyhow!("configuration: {e}"))?;
        Ok(settings)
    }

    /// The flags that override config values, shaped like the config file.
    fn overrides(&self) -> serde_json::Value {
        let mut overrides = serde_json::json!({});
        if let Some(servers) = &self.bootstrap_servers {
            overrides["kafka"]["bootstrap_servers"] = servers.clone().into();
        }
        if let Some(url) = &self.registry_url {
            overrides["registry"]["url"] = url.clone().into();
        }
        if !self.producer_options.is_empty() {
            let options: BTreeMap<String, String> = self.producer_options.iter().cloned().collect();
            overrides["producer"]["options"] = serde_json::json!(options);
        }
        overrides
    }
}

/// Entry point of the binary.
pub fn main() -> ExitCode {
    // Die quietly when stdout is closed (`orderpipe dlq list | head`), as a
    // Unix tool should, instead of panicking on the failed write.
    #[cfg(unix)]
    // SAFETY: restoring the default disposition of SIGPIPE before any thread starts.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
    // Before any thread allocates: fewer malloc arenas, less memory (docs/tuning.md, "Memory").
    crate::startup::cap_malloc_arenas();
    let cli = Cli::parse();
    crate::stopping::set_timeout(std::time::Duration::from_secs(cli.global.stop_timeout));
    if let Err(e) = telemetry::init(
        cli.global.log_format,
        &cli.global.log_level,
        cli.global.otlp_endpoint.as_deref(),
    ) {
        eprintln!("error: {e}");
        return ExitCode::FAILURE;
    }
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let code = match runtime.block_on(run(cli)) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    };
    telemetry::shutdown();
    crate::stopping::phase("ending the runtime's tasks");
    drop(runtime);
    code
}

/// Runs one parsed command; `Ok` carries the exit code.
pub async fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    match cli.command {
        #[cfg(feature = "harness")]
        Command::Harness(command) => harness::run(&cli.global, command).await,
        Command::Schema(SchemaCommand::Register { schemas, output }) => {
            let settings = cli.global.settings()?;
            let catalog = SchemaCatalog::load(schemas.as_deref())?;
            let registered =
                schema::register(&settings.registry, &settings.topics, &catalog).await?;
            output::registered(&registered, output.output);
            Ok(ExitCode::SUCCESS)
        }
        Command::Schema(SchemaCommand::Check {
            schemas,
            level,
            output,
        }) => {
            let settings = cli.global.settings()?;
            let catalog = SchemaCatalog::load(schemas.as_deref())?;
            let reports =
                schema::check(&settings.registry, &settings.topics, &catalog, level).await?;
            output::compat(&reports, output.output);
            Ok(exit_if(reports.iter().any(|r| !r.is_compatible())))
        }
        Command::Topics(TopicsCommand::Ensure {
            dry_run,
            allow_repartition,
            groups,
            output,
        }) => {
            let settings = cli.global.settings()?;
            let admin = TopicAdmin::new(&settings.kafka)?;
            let specs = crate::startup::declared_topics(&settings, &groups.groups);
            let options = topics::EnsureOptions {
                dry_run,
                allow_repartition,
            };
            let changes = admin
                .ensure(&specs.iter().collect::<Vec<_>>(), options)
                .await?;
            output::changes(&changes, dry_run, output.output);
            Ok(exit_if(changes.iter().any(topics::Change::is_refused)))
        }
        Command::Topics(TopicsCommand::Describe { groups, output }) => {
            let settings = cli.global.settings()?;
            let admin = TopicAdmin::new(&settings.kafka)?;
            let specs = crate::startup::declared_topics(&settings, &groups.groups);
            let states = admin.describe(&specs.iter().collect::<Vec<_>>()).await?;
            output::topic_states(&states, output.output);
            Ok(ExitCode::SUCCESS)
        }
        Command::Produce(args) => {
            let settings = cli.global.settings()?;
            produce::run(&settings, args).await
        }
        Command::Migrate { to } => {
            let settings = cli.global.settings()?;
            let db = Db::connect(&settings.database, 2)?;
            db.migrate_to(to).await?;
            match to {
                Some(version) => println!("migrations up to {version} applied ({:?})", db.dialect),
                None => println!("migrations applied ({:?})", db.dialect),
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Api(args) => relay::api(&cli.global.settings()?, args).await,
        Command::Relay(args) => relay::relay(&cli.global.settings()?, args).await,
        Command::Cdc(args) => cdc::run(&cli.global.settings()?, args).await,
        Command::Deliver(args) => {
            let settings = cli.global.settings()?;
            consume::deliver(&settings, cli.global.config.clone(), args).await
        }
        Command::Consume(args) => {
            let settings = cli.global.settings()?;
            consume::run(&settings, args).await
        }
        Command::Console(args) => console::run(&cli.global.settings()?, args).await,
        Command::Lag(args) => lag::run(&cli.global.settings()?, args).await,
        Command::Search(args) => search::run(&cli.global.settings()?, args).await,
        Command::Group(command) => group::run(&cli.global.settings()?, command).await,
        Command::Reconcile(args) => reconcile::run(&cli.global.settings()?, args).await,
        Command::Subs(command) => subs::run(&cli.global.settings()?, command).await,
        Command::Dlq(command) => {
            let settings = cli.global.settings()?;
            dlq::run(&settings, command).await
        }
        Command::Dedup(DedupCommand::Cleanup {
            older_than,
            batch,
            output,
        }) => {
            let settings = cli.global.settings()?;
            let db = Db::connect(&settings.database, 2)?;
            let removed = crate::dedup::cleanup(&db, older_than, batch.max(1)).await?;
            crate::dedup::cleanup_deleted(removed);
            match output.output {
                Output::Json => println!("{}", serde_json::json!({"removed": removed})),
                Output::Table => println!(
                    "removed {removed} dedup rows older than {}",
                    humantime::format_duration(older_than)
                ),
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Dedup(DedupCommand::Upgrade { batch, output }) => {
            let settings = cli.global.settings()?;
            let db = Db::connect(&settings.database, 2)?;
            let mut shown = std::time::Instant::now();
            let report = crate::dedup::upgrade(&db, batch.max(1), |p| {
                if shown.elapsed() >= std::time::Duration::from_secs(1) || p.moved == p.total {
                    shown = std::time::Instant::now();
                    eprintln!(
                        "dedup upgrade: {}/{} rows moved ({:.0} rows/s, about {:.0} s left)",
                        p.moved, p.total, p.rows_per_sec, p.eta_secs
                    );
                }
            })
            .await?;
            match output.output {
                Output::Json => println!("{}", serde_json::to_string(&report)?),
                Output::Table => println!(
                    "moved {} of {} legacy dedup rows in {:.1} s ({:.0} rows/s); {} left; legacy table {}",
                    report.progress.moved,
                    report.progress.total,
                    report.progress.secs,
                    report.progress.rows_per_sec,
                    report.left,
                    if report.dropped { "dropped" } else { "kept" }
                ),
            }
            Ok(if report.left == 0 {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            })
        }
        Command::Config { output } => {
            let document =
                Settings::redacted_document(cli.global.config.as_deref(), &cli.global.overrides())?;
            match output {
                ConfigFormat::Json => println!("{}", serde_json::to_string_pretty(&document)?),
                ConfigFormat::Toml => print!("{}", toml::to_string_pretty(&document)?),
            }
            Ok(ExitCode::SUCCESS)
        }
    }
}

fn exit_if(failed: bool) -> ExitCode {
    if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_command_line_is_consistent() {
        use clap::CommandFactory;
        // Duplicate flags, a global flag a subcommand defines again, and
        // the like panic here rather than at a user's first run.
        super::Cli::command().debug_assert();
    }
}
