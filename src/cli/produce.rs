//! `orderpipe produce`: events from an NDJSON file (one envelope per line)
//! or, in a `harness` build, from the synthetic lifecycle generator
//! (`--count`, see [`super::harness::SyntheticArgs`]).
//!
//! A bad line is reported with its number and reason and the rest still go.
//! The command waits for every delivery report and exits non-zero if any
//! line was bad or any record was not acknowledged.

use std::io::BufRead;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::Args;
use futures::StreamExt;
use serde::Serialize;

use super::OutputArg;
use super::output::{self, Output};
use crate::codec::Codec;
use crate::config::Settings;
use crate::envelope::Envelope;
use crate::producer::{EventProducer, SendReport};
use crate::schema::SchemaCatalog;

/// Flags of `orderpipe produce`.
#[derive(Debug, Args)]
#[cfg_attr(feature = "harness", command(group(clap::ArgGroup::new("source").required(true).args(["file", "count"]))))]
pub struct ProduceArgs {
    /// NDJSON file of envelopes (`-` for stdin).
    #[cfg_attr(feature = "harness", arg(long))]
    #[cfg_attr(not(feature = "harness"), arg(long, required = true))]
    file: Option<PathBuf>,
    /// Synthetic lifecycle events instead of a file.
    #[cfg(feature = "harness")]
    #[command(flatten)]
    synthetic: super::harness::SyntheticArgs,
    /// Events per second at most (0 = as fast as possible).
    #[arg(long, default_value_t = 0)]
    rate: u64,
    /// Target topic (default: topics.order_events.name).
    #[arg(long)]
    topic: Option<String>,
    #[command(flatten)]
    output: OutputArg,
}

/// Summary of a produce run.
#[derive(Debug, Serialize)]
pub struct ProduceSummary {
    /// Target topic.
    pub topic: String,
    /// Input lines refused, with line number and reason.
    pub invalid_lines: Vec<String>,
    /// Delivery counts.
    #[serde(flatten)]
    pub report: SendReport,
    /// Seconds from first send to last acknowledgement.
    pub elapsed_secs: f64,
    /// Acknowledged events per second.
    pub events_per_sec: f64,
}

/// Paces a stream to `rate` items per second (0 = unpaced) without
/// blocking the runtime.
struct Pacer {
    start: tokio::time::Instant,
    rate: u64,
    sent: u64,
}

impl Pacer {
    /// A future that resolves when the next item is due.
    fn next_due(&mut self) -> impl std::future::Future<Output = ()> + use<> {
        let due = (self.rate > 0)
            .then(|| self.start + Duration::from_secs_f64(self.sent as f64 / self.rate as f64));
        self.sent += 1;
        async move {
            if let Some(due) = due {
                tokio::time::sleep_until(due).await;
            }
        }
    }
}

/// Runs the command.
pub async fn run(settings: &Settings, args: ProduceArgs) -> anyhow::Result<ExitCode> {
    let topic = args
        .topic
        .clone()
        .unwrap_or_else(|| settings.topics.order_events.name.clone());
    let catalog = SchemaCatalog::embedded();
    let codec = Codec::new(
        &settings.registry,
        &topic,
        catalog.order_events(),
        settings.registry.auto_register,
    )?;
    let codec = Arc::new(codec);
    let producer = EventProducer::new(&settings.kafka, &settings.producer, codec.clone(), &topic)?;
    // Broker first, then registry: each failure names the service that failed.
    producer.check_ready(Duration::from_secs(10)).await?;
    codec
        .warm_up()
        .await
        .with_context(|| format!("schema registry at {}", settings.registry.url))?;

    let mut invalid_lines = Vec::new();
    #[cfg(feature = "harness")]
    let (synthetic, count) = (
        args.synthetic.events(&settings.producer.service_name),
        args.synthetic.count,
    );
    #[cfg(not(feature = "harness"))]
    let (synthetic, count) = (None::<std::iter::Empty<Envelope>>, None);
    let source: Box<dyn Iterator<Item = Envelope> + '_> = match (&args.file, synthetic) {
        (Some(path), _) => Box::new(ndjson(path, &mut invalid_lines)?),
        (None, Some(events)) => Box::new(events),
        (None, None) => unreachable!("clap requires --file or --count"),
    };

    let progress = output::progress_bar(count, "produced");
    let mut pacer = Pacer {
        start: tokio::time::Instant::now(),
        rate: args.rate,
        sent: 0,
    };
    let started = Instant::now();
    let paced = futures::stream::iter(source).then(move |e| {
        let wait = pacer.next_due();
        async move {
            wait.await;
            e
        }
    });
    let report = producer
        .send_all(paced, |acknowledged| progress.set_position(acknowledged))
        .await;
    progress.finish_and_clear();
    for (event, n) in &report.by_event {
        crate::producer::produced(&topic, event, *n);
    }
    let elapsed = started.elapsed().as_secs_f64();
    let summary = ProduceSummary {
        topic,
        invalid_lines,
        events_per_sec: report.acknowledged as f64 / elapsed.max(1e-9),
        report,
        elapsed_secs: elapsed,
    };
    produce(&summary, args.output.output);
    let failed = summary.report.failed > 0 || !summary.invalid_lines.is_empty();
    Ok(if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    })
}

/// Valid envelopes of an NDJSON file; bad lines go to `invalid` (and stderr).
fn ndjson<'a>(
    path: &PathBuf,
    invalid: &'a mut Vec<String>,
) -> anyhow::Result<impl Iterator<Item = Envelope> + 'a> {
    let reader: Box<dyn BufRead> = if path.as_os_str() == "-" {
        Box::new(std::io::BufReader::new(std::io::stdin()))
    } else {
        let file =
            std::fs::File::open(path).with_context(|| format!("opening {}", path.display()))?;
        Box::new(std::io::BufReader::new(file))
    };
    Ok(reader.lines().enumerate().filter_map(move |(i, line)| {
        let number = i + 1;
        let parsed = line
            .map_err(|e| e.to_string())
            .and_then(|l| match l.trim() {
                "" => Ok(None),
                text => Envelope::from_json(text)
                    .map(Some)
                    .map_err(|e| e.to_string()),
            });
        match parsed {
            Ok(envelope) => envelope,
            Err(reason) => {
                let message = format!("line {number}: {reason}");
                eprintln!("skipped {message}");
                invalid.push(message);
                None
            }
        }
    }))
}

/// `orderpipe produce`.
fn produce(summary: &ProduceSummary, format: Output) {
    if format == Output::Json {
        return output::json(summary);
    }
    let r = &summary.report;
    let rows = r
        .by_event
        .iter()
        .map(|(k, v)| vec![k.clone(), v.to_string()]);
    println!("{}", output::table(&["event", "acknowledged"], rows));
    println!(
        "topic {}: sent {}, acknowledged {}, failed {}, invalid input lines {} — {:.0} events/s over {:.2}s",
        summary.topic,
        r.sent,
        r.acknowledged,
        r.failed,
        summary.invalid_lines.len(),
        summary.events_per_sec,
        summary.elapsed_secs
    );
    for failure in &r.failures {
        println!("  failed: {failure}");
    }
    for line in &summary.invalid_lines {
        println!("  invalid: {line}");
    }
}
