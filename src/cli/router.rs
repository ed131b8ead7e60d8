//! `orderpipe subs reconcile`: the router's desired vs actual state, printed
//! (the router itself runs the same comparison at start and on a timer).

use std::process::ExitCode;

use super::output::{self, Output};
use crate::config::Settings;
use crate::router::reconcile::{self, Report};
use crate::subscriptions::Store;
use crate::subscriptions::store::RequestKind;

/// Prints the difference between the desired groups and the broker; without
/// `dry_run` also asks the routers to refresh now (they start what is missing).
/// Exits 1 when something is missing or orphaned.
pub async fn reconcile(
    settings: &Settings,
    store: &Store,
    dry_run: bool,
    format: Output,
) -> anyhow::Result<ExitCode> {
    let report = reconcile::compare_with_broker(settings, store).await?;
    let refresh = if dry_run {
        None
    } else {
        Some(store.request(RequestKind::Refresh, None).await?.id)
    };
    print(&report, refresh, format);
    let clean = report.missing.is_empty()
        && report.orphaned_groups.is_empty()
        && report.orphaned_topics.is_empty();
    Ok(if clean {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

fn print(report: &Report, refresh: Option<i64>, format: Output) {
    if format == Output::Json {
        return output::json(&serde_json::json!({"report": report, "refresh_request": refresh}));
    }
    let mut rows = Vec::new();
    for group in &report.desired {
        let status = if report.missing.contains(group) {
            "MISSING: no router runs it"
        } else {
            "running"
        };
        rows.push(vec!["group".to_string(), group.clone(), status.to_string()]);
    }
    for group in &report.orphaned_groups {
        rows.push(vec![
            "group".into(),
            group.clone(),
            "ORPHANED: nothing binds it (not deleted)".into(),
        ]);
    }
    for topic in &report.orphaned_topics {
        rows.push(vec![
            "topic".into(),
            topic.clone(),
            "ORPHANED: nothing uses it (not deleted)".into(),
        ]);
    }
    if rows.is_empty() {
        println!("no enabled binding, no orphaned group or topic");
    } else {
        println!("{}", output::table(&["kind", "name", "state"], rows));
    }
    match refresh {
        Some(id) => {
            println!("refresh request {id} written: routers start what is missing within seconds")
        }
        None => println!("(dry run) nothing requested"),
    }
}
