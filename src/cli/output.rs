//! How commands print results: a table for people, JSON for machines.

use comfy_table::{Table, presets::UTF8_FULL_CONDENSED};
use indicatif::{ProgressBar, ProgressStyle};
use serde::Serialize;

use super::produce::ProduceSummary;
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

/// Prints `value` as pretty JSON on stdout.
pub(crate) fn json(value: &impl Serialize) {
    println!("{}", serde_json::to_string_pretty(value).expect("reports serialize"));
}

/// A table with `header` and `rows` in the commands' style.
pub(crate) fn table(header: &[&str], rows: impl IntoIterator<Item = Vec<String>>) -> Table {
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
        "group {}: consumed {}, applied {}, duplicates skipped {}, poison {}, failed attempts {}, \
         recovered by local retry {}, sent to retry topic {}, dead-lettered {}, \
         held behind a parked key {}, released in order {}",
        summary.group,
        summary.consumed,
        summary.applied,
        summary.duplicates,
        summary.decode_failures,
        summary.apply_failures,
        summary.recovered_locally,
        summary.sent_to_retry,
        summary.dead_lettered,
        summary.held,
        summary.released
    );
    if summary.unsupported_versions + summary.conflicting_duplicates > 0 {
        println!(
            "unsupported event_version (dead-lettered) {}, conflicting duplicates (event id reused, see `orderpipe dlq conflicts`) {}",
            summary.unsupported_versions, summary.conflicting_duplicates
        );
    }
    let rows = summary.handlers.iter().map(|(name, c)| {
        vec![name.clone(), c.applied.to_string(), c.already_done.to_string(), c.ignored.to_string()]
    });
    println!("{}", table(&["handler", "applied", "already done", "not its event"], rows));
}

fn time_ms(ms: i64) -> String {
    chrono::DateTime::from_timestamp_millis(ms)
        .map(|t| t.format("%Y-%m-%d %H:%M:%S").to_string())
        .unwrap_or_else(|| ms.to_string())
}

fn short(text: &str, max: usize) -> String {
    if text.chars().count() <= max {
        text.to_string()
    } else {
        format!("{}…", text.chars().take(max).collect::<String>())
    }
}

/// `orderpipe dlq list`.
pub fn dead_letters(rows: &[crate::dlq::store::DeadLetter], format: Output) {
    if format == Output::Json {
        return json(&rows);
    }
    let table_rows = rows.iter().map(|r| {
        vec![
            r.id.to_string(),
            r.status.clone(),
            r.consumer_group.clone(),
            r.event_name.clone().unwrap_or_else(|| "-".into()),
            format!("{}/{}@{}", r.original_topic, r.original_partition, r.original_offset),
            r.error_class.clone(),
            short(&r.error_message, 60),
            r.attempts.to_string(),
            time_ms(r.last_failure_ms),
            r.replay_count.to_string(),
        ]
    });
    println!(
        "{}",
        table(
            &["id", "status", "group", "event", "origin", "class", "error", "attempts", "last failure (UTC)", "replays"],
            table_rows
        )
    );
    println!("{} dead letters", rows.len());
}

/// `orderpipe dlq show`.
pub fn dead_letter(
    record: &crate::dlq::store::DeadLetterRecord,
    decoded: &serde_json::Value,
    heads: Option<&(crate::ordering::Parked, i64)>,
    format: Output,
) {
    let r = &record.row;
    let headers: serde_json::Value = serde_json::from_str(&record.headers).unwrap_or_default();
    let doc = serde_json::json!({
        "dead_letter": r,
        "heads_parked_key": heads.map(|(p, held)| serde_json::json!({"parked": p, "held_records": held})),
        "key": record.key.as_ref().map(|k| String::from_utf8_lossy(k).into_owned()),
        "value_bytes": record.payload.as_ref().map_or(0, Vec::len),
        "headers": headers,
        "envelope": decoded,
    });
    if format == Output::Json {
        return json(&doc);
    }
    println!("dead letter {} — {} (group {})", r.id, r.status, r.consumer_group);
    println!("origin:   {} partition {} offset {}", r.original_topic, r.original_partition, r.original_offset);
    println!("event:    {} {}", r.event_name.as_deref().unwrap_or("-"), r.event_id.as_deref().unwrap_or("-"));
    println!("error:    [{}] {}", r.error_class, r.error_message);
    println!(
        "history:  {} attempts, first failure {}, last failure {}, replayed {} times{}",
        r.attempts,
        time_ms(r.first_failure_ms),
        time_ms(r.last_failure_ms),
        r.replay_count,
        r.last_replayed_ms.map(|t| format!(" (last {})", time_ms(t))).unwrap_or_default()
    );
    if let Some(reason) = &r.ignored_reason {
        println!("ignored:  {reason}");
    }
    if let Some((parked, held)) = heads {
        println!(
            "parked:   heads key {} (parked {}, {}): {held} records held behind it (dlq list --status held --group {})",
            parked.key,
            time_ms(parked.parked_ms),
            parked.state,
            r.consumer_group
        );
    }
    println!("key:      {}", doc["key"]);
    println!("headers:\n{}", serde_json::to_string_pretty(&headers).unwrap_or_default());
    println!("envelope:\n{}", serde_json::to_string_pretty(decoded).unwrap_or_default());
}

/// Where a parked key's head is: its dead-letter row, or the retry topic.
fn head_place(view: &crate::dlq::held::HeldView) -> String {
    match (&view.head, view.head_dead_letter) {
        (None, _) => "- (unparked; being released)".into(),
        (Some(h), Some(id)) => format!("dead letter {id} ({}, {})", h.head_event_name.as_deref().unwrap_or("undecodable"), h.state),
        (Some(h), None) => format!("{} at {} ({})", h.head_event_name.as_deref().unwrap_or("undecodable"), h.head_origin, h.state),
    }
}

/// `orderpipe dlq list --status held`.
pub fn held_records(views: &[crate::dlq::held::HeldView], format: Output) {
    if format == Output::Json {
        return json(&views);
    }
    let rows = views.iter().map(|v| {
        let h = &v.held;
        vec![
            h.id.to_string(),
            h.consumer_group.clone(),
            h.key.clone(),
            h.event_name.clone().unwrap_or_else(|| "undecodable".into()),
            format!("{}/{}@{}", h.source_topic, h.source_partition, h.source_offset),
            time_ms(h.held_ms),
            head_place(v),
        ]
    });
    println!("{}", table(&["id", "group", "key", "event", "source", "held since (UTC)", "waiting behind"], rows));
    println!("{} held records", views.len());
}

/// `orderpipe dlq conflicts`.
pub fn conflicts(conflicts: &[crate::dedup::Conflict], format: Output) {
    if format == Output::Json {
        return json(&conflicts);
    }
    let rows = conflicts.iter().map(|c| {
        vec![
            c.id.to_string(),
            c.consumer_group.clone(),
            c.event_id.clone(),
            c.event_name.clone(),
            format!("{}/{}@{} ({})", c.first_topic, c.first_partition, c.first_offset, &c.first_digest[..12.min(c.first_digest.len())]),
            format!("{}/{}@{} ({})", c.topic, c.partition, c.offset, &c.digest[..12.min(c.digest.len())]),
            time_ms(c.detected_ms),
        ]
    });
    println!("{}", table(&["id", "group", "event id", "event", "applied (digest)", "skipped (digest)", "detected (UTC)"], rows));
    println!("{} conflicting duplicates: an event id reused with different content; only the applied one took effect", conflicts.len());
}

/// `orderpipe dlq show --held`.
pub fn held_record(view: &crate::dlq::held::HeldView, format: Output) {
    if format == Output::Json {
        return json(view);
    }
    let h = &view.held;
    println!("held record {} — group {}, key {}", h.id, h.consumer_group, h.key);
    println!("event:    {} {}", h.event_name.as_deref().unwrap_or("undecodable"), h.event_id.as_deref().unwrap_or("-"));
    println!("source:   {} partition {} offset {}", h.source_topic, h.source_partition, h.source_offset);
    println!("held:     since {}", time_ms(h.held_ms));
    println!("behind:   {}", head_place(view));
    if let Some(id) = view.head_dead_letter {
        println!(
            "release:  orderpipe dlq replay --id {id}   (or: orderpipe dlq ignore --id {id} --reason ... --release-followers)"
        );
    }
}

/// `orderpipe dlq ignore`.
pub fn ignored(summary: &crate::dlq::ignore::IgnoreSummary, reason: &str, format: Output) {
    if format == Output::Json {
        return json(summary);
    }
    println!("ignored {} dead letters: {reason}", summary.ignored);
    for (group, key, held) in &summary.released {
        println!("  key {key} of {group}: released, {held} held records will be applied in order by the group's consumer");
    }
    for (group, key, held) in &summary.kept_held {
        println!("  key {key} of {group}: stays parked, {held} records kept held");
    }
}

/// `orderpipe dlq stats`.
pub fn dlq_stats(counts: &[crate::dlq::store::Count], format: Output) {
    if format == Output::Json {
        return json(&counts);
    }
    let rows = counts.iter().map(|c| vec![c.by.to_string(), c.value.clone(), c.rows.to_string()]);
    println!("{}", table(&["by", "value", "dead letters"], rows));
}

/// `orderpipe dlq replay --dry-run`.
pub fn replay_plan(plan: &[crate::dlq::replay::Planned], format: Output) {
    if format == Output::Json {
        return json(&plan);
    }
    // An absent event name or id prints as JSON's null, as it always has.
    let or_null = |v: &Option<String>| v.clone().unwrap_or_else(|| "null".into());
    let table_rows = plan
        .iter()
        .map(|p| vec![p.id.to_string(), p.group.clone(), or_null(&p.event_name), or_null(&p.event_id), p.to.clone()]);
    println!("{}", table(&["id", "group", "event", "event id", "would go to"], table_rows));
    println!("dry run: {} dead letters would be replayed; nothing changed", plan.len());
}

/// `orderpipe dlq replay`.
pub fn replayed(summary: &crate::dlq::replay::ReplaySummary, format: Output) {
    if format == Output::Json {
        return json(summary);
    }
    for (topic, n) in &summary.by_topic {
        println!("replayed {n} to {topic}");
    }
    println!("replayed {}, failed {}", summary.replayed, summary.failed.len());
    for f in &summary.failed {
        println!("  failed: {f}");
    }
}

/// `orderpipe relay` (at exit).
pub fn relay(summary: &crate::outbox::relay::RelaySummary) {
    println!(
        "relay: published {} outbox rows in {} Kafka transactions ({} aborted), purged {} sent rows",
        summary.published, summary.transactions, summary.aborted, summary.purged
    );
    let rows = summary.by_topic.iter().map(|(t, n)| vec![t.clone(), n.to_string()]);
    println!("{}", table(&["topic", "records"], rows));
}
