//! The `make bench` report: reads the measurements the `dev/bench-*.sh`
//! scripts append to `target/bench/results.tsv` and writes
//! `target/bench/report.md` (one table row per measurement, with its ratio to
//! its peer and the command that produced it) and SVG plots beside it.
//!
//! `results.tsv` has one measurement per line, tab-separated:
//!
//! | column | meaning |
//! |---|---|
//! | `benchmark` | `produce`, `consume`, `dlq`, `relay`, `ordering` |
//! | `variant` | who was measured: ours, a peer (`kafka-producer-perf-test`, `naive per-record`), a setting (`batch 200`, `key 1%`) |
//! | `metric` | `throughput`, `peak RSS`, `p99 latency`, `MariaDB statements per event`, ... |
//! | `value`, `unit` | the number; a unit ending in `/s` marks a throughput |
//! | `peer` | the variant of the same benchmark and metric this row is compared with (empty: none) |
//! | `command` | the command line that produced the number |
//!
//! Lines starting with `#` are notes (the sizes, the commit) and head the
//! report. A later line for the same benchmark, variant and metric replaces
//! an earlier one, so re-running one `make bench-*` updates its rows.
//!
//! Plots follow the variants' naming: `bench-ordering` writes `<mode> <rate>%`
//! (`key 1%`), drawn as throughput against failure rate; `bench-relay`
//! writes `batch <rows per transaction>`, drawn as throughput per batch size.
//! The SVG backend writes `<text>` elements: no font files are read.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use plotters::prelude::*;

/// The column names of `results.tsv`, in order (its header line).
pub const COLUMNS: [&str; 7] = [
    "benchmark",
    "variant",
    "metric",
    "value",
    "unit",
    "peer",
    "command",
];

/// Why the report could not be made.
#[derive(Debug, thiserror::Error)]
pub enum ReportError {
    /// A line of the results file is malformed.
    #[error("{path} line {line}: {message}")]
    Line {
        /// The results file.
        path: String,
        /// 1-based line number.
        line: usize,
        /// What is wrong, naming the field.
        message: String,
    },
    /// The results file has no measurement.
    #[error("{0}: no measurements (run `make bench` or a dev/bench-*.sh script first)")]
    Empty(String),
    /// Reading or writing a file failed.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: String,
        /// The error.
        source: std::io::Error,
    },
    /// Drawing a plot failed.
    #[error("plot {path}: {message}")]
    Plot {
        /// The SVG file.
        path: String,
        /// What failed.
        message: String,
    },
}

/// One measurement: one line of `results.tsv`.
#[derive(Debug, Clone, PartialEq)]
pub struct Measurement {
    /// Benchmark name (`produce`, `consume`, ...).
    pub benchmark: String,
    /// Who or which setting was measured.
    pub variant: String,
    /// What was measured (`throughput`, `peak RSS`, ...).
    pub metric: String,
    /// The number.
    pub value: f64,
    /// Its unit; one ending in `/s` is a throughput.
    pub unit: String,
    /// The variant this row is compared with (same benchmark and metric); empty for none.
    pub peer: String,
    /// The command that produced the number.
    pub command: String,
}

impl Measurement {
    /// Whether this is a throughput (its unit is per second).
    pub fn is_throughput(&self) -> bool {
        self.unit.ends_with("/s")
    }
}

/// The parsed results file: notes and measurements (later duplicates replaced).
#[derive(Debug, Clone, Default)]
pub struct Results {
    /// `#` lines, without the `#`.
    pub notes: Vec<String>,
    /// Measurements in first-seen order.
    pub rows: Vec<Measurement>,
}

impl Results {
    /// Parses `results.tsv` text; `path` names it in errors.
    pub fn parse(path: &str, text: &str) -> Result<Results, ReportError> {
        let mut results = Results::default();
        for (index, line) in text.lines().enumerate() {
            let err = |message: String| ReportError::Line {
                path: path.to_string(),
                line: index + 1,
                message,
            };
            if line.trim().is_empty() || line.split('\t').collect::<Vec<_>>() == COLUMNS {
                continue;
            }
            if let Some(note) = line.strip_prefix('#') {
                results.notes.push(note.trim().to_string());
                continue;
            }
            let fields: Vec<&str> = line.split('\t').collect();
            if fields.len() != COLUMNS.len() {
                return Err(err(format!(
                    "{} tab-separated fields, expected {} ({})",
                    fields.len(),
                    COLUMNS.len(),
                    COLUMNS.join(", ")
                )));
            }
            for (name, field) in COLUMNS.iter().zip(&fields) {
                if field.trim().is_empty() && !matches!(*name, "peer" | "unit") {
                    return Err(err(format!("field `{name}` is empty")));
                }
            }
            let value: f64 = fields[3]
                .trim()
                .parse()
                .ok()
                .filter(|v: &f64| v.is_finite())
                .ok_or_else(|| {
                    err(format!(
                        "field `value` is {:?}, expected a finite number",
                        fields[3]
                    ))
                })?;
            let row = Measurement {
                benchmark: fields[0].trim().to_string(),
                variant: fields[1].trim().to_string(),
                metric: fields[2].trim().to_string(),
                value,
                unit: fields[4].trim().to_string(),
                peer: fields[5].trim().to_string(),
                command: fields[6].trim().to_string(),
            };
            match results.rows.iter_mut().find(|r| {
                (&r.benchmark, &r.variant, &r.metric) == (&row.benchmark, &row.variant, &row.metric)
            }) {
                Some(earlier) => *earlier = row,
                None => results.rows.push(row),
            }
        }
        Ok(results)
    }

    /// The row `row` is compared with: same benchmark and metric, variant `row.peer`.
    pub fn peer_of(&self, row: &Measurement) -> Option<&Measurement> {
        if row.peer.is_empty() {
            return None;
        }
        self.rows.iter().find(|p| {
            p.benchmark == row.benchmark && p.metric == row.metric && p.variant == row.peer
        })
    }

    /// `row`'s value divided by its peer's; None without a peer or when the peer's value is 0.
    pub fn ratio(&self, row: &Measurement) -> Option<f64> {
        self.peer_of(row)
            .filter(|p| p.value != 0.0)
            .map(|p| row.value / p.value)
    }

    /// Benchmarks in first-seen order.
    fn benchmarks(&self) -> Vec<&str> {
        let mut names: Vec<&str> = Vec::new();
        for row in &self.rows {
            if !names.contains(&row.benchmark.as_str()) {
                names.push(&row.benchmark);
            }
        }
        names
    }
}

/// `1234567.8` → `1,234,568`; small numbers keep up to three decimals.
pub fn format_value(value: f64) -> String {
    if value.abs() >= 100.0 {
        let digits = format!("{:.0}", value.abs());
        let mut grouped = String::new();
        for (i, c) in digits.chars().enumerate() {
            if i > 0 && (digits.len() - i) % 3 == 0 {
                grouped.push(',');
            }
            grouped.push(c);
        }
        if value < 0.0 {
            format!("-{grouped}")
        } else {
            grouped
        }
    } else {
        let text = format!("{value:.3}");
        text.trim_end_matches('0').trim_end_matches('.').to_string()
    }
}

/// A ratio as `0.402×`, `8.0×`, `35×`.
pub fn format_ratio(ratio: f64) -> String {
    match ratio {
        r if r >= 10.0 => format!("{r:.0}×"),
        r if r >= 1.0 => format!("{r:.2}×"),
        r => format!("{r:.3}×"),
    }
}

/// Text made safe for one Markdown table cell.
fn cell(text: &str) -> String {
    text.replace('|', "\\|").replace('\n', " ")
}

/// The Markdown table: one row per measurement, with its peer, the ratio to it and the command.
pub fn markdown_table(results: &Results) -> String {
    let mut out = String::from(
        "| benchmark | variant | metric | value | peer | ratio to peer | command |\n|---|---|---|---:|---|---:|---|\n",
    );
    for row in &results.rows {
        let ratio = results
            .ratio(row)
            .map(format_ratio)
            .unwrap_or_else(|| "—".to_string());
        let peer = if row.peer.is_empty() {
            "—".to_string()
        } else {
            cell(&row.peer)
        };
        let value = format!("{} {}", format_value(row.value), row.unit);
        let command = format!("`{}`", row.command.replace('`', "'"));
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {} | {} | {} |",
            cell(&row.benchmark),
            cell(&row.variant),
            cell(&row.metric),
            cell(value.trim()),
            peer,
            ratio,
            cell(&command)
        );
    }
    out
}

/// What [`write_report`] wrote.
#[derive(Debug, Clone)]
pub struct ReportFiles {
    /// `report.md`.
    pub markdown: PathBuf,
    /// The SVG plots.
    pub plots: Vec<PathBuf>,
}

/// Reads `results` and writes `report.md` and the SVG plots into `out_dir`.
pub fn write_report(results: &Path, out_dir: &Path) -> Result<ReportFiles, ReportError> {
    let path = results.display().to_string();
    let text = std::fs::read_to_string(results).map_err(|source| ReportError::Io {
        path: path.clone(),
        source,
    })?;
    let parsed = Results::parse(&path, &text)?;
    if parsed.rows.is_empty() {
        return Err(ReportError::Empty(path));
    }
    std::fs::create_dir_all(out_dir).map_err(|source| ReportError::Io {
        path: out_dir.display().to_string(),
        source,
    })?;
    let runs = latency_runs(results.parent().unwrap_or(Path::new(".")))?;
    let plots = write_plots(&parsed, &runs, out_dir)?;
    let mut md = String::from("# orderpipe benchmark report\n\n");
    for note in &parsed.notes {
        let _ = writeln!(md, "- {note}");
    }
    let _ = writeln!(
        md,
        "{}Ratio: the row's value divided by its peer's (same benchmark and metric). Throughputs are per second of active work.\n",
        if parsed.notes.is_empty() { "" } else { "\n" }
    );
    md.push_str(&markdown_table(&parsed));
    md.push_str("\n## Plots\n\n");
    for plot in &plots {
        let name = plot
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let _ = writeln!(md, "![{name}]({name})\n");
    }
    let markdown = out_dir.join("report.md");
    std::fs::write(&markdown, md).map_err(|source| ReportError::Io {
        path: markdown.display().to_string(),
        source,
    })?;
    Ok(ReportFiles { markdown, plots })
}

/// Every plot the results allow: throughput bars per benchmark, throughput
/// against failure rate (ordering), relay throughput per batch size, and a
/// latency CDF per [`LatencyKind`] of the latency `runs` (one line each).
fn write_plots(
    results: &Results,
    runs: &[LatencyRun],
    out_dir: &Path,
) -> Result<Vec<PathBuf>, ReportError> {
    let mut written = Vec::new();
    for benchmark in results.benchmarks() {
        let bars: Vec<(String, f64, String)> = results
            .rows
            .iter()
            .filter(|r| r.benchmark == benchmark && r.is_throughput())
            .map(|r| {
                let label = if r.metric == "throughput" {
                    r.variant.clone()
                } else {
                    format!("{} ({})", r.variant, r.metric)
                };
                (label, r.value, r.unit.clone())
            })
            .collect();
        if bars.is_empty() {
            continue;
        }
        let path = out_dir.join(format!("throughput-{benchmark}.svg"));
        throughput_bars(
            &path,
            &format!("{benchmark}: throughput (log scale)"),
            &bars,
        )
        .map_err(plot_error(&path))?;
        written.push(path);
    }
    let by_mode = failure_rate_series(results);
    if !by_mode.is_empty() {
        let path = out_dir.join("throughput-vs-failure-rate.svg");
        let plot = LinePlot {
            title: "ordering: throughput against failing events".into(),
            x_desc: "failing events (%)",
            y_desc: "events per second",
            log_x: false,
            marks: true,
        };
        plot.draw(&path, &by_mode).map_err(plot_error(&path))?;
        written.push(path);
    }
    let relay = relay_batch_series(results);
    if !relay.is_empty() {
        let path = out_dir.join("relay-throughput-per-batch.svg");
        let series = BTreeMap::from([("relay".to_string(), relay)]);
        let plot = LinePlot {
            title: "relay: throughput per batch size".into(),
            x_desc: "rows per Kafka transaction (log scale)",
            y_desc: "rows per second",
            log_x: true,
            marks: true,
        };
        plot.draw(&path, &series).map_err(plot_error(&path))?;
        written.push(path);
    }
    for kind in LatencyKind::ALL {
        let series: BTreeMap<String, Vec<(f64, f64)>> = runs
            .iter()
            .filter(|run| run.kind == kind && !run.sorted.is_empty())
            .map(|run| {
                let name = format!(
                    "{}: p50 {} ms, p99 {} ms",
                    run.label,
                    format_value(percentile(&run.sorted, 50.0)),
                    format_value(percentile(&run.sorted, 99.0))
                );
                (name, cdf_points(&run.sorted))
            })
            .collect();
        if series.is_empty() {
            continue;
        }
        let (file, title, y_desc) = kind.plot();
        let path = out_dir.join(file);
        let plot = LinePlot {
            title: title.into(),
            x_desc: "milliseconds (log scale)",
            y_desc,
            log_x: true,
            marks: false,
        };
        plot.draw(&path, &series).map_err(plot_error(&path))?;
        written.push(path);
    }
    Ok(written)
}

/// The relay benchmark's API-to-apply latencies of old runs (ms, one a
/// line), beside `results.tsv`; drawn as the run `latency`.
pub const LATENCIES: &str = "relay-latency-ms.txt";

/// Latency runs beside `results.tsv`: `latency-<run>.txt`, written by
/// `dev/bench-latency.sh`, one latency in ms a line after an optional
/// `# label: <name>` line (default: `<run>`).
pub const LATENCY_RUN_PREFIX: &str = "latency-";

/// What a latency run measured, and so the CDF it is drawn on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LatencyKind {
    /// `latency-<run>.txt` (`dev/bench-latency.sh`): API commit → consumer commit.
    Api,
    /// `cdc-latency-<run>.txt` (`dev/bench-cdc.sh`): binlog commit →
    /// read_committed consumer, `cdc` and Debezium.
    Cdc,
}

impl LatencyKind {
    const ALL: [Self; 2] = [Self::Api, Self::Cdc];

    /// The file-name prefix of its runs.
    fn prefix(self) -> &'static str {
        match self {
            Self::Api => LATENCY_RUN_PREFIX,
            Self::Cdc => "cdc-latency-",
        }
    }

    /// Its CDF's file, title and y axis.
    fn plot(self) -> (&'static str, &'static str, &'static str) {
        match self {
            Self::Api => (
                "latency-cdf.svg",
                "API commit → consumer commit: latency CDF",
                "fraction of events applied within",
            ),
            Self::Cdc => (
                "cdc-latency-cdf.svg",
                "binlog commit → read_committed consumer: latency CDF",
                "fraction of changes consumed within",
            ),
        }
    }

    /// The kind of the run in file `name`, if it is one.
    fn of_file(name: &str) -> Option<Self> {
        Self::ALL
            .into_iter()
            .find(|kind| name.starts_with(kind.prefix()) && name.ends_with(".txt"))
    }
}

/// One latency run: its label and its latencies (ms), sorted.
#[derive(Debug, Clone, PartialEq)]
pub struct LatencyRun {
    /// What ran (`100 orders/s`).
    pub label: String,
    /// What it measured.
    pub kind: LatencyKind,
    /// Latencies in milliseconds, ascending.
    pub sorted: Vec<f64>,
}

/// Every latency run in `dir` (the files of each [`LatencyKind`], then the
/// old [`LATENCIES`] file), by file name.
fn latency_runs(dir: &Path) -> Result<Vec<LatencyRun>, ReportError> {
    let mut paths: Vec<PathBuf> = match std::fs::read_dir(dir) {
        Ok(entries) => entries
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| {
                p.file_name()
                    .and_then(|n| n.to_str())
                    .and_then(LatencyKind::of_file)
                    .is_some()
            })
            .collect(),
        Err(_) => Vec::new(),
    };
    paths.sort();
    let legacy = dir.join(LATENCIES);
    if legacy.exists() {
        paths.push(legacy);
    }
    paths.iter().map(|p| sorted_latencies(p)).collect()
}

/// The `q`-th percentile of ascending `sorted` (nearest rank: the smallest
/// value with at least q% of the values at or below it).
pub fn percentile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    // q% of n, less a hair: 0.99 * 1000 is 990.0000000000001 in floating point.
    let rank = ((q * sorted.len() as f64 / 100.0 - 1e-9).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1]
}

/// The latency run in `path`, sorted.
fn sorted_latencies(path: &Path) -> Result<LatencyRun, ReportError> {
    let name = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|source| ReportError::Io {
        path: name.clone(),
        source,
    })?;
    let stem = path
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default();
    let kind = path
        .file_name()
        .and_then(|n| LatencyKind::of_file(&n.to_string_lossy()))
        .unwrap_or(LatencyKind::Api);
    let mut label = match stem.strip_prefix(kind.prefix()) {
        Some(run) => run.to_string(),
        None => "latency".to_string(),
    };
    let mut values = Vec::new();
    for (index, line) in text
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
    {
        if let Some(comment) = line.trim().strip_prefix('#') {
            if let Some(name) = comment.trim().strip_prefix("label:") {
                label = name.trim().to_string();
            }
            continue;
        }
        let value = line
            .trim()
            .parse::<f64>()
            .ok()
            .filter(|v| v.is_finite())
            .ok_or_else(|| ReportError::Line {
                path: name.clone(),
                line: index + 1,
                message: format!(
                    "latency {:?}, expected milliseconds as a number",
                    line.trim()
                ),
            })?;
        values.push(value);
    }
    values.sort_by(f64::total_cmp);
    Ok(LatencyRun {
        label,
        kind,
        sorted: values,
    })
}

/// Smallest latency drawn on the CDF's log axis (ms): a 0 ms stamp
/// difference sits there.
const CDF_FLOOR_MS: f64 = 0.01;

/// (latency, fraction of events at or below it) of sorted `values`, at
/// most about 1,000 points: evenly spaced in rank, plus every point of the
/// top 1% (the tail a log-x CDF is read for), and the maximum at 1.0.
pub fn cdf_points(values: &[f64]) -> Vec<(f64, f64)> {
    let n = values.len();
    let step = n.div_ceil(500).max(1);
    let tail = n - n.div_ceil(100).min(500);
    let mut points: Vec<(f64, f64)> = values
        .iter()
        .enumerate()
        .filter(|(i, _)| i % step == 0 || *i >= tail)
        .map(|(i, v)| (v.max(CDF_FLOOR_MS), (i + 1) as f64 / n as f64))
        .collect();
    if let Some(last) = values
        .last()
        .filter(|_| points.last().is_some_and(|p| p.1 < 1.0))
    {
        points.push((last.max(CDF_FLOOR_MS), 1.0));
    }
    points
}

fn plot_error<E: std::fmt::Display>(path: &Path) -> impl Fn(E) -> ReportError + '_ {
    move |e| ReportError::Plot {
        path: path.display().to_string(),
        message: e.to_string(),
    }
}

/// `ordering` throughput rows named `<mode> <rate>%`: (rate, value) per mode, by rate.
fn failure_rate_series(results: &Results) -> BTreeMap<String, Vec<(f64, f64)>> {
    let mut series: BTreeMap<String, Vec<(f64, f64)>> = BTreeMap::new();
    for row in results
        .rows
        .iter()
        .filter(|r| r.benchmark == "ordering" && r.metric == "throughput")
    {
        let Some((mode, rate)) = row.variant.rsplit_once(' ') else {
            continue;
        };
        let Some(rate) = rate.strip_suffix('%').and_then(|r| r.parse::<f64>().ok()) else {
            continue;
        };
        series
            .entry(format!("mode {mode}"))
            .or_default()
            .push((rate, row.value));
    }
    for points in series.values_mut() {
        points.sort_by(|a, b| a.0.total_cmp(&b.0));
    }
    series
}

/// `relay` throughput rows named `batch <n>`: (n, value), by n.
fn relay_batch_series(results: &Results) -> Vec<(f64, f64)> {
    let mut points: Vec<(f64, f64)> = results
        .rows
        .iter()
        .filter(|r| r.benchmark == "relay" && r.metric == "throughput")
        .filter_map(|r| {
            Some((
                r.variant
                    .strip_prefix("batch ")?
                    .trim()
                    .parse::<f64>()
                    .ok()?,
                r.value,
            ))
        })
        .collect();
    points.sort_by(|a, b| a.0.total_cmp(&b.0));
    points
}

type PlotResult = Result<(), Box<dyn std::error::Error>>;

/// Bars of `(label, value, unit)` on a log scale, each labelled with its value.
fn throughput_bars(path: &Path, title: &str, bars: &[(String, f64, String)]) -> PlotResult {
    let width = (220 * bars.len() as u32).max(640);
    let root = SVGBackend::new(path, (width, 440)).into_drawing_area();
    root.fill(&WHITE)?;
    let max = bars.iter().map(|b| b.1).fold(1.0, f64::max);
    // One unit for the axis when the bars share it (rec/s, events/s), else "per second".
    let unit = match bars.first() {
        Some(first) if bars.iter().all(|b| b.2 == first.2) => first.2.clone(),
        _ => "per second".to_string(),
    };
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 20))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(80)
        .build_cartesian_2d(
            -0.5f64..bars.len() as f64 - 0.5,
            (1.0f64..max * 4.0).log_scale(),
        )?;
    let labels: Vec<String> = bars.iter().map(|b| b.0.clone()).collect();
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(bars.len())
        .x_label_formatter(&|x| {
            let i = x.round();
            if (x - i).abs() < 1e-6 && i >= 0.0 {
                labels.get(i as usize).cloned().unwrap_or_default()
            } else {
                String::new()
            }
        })
        .y_desc(unit)
        .y_label_formatter(&|y| format_value(*y))
        .draw()?;
    chart.draw_series(bars.iter().enumerate().map(|(i, bar)| {
        let color = Palette99::pick(i).filled();
        Rectangle::new(
            [(i as f64 - 0.35, 1.0), (i as f64 + 0.35, bar.1.max(1.0))],
            color,
        )
    }))?;
    chart.draw_series(bars.iter().enumerate().map(|(i, bar)| {
        Text::new(
            format_value(bar.1),
            (i as f64 - 0.3, bar.1.max(1.0) * 1.4),
            ("sans-serif", 14),
        )
    }))?;
    root.present()?;
    Ok(())
}

/// A plot of one line per series.
struct LinePlot {
    title: String,
    x_desc: &'static str,
    y_desc: &'static str,
    /// A logarithmic x axis (batch sizes).
    log_x: bool,
    /// A dot and the value at every point (few points); off for a CDF.
    marks: bool,
}

impl LinePlot {
    fn draw(&self, path: &Path, series: &BTreeMap<String, Vec<(f64, f64)>>) -> PlotResult {
        let (title, x_desc, y_desc) = (self.title.as_str(), self.x_desc, self.y_desc);
        let root = SVGBackend::new(path, (720, 440)).into_drawing_area();
        root.fill(&WHITE)?;
        let points = series.values().flatten();
        let (x_min, x_max) = points.clone().fold((f64::MAX, f64::MIN), |(lo, hi), p| {
            (lo.min(p.0), hi.max(p.0))
        });
        let y_max = points.map(|p| p.1).fold(1.0, f64::max) * 1.15;
        let mut builder = ChartBuilder::on(&root);
        builder
            .caption(title, ("sans-serif", 20))
            .margin(12)
            .x_label_area_size(45)
            .y_label_area_size(80);
        if self.log_x {
            let mut chart = builder.build_cartesian_2d(
                (x_min.max(CDF_FLOOR_MS) * 0.7..x_max * 1.4).log_scale(),
                0f64..y_max,
            )?;
            chart
                .configure_mesh()
                .x_desc(x_desc)
                .y_desc(y_desc)
                .y_label_formatter(&|y| format_value(*y))
                .draw()?;
            draw_lines(&mut chart, series, self.marks)?;
        } else {
            let pad = ((x_max - x_min) * 0.05).max(0.5);
            let mut chart = builder.build_cartesian_2d(x_min - pad..x_max + pad, 0f64..y_max)?;
            chart
                .configure_mesh()
                .x_desc(x_desc)
                .x_label_formatter(&|x| format_value(*x))
                .y_desc(y_desc)
                .y_label_formatter(&|y| format_value(*y))
                .draw()?;
            draw_lines(&mut chart, series, self.marks)?;
        }
        root.present()?;
        Ok(())
    }
}

fn draw_lines<'a, X>(
    chart: &mut ChartContext<
        'a,
        SVGBackend<'a>,
        Cartesian2d<X, plotters::coord::types::RangedCoordf64>,
    >,
    series: &BTreeMap<String, Vec<(f64, f64)>>,
    marks: bool,
) -> PlotResult
where
    X: Ranged<ValueType = f64>,
{
    for (i, (name, points)) in series.iter().enumerate() {
        let color = Palette99::pick(i).to_rgba();
        chart
            .draw_series(LineSeries::new(
                points.iter().copied(),
                color.stroke_width(2),
            ))?
            .label(name.as_str())
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 18, y)], color.stroke_width(2))
            });
        if !marks {
            continue;
        }
        // A value above its point when it is the highest at that x, else
        // below, so close lines do not print over each other.
        let highest = |p: &(f64, f64)| {
            series
                .values()
                .flatten()
                .filter(|q| q.0 == p.0)
                .all(|q| q.1 <= p.1)
        };
        chart.draw_series(points.iter().map(|p| {
            let dy = if highest(p) { -18 } else { 6 };
            EmptyElement::at(*p)
                + Circle::new((0, 0), 4, color.filled())
                + Text::new(format_value(p.1), (6, dy), ("sans-serif", 13))
        }))?;
    }
    chart
        .configure_series_labels()
        .border_style(BLACK)
        .background_style(WHITE.mix(0.8))
        .draw()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAMPLE: &str = "benchmark\tvariant\tmetric\tvalue\tunit\tpeer\tcommand
# sizes: SCALE=0.1
produce\torderpipe produce\tthroughput\t120605\trec/s\tkafka-producer-perf-test\torderpipe produce --count 1000
produce\tkafka-producer-perf-test\tthroughput\t300481.5\trec/s\t\tkafka-producer-perf-test --num-records 1000 | tail -1
produce\torderpipe produce\tpeak RSS\t33\tMB\t\torderpipe produce --count 1000
ordering\tkey 0%\tthroughput\t8000\tevents/s\tnone 0%\tconsume --ordering key
ordering\tnone 0%\tthroughput\t8100\tevents/s\t\tconsume --ordering none
ordering\tkey 1%\tthroughput\t4000\tevents/s\tkey 0%\tconsume --ordering key
ordering\tnone 1%\tthroughput\t3990\tevents/s\tnone 0%\tconsume --ordering none
relay\tbatch 50\tthroughput\t471\trows/s\tplain producer\trelay --batch-size 50
relay\tbatch 1000\tthroughput\t7756\trows/s\tplain producer\trelay --batch-size 1000
relay\tplain producer\tthroughput\t88546\trows/s\t\torderpipe produce
relay\tbatch 50\tthroughput\t500\trows/s\tplain producer\trelay --batch-size 50 (again)
";

    #[test]
    fn rows_ratios_and_the_latest_duplicate() {
        let results = Results::parse("results.tsv", SAMPLE).unwrap();
        assert_eq!(results.notes, vec!["sizes: SCALE=0.1"]);
        assert_eq!(results.rows.len(), 10);
        let ours = &results.rows[0];
        assert!((results.ratio(ours).unwrap() - 120605.0 / 300481.5).abs() < 1e-12);
        assert_eq!(
            results.ratio(&results.rows[1]),
            None,
            "a row without a peer has no ratio"
        );
        // the same variant and metric again: the later value replaces the earlier, in place
        let batch50 = results
            .rows
            .iter()
            .find(|r| r.variant == "batch 50")
            .unwrap();
        assert_eq!(batch50.value, 500.0);
        assert_eq!(batch50.command, "relay --batch-size 50 (again)");

        let table = markdown_table(&results);
        let lines: Vec<&str> = table.lines().collect();
        assert_eq!(lines.len(), 2 + 10);
        assert_eq!(
            lines[2],
            "| produce | orderpipe produce | throughput | 120,605 rec/s | kafka-producer-perf-test | 0.401× | `orderpipe produce --count 1000` |"
        );
        // a pipe inside a command does not split the cell
        assert!(
            lines[3]
                .ends_with("| — | — | `kafka-producer-perf-test --num-records 1000 \\| tail -1` |"),
            "{}",
            lines[3]
        );
        assert!(lines.iter().any(|l| {
            l.starts_with("| ordering | key 1% | throughput | 4,000 events/s | key 0% | 0.500× |")
        }));
        assert!(lines.iter().any(|l| l.starts_with(
            "| relay | batch 50 | throughput | 500 rows/s | plain producer | 0.006× |"
        )));
    }

    #[test]
    fn bad_lines_name_the_line_and_the_field() {
        let err = Results::parse("r.tsv", "produce\tours\tthroughput\tfast\trec/s\t\tcmd\n")
            .unwrap_err()
            .to_string();
        assert_eq!(
            err,
            "r.tsv line 1: field `value` is \"fast\", expected a finite number"
        );
        let err = Results::parse("r.tsv", "# note\nproduce\tours\tthroughput\t1\n")
            .unwrap_err()
            .to_string();
        assert_eq!(
            err,
            "r.tsv line 2: 4 tab-separated fields, expected 7 (benchmark, variant, metric, value, unit, peer, command)"
        );
        let err = Results::parse("r.tsv", "produce\t\tthroughput\t1\trec/s\t\tcmd\n")
            .unwrap_err()
            .to_string();
        assert_eq!(err, "r.tsv line 1: field `variant` is empty");
    }

    #[test]
    fn a_bad_latency_names_its_line() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(LATENCIES);
        std::fs::write(&path, "12.5\n\nslow\n").unwrap();
        let err = sorted_latencies(&path).unwrap_err().to_string();
        assert!(
            err.ends_with("line 3: latency \"slow\", expected milliseconds as a number"),
            "{err}"
        );
        std::fs::write(&path, "3\n1\n2\n").unwrap();
        let run = sorted_latencies(&path).unwrap();
        assert_eq!(
            run,
            LatencyRun {
                label: "latency".into(),
                kind: LatencyKind::Api,
                sorted: vec![1.0, 2.0, 3.0]
            }
        );
        assert_eq!(
            cdf_points(&run.sorted),
            [(1.0, 1.0 / 3.0), (2.0, 2.0 / 3.0), (3.0, 1.0)]
        );
        let named = dir.path().join("latency-low.txt");
        std::fs::write(&named, "# label: 100 orders/s\n0\n7.5\n").unwrap();
        let run = sorted_latencies(&named).unwrap();
        assert_eq!(
            run,
            LatencyRun {
                label: "100 orders/s".into(),
                kind: LatencyKind::Api,
                sorted: vec![0.0, 7.5]
            }
        );
        let cdc = dir.path().join("cdc-latency-debezium.txt");
        std::fs::write(&cdc, "4\n").unwrap();
        let run = sorted_latencies(&cdc).unwrap();
        assert_eq!(
            (run.label.as_str(), run.kind),
            ("debezium", LatencyKind::Cdc)
        );
    }

    #[test]
    fn the_cdf_rises_to_one_keeps_the_tail_and_floors_zero_for_the_log_axis() {
        // 0..10,000 ms: rank-spaced points, then every point of the top 1%.
        let values: Vec<f64> = (0..10_000).map(f64::from).collect();
        let points = cdf_points(&values);
        assert_eq!(
            points[0],
            (CDF_FLOOR_MS, 1.0 / 10_000.0),
            "0 ms drawn at the floor"
        );
        assert!(
            points
                .windows(2)
                .all(|w| w[0].0 <= w[1].0 && w[0].1 < w[1].1),
            "monotone"
        );
        assert_eq!(*points.last().unwrap(), (9_999.0, 1.0));
        let tail: Vec<&(f64, f64)> = points.iter().filter(|p| p.1 > 0.99).collect();
        assert_eq!(tail.len(), 100, "every one of the top 1%");
        assert!(points.len() <= 1_000, "{}", points.len());
        // Each point's fraction is the share of values at or below it.
        for (x, f) in &points[1..] {
            let at_or_below = values.iter().filter(|v| *v <= x).count() as f64;
            assert_eq!(*f, at_or_below / 10_000.0);
        }
        assert!(cdf_points(&[]).is_empty());
        assert_eq!(cdf_points(&[5.0]), [(5.0, 1.0)]);
    }

    #[test]
    fn percentiles_are_nearest_rank() {
        let sorted: Vec<f64> = (1..=1000).map(f64::from).collect();
        assert_eq!(percentile(&sorted, 50.0), 500.0);
        assert_eq!(percentile(&sorted, 99.0), 990.0);
        assert_eq!(percentile(&sorted, 99.9), 999.0);
        assert_eq!(percentile(&sorted, 100.0), 1000.0);
        assert_eq!(percentile(&[4.0], 50.0), 4.0);
        assert!(percentile(&[], 50.0).is_nan());
    }

    #[test]
    fn numbers_are_formatted_for_reading() {
        assert_eq!(format_value(1234567.8), "1,234,568");
        assert_eq!(format_value(120.0), "120");
        assert_eq!(format_value(3.3925), "3.393");
        assert_eq!(format_value(0.05), "0.05");
        assert_eq!(format_ratio(0.0132), "0.013×");
        assert_eq!(format_ratio(8.04), "8.04×");
        assert_eq!(format_ratio(35.2), "35×");
    }

    /// Every tag opened is closed in order (a small XML well-formedness check:
    /// no XML crate is a dependency).
    fn assert_well_formed(svg: &str) {
        let mut open: Vec<String> = Vec::new();
        let mut rest = svg.trim_start();
        if rest.starts_with("<?xml") {
            rest = &rest[rest.find("?>").expect("xml declaration closed") + 2..];
        }
        while let Some(start) = rest.find('<') {
            let end = start + rest[start..].find('>').expect("tag closed with >");
            let tag = &rest[start + 1..end];
            if let Some(name) = tag.strip_prefix('/') {
                assert_eq!(
                    open.pop().as_deref(),
                    Some(name.trim()),
                    "closing tag </{name}> matches"
                );
            } else if !tag.ends_with('/') && !tag.starts_with('!') {
                open.push(tag.split_whitespace().next().unwrap().to_string());
            }
            rest = &rest[end + 1..];
        }
        assert!(open.is_empty(), "unclosed tags: {open:?}");
    }

    /// The contents of the `<text>` elements, trimmed.
    fn texts(svg: &str) -> Vec<String> {
        svg.split("<text")
            .skip(1)
            .map(|t| {
                t[t.find('>').unwrap() + 1..t.find("</text>").unwrap()]
                    .trim()
                    .to_string()
            })
            .collect()
    }

    #[test]
    fn report_and_plots_are_written_and_well_formed() {
        let dir = tempfile::tempdir().unwrap();
        let results = dir.path().join("results.tsv");
        std::fs::write(&results, SAMPLE).unwrap();
        let latencies: String = (1..=1000).map(|i| format!("{}\n", 1000 - i)).collect();
        std::fs::write(
            dir.path().join("latency-low.txt"),
            format!("# label: 100 orders/s\n{latencies}"),
        )
        .unwrap();
        let fast: String = (1..=1000)
            .map(|i| format!("{}\n", f64::from(i) / 10.0))
            .collect();
        std::fs::write(
            dir.path().join("latency-high.txt"),
            format!("# label: 5000 events/s\n{fast}"),
        )
        .unwrap();
        std::fs::write(
            dir.path().join("cdc-latency-cdc.txt"),
            format!("# label: orderpipe cdc\n{fast}"),
        )
        .unwrap();
        let out = dir.path().join("out");
        let files = write_report(&results, &out).unwrap();

        let md = std::fs::read_to_string(&files.markdown).unwrap();
        assert!(md.starts_with("# orderpipe benchmark report\n\n- sizes: SCALE=0.1\n"));
        assert!(md.contains(
            "| ordering | key 0% | throughput | 8,000 events/s | none 0% | 0.988× | `consume --ordering key` |"
        ));
        let names: Vec<String> = files
            .plots
            .iter()
            .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
            .collect();
        assert_eq!(
            names,
            [
                "throughput-produce.svg",
                "throughput-ordering.svg",
                "throughput-relay.svg",
                "throughput-vs-failure-rate.svg",
                "relay-throughput-per-batch.svg",
                "latency-cdf.svg",
                "cdc-latency-cdf.svg"
            ]
        );
        for (plot, name) in files.plots.iter().zip(&names) {
            assert!(
                md.contains(&format!("![{name}]({name})")),
                "report links {name}"
            );
            let svg = std::fs::read_to_string(plot).unwrap();
            assert!(
                svg.contains("<svg") && svg.trim_end().ends_with("</svg>"),
                "{name}"
            );
            assert_well_formed(&svg);
        }
        let text_of = |name: &str| texts(&std::fs::read_to_string(out.join(name)).unwrap());
        let bars = text_of("throughput-produce.svg");
        for label in [
            "orderpipe produce",
            "kafka-producer-perf-test",
            "120,605",
            "300,482",
        ] {
            assert!(bars.contains(&label.to_string()), "{label} in {bars:?}");
        }
        let rates = text_of("throughput-vs-failure-rate.svg");
        for label in ["mode key", "mode none", "8,000", "4,000", "3,990"] {
            assert!(rates.contains(&label.to_string()), "{label} in {rates:?}");
        }
        // One line per run, named with its nearest-rank p50 and p99.
        let cdf = text_of("latency-cdf.svg");
        for label in [
            "API commit → consumer commit: latency CDF",
            "100 orders/s: p50 499 ms, p99 989 ms",
            "5000 events/s: p50 50 ms, p99 99 ms",
        ] {
            assert!(cdf.contains(&label.to_string()), "{label} in {cdf:?}");
        }
        let relay = text_of("relay-throughput-per-batch.svg");
        for label in ["500", "7,756"] {
            assert!(relay.contains(&label.to_string()), "{label} in {relay:?}");
        }
    }

    #[test]
    fn an_empty_results_file_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let results = dir.path().join("results.tsv");
        std::fs::write(&results, format!("{}\n", COLUMNS.join("\t"))).unwrap();
        let err = write_report(&results, dir.path()).unwrap_err().to_string();
        assert!(
            err.ends_with("no measurements (run `make bench` or a dev/bench-*.sh script first)"),
            "{err}"
        );
    }
}
