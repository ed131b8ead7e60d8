//! `orderpipe demo`: the whole pipeline on an embedded stack, no servers.
//!
//! librdkafka's mock cluster stands in for Kafka and the
//! [`EmbeddedRegistry`] for the schema registry; everything else is the
//! production code path: the same [`Codec`], the same [`EventProducer`] with
//! its headers and keys. The demo produces a batch of order lifecycles,
//! reads them back, decodes them and checks that every order's events sit
//! in one partition in the order they were produced.

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
    let events = LifecycleGenerator::new(&settings.producer.service_name, options.orders, 1, options.seed)
        .take(options.events as usize)
        .inspect(|e| expected.entry(e.data.order_id()).or_default().push(e.event_id));
    let report = producer
        .send_all(futures::stream::iter(events), |_, _| {})
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
    drop(registry);
    Ok(DemoReport {
        produced: report.acknowledged,
        consumed,
        orders: expected.len(),
        by_event,
        by_partition,
        ordering_violations,
        elapsed_ms: started.elapsed().as_millis(),
    })
}
