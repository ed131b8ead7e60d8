//! Topic reconcile: make the cluster match the declared [`TopicSpec`]s.
//!
//! `topics ensure` creates missing topics, grows partition counts and fixes
//! topic configs; it never shrinks, deletes or re-replicates, it reports
//! those instead. It is safe to run at every start: a second run changes
//! nothing.
//!
//! Kafka's non-incremental AlterConfigs replaces a topic's whole dynamic
//! config, so a fix sends the topic's current dynamic configs merged with
//! the declared ones; configs set by someone else survive.

use std::collections::BTreeMap;
use std::time::Duration;

use rdkafka::admin::{
    AdminClient, AdminOptions, AlterConfig, ConfigSource, NewPartitions, NewTopic,
    ResourceSpecifier, TopicReplication,
};
use rdkafka::client::DefaultClientContext;
use rdkafka::error::KafkaError;
use serde::Serialize;

use crate::config::{Settings, TopicSpec};
use crate::producer::config::client_config;

/// How long admin calls may take before they are reported as failed.
const ADMIN_TIMEOUT: Duration = Duration::from_secs(30);

/// Reconcile failures.
#[derive(Debug, thiserror::Error)]
pub enum TopicsError {
    /// The broker could not be reached.
    #[error("cannot reach Kafka at {servers} within {seconds}s: {cause}")]
    Unreachable {
        /// bootstrap.servers.
        servers: String,
        /// How long we waited.
        seconds: u64,
        /// librdkafka's error.
        cause: String,
    },
    /// An admin request failed.
    #[error("topic {topic}: {action} failed: {cause}")]
    Admin {
        /// The topic.
        topic: String,
        /// What we tried.
        action: &'static str,
        /// The broker's answer.
        cause: String,
    },
    /// The admin client could not be created.
    #[error("kafka: {0}")]
    Kafka(#[from] KafkaError),
}

/// One thing `ensure` did or noticed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "action", rename_all = "snake_case")]
pub enum Change {
    /// The topic was created.
    Created {
        /// Topic.
        topic: String,
        /// Partitions.
        partitions: i32,
    },
    /// Partitions were added.
    GrewPartitions {
        /// Topic.
        topic: String,
        /// Before.
        from: i32,
        /// After.
        to: i32,
    },
    /// A config value was set.
    ConfigSet {
        /// Topic.
        topic: String,
        /// Config key.
        key: String,
        /// Value before (None = broker default).
        from: Option<String>,
        /// Value now.
        to: String,
    },
    /// Something differs that ensure will not change by itself.
    Warning {
        /// Topic.
        topic: String,
        /// What and why.
        message: String,
    },
    /// A topic of the orderpipe family exists but is not declared.
    Undeclared {
        /// Topic.
        topic: String,
    },
}

impl Change {
    /// True for changes that altered the cluster.
    pub fn is_mutation(&self) -> bool {
        matches!(
            self,
            Self::Created { .. } | Self::GrewPartitions { .. } | Self::ConfigSet { .. }
        )
    }
}

impl std::fmt::Display for Change {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Created { topic, partitions } => {
                write!(f, "created   {topic} ({partitions} partitions)")
            }
            Self::GrewPartitions { topic, from, to } => {
                write!(f, "grew      {topic} partitions {from} -> {to}")
            }
            Self::ConfigSet { topic, key, from, to } => write!(
                f,
                "config    {topic} {key}: {} -> {to}",
                from.as_deref().unwrap_or("(default)")
            ),
            Self::Warning { topic, message } => write!(f, "WARNING   {topic}: {message}"),
            Self::Undeclared { topic } => {
                write!(f, "undeclared {topic} exists but is not declared (left alone)")
            }
        }
    }
}

/// What a topic looks like on the cluster.
#[derive(Debug, Clone, Serialize)]
pub struct TopicState {
    /// Topic.
    pub topic: String,
    /// Whether it exists.
    pub exists: bool,
    /// Partition count.
    pub partitions: i32,
    /// Replicas of partition 0.
    pub replication_factor: i32,
    /// Declared values that differ, as `key: actual != declared`.
    pub drift: Vec<String>,
    /// All non-default configs.
    pub configs: BTreeMap<String, String>,
}

/// Admin access to the cluster for the declared topics.
pub struct TopicAdmin {
    admin: AdminClient<DefaultClientContext>,
    servers: String,
}

impl TopicAdmin {
    /// An admin client with the settings' Kafka options.
    pub fn new(settings: &Settings) -> Result<Self, TopicsError> {
        let admin = client_config(&settings.kafka_client_options()).create()?;
        Ok(Self {
            admin,
            servers: settings.kafka.bootstrap_servers.clone(),
        })
    }

    fn options() -> AdminOptions {
        AdminOptions::new()
            .request_timeout(Some(ADMIN_TIMEOUT))
            .operation_timeout(Some(ADMIN_TIMEOUT))
    }

    /// Partition and replica counts of every topic on the cluster.
    async fn layout(&self) -> Result<BTreeMap<String, (i32, i32)>, TopicsError> {
        // A one-shot admin command: blocking this thread for the bounded
        // metadata call is simpler than moving the client to another one.
        let timeout = Duration::from_secs(10);
        let metadata = self
            .admin
            .inner()
            .fetch_metadata(None, timeout)
            .map_err(|e| TopicsError::Unreachable {
                servers: self.servers.clone(),
                seconds: timeout.as_secs(),
                cause: e.to_string(),
            })?;
        Ok(metadata
            .topics()
            .iter()
            .filter(|t| t.error().is_none())
            .map(|t| {
                let replicas = t.partitions().first().map_or(0, |p| p.replicas().len() as i32);
                (t.name().to_string(), (t.partitions().len() as i32, replicas))
            })
            .collect())
    }

    /// Current configs of `topic`: (value, set dynamically on the topic?).
    async fn configs(&self, topic: &str) -> Result<BTreeMap<String, (String, bool)>, TopicsError> {
        let results = self
            .admin
            .describe_configs([&ResourceSpecifier::Topic(topic)], &Self::options())
            .await?;
        let resource = results
            .into_iter()
            .next()
            .expect("one result per resource")
            .map_err(|e| admin_error(topic, "describe configs", e))?;
        Ok(resource
            .entries
            .into_iter()
            .filter_map(|e| {
                let dynamic = matches!(e.source, ConfigSource::DynamicTopic);
                e.value.map(|v| (e.name, (v, dynamic)))
            })
            .collect())
    }

    /// Reconciles the cluster to `specs`; with `dry_run` only reports.
    pub async fn ensure(&self, specs: &[&TopicSpec], dry_run: bool) -> Result<Vec<Change>, TopicsError> {
        let layout = self.layout().await?;
        let mut changes = Vec::new();
        for spec in specs {
            match layout.get(&spec.name) {
                None => {
                    if !dry_run {
                        self.create(spec).await?;
                    }
                    changes.push(Change::Created {
                        topic: spec.name.clone(),
                        partitions: spec.partitions,
                    });
                }
                Some(&(partitions, replicas)) => {
                    changes.extend(self.fix_layout(spec, partitions, replicas, dry_run).await?);
                    changes.extend(self.fix_configs(spec, dry_run).await?);
                }
            }
        }
        changes.extend(undeclared(layout.keys(), specs));
        Ok(changes)
    }

    async fn create(&self, spec: &TopicSpec) -> Result<(), TopicsError> {
        let configs = spec.desired_configs();
        let topic = configs.iter().fold(
            NewTopic::new(
                &spec.name,
                spec.partitions,
                TopicReplication::Fixed(spec.replication_factor),
            ),
            |t, (k, v)| t.set(k, v),
        );
        let result = self.admin.create_topics([&topic], &Self::options()).await?;
        for r in result {
            r.map_err(|(_, e)| admin_error(&spec.name, "create", e))?;
        }
        Ok(())
    }

    async fn fix_layout(
        &self,
        spec: &TopicSpec,
        partitions: i32,
        replicas: i32,
        dry_run: bool,
    ) -> Result<Vec<Change>, TopicsError> {
        let mut changes = Vec::new();
        if partitions < spec.partitions {
            if !dry_run {
                let grow = NewPartitions::new(&spec.name, spec.partitions as usize);
                for r in self.admin.create_partitions([&grow], &Self::options()).await? {
                    r.map_err(|(_, e)| admin_error(&spec.name, "add partitions", e))?;
                }
            }
            changes.push(Change::GrewPartitions {
                topic: spec.name.clone(),
                from: partitions,
                to: spec.partitions,
            });
        } else if partitions > spec.partitions {
            changes.push(Change::Warning {
                topic: spec.name.clone(),
                message: format!(
                    "has {partitions} partitions, declared {}: partitions are never removed (it would break key ordering)",
                    spec.partitions
                ),
            });
        }
        if replicas != spec.replication_factor {
            changes.push(Change::Warning {
                topic: spec.name.clone(),
                message: format!(
                    "replication factor is {replicas}, declared {}: change it with a partition reassignment",
                    spec.replication_factor
                ),
            });
        }
        Ok(changes)
    }

    async fn fix_configs(&self, spec: &TopicSpec, dry_run: bool) -> Result<Vec<Change>, TopicsError> {
        let current = self.configs(&spec.name).await?;
        let mut changes = Vec::new();
        for (key, want) in spec.desired_configs() {
            let have = current.get(&key).map(|(v, _)| v.clone());
            if have.as_deref() != Some(want.as_str()) {
                changes.push(Change::ConfigSet {
                    topic: spec.name.clone(),
                    key,
                    from: have,
                    to: want,
                });
            }
        }
        if changes.is_empty() || dry_run {
            return Ok(changes);
        }
        // Keep every dynamic config already set, then apply ours on top.
        let mut merged: BTreeMap<String, String> = current
            .into_iter()
            .filter(|(_, (_, dynamic))| *dynamic)
            .map(|(k, (v, _))| (k, v))
            .collect();
        merged.extend(spec.desired_configs());
        let alter = merged
            .iter()
            .fold(AlterConfig::new(ResourceSpecifier::Topic(&spec.name)), |a, (k, v)| {
                a.set(k, v)
            });
        for r in self.admin.alter_configs([&alter], &Self::options()).await? {
            r.map_err(|(_, e)| admin_error(&spec.name, "alter configs", e))?;
        }
        Ok(changes)
    }

    /// The state of each declared topic, with drift from its spec.
    pub async fn describe(&self, specs: &[&TopicSpec]) -> Result<Vec<TopicState>, TopicsError> {
        let layout = self.layout().await?;
        let mut states = Vec::new();
        for spec in specs {
            let Some(&(partitions, replicas)) = layout.get(&spec.name) else {
                states.push(TopicState {
                    topic: spec.name.clone(),
                    exists: false,
                    partitions: 0,
                    replication_factor: 0,
                    drift: vec!["missing".into()],
                    configs: BTreeMap::new(),
                });
                continue;
            };
            let current = self.configs(&spec.name).await?;
            let mut drift = Vec::new();
            if partitions != spec.partitions {
                drift.push(format!("partitions: {partitions} != {}", spec.partitions));
            }
            if replicas != spec.replication_factor {
                drift.push(format!("replication_factor: {replicas} != {}", spec.replication_factor));
            }
            for (key, want) in spec.desired_configs() {
                let have = current.get(&key).map(|(v, _)| v.as_str()).unwrap_or("(default)");
                if have != want {
                    drift.push(format!("{key}: {have} != {want}"));
                }
            }
            states.push(TopicState {
                topic: spec.name.clone(),
                exists: true,
                partitions,
                replication_factor: replicas,
                drift,
                configs: current
                    .into_iter()
                    .filter(|(_, (_, dynamic))| *dynamic)
                    .map(|(k, (v, _))| (k, v))
                    .collect(),
            });
        }
        Ok(states)
    }
}

fn admin_error(topic: &str, action: &'static str, e: impl std::fmt::Display) -> TopicsError {
    TopicsError::Admin {
        topic: topic.to_string(),
        action,
        cause: e.to_string(),
    }
}

/// Existing topics of the orderpipe family (named `<declared topic>.*`, such
/// as a retry or DLQ topic) that no spec declares.
fn undeclared<'a>(
    existing: impl Iterator<Item = &'a String>,
    specs: &[&TopicSpec],
) -> Vec<Change> {
    existing
        .filter(|name| !specs.iter().any(|s| &s.name == *name))
        .filter(|name| specs.iter().any(|s| name.starts_with(&format!("{}.", s.name))))
        .map(|name| Change::Undeclared { topic: name.clone() })
        .collect()
}

/// The topics a settings file declares.
pub fn declared(settings: &Settings) -> Vec<&TopicSpec> {
    vec![
        &settings.topics.order_events,
        &settings.topics.inventory_events,
        &settings.topics.dead_letter,
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn undeclared_lists_only_the_family() {
        let settings = Settings::default();
        let specs = declared(&settings);
        let existing = [
            "order.events.v1".to_string(),
            "order.events.v1.dlq".to_string(),
            "order.events.v1.retry.old-group".to_string(),
            "payments.v3".to_string(),
        ];
        let found = undeclared(existing.iter(), &specs);
        assert_eq!(
            found,
            vec![Change::Undeclared {
                topic: "order.events.v1.retry.old-group".into()
            }]
        );
    }
}
