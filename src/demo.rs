//! `orderpipe demo`: the whole pipeline on an embedded stack, no servers.
//!
//! librdkafka's mock cluster stands in for Kafka and the
//! [`EmbeddedRegistry`] for the schema registry; everything else is the
//! production code path: the same [`Codec`], the same [`EventProducer`] with
//! its headers and keys, the same consumer with its dedup and handlers (on
//! SQLite instead of MariaDB). The demo:
//!
//! 1. produces a batch of order lifecycles, reads them back, decodes them and
//!    checks every order's events sit in one partition in production order;
//! 2. produces some events a second time (duplicate deliveries);
//! 3. runs two consumer groups over the topic into one SQLite database;
//! 4. checks the business tables hold every event exactly once, and each
//!    order's effects were applied in production order.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::mocking::MockCluster;
use rdkafka::{Message, Offset, TopicPartitionList};
use serde::Serialize;
use uuid::Uuid;

use crate::codec::Codec;
use crate::consumer::verify::{Verification, applied_order, verify};
use crate::consumer::{self, ConsumeOptions, ConsumeSummary, StartFrom, handlers};
use crate::db::Db;
use crate::codec::embedded_registry::EmbeddedRegistry;
use crate::config::Settings;
use crate::generator::LifecycleGenerator;
use crate::producer::EventProducer;
use crate::producer::config::client_config;
use crate::schema::SchemaCatalog;

/// Knobs of a demo run.
#[derive(Debug, Clone)]
pub struct DemoOptions {
    /// Events to produce.
    pub events: u64,
    /// Orders open at once.
    pub orders: usize,
    /// Generator seed.
    pub seed: u64,
}

/// What the demo saw.
#[derive(Debug, Serialize)]
pub struct DemoReport {
    /// Events produced and acknowledged.
    pub produced: u64,
    /// Events read back and decoded.
    pub consumed: u64,
    /// Distinct orders.
    pub orders: usize,
    /// Events per name.
    pub by_event: BTreeMap<String, u64>,
    /// Events per partition.
    pub by_partition: BTreeMap<i32, u64>,
    /// Orders whose events were split across partitions or reordered.
    pub ordering_violations: Vec<String>,
    /// Events produced a second time to simulate redelivery.
    pub injected_duplicates: u64,
    /// What each consumer group did.
    pub groups: Vec<ConsumeSummary>,
    /// Business tables vs the exactly-once expectation.
    pub verification: Verification,
    /// Per group: orders applied out of production order.
    pub group_order_violations: BTreeMap<String, usize>,
    /// Wall time of the run in milliseconds.
    pub elapsed_ms: u128,
}

/// Runs the demo end to end.
pub async fn run(options: &DemoOptions) -> anyhow::Result<DemoReport> {
    let started = Instant::now();
    let mut settings = Settings::default();
    let cluster = MockCluster::new(1).context("starting librdkafka's mock cluster")?;
    let spec = settings.topics.order_events.clone();
    cluster
        .create_topic(&spec.name, spec.partitions, 1)
        .context("creating the demo topic")?;
    let registry = EmbeddedRegistry::start().await.context("starting the embedded registry")?;
    settings.kafka.bootstrap_servers = cluster.bootstrap_servers();
    settings.registry.url = registry.url().to_string();

    let catalog = SchemaCatalog::embedded();
    let codec = Arc::new(Codec::new(&settings.registry, &spec.name, catalog.order_events(), true)?);
    codec.warm_up().await?;
    let producer = EventProducer::new(&settings, codec.clone(), &spec.name)?;
    producer.check_ready(Duration::from_secs(10)).await?;

    // What each order's sequence should be, in production order.
    let mut expected: HashMap<i64, Vec<Uuid>> = HashMap::new();
    let events: Vec<_> =
        LifecycleGenerator::new(&settings.producer.service_name, options.orders, 1, options.seed)
            .take(options.events as usize)
            .collect();
    for e in &events {
        expected.entry(e.data.order_id()).or_default().push(e.event_id);
    }
    let report = producer
        .send_all(futures::stream::iter(events.iter().cloned()), |_, _| {})
        .await;
    if report.failed > 0 {
        bail!("{} of {} demo events were not acknowledged: {:?}", report.failed, report.sent, report.failures);
    }

    let consumer: BaseConsumer = client_config(&settings.kafka_client_options())
        .set("group.id", "orderpipe-demo-reader")
        .set("enable.auto.commit", "false")
        .create()?;
    let mut assignment = TopicPartitionList::new();
    for p in 0..spec.partitions {
        assignment.add_partition_offset(&spec.name, p, Offset::Beginning)?;
    }
    consumer.assign(&assignment)?;

    let mut seen: HashMap<i64, Vec<(i32, Uuid)>> = HashMap::new();
    let mut by_event = BTreeMap::new();
    let mut by_partition = BTreeMap::new();
    let mut consumed = 0u64;
    let deadline = Instant::now() + Duration::from_secs(60);
    while consumed < report.acknowledged {
        if Instant::now() > deadline {
            bail!("read back only {consumed} of {} events within 60s", report.acknowledged);
        }
        let Some(message) = consumer.poll(Duration::from_millis(100)) else {
            continue;
        };
        let message = message?;
        let envelope = codec.decode(message.payload()).await?;
        consumed += 1;
        *by_event.entry(envelope.event_name.to_string()).or_insert(0) += 1;
        *by_partition.entry(message.partition()).or_insert(0) += 1;
        seen.entry(envelope.data.order_id())
            .or_default()
            .push((message.partition(), envelope.event_id));
    }

    let mut ordering_violations = Vec::new();
    for (order, ids) in &expected {
        let got = seen.get(order).cloned().unwrap_or_default();
        let partitions: std::collections::BTreeSet<i32> = got.iter().map(|(p, _)| *p).collect();
        let order_ok = got.iter().map(|(_, id)| *id).eq(ids.iter().copied());
        if partitions.len() != 1 || !order_ok {
            ordering_violations.push(format!("order {order}: partitions {partitions:?}, in order: {order_ok}"));
        }
    }

    // Redelivery: every 10th event once more, after the originals.
    let duplicates: Vec<_> = events.iter().step_by(10).cloned().collect();
    let injected_duplicates = duplicates.len() as u64;
    let resent = producer.send_all(futures::stream::iter(duplicates), |_, _| {}).await;
    if resent.failed > 0 {
        bail!("duplicate injection failed: {:?}", resent.failures);
    }

    // Two groups, one SQLite database, each group with its own handlers.
    let dir = tempfile::tempdir().context("temporary folder for the demo database")?;
    settings.database.url = format!("sqlite://{}/demo.db?mode=rwc", dir.path().display()).into();
    // One connection: SQLite allows one writer at a time anyway.
    let db = Db::connect(&settings.database, 1)?;
    db.migrate().await?;
    let group_specs: [(&str, &[&str]); 2] = [
        ("fulfilment-service.order.consumer", &["inventory", "payment", "points"]),
        ("customer-service.order.consumer", &["logistics", "notification"]),
    ];
    let mut groups = Vec::new();
    let mut group_order_violations = BTreeMap::new();
    for (group, names) in group_specs {
        let handlers = names
            .iter()
            .map(|n| handlers::by_name(n, &settings).map_err(anyhow::Error::msg))
            .collect::<anyhow::Result<Vec<_>>>()?;
        let options = ConsumeOptions {
            group: group.to_string(),
            handlers,
            topic: spec.name.clone(),
            start_from: StartFrom::Earliest,
            until_idle: Some(Duration::from_secs(2)),
            health_addr: None,
        };
        groups.push(consumer::run(&settings, db.clone(), options, std::future::pending()).await?);
        let (_, violations) = applied_order(&db, group, &events).await?;
        group_order_violations.insert(group.to_string(), violations.len());
    }
    let verification = verify(&db, group_specs[0].0, &events).await?;

    drop(registry);
    Ok(DemoReport {
        produced: report.acknowledged,
        consumed,
        orders: expected.len(),
        by_event,
        by_partition,
        ordering_violations,
        injected_duplicates,
        groups,
        verification,
        group_order_violations,
        elapsed_ms: started.elapsed().as_millis(),
    })
}
