//! The harness commands (cargo feature `harness`): `orderpipe demo` and the
//! hidden `bench-*` commands the `make bench-*` scripts call. A build
//! without the feature has none of them (`dev/no-harness-check.sh`).

use std::process::ExitCode;

use clap::Subcommand;

use super::output::{self, Output};
use super::{GlobalArgs, OutputArg, exit_if};
use crate::db::Db;
use crate::harness::demo::{self, DemoReport};
use crate::harness::{bench, bench_report, chaos, generator, verify};

/// The harness's subcommands, flattened into the command line.
#[derive(Debug, Subcommand)]
pub enum HarnessCommand {
    /// Run the pipeline on an embedded stack (mock Kafka, in-process registry): no servers needed.
    Demo {
        /// Orders driven through the order API.
        #[arg(long, default_value_t = 1000)]
        orders: usize,
        /// Seed of their lifecycles.
        #[arg(long, default_value_t = 1)]
        seed: u64,
        #[command(flatten)]
        output: OutputArg,
    },
    /// Benchmark driver: order lifecycles through the order service in-process,
    /// at a steady rate. Used by `make bench-relay`.
    #[command(hide = true)]
    BenchDriveOrders {
        /// Orders.
        #[arg(long)]
        orders: usize,
        /// Orders started per second (0 = as fast as possible).
        #[arg(long, default_value_t = 0)]
        rate: u32,
        /// Seed.
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// Drivers side by side, each with its share of the orders and the rate.
        #[arg(long, default_value_t = 1)]
        drivers: usize,
        /// Append `<event_id>\t<µs>` per event, stamped right after its
        /// transaction committed (`harness::latency`).
        #[arg(long, value_name = "FILE")]
        stamps: Option<std::path::PathBuf>,
    },
    /// Benchmark check: regenerates `produce --count --orders --seed
    /// --first-order-id`'s events and reports how many orders GROUP applied
    /// out of production order (from `event_dedup`). Used by `make bench-ordering`.
    #[command(hide = true)]
    BenchOrderCheck {
        /// Consumer group id.
        #[arg(long)]
        group: String,
        /// As given to `produce`.
        #[arg(long)]
        count: usize,
        /// As given to `produce`.
        #[arg(long)]
        orders: usize,
        /// As given to `produce`.
        #[arg(long)]
        seed: u64,
        /// As given to `produce`.
        #[arg(long)]
        first_order_id: i64,
    },
    /// Benchmark peer: the textbook consumer (one transaction and one
    /// synchronous offset commit per record). Used by `make bench-consume`.
    #[command(hide = true)]
    BenchNaiveConsume {
        /// Consumer group id.
        #[arg(long)]
        group: String,
        /// The one handler to apply.
        #[arg(long)]
        handler: String,
        /// Records to process, then stop.
        #[arg(long)]
        limit: u64,
        /// Topic (default: topics.order_events.name).
        #[arg(long)]
        topic: Option<String>,
    },
    /// Benchmark peer: the database's own ceiling. Writes the rows a
    /// `consume --handler notification` run stored in FROM (`event_dedup`
    /// and `notifications`) into database.url, a fresh migrated database,
    /// with one multi-row `INSERT IGNORE` per table per transaction. Used
    /// by `make bench-consume`.
    #[command(hide = true)]
    BenchDbCeiling {
        /// The measured consumer's database (`mysql://...`).
        #[arg(long, value_name = "DB_URL")]
        from: String,
        /// Events per transaction (the consumer's).
        #[arg(long)]
        events_per_tx: usize,
        /// Connections writing side by side (the consumer's partition workers).
        #[arg(long)]
        connections: usize,
        /// Once the rows are read and the connections open, print `ready`
        /// and write only after a line on stdin: the caller reads the
        /// server's counters around the writes alone.
        #[arg(long)]
        start_on_stdin: bool,
    },
    /// Benchmark report: reads the measurements the `dev/bench-*.sh` scripts
    /// append to RESULTS and writes report.md and SVG plots into OUT. Used by `make bench`.
    #[command(hide = true)]
    BenchReport {
        /// The measurements (tab-separated, see `harness::bench_report`).
        #[arg(long, default_value = "target/bench/results.tsv")]
        results: std::path::PathBuf,
        /// Where report.md and the plots go.
        #[arg(long, default_value = "target/bench")]
        out: std::path::PathBuf,
    },
}

/// Runs a harness command.
pub(super) async fn run(global: &GlobalArgs, command: HarnessCommand) -> anyhow::Result<ExitCode> {
    match command {
        HarnessCommand::Demo {
            orders,
            seed,
            output,
        } => {
            let report = demo::run(&demo::DemoOptions { orders, seed }).await?;
            print_demo(&report, output.output);
            Ok(exit_if(!report.passed()))
        }
        HarnessCommand::BenchDriveOrders {
            orders,
            rate,
            seed,
            drivers,
            stamps,
        } => {
            let settings = global.settings()?;
            let db = Db::connect(&settings.database, (drivers as u32).clamp(2, 64))?;
            // Wakes the relays of outbox.wake_targets, as `orderpipe api` does.
            let wake = crate::outbox::wake::WakeNotifier::from_settings(&settings.outbox)?;
            let mut service =
                crate::api::service(&settings.producer, &settings.topics, db).with_wake(wake);
            if let Some(path) = stamps {
                let file = crate::harness::latency::StampFile::append(&path)
                    .map_err(|e| anyhow::anyhow!("--stamps {}: {e}", path.display()))?;
                service = service.with_commit_stamps(std::sync::Arc::new(file));
            }
            let started = std::time::Instant::now();
            let events =
                generator::drive_concurrently(&service, orders, seed, Some(rate), drivers).await?;
            println!(
                "{}",
                serde_json::json!({"orders": orders, "events": events, "secs": started.elapsed().as_secs_f64()})
            );
            Ok(ExitCode::SUCCESS)
        }
        HarnessCommand::BenchOrderCheck {
            group,
            count,
            orders,
            seed,
            first_order_id,
        } => {
            let settings = global.settings()?;
            let db = Db::connect(&settings.database, 2)?;
            let events: Vec<_> = generator::LifecycleGenerator::new(
                &settings.producer.service_name,
                orders,
                first_order_id,
                seed,
            )
            .take(count)
            .collect();
            let (rows, out_of_order) = verify::applied_order(&db, &group, &events).await?;
            let report = serde_json::json!({"applied": rows.actual, "produced": rows.expected, "orders_out_of_order": out_of_order.len()});
            println!("{report}");
            Ok(ExitCode::SUCCESS)
        }
        HarnessCommand::BenchNaiveConsume {
            group,
            handler,
            limit,
            topic,
        } => {
            let settings = global.settings()?;
            let handler =
                chaos::handler_by_name(&handler, &settings).map_err(anyhow::Error::msg)?;
            let db = Db::connect(&settings.database, 2)?;
            let topic = topic.unwrap_or_else(|| settings.topics.order_events.name.clone());
            let report =
                bench::naive_consume(&settings, &db, &topic, &group, handler.as_ref(), limit)
                    .await?;
            println!("{}", serde_json::to_string(&report)?);
            Ok(ExitCode::SUCCESS)
        }
        HarnessCommand::BenchDbCeiling {
            from,
            events_per_tx,
            connections,
            start_on_stdin,
        } => {
            let settings = global.settings()?;
            let db = Db::connect(&settings.database, connections.max(1) as u32)?;
            let ceiling = bench::Ceiling::prepare(&db, &from, events_per_tx, connections).await?;
            if start_on_stdin {
                println!("ready");
                tokio::task::spawn_blocking(|| std::io::stdin().read_line(&mut String::new()))
                    .await??;
            }
            let report = ceiling.write().await?;
            println!("{}", serde_json::to_string(&report)?);
            Ok(ExitCode::SUCCESS)
        }
        HarnessCommand::BenchReport { results, out } => {
            let files = bench_report::write_report(&results, &out)?;
            println!("{}", files.markdown.display());
            for plot in &files.plots {
                println!("{}", plot.display());
            }
            Ok(ExitCode::SUCCESS)
        }
    }
}

/// Prints what `orderpipe demo` saw.
fn print_demo(report: &DemoReport, format: Output) {
    if format == Output::Json {
        return output::json(report);
    }
    println!(
        "orderpipe demo: embedded stack (librdkafka mock cluster + in-process schema registry + SQLite)\n"
    );
    let r = &report.relayed;
    println!(
        "order API -> outbox -> relay: {} outbox rows published in {} Kafka transactions",
        r.published, r.transactions
    );
    for (topic, n) in &r.by_topic {
        println!("  {topic}: {n} records");
    }
    println!();
    let rows = report
        .by_event
        .iter()
        .map(|(k, v)| vec![k.clone(), v.to_string()]);
    println!("{}", output::table(&["event", "count"], rows));
    let rows = report
        .by_partition
        .iter()
        .map(|(k, v)| vec![k.to_string(), v.to_string()]);
    println!("{}", output::table(&["partition", "events"], rows));
    println!(
        "produced {} events for {} orders, read back and decoded {}",
        report.produced, report.orders, report.consumed
    );
    if report.ordering_violations.is_empty() {
        println!(
            "per-order ordering: OK — every order's events are in one partition, in the order produced"
        );
    } else {
        println!(
            "per-order ordering: {} VIOLATIONS",
            report.ordering_violations.len()
        );
        for v in report.ordering_violations.iter().take(20) {
            println!("  {v}");
        }
    }
    println!(
        "\ninjected {} duplicate deliveries (every 10th event produced again); two consumer groups on SQLite:\n",
        report.injected_duplicates
    );
    let rows = report.groups.iter().map(|g| {
        let handlers: Vec<&str> = g.handlers.keys().map(String::as_str).collect();
        vec![
            g.group.clone(),
            handlers.join(", "),
            g.consumed.to_string(),
            g.applied.to_string(),
            g.duplicates.to_string(),
            report
                .group_order_violations
                .get(&g.group)
                .copied()
                .unwrap_or(0)
                .to_string(),
        ]
    });
    println!(
        "{}",
        output::table(
            &[
                "group",
                "handlers",
                "consumed",
                "applied",
                "duplicates skipped",
                "orders out of order"
            ],
            rows
        )
    );
    let t = &report.tier;
    let first = &report.groups[0];
    println!(
        "error tier: {} poison records injected; order {}'s payment fails 4 times, order {} fails permanently",
        t.poison_injected, t.transient_order, t.permanent_order
    );
    println!(
        "  {}: recovered by local retry {}, sent to the retry topic {}, dead-lettered {}, held behind a parked order {}, released {}",
        first.group,
        first.recovered_locally,
        first.sent_to_retry,
        first.dead_lettered,
        first.held,
        first.released
    );
    println!(
        "per-order ordering through retries: order {} was parked while its payment was retried; its later events waited.\n  \
         applied in this order: {}\n  meanwhile {} events of other orders were applied",
        t.transient_order,
        t.transient_applied.join(" -> "),
        t.applied_meanwhile
    );
    println!("\ndead letters persisted from the DLQ topic (orderpipe dlq list):");
    super::dlq::dead_letters(&t.dead_letters, Output::Table);
    println!(
        "replayed {} dead letters of order {} after the fix (orderpipe dlq replay); ignored {} poison rows (orderpipe dlq ignore)",
        t.replayed, t.permanent_order, t.ignored
    );
    println!(
        "  after the replay {} applied {} more, duplicates {}, dead-lettered {}\n",
        t.after_replay.group,
        t.after_replay.applied,
        t.after_replay.duplicates,
        t.after_replay.dead_lettered
    );
    let v = &report.verification;
    let rows = v.facts.iter().map(|f| {
        let ok = if f.expected == f.actual {
            "ok"
        } else {
            "MISMATCH"
        };
        vec![
            f.what.to_string(),
            f.expected.to_string(),
            f.actual.to_string(),
            ok.to_string(),
        ]
    });
    println!(
        "{}",
        output::table(&["business table check", "expected", "actual", ""], rows)
    );
    if v.is_exact() && report.group_order_violations.values().all(|n| *n == 0) {
        println!(
            "exactly-once check: OK — every table matches the events applied exactly once, in order"
        );
    } else {
        println!("exactly-once check: FAILED");
    }
    let h = &report.http;
    println!(
        "HTTP subscription crm (order.payment.succeeded -> local endpoint): {} requests for {} matching events, dead-lettered {}",
        h.requests, h.matching, h.group.dead_lettered
    );
    println!("demo took {:.1} s", report.elapsed_ms as f64 / 1000.0);
}

/// `orderpipe produce --count N`: synthetic lifecycle events instead of a file.
#[derive(Debug, clap::Args)]
pub struct SyntheticArgs {
    /// Generate this many synthetic lifecycle events.
    #[arg(long)]
    pub count: Option<u64>,
    /// Orders open at once in the generator.
    #[arg(long, default_value_t = 1000)]
    orders: usize,
    /// Generator seed (default: random).
    #[arg(long)]
    seed: Option<u64>,
    /// First order id of the generator (default: derived from the clock, so runs do not collide).
    #[arg(long)]
    first_order_id: Option<i64>,
}

impl SyntheticArgs {
    /// The `--count` events, produced by `service_name`; None without `--count`.
    pub fn events(
        &self,
        service_name: &str,
    ) -> Option<impl Iterator<Item = crate::envelope::Envelope> + use<>> {
        let count = self.count?;
        let seed = self.seed.unwrap_or_else(rand::random);
        let first = self
            .first_order_id
            .unwrap_or_else(|| crate::clock::now_ms() * 1000);
        Some(
            generator::LifecycleGenerator::new(service_name, self.orders, first, seed)
                .take(count as usize),
        )
    }
}
