//! Topic reconcile: make the cluster match the declared [`TopicSpec`]s, and
//! the read-only check the other roles run instead.
//!
//! `topics ensure` creates missing topics and fixes topic configs; it never
//! shrinks, deletes or re-replicates, it reports those instead. It plans
//! first and changes nothing when the plan needs a partition increase: that
//! moves keys to other partitions, so it is done only with
//! `allow_repartition` (see [`EnsureOptions`]). A retention that is longer on
//! the cluster than declared is reported, not lowered (lowering deletes
//! records). A second run changes nothing.
//!
//! Kafka's non-incremental AlterConfigs replaces a topic's whole dynamic
//! config, so a fix sends the topic's current dynamic configs merged with
//! the declared ones; configs set by someone else survive.
//!
//! Two other roles ensure their own topics with the same reconcile: `cdc`
//! (its change, offsets and dead-letter topics) and the router (the retry
//! topic of each group it starts). Consumers, `deliver --subscription`, the
//! relay and the DLQ persister never create or alter topics: they call
//! [`require`], which reads cluster metadata only (Describe rights), and
//! refuse to start when a topic they need is missing or has another
//! partition count than declared. docs/operations.md ("Topics and Kafka
//! rights") lists which role creates what and each role's Kafka ACLs.
//!
//! [`TopicsSettings`] is the `[topics]` section of the configuration.

use std::collections::BTreeMap;
use std::time::Duration;

use rdkafka::ClientContext;
use rdkafka::admin::{
    AdminClient, AdminOptions, AlterConfig, ConfigSource, NewPartitions, NewTopic,
    ResourceSpecifier, TopicReplication,
};
use rdkafka::client::{Client, DefaultClientContext};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use serde::{Deserialize, Serialize};

use crate::kafka::client::{KafkaSettings, client_config};

/// The `[topics]` section of the configuration: the declared topics;
/// `topics ensure` reconciles the cluster to these.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TopicsSettings {
    /// `order.events.v1`.
    pub order_events: TopicSpec,
    /// `inventory.events.v1`.
    pub inventory_events: TopicSpec,
    /// `order.events.v1.dlq`.
    pub dead_letter: TopicSpec,
}

/// One topic's declared shape.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct TopicSpec {
    /// Topic name.
    pub name: String,
    /// Partition count (only ever grown).
    pub partitions: i32,
    /// Replication factor at creation.
    pub replication_factor: i32,
    /// `min.insync.replicas`.
    pub min_insync_replicas: i32,
    /// `retention.ms`.
    pub retention_ms: i64,
    /// Other topic configs to enforce.
    #[serde(default)]
    pub configs: BTreeMap<String, String>,
}

const DAY_MS: i64 = 24 * 60 * 60 * 1000;

impl TopicSpec {
    /// Every config `topics ensure` enforces, including min ISR and retention.
    pub fn desired_configs(&self) -> BTreeMap<String, String> {
        let mut configs = self.configs.clone();
        configs.insert(
            "min.insync.replicas".into(),
            self.min_insync_replicas.to_string(),
        );
        configs.insert("retention.ms".into(), self.retention_ms.to_string());
        configs
    }
}

impl TopicsSettings {
    /// The three declared topics, in the order of the config file.
    fn specs(&self) -> [&TopicSpec; 3] {
        [
            &self.order_events,
            &self.inventory_events,
            &self.dead_letter,
        ]
    }

    /// The declared topic named `name`, if one is.
    pub fn find(&self, name: &str) -> Option<&TopicSpec> {
        self.specs().into_iter().find(|spec| spec.name == name)
    }

    /// Rejects partition, replica and min ISR counts no cluster accepts.
    pub fn validate_layout(&self) -> Result<(), String> {
        for spec in self.specs() {
            let field = |f: &str| format!("topics.{}.{f}", spec.name);
            if spec.partitions < 1 {
                return Err(format!("{} must be >= 1", field("partitions")));
            }
            if spec.replication_factor < 1 {
                return Err(format!("{} must be >= 1", field("replication_factor")));
            }
            if spec.min_insync_replicas < 1 || spec.min_insync_replicas > spec.replication_factor {
                return Err(format!(
                    "{} must be between 1 and replication_factor ({})",
                    field("min_insync_replicas"),
                    spec.replication_factor
                ));
            }
        }
        Ok(())
    }

    /// Every declared topic holds key messages (retry topics inherit the
    /// order topic's spec): at least 30 days, or forever.
    pub fn validate_retention(&self) -> Result<(), String> {
        for (key, spec, why) in [
            (
                "order_events",
                &self.order_events,
                "order events are kept for audit",
            ),
            (
                "inventory_events",
                &self.inventory_events,
                "inventory events are audited with the order events",
            ),
            (
                "dead_letter",
                &self.dead_letter,
                "dead letters must outlive a persister outage and stay replayable",
            ),
        ] {
            if spec.retention_ms >= 0 && spec.retention_ms < 30 * DAY_MS {
                return Err(format!(
                    "topics.{key}.retention_ms must be >= 30 days (2592000000) or -1 (forever), got {}: {why}",
                    spec.retention_ms
                ));
            }
        }
        Ok(())
    }

    /// The configured name of the topic a schema file (named after the
    /// default topic name) describes; tests and staging rename topics.
    pub fn name_for_schema(&self, schema_topic: &str) -> String {
        self.specs()
            .into_iter()
            .zip([
                "order.events.v1",
                "inventory.events.v1",
                "order.events.v1.dlq",
            ])
            .find(|(_, default)| *default == schema_topic)
            .map_or_else(|| schema_topic.to_string(), |(spec, _)| spec.name.clone())
    }
}

/// How long admin calls may take before they are reported as failed.
const ADMIN_TIMEOUT: Duration = Duration::from_secs(30);

/// A broker lists a topic in its metadata a moment after creating it, so a
/// topic created just before (by a previous run, or by the hook right
/// before a role starts) may look missing. `ensure` then plans again
/// (a create answers TopicAlreadyExists) and [`require`] checks again.
const METADATA_SETTLE: Duration = Duration::from_millis(500);
/// Attempts of `ensure` on metadata found stale.
const STALE_METADATA_ATTEMPTS: u32 = 10;
/// How long `ensure` waits for its new topics and partitions to show.
const LAYOUT_WAIT: Duration = Duration::from_secs(15);
/// How long [`require`] waits for missing or different topics to settle.
const REQUIRE_SETTLE: Duration = Duration::from_secs(3);

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
    /// A topic a role needs is missing or differs from its declaration.
    #[error(
        "{}; this role has read-only Kafka rights and never creates or alters topics: run `{fix}` (the chart's topics hook) first",
        problems.join("; ")
    )]
    NotReady {
        /// One line per topic: what is wrong.
        problems: Vec<String>,
        /// The command that fixes it.
        fix: String,
    },
}

/// What `topics ensure` may do.
#[derive(Debug, Clone, Copy, Default)]
pub struct EnsureOptions {
    /// Report only.
    pub dry_run: bool,
    /// Grow topics with fewer partitions than declared (moves keys).
    pub allow_repartition: bool,
}

/// What growing a keyed topic does to orders in flight; printed with every
/// partition increase.
pub const REPARTITION_WARNING: &str = "partitions added: keys now map to other partitions, so an order's next events may land in a new partition and be applied before its earlier events still waiting in the old one. Drain consumers (lag 0) and stop the relay before growing; orders in flight during the change may be applied out of order";

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
    /// The topic has fewer partitions than declared and growing it was not
    /// allowed: nothing at all was changed.
    RepartitionRefused {
        /// Topic.
        topic: String,
        /// Partitions on the cluster.
        from: i32,
        /// Declared.
        to: i32,
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

    /// True for differences that stop `ensure` from changing anything.
    pub fn is_refused(&self) -> bool {
        matches!(self, Self::RepartitionRefused { .. })
    }
}

impl std::fmt::Display for Change {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Created { topic, partitions } => {
                write!(f, "created   {topic} ({partitions} partitions)")
            }
            Self::RepartitionRefused { topic, from, to } => write!(
                f,
                "REFUSED   {topic} has {from} partitions, declared {to}: adding partitions moves keys and breaks per-order ordering; nothing was changed. Drain consumers, then rerun with --allow-repartition"
            ),
            Self::GrewPartitions { topic, from, to } => {
                write!(f, "grew      {topic} partitions {from} -> {to}")
            }
            Self::ConfigSet {
                topic,
                key,
                from,
                to,
            } => write!(
                f,
                "config    {topic} {key}: {} -> {to}",
                from.as_deref().unwrap_or("(default)")
            ),
            Self::Warning { topic, message } => write!(f, "WARNING   {topic}: {message}"),
            Self::Undeclared { topic } => {
                write!(
                    f,
                    "undeclared {topic} exists but is not declared (left alone)"
                )
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
    /// An admin client with the Kafka connection settings.
    pub fn new(kafka: &KafkaSettings) -> Result<Self, TopicsError> {
        let admin = client_config(&kafka.client_options()).create()?;
        Ok(Self {
            admin,
            servers: kafka.bootstrap_servers.clone(),
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
        layout(self.admin.inner(), &self.servers)
    }

    /// Current configs of `topic`: (value, set dynamically on the topic?).
    pub(crate) async fn configs(
        &self,
        topic: &str,
    ) -> Result<BTreeMap<String, (String, bool)>, TopicsError> {
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

    /// Reconciles the cluster to `specs`. Plans first; applies nothing when
    /// `dry_run`, or when the plan holds a refused repartition.
    pub async fn ensure(
        &self,
        specs: &[&TopicSpec],
        options: EnsureOptions,
    ) -> Result<Vec<Change>, TopicsError> {
        // Mutations done so far, over all attempts.
        let mut applied = Vec::new();
        let mut attempt = 1;
        loop {
            let layout = self.layout().await?;
            let mut plans = Vec::new();
            for spec in specs {
                plans.push(
                    self.plan(
                        spec,
                        layout.get(&spec.name).copied(),
                        options.allow_repartition,
                    )
                    .await?,
                );
            }
            let refused = plans
                .iter()
                .flat_map(|p| &p.changes)
                .any(Change::is_refused);
            let mut stale = false;
            if !options.dry_run && !refused {
                for plan in &plans {
                    stale |= self.apply(plan, &mut applied).await?;
                }
            }
            if stale && attempt < STALE_METADATA_ATTEMPTS {
                attempt += 1;
                tokio::time::sleep(METADATA_SETTLE).await;
                continue;
            }
            if !options.dry_run && !refused {
                applied.extend(self.await_layout(&applied).await?);
            }
            let planned = plans.into_iter().flat_map(|p| p.changes);
            let mut changes: Vec<Change> = if options.dry_run || refused {
                planned.collect()
            } else {
                applied
                    .into_iter()
                    .chain(planned.filter(|c| !c.is_mutation()))
                    .collect()
            };
            changes.extend(undeclared(layout.keys(), specs));
            return Ok(changes);
        }
    }

    /// Waits until the broker's metadata shows the topics, partitions and
    /// configs changed in `applied`, so a role started right after `ensure`
    /// finds them and a second run changes nothing. A warning for what is
    /// still not shown after [`LAYOUT_WAIT`].
    async fn await_layout(&self, applied: &[Change]) -> Result<Vec<Change>, TopicsError> {
        let expected: Vec<(&String, i32)> = applied
            .iter()
            .filter_map(|c| match c {
                Change::Created { topic, partitions } => Some((topic, *partitions)),
                Change::GrewPartitions { topic, to, .. } => Some((topic, *to)),
                _ => None,
            })
            .collect();
        let deadline = std::time::Instant::now() + LAYOUT_WAIT;
        loop {
            let layout = self.layout().await?;
            let mut pending: Vec<_> = expected
                .iter()
                .filter(|(topic, partitions)| {
                    layout.get(*topic).is_none_or(|(p, _)| p != partitions)
                })
                .map(|(topic, partitions)| (topic.to_string(), format!("{partitions} partitions")))
                .collect();
            for change in applied {
                if let Change::ConfigSet { topic, key, to, .. } = change {
                    let shown = self.configs(topic).await?;
                    if shown.get(key).map(|(v, _)| v) != Some(to) {
                        pending.push((topic.clone(), format!("{key}={to}")));
                    }
                }
            }
            if pending.is_empty() {
                return Ok(Vec::new());
            }
            if std::time::Instant::now() >= deadline {
                return Ok(pending
                    .into_iter()
                    .map(|(topic, what)| Change::Warning {
                        topic,
                        message: format!(
                            "the broker's metadata does not show {what} yet ({}s after the change)",
                            LAYOUT_WAIT.as_secs()
                        ),
                    })
                    .collect());
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// What `ensure` would do to one topic (`layout`: its partitions and
    /// replicas, None when missing).
    async fn plan<'a>(
        &self,
        spec: &'a TopicSpec,
        layout: Option<(i32, i32)>,
        allow_repartition: bool,
    ) -> Result<TopicPlan<'a>, TopicsError> {
        let Some((partitions, replicas)) = layout else {
            return Ok(TopicPlan {
                spec,
                dynamic: BTreeMap::new(),
                changes: vec![Change::Created {
                    topic: spec.name.clone(),
                    partitions: spec.partitions,
                }],
            });
        };
        let mut changes = layout_changes(spec, partitions, replicas, allow_repartition);
        let current = self.configs(&spec.name).await?;
        changes.extend(config_changes(spec, &current));
        Ok(TopicPlan {
            spec,
            dynamic: current
                .into_iter()
                .filter(|(_, (_, dynamic))| *dynamic)
                .map(|(k, (v, _))| (k, v))
                .collect(),
            changes,
        })
    }

    /// Carries out the mutations of a plan, adding each done to `applied`.
    /// True when the plan was made on stale metadata (a topic it would
    /// create exists already): the rest of the plan is left undone.
    async fn apply(
        &self,
        plan: &TopicPlan<'_>,
        applied: &mut Vec<Change>,
    ) -> Result<bool, TopicsError> {
        let spec = plan.spec;
        // Keep every dynamic config already set, then apply ours on top.
        let mut merged = plan.dynamic.clone();
        let mut alter = false;
        for change in &plan.changes {
            match change {
                Change::Created { .. } => {
                    if !self.create(spec).await? {
                        return Ok(true);
                    }
                    applied.push(change.clone());
                }
                Change::GrewPartitions { to, .. } => {
                    let grow = NewPartitions::new(&spec.name, *to as usize);
                    for r in self
                        .admin
                        .create_partitions([&grow], &Self::options())
                        .await?
                    {
                        r.map_err(|(_, e)| admin_error(&spec.name, "add partitions", e))?;
                    }
                    applied.push(change.clone());
                }
                Change::ConfigSet { key, to, .. } => {
                    merged.insert(key.clone(), to.clone());
                    alter = true;
                    applied.push(change.clone());
                }
                _ => {}
            }
        }
        if alter {
            let request = merged.iter().fold(
                AlterConfig::new(ResourceSpecifier::Topic(&spec.name)),
                |a, (k, v)| a.set(k, v),
            );
            for r in self
                .admin
                .alter_configs([&request], &Self::options())
                .await?
            {
                r.map_err(|(_, e)| admin_error(&spec.name, "alter configs", e))?;
            }
        }
        Ok(false)
    }

    /// Creates the topic; false when it exists already.
    async fn create(&self, spec: &TopicSpec) -> Result<bool, TopicsError> {
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
            match r {
                Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => return Ok(false),
                r => r.map_err(|(_, e)| admin_error(&spec.name, "create", e))?,
            };
        }
        Ok(true)
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
                drift.push(format!(
                    "replication_factor: {replicas} != {}",
                    spec.replication_factor
                ));
            }
            for (key, want) in spec.desired_configs() {
                let have = current
                    .get(&key)
                    .map(|(v, _)| v.as_str())
                    .unwrap_or("(default)");
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

/// One topic's planned changes, and what `apply` needs to carry them out.
struct TopicPlan<'a> {
    spec: &'a TopicSpec,
    /// Dynamic configs already set on the topic (a config fix keeps them).
    dynamic: BTreeMap<String, String>,
    changes: Vec<Change>,
}

/// Partition and replica differences of an existing topic.
fn layout_changes(
    spec: &TopicSpec,
    partitions: i32,
    replicas: i32,
    allow_repartition: bool,
) -> Vec<Change> {
    let mut changes = Vec::new();
    let topic = spec.name.clone();
    if partitions < spec.partitions && allow_repartition {
        changes.push(Change::GrewPartitions {
            topic: topic.clone(),
            from: partitions,
            to: spec.partitions,
        });
        changes.push(Change::Warning {
            topic: topic.clone(),
            message: REPARTITION_WARNING.into(),
        });
    } else if partitions < spec.partitions {
        changes.push(Change::RepartitionRefused {
            topic: topic.clone(),
            from: partitions,
            to: spec.partitions,
        });
    } else if partitions > spec.partitions {
        changes.push(Change::Warning {
            topic: topic.clone(),
            message: format!(
                "has {partitions} partitions, declared {}: partitions are never removed (Kafka cannot, and it would break key ordering); declare {partitions}",
                spec.partitions
            ),
        });
    }
    if replicas != spec.replication_factor {
        changes.push(Change::Warning {
            topic,
            message: format!(
                "replication factor is {replicas}, declared {}: change it with a partition reassignment",
                spec.replication_factor
            ),
        });
    }
    changes
}

/// Config differences of an existing topic (`current`: value, set
/// dynamically?). A retention longer than declared is reported, not lowered.
fn config_changes(spec: &TopicSpec, current: &BTreeMap<String, (String, bool)>) -> Vec<Change> {
    let mut changes = Vec::new();
    for (key, want) in spec.desired_configs() {
        let have = current.get(&key).map(|(v, _)| v.clone());
        if have.as_deref() == Some(want.as_str()) {
            continue;
        }
        match have {
            Some(have) if retains_longer(&key, &have, &want) => changes.push(Change::Warning {
                topic: spec.name.clone(),
                message: format!(
                    "{key} is {have} on the cluster, declared {want}: not lowered (that would delete records at once); declare {have}, or lower it by hand with kafka-configs if you mean it"
                ),
            }),
            have => changes.push(Change::ConfigSet {
                topic: spec.name.clone(),
                key,
                from: have,
                to: want,
            }),
        }
    }
    changes
}

/// Whether `have` keeps more than `want` for a retention config (-1 = no limit).
fn retains_longer(key: &str, have: &str, want: &str) -> bool {
    if !matches!(key, "retention.ms" | "retention.bytes") {
        return false;
    }
    match (have.parse::<i64>(), want.parse::<i64>()) {
        (Ok(have), Ok(want)) => want >= 0 && (have < 0 || have > want),
        _ => false,
    }
}

/// Partition and replica counts of every topic the client may describe,
/// from one metadata request for all topics (which, unlike a request naming
/// a topic, never auto-creates one).
fn layout<C: ClientContext>(
    client: &Client<C>,
    servers: &str,
) -> Result<BTreeMap<String, (i32, i32)>, TopicsError> {
    let timeout = Duration::from_secs(10);
    let metadata = client
        .fetch_metadata(None, timeout)
        .map_err(|e| TopicsError::Unreachable {
            servers: servers.to_string(),
            seconds: timeout.as_secs(),
            cause: e.to_string(),
        })?;
    Ok(metadata
        .topics()
        .iter()
        .filter(|t| t.error().is_none())
        .map(|t| {
            let replicas = t
                .partitions()
                .first()
                .map_or(0, |p| p.replicas().len() as i32);
            (
                t.name().to_string(),
                (t.partitions().len() as i32, replicas),
            )
        })
        .collect())
}

/// A topic a role reads or writes, as it must be on the cluster.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Required {
    /// Topic.
    pub topic: String,
    /// Declared partition count; None for a topic orderpipe does not declare.
    pub partitions: Option<i32>,
}

impl Required {
    /// `spec`'s topic with its declared partition count.
    pub fn declared(spec: &TopicSpec) -> Self {
        Self {
            topic: spec.name.clone(),
            partitions: Some(spec.partitions),
        }
    }
}

/// The read-only start-up check of the roles that do not own topics: with
/// one metadata request (Describe rights, no admin call), fails with
/// [`TopicsError::NotReady`] naming every `required` topic that is missing
/// or has another partition count than declared. `fix` is the command that
/// repairs it, e.g. `orderpipe topics ensure --group G`.
pub fn require<C: ClientContext>(
    client: &Client<C>,
    servers: &str,
    required: &[Required],
    fix: &str,
) -> Result<(), TopicsError> {
    let deadline = std::time::Instant::now() + REQUIRE_SETTLE;
    loop {
        let layout = layout(client, servers)?;
        let problems: Vec<String> = required
            .iter()
            .filter_map(|r| match (layout.get(&r.topic), r.partitions) {
                (None, _) => Some(format!("topic {} is missing", r.topic)),
                (Some(&(have, _)), Some(want)) if have != want => Some(format!(
                    "topic {} has {have} partitions, declared {want}",
                    r.topic
                )),
                _ => None,
            })
            .collect();
        if problems.is_empty() {
            return Ok(());
        }
        if std::time::Instant::now() >= deadline {
            return Err(TopicsError::NotReady {
                problems,
                fix: fix.to_string(),
            });
        }
        // Start-up only: a short blocking wait keeps this usable from any caller.
        std::thread::sleep(METADATA_SETTLE);
    }
}

/// [`require`] with a metadata-only client of its own, for roles whose
/// Kafka clients are built elsewhere (the relay).
pub fn require_with(
    kafka: &KafkaSettings,
    required: &[Required],
    fix: &str,
) -> Result<(), TopicsError> {
    use rdkafka::producer::Producer;
    let client: rdkafka::producer::BaseProducer =
        client_config(&kafka.client_options()).create()?;
    require(client.client(), &kafka.bootstrap_servers, required, fix)
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
fn undeclared<'a>(existing: impl Iterator<Item = &'a String>, specs: &[&TopicSpec]) -> Vec<Change> {
    existing
        .filter(|name| !specs.iter().any(|s| &s.name == *name))
        .filter(|name| {
            specs
                .iter()
                .any(|s| name.starts_with(&format!("{}.", s.name)))
        })
        .map(|name| Change::Undeclared {
            topic: name.clone(),
        })
        .collect()
}

/// The declared topics plus the retry topics of `groups` (each once).
/// [`crate::startup::declared_topics`] adds the groups of the HTTP
/// subscriptions.
pub fn declared(
    topics: &TopicsSettings,
    groups: impl IntoIterator<Item = String>,
) -> Vec<TopicSpec> {
    let mut specs: Vec<TopicSpec> = topics.specs().into_iter().cloned().collect();
    for group in groups {
        let spec = retry_spec(topics, &group);
        if !specs.contains(&spec) {
            specs.push(spec);
        }
    }
    specs
}

/// The retry topic of `group` on the order topic: declared like the order
/// topic (same partitions, so keys spread alike; same retention).
pub fn retry_spec(topics: &TopicsSettings, group: &str) -> TopicSpec {
    let mut spec = topics.order_events.clone();
    spec.name = crate::retry::retry_topic(&topics.order_events.name, group);
    spec
}

/// The command that creates the topics of consumer group `group`.
pub fn ensure_command(group: Option<&str>) -> String {
    match group {
        Some(group) => format!("orderpipe topics ensure --group {group}"),
        None => "orderpipe topics ensure".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Settings;

    #[test]
    fn undeclared_lists_only_the_family() {
        let settings = Settings::default();
        let owned = crate::startup::declared_topics(&settings, &[]);
        let specs: Vec<&TopicSpec> = owned.iter().collect();
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

    #[test]
    fn fewer_partitions_are_refused_unless_allowed_and_more_are_reported() {
        let spec = Settings::default().topics.dead_letter;
        let refused = layout_changes(&spec, 4, 1, false);
        assert_eq!(
            refused,
            vec![Change::RepartitionRefused {
                topic: spec.name.clone(),
                from: 4,
                to: 12
            }]
        );
        assert!(refused[0].is_refused() && !refused[0].is_mutation());
        let grown = layout_changes(&spec, 4, 1, true);
        assert_eq!(
            grown[0],
            Change::GrewPartitions {
                topic: spec.name.clone(),
                from: 4,
                to: 12
            }
        );
        assert!(
            matches!(&grown[1], Change::Warning { message, .. } if message == REPARTITION_WARNING)
        );
        let more = layout_changes(&spec, 24, 1, true);
        assert!(
            matches!(&more[..], [Change::Warning { message, .. }] if message.contains("never removed")),
            "{more:?}"
        );
        assert!(layout_changes(&spec, 12, 1, false).is_empty());
    }

    #[test]
    fn a_longer_retention_is_reported_and_a_shorter_one_fixed() {
        let spec = Settings::default().topics.inventory_events;
        let current = |ms: &str| {
            BTreeMap::from([
                ("retention.ms".to_string(), (ms.to_string(), true)),
                ("min.insync.replicas".to_string(), ("1".to_string(), false)),
            ])
        };
        let shorter = config_changes(&spec, &current("86400000"));
        assert_eq!(
            shorter,
            vec![Change::ConfigSet {
                topic: spec.name.clone(),
                key: "retention.ms".into(),
                from: Some("86400000".into()),
                to: "2592000000".into()
            }]
        );
        for longer in ["-1", "7776000000"] {
            let changes = config_changes(&spec, &current(longer));
            assert!(
                matches!(&changes[..], [Change::Warning { message, .. }] if message.contains("not lowered")),
                "{changes:?}"
            );
        }
        assert!(config_changes(&spec, &current("2592000000")).is_empty());
        assert!(!retains_longer("segment.ms", "-1", "1000"));
        assert!(!retains_longer("retention.ms", "5", "-1"));
    }

    #[test]
    fn declared_topics_include_the_retry_topics_of_named_and_subscription_groups() {
        let mut settings = Settings::default();
        settings.http.subscriptions = toml_subscriptions("crm");
        let specs = crate::startup::declared_topics(
            &settings,
            &["payments".to_string(), "payments".to_string()],
        );
        let names: Vec<&str> = specs.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "order.events.v1",
                "inventory.events.v1",
                "order.events.v1.dlq",
                "order.events.v1.retry.payments",
                "order.events.v1.retry.http.crm"
            ]
        );
        assert_eq!(specs[3].partitions, settings.topics.order_events.partitions);
        assert_eq!(
            specs[3].retention_ms,
            settings.topics.order_events.retention_ms
        );
    }

    fn toml_subscriptions(name: &str) -> Vec<crate::delivery::Subscription> {
        let text = format!(
            "[[subscriptions]]\nname = \"{name}\"\nevents = [\"order.*\"]\nurl = \"http://x/\"\n"
        );
        let settings: crate::delivery::HttpSettings = toml_from(&text);
        settings.subscriptions
    }

    fn toml_from<T: serde::de::DeserializeOwned>(text: &str) -> T {
        use figment::providers::Format;
        figment::Figment::from(figment::providers::Toml::string(text))
            .extract()
            .expect("valid TOML")
    }

    /// The check runs on librdkafka's mock cluster: a missing topic and a
    /// partition count other than declared are named, a matching one passes.
    #[test]
    fn require_names_missing_and_mismatched_topics() {
        use rdkafka::producer::Producer;
        let cluster = rdkafka::mocking::MockCluster::new(1).unwrap();
        cluster.create_topic("present", 12, 1).unwrap();
        cluster.create_topic("narrow", 3, 1).unwrap();
        let client: rdkafka::producer::BaseProducer = rdkafka::ClientConfig::new()
            .set("bootstrap.servers", cluster.bootstrap_servers())
            .create()
            .unwrap();
        let servers = cluster.bootstrap_servers();
        let need = |topic: &str, partitions: Option<i32>| Required {
            topic: topic.into(),
            partitions,
        };
        require(
            client.client(),
            &servers,
            &[need("present", Some(12)), need("narrow", None)],
            "fix",
        )
        .unwrap();
        let err = require(
            client.client(),
            &servers,
            &[
                need("present", Some(12)),
                need("narrow", Some(12)),
                need("absent", None),
            ],
            "orderpipe topics ensure --group g",
        )
        .unwrap_err();
        let text = err.to_string();
        assert!(
            text.contains("topic narrow has 3 partitions, declared 12"),
            "{text}"
        );
        assert!(text.contains("topic absent is missing"), "{text}");
        assert!(
            text.contains("run `orderpipe topics ensure --group g`"),
            "{text}"
        );
        assert!(!text.contains("present"), "{text}");
    }
}
