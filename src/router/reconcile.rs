//! Desired vs actual state of the router (seed 003's start-up and
//! five-minute reconcile), reported and never deleted.
//!
//! * desired: the groups of the enabled bindings
//!   ([`crate::subscriptions::Store::desired`]);
//! * actual: the groups the router runs, and the consumer groups and topics
//!   the broker has.
//!
//! A broker group named like a router group (`<consumer>.<bind_key>.consumer`
//! of a consumer in `downstream_consumers`) that no enabled binding wants is
//! an orphaned group; its retry topic, and a `cdc.*` topic no event
//! definition names, are orphaned topics. They may hold offsets or records
//! someone still needs, so they are only reported: a warning each and the
//! gauges [`ORPHANED_GROUPS`] and [`ORPHANED_TOPICS`] (the alert's input).
//! Desired groups the router does not run are `missing`: the router starts
//! them at its next re-read.

use std::collections::BTreeSet;

use metrics::gauge;
use serde::Serialize;

use crate::config::Settings;
use crate::lag::{self, LagSettings};
use crate::subscriptions::Store;

/// Orphaned consumer groups found by the last reconciliation.
pub const ORPHANED_GROUPS: &str = "orderpipe_router_orphaned_groups";
/// Orphaned topics found by the last reconciliation.
pub const ORPHANED_TOPICS: &str = "orderpipe_router_orphaned_topics";

/// The difference between desired and actual state.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Report {
    /// Groups of enabled bindings.
    pub desired: Vec<String>,
    /// Desired groups not running in the router.
    pub missing: Vec<String>,
    /// Broker groups named like router groups that nothing binds.
    pub orphaned_groups: Vec<String>,
    /// Retry topics of orphaned groups and `cdc.*` topics no event names.
    pub orphaned_topics: Vec<String>,
}

/// Why reconciliation failed.
#[derive(Debug, thiserror::Error)]
pub enum ReconcileError {
    /// The tables could not be read.
    #[error(transparent)]
    Subscriptions(#[from] crate::subscriptions::SubsError),
    /// The broker could not be asked.
    #[error(transparent)]
    Lag(#[from] lag::LagError),
    /// A Kafka metadata request failed.
    #[error("kafka: {0}")]
    Kafka(#[from] rdkafka::error::KafkaError),
    /// The blocking task died.
    #[error("reconcile task failed: {0}")]
    Task(String),
}

/// Compares the desired bindings of `store` with `running` (the groups a
/// router runs; empty for a dry run from the CLI) and the broker.
pub async fn compare(
    settings: &Settings,
    store: &Store,
    running: &[String],
) -> Result<Report, ReconcileError> {
    let desired: BTreeSet<String> = store
        .desired(None)
        .await?
        .into_iter()
        .map(|b| b.group)
        .collect();
    let consumers: Vec<String> = store
        .list_consumers()
        .await?
        .into_iter()
        .map(|c| c.name)
        .collect();
    let event_topics: BTreeSet<String> = store
        .list_events()
        .await?
        .into_iter()
        .map(|e| e.topic)
        .collect();
    let (broker_groups, _) = lag::groups_to_measure(
        &settings.kafka,
        &LagSettings::default(),
        &settings.dlq.persister_group,
        &[],
    )
    .await?;
    let topics = with_probe(settings, |probe| {
        use rdkafka::consumer::Consumer;
        let metadata = probe.fetch_metadata(None, std::time::Duration::from_secs(10))?;
        Ok(metadata
            .topics()
            .iter()
            .map(|t| t.name().to_string())
            .collect::<Vec<_>>())
    })
    .await?;
    Ok(difference(
        settings,
        &desired,
        running,
        &consumers,
        &event_topics,
        &broker_groups,
        &topics,
    ))
}

/// [`compare`] from outside a router (`orderpipe subs reconcile`): the
/// desired groups with a live member on the broker count as running.
pub async fn compare_with_broker(
    settings: &Settings,
    store: &Store,
) -> Result<Report, ReconcileError> {
    let desired: Vec<String> = store
        .desired(None)
        .await?
        .into_iter()
        .map(|b| b.group)
        .collect();
    let running = with_probe(settings, move |probe| {
        let mut running = Vec::new();
        for group in desired {
            if !lag::describe_group(probe, &group)?.1.is_empty() {
                running.push(group);
            }
        }
        Ok(running)
    })
    .await?;
    compare(settings, store, &running).await
}

/// Runs `ask` with a probe consumer (one that never joins a group) on a blocking thread.
async fn with_probe<T: Send + 'static>(
    settings: &Settings,
    ask: impl FnOnce(&rdkafka::consumer::BaseConsumer) -> Result<T, rdkafka::error::KafkaError>
    + Send
    + 'static,
) -> Result<T, ReconcileError> {
    let kafka = settings.kafka.clone();
    let asked = tokio::task::spawn_blocking(move || ask(&lag::probe(&kafka)?))
        .await
        .map_err(|e| ReconcileError::Task(e.to_string()))?;
    Ok(asked?)
}

/// The pure part of [`compare`].
fn difference(
    settings: &Settings,
    desired: &BTreeSet<String>,
    running: &[String],
    consumers: &[String],
    event_topics: &BTreeSet<String>,
    broker_groups: &[String],
    broker_topics: &[String],
) -> Report {
    let router_like = |group: &str| {
        group.ends_with(".consumer")
            && consumers.iter().any(|c| {
                group.starts_with(&format!("{c}.")) && group.len() > c.len() + ".consumer".len() + 1
            })
    };
    let orphaned_groups: Vec<String> = broker_groups
        .iter()
        .filter(|g| router_like(g) && !desired.contains(*g))
        .cloned()
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    let order_topic = &settings.topics.order_events.name;
    let mut orphaned_topics: BTreeSet<String> = orphaned_groups
        .iter()
        .map(|g| crate::retry::retry_topic(order_topic, g))
        .filter(|t| broker_topics.contains(t))
        .collect();
    orphaned_topics.extend(
        broker_topics
            .iter()
            .filter(|t| {
                t.starts_with("cdc.") && !event_topics.contains(*t) && !t.starts_with("cdc.offsets")
            })
            .cloned(),
    );
    Report {
        desired: desired.iter().cloned().collect(),
        missing: desired
            .iter()
            .filter(|g| !running.contains(g))
            .cloned()
            .collect(),
        orphaned_groups,
        orphaned_topics: orphaned_topics.into_iter().collect(),
    }
}

impl Report {
    /// The gauges and a log line per orphan.
    pub fn emit(&self) {
        gauge!(ORPHANED_GROUPS).set(self.orphaned_groups.len() as f64);
        gauge!(ORPHANED_TOPICS).set(self.orphaned_topics.len() as f64);
        for group in &self.orphaned_groups {
            tracing::warn!(group = %group, "orphaned consumer group: no enabled subscription binds it; not deleted (`kafka-consumer-groups.sh --delete --group {group}` once nobody needs its offsets)");
        }
        for topic in &self.orphaned_topics {
            tracing::warn!(topic = %topic, "orphaned topic: no enabled binding or event definition uses it; not deleted");
        }
        tracing::info!(
            desired = self.desired.len(),
            missing = self.missing.len(),
            orphaned_groups = self.orphaned_groups.len(),
            orphaned_topics = self.orphaned_topics.len(),
            "router reconciled"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn orphans_are_router_like_groups_nothing_binds_and_their_topics() {
        let settings = Settings::default();
        let order = settings.topics.order_events.name.clone();
        let desired: BTreeSet<String> = ["sms.user.consumer".to_string()].into();
        let groups = [
            "sms.user.consumer",
            "sms.old.consumer",
            "inventory-service.order.consumer",
            "crm.x.consumer",
            "sms.consumer",
        ]
        .map(String::from);
        let topics = [
            format!("{order}.retry.sms.old.consumer"),
            "cdc.db.table_user".into(),
            "cdc.db.gone".into(),
            order.clone(),
        ];
        let events: BTreeSet<String> = ["cdc.db.table_user".to_string()].into();
        let report = difference(
            &settings,
            &desired,
            &[],
            &["sms".into()],
            &events,
            &groups,
            &topics,
        );
        assert_eq!(
            report.orphaned_groups,
            ["sms.old.consumer"],
            "another consumer's or a non-router group is not ours"
        );
        assert_eq!(
            report.orphaned_topics,
            [
                "cdc.db.gone".to_string(),
                format!("{order}.retry.sms.old.consumer")
            ]
        );
        assert_eq!(report.missing, ["sms.user.consumer"]);
        let running = difference(
            &settings,
            &desired,
            &["sms.user.consumer".into()],
            &["sms".into()],
            &events,
            &groups,
            &topics,
        );
        assert!(running.missing.is_empty());
    }
}
