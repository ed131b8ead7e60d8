//! How commands print results: a table for people, JSON for machines.
//!
//! The shared pieces ([`Output`], tables, JSON, progress bars) and the
//! printers of the commands `cli/mod.rs` runs itself (`schema`, `topics`);
//! every other command prints in its own file (`dlq.rs`, `consume.rs`, ...).

use comfy_table::{Table, presets::UTF8_FULL_CONDENSED};
use indicatif::{ProgressBar, ProgressStyle};
use serde::Serialize;
use std::collections::BTreeMap;

use crate::schema::{CompatReport, Registered};
use crate::stages::StageTimes;
use crate::topics::{Change, TopicState};

/// Output format of a command.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Output {
    /// Human-readable table.
    Table,
    /// One JSON document on stdout.
    Json,
}

/// Prints `value` as pretty JSON on stdout.
pub(crate) fn json(value: &impl Serialize) {
    println!(
        "{}",
        serde_json::to_string_pretty(value).expect("reports serialize")
    );
}

/// A table with `header` and `rows` in the commands' style.
pub(crate) fn table(header: &[&str], rows: impl IntoIterator<Item = Vec<String>>) -> Table {
    let mut table = Table::new();
    table
        .load_preset(UTF8_FULL_CONDENSED)
        .set_header(header.to_vec());
    for row in rows {
        table.add_row(row);
    }
    table
}

/// The time per batch of each stage of a pipeline (the relays', `cdc`'s).
pub(crate) fn stage_table(stages: &BTreeMap<String, StageTimes>) -> Table {
    let ms = |v: f64| format!("{v:.1}");
    let rows = stages.iter().map(|(stage, t)| {
        vec![
            stage.clone(),
            t.count.to_string(),
            ms(t.mean),
            ms(t.p50),
            ms(t.p99),
            ms(t.max),
        ]
    });
    table(
        &[
            "stage (per batch)",
            "batches",
            "mean ms",
            "p50 ms",
            "p99 ms",
            "max ms",
        ],
        rows,
    )
}

/// Prints `items` as JSON, or as a table with `header` and one `row` per
/// item: the list printers of the commands (`subs list`, ...) differ only
/// in their columns.
pub(crate) fn print_list<T: Serialize>(
    items: &[T],
    format: Output,
    header: &[&str],
    row: impl Fn(&T) -> Vec<String>,
) {
    if format == Output::Json {
        return json(&items);
    }
    println!("{}", table(header, items.iter().map(row)));
}

/// A progress bar on stderr (drawn only on a terminal); `len` None = spinner.
pub fn progress_bar(len: Option<u64>, what: &str) -> ProgressBar {
    let bar = match len {
        Some(n) => ProgressBar::new(n),
        None => ProgressBar::new_spinner(),
    };
    let template = format!(
        "{{elapsed_precise}} [{{bar:40}}] {{pos}}/{{len}} {what} ({{per_sec}}, eta {{eta}})"
    );
    bar.set_style(
        ProgressStyle::with_template(&template)
            .expect("valid template")
            .progress_chars("=> "),
    );
    bar
}

/// `orderpipe schema register`.
pub fn registered(registered: &[Registered], format: Output) {
    if format == Output::Json {
        return json(&registered);
    }
    let rows = registered
        .iter()
        .map(|r| vec![r.subject.clone(), r.id.to_string()]);
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
        table(
            &[
                "subject",
                "registered id",
                "verdict",
                "registry says",
                "problem"
            ],
            rows
        )
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
    // A refused repartition stops the whole run: nothing else was applied.
    let refused = changes.iter().any(Change::is_refused);
    for change in changes {
        let prefix = match (dry_run, refused && change.is_mutation()) {
            (true, _) => "(dry run) ",
            (false, true) => "(not done) ",
            (false, false) => "",
        };
        println!("{prefix}{change}");
    }
}

/// `orderpipe topics describe`.
pub fn topic_states(states: &[TopicState], format: Output) {
    if format == Output::Json {
        return json(&states);
    }
    let rows = states.iter().map(|s| {
        let get = |k: &str| {
            s.configs
                .get(k)
                .cloned()
                .unwrap_or_else(|| "(default)".into())
        };
        vec![
            s.topic.clone(),
            if s.exists {
                s.partitions.to_string()
            } else {
                "missing".into()
            },
            s.replication_factor.to_string(),
            get("min.insync.replicas"),
            retention(&get("retention.ms")),
            if s.drift.is_empty() {
                "as declared".into()
            } else {
                s.drift.join("; ")
            },
        ]
    });
    println!(
        "{}",
        table(
            &[
                "topic",
                "partitions",
                "replicas",
                "min.insync",
                "retention",
                "drift"
            ],
            rows
        )
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

/// The CLI's side: `mask` applied to what `apply` is given, unless the
/// user said `--reveal`, which is written to the audit table first (who:
/// `$USER`, role `cli`, `target` naming what was shown).
pub async fn cli_mask(
    db: &crate::db::Db,
    mask: &crate::masking::FieldMask,
    reveal: bool,
    target: serde_json::Value,
) -> Result<Option<crate::masking::FieldMask>, crate::db::DbError> {
    if mask.is_empty() {
        return Ok(None);
    }
    if !reveal {
        return Ok(Some(mask.clone()));
    }
    let who = super::who(None);
    crate::console::audit::record_as(db, &who, "cli", "reveal", &target, 1, "masked fields shown")
        .await?;
    Ok(None)
}
