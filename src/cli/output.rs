//! How commands print results: a table for people, JSON for machines.

use comfy_table::{Table, presets::UTF8_FULL_CONDENSED};
use indicatif::{ProgressBar, ProgressStyle};
use serde::Serialize;

use super::produce::ProduceSummary;
use crate::demo::DemoReport;
use crate::schema::{CompatReport, Registered};
use crate::topics::{Change, TopicState};

/// Output format of a command.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Output {
    /// Human-readable table.
    Table,
    /// One JSON document on stdout.
    Json,
}

fn json(value: &impl Serialize) {
    println!("{}", serde_json::to_string_pretty(value).expect("reports serialize"));
}

fn table(header: &[&str], rows: impl IntoIterator<Item = Vec<String>>) -> Table {
    let mut table = Table::new();
    table.load_preset(UTF8_FULL_CONDENSED).set_header(header.to_vec());
    for row in rows {
        table.add_row(row);
    }
    table
}

/// A progress bar on stderr (drawn only on a terminal); `len` None = spinner.
pub fn progress_bar(len: Option<u64>, what: &str) -> ProgressBar {
    let bar = match len {
        Some(n) => ProgressBar::new(n),
        None => ProgressBar::new_spinner(),
    };
    let template = format!("{{elapsed_precise}} [{{bar:40}}] {{pos}}/{{len}} {what} ({{per_sec}}, eta {{eta}})");
    bar.set_style(
        ProgressStyle::with_template(&template)
            .expect("valid template")
            .progress_chars("=> "),
    );
    bar
}

/// `orderpipe demo`.
pub fn demo(report: &DemoReport, format: Output) {
    if format == Output::Json {
        return json(report);
    }
    println!(
        "orderpipe demo: embedded stack (librdkafka mock cluster + in-process schema registry)\n"
    );
    let rows = report.by_event.iter().map(|(k, v)| vec![k.clone(), v.to_string()]);
    println!("{}", table(&["event", "count"], rows));
    let rows = report.by_partition.iter().map(|(k, v)| vec![k.to_string(), v.to_string()]);
    println!("{}", table(&["partition", "events"], rows));
    println!(
        "produced {} events for {} orders, read back and decoded {}",
        report.produced, report.orders, report.consumed
    );
    if report.ordering_violations.is_empty() {
        println!(
            "per-order ordering: OK — every order's events are in one partition, in the order produced"
        );
    } else {
        println!("per-order ordering: {} VIOLATIONS", report.ordering_violations.len());
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
            report.group_order_violations.get(&g.group).copied().unwrap_or(0).to_string(),
        ]
    });
    println!(
        "{}",
        table(&["group", "handlers", "consumed", "applied", "duplicates skipped", "orders out of order"], rows)
    );
    let v = &report.verification;
    let rows = v.facts.iter().map(|f| {
        let ok = if f.expected == f.actual { "ok" } else { "MISMATCH" };
        vec![f.what.to_string(), f.expected.to_string(), f.actual.to_string(), ok.to_string()]
    });
    println!("{}", table(&["business table check", "expected", "actual", ""], rows));
    if v.is_exact() && report.group_order_violations.values().all(|n| *n == 0) {
        println!("exactly-once check: OK — every table matches the events applied exactly once, in order");
    } else {
        println!("exactly-once check: FAILED");
    }
    println!("demo took {:.1} s", report.elapsed_ms as f64 / 1000.0);
}

/// `orderpipe schema register`.
pub fn registered(registered: &[Registered], format: Output) {
    if format == Output::Json {
        return json(&registered);
    }
    let rows = registered.iter().map(|r| vec![r.subject.clone(), r.id.to_string()]);
    println!("{}", table(&["subject", "schema id"], rows));
}

/// `orderpipe schema check`.
pub fn compat(reports: &[CompatReport], format: Output) {
    if format == Output::Json {
        return json(&reports);
    }
    let rows = reports.iter().map(|r| {
        let verdict = match (r.registered_id, r.is_compatible()) {
            (None, _) => "new subject (nothing registered yet)".to_string(),
            (Some(_), true) => "compatible".to_string(),
            (Some(_), false) => "INCOMPATIBLE".to_string(),
        };
        let registry = match r.registry_compatible {
            None => "-".to_string(),
            Some(true) => "compatible".to_string(),
            Some(false) => "incompatible".to_string(),
        };
        vec![
            r.subject.clone(),
            r.registered_id.map_or("-".into(), |id| id.to_string()),
            verdict,
            registry,
            r.local_problem.clone().unwrap_or_default(),
        ]
    });
    println!(
        "{}",
        table(&["subject", "registered id", "verdict", "registry says", "problem"], rows)
    );
}

/// `orderpipe topics ensure`.
pub fn changes(changes: &[Change], dry_run: bool, format: Output) {
    if format == Output::Json {
        return json(&changes);
    }
    if changes.is_empty() {
        println!("topics are up to date: nothing to change");
    }
    let prefix = if dry_run { "(dry run) " } else { "" };
    for change in changes {
        println!("{prefix}{change}");
    }
}

/// `orderpipe topics describe`.
pub fn topic_states(states: &[TopicState], format: Output) {
    if format == Output::Json {
        return json(&states);
    }
    let rows = states.iter().map(|s| {
        let get = |k: &str| s.configs.get(k).cloned().unwrap_or_else(|| "(default)".into());
        vec![
            s.topic.clone(),
            if s.exists { s.partitions.to_string() } else { "missing".into() },
            s.replication_factor.to_string(),
            get("min.insync.replicas"),
            retention(&get("retention.ms")),
            if s.drift.is_empty() { "as declared".into() } else { s.drift.join("; ") },
        ]
    });
    println!(
        "{}",
        table(&["topic", "partitions", "replicas", "min.insync", "retention", "drift"], rows)
    );
}

fn retention(ms: &str) -> String {
    match ms.parse::<i64>() {
        Ok(-1) => "forever".into(),
        Ok(ms) if ms % 86_400_000 == 0 => format!("{}d", ms / 86_400_000),
        Ok(ms) => format!("{ms}ms"),
        Err(_) => ms.to_string(),
    }
}

/// `orderpipe produce`.
pub fn produce(summary: &ProduceSummary, format: Output) {
    if format == Output::Json {
        return json(summary);
    }
    let r = &summary.report;
    let rows = r.by_event.iter().map(|(k, v)| vec![k.clone(), v.to_string()]);
    println!("{}", table(&["event", "acknowledged"], rows));
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

/// `orderpipe consume` (at exit).
pub fn consume(summary: &crate::consumer::ConsumeSummary, format: Output) {
    if format == Output::Json {
        return json(summary);
    }
    println!(
        "group {}: consumed {}, applied {}, duplicates skipped {}, decode failures {}, apply failures (retried) {}",
        summary.group,
        summary.consumed,
        summary.applied,
        summary.duplicates,
        summary.decode_failures,
        summary.apply_failures
    );
    let rows = summary.handlers.iter().map(|(name, c)| {
        vec![name.clone(), c.applied.to_string(), c.already_done.to_string(), c.ignored.to_string()]
    });
    println!("{}", table(&["handler", "applied", "already done", "not its event"], rows));
}
