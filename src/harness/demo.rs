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

use rdkafka::producer::{FutureProducer, FutureRecord};

use crate::api::orders::OrderService;
use crate::codec::Codec;
use crate::codec::embedded_registry::EmbeddedRegistry;
use crate::config::Settings;
use crate::consumer::handler::Handler;
use crate::consumer::{self, ConsumeOptions, ConsumeSummary, StartFrom, handlers};
use crate::db::Db;
use crate::delivery::{HttpDelivery, Subscription};
use crate::dlq::replay::{self, ReplayOptions};
use crate::dlq::store::{self, DeadLetter, Filter};
use crate::envelope::{Envelope, EventData};
use crate::kafka::client::{client_config, producer_options};
use crate::outbox::relay::{Relay, RelayOptions, RelaySummary};
use crate::producer::EventProducer;
use crate::retry::retry_topic;
use crate::schema::SchemaCatalog;

use super::chaos::{self, Chaos, ChaosSettings};
use super::generator;
use super::verify::{
    Verification, applied_order, applied_sequence, others_applied_between, verify,
};

/// Knobs of a demo run.
#[derive(Debug, Clone)]
pub struct DemoOptions {
    /// Orders driven through the API.
    pub orders: usize,
    /// Seed of their lifecycles.
    pub seed: u64,
}

/// What the demo saw.
#[derive(Debug, Serialize)]
pub struct DemoReport {
    /// Order events published by the relay.
    pub produced: u64,
    /// The relay's run.
    pub relayed: RelaySummary,
    /// The HTTP subscription's run.
    pub http: HttpDemoReport,
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
    /// Failures injected and how they were handled.
    pub tier: ErrorTierReport,
    /// Business tables vs the exactly-once expectation.
    pub verification: Verification,
    /// Per group: orders applied out of production order.
    pub group_order_violations: BTreeMap<String, usize>,
    /// Wall time of the run in milliseconds.
    pub elapsed_ms: u128,
}

impl DemoReport {
    /// Every check held: per-order partitioning and order, everything read
    /// back, exactly once in the tables, applied in order by every group,
    /// and every matching event delivered over HTTP.
    pub fn passed(&self) -> bool {
        self.ordering_violations.is_empty()
            && self.consumed == self.produced
            && self.verification.is_exact()
            && self.group_order_violations.values().all(|n| *n == 0)
            && self.http.requests == self.http.matching
    }
}

/// The error tier part of the demo.
#[derive(Debug, Serialize)]
pub struct ErrorTierReport {
    /// Undecodable records injected (each group dead-letters them).
    pub poison_injected: usize,
    /// Order whose payment fails 4 times, then succeeds from the retry
    /// topic, while its refund waits behind it.
    pub transient_order: i64,
    /// That order's events in the order the first group applied them.
    pub transient_applied: Vec<String>,
    /// Other orders' events the first group applied while the order was parked.
    pub applied_meanwhile: i64,
    /// Order whose events fail permanently until the replay.
    pub permanent_order: i64,
    /// The dead letters as persisted.
    pub dead_letters: Vec<DeadLetter>,
    /// Dead letters replayed (the permanent order's).
    pub replayed: u64,
    /// Dead letters ignored (the poison).
    pub ignored: u64,
    /// The first group's run after the replay.
    pub after_replay: ConsumeSummary,
}

/// The HTTP delivery part of the demo.
#[derive(Debug, Serialize)]
pub struct HttpDemoReport {
    /// Events the subscription matches.
    pub matching: usize,
    /// Requests the local endpoint answered.
    pub requests: usize,
    /// The delivering group's run.
    pub group: ConsumeSummary,
}

/// Consumer group of the demo's HTTP subscription.
const HTTP_GROUP: &str = "http.crm";

/// Delivers `order.payment.succeeded` to a local endpoint through an HTTP
/// subscription, as `orderpipe deliver --subscription crm` would.
async fn deliver_payments(
    settings: &Settings,
    db: &Db,
    topic: &str,
    events: &[Envelope],
) -> anyhow::Result<HttpDemoReport> {
    let hits = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counter = hits.clone();
    let app = axum::Router::new().route(
        "/hooks/orders",
        axum::routing::post(move || {
            counter.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            async { axum::Json(serde_json::json!({"code": 0, "message": "ok"})) }
        }),
    );
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", 0)).await?;
    let url = format!("http://{}/hooks/orders", listener.local_addr()?);
    let server = tokio::spawn(async move { axum::serve(listener, app).await });
    let subscription = Subscription {
        name: "crm".into(),
        events: vec!["order.payment.succeeded".into()],
        url,
        method: "POST".into(),
        timeout_ms: 2000,
        retry_profile: Some("default".into()),
        retry: None,
        channel_id: "orderpipe-demo".into(),
        enabled: true,
        success: Default::default(),
        in_flight: crate::delivery::DEFAULT_IN_FLIGHT,
    };
    let (handler, _) = HttpDelivery::new(subscription.clone());
    let group = run_group(settings, db, HTTP_GROUP, vec![Arc::new(handler)], topic).await?;
    server.abort();
    Ok(HttpDemoReport {
        matching: events
            .iter()
            .filter(|e| subscription.matches(e.event_name.as_str()))
            .count(),
        requests: hits.load(std::sync::atomic::Ordering::SeqCst),
        group,
    })
}

/// The demo's consumer groups and their handlers.
const GROUPS: [(&str, &[&str]); 2] = [
    (
        "fulfilment-service.order.consumer",
        &["chaos", "inventory", "payment", "points"],
    ),
    (
        "customer-service.order.consumer",
        &["logistics", "notification"],
    ),
];

/// Runs one group of built-in handlers (`chaos` with the rules of
/// `chaos`) over the topic until it is idle.
async fn run_built_in(
    settings: &Settings,
    db: &Db,
    chaos: &ChaosSettings,
    group: &str,
    names: &[&str],
    topic: &str,
) -> anyhow::Result<ConsumeSummary> {
    let handlers = names
        .iter()
        .map(|n| match *n {
            chaos::NAME => Ok(Arc::new(Chaos::new(chaos.clone())) as Arc<dyn Handler>),
            n => handlers::by_name(n)
                .ok_or_else(|| anyhow::anyhow!(handlers::unknown(n, &[chaos::NAME]))),
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    run_group(settings, db, group, handlers, topic).await
}

/// Runs one group over the topic until it is idle.
async fn run_group(
    settings: &Settings,
    db: &Db,
    group: &str,
    handlers: Vec<Arc<dyn Handler>>,
    topic: &str,
) -> anyhow::Result<ConsumeSummary> {
    let options = ConsumeOptions {
        group: group.to_string(),
        handlers,
        topic: topic.to_string(),
        reads: Vec::new(),
        start_from: StartFrom::Earliest,
        until_idle: Some(Duration::from_secs(3)),
        health_addr: None,
        error_tier: true,
        ordering: settings.consumer.ordering,
        crash_before_forward_ack: false,
        commit_stamps: None,
    };
    Ok(consumer::run(
        crate::startup::consumer_sections(settings),
        db.clone(),
        options,
        std::future::pending(),
    )
    .await?)
}

/// The first order that has an event matching `pick`.
fn first_order_with(events: &[Envelope], pick: impl Fn(&Envelope) -> bool) -> i64 {
    events
        .iter()
        .find(|e| pick(e))
        .map_or(1, |e| e.data.order_id())
}

/// The transient order as `group` applied it: its event names in apply
/// order, and how many events of other orders were applied between its
/// first and its last (they flowed while it was parked).
async fn parked_story(db: &Db, group: &str, order: i64) -> anyhow::Result<(Vec<String>, i64)> {
    let rows = applied_sequence(db, group, order).await?;
    let meanwhile = match (rows.first(), rows.last()) {
        (Some(first), Some(last)) => {
            others_applied_between(db, group, order, first.1, last.1).await?
        }
        _ => 0,
    };
    Ok((rows.into_iter().map(|(name, _)| name).collect(), meanwhile))
}

/// Writes records that are not order events: random bytes, a wrong magic
/// byte, an unknown schema id. Returns how many.
async fn inject_poison(
    settings: &Settings,
    topic: &str,
    events: &[Envelope],
) -> anyhow::Result<usize> {
    // orderpipe's producer options, so each poison shares its order's partition.
    let options = producer_options(&settings.kafka.client_options(), &settings.producer.options)?;
    let producer: FutureProducer = client_config(&options).create()?;
    let poison: [&[u8]; 3] = [
        &[0xde, 0xad, 0xbe, 0xef],
        &[7, 0, 0, 0, 1, 2],
        &[0, 0x7f, 0xff, 0xff, 0x01, 2],
    ];
    // Keyed like three different orders (each poison parks its order's key).
    let mut keys: Vec<String> = Vec::new();
    for key in events.iter().map(Envelope::key) {
        if keys.len() < poison.len() && !keys.contains(&key) {
            keys.push(key);
        }
    }
    for (bytes, key) in poison.iter().zip(keys) {
        producer
            .send(
                FutureRecord::to(topic).key(&key).payload(*bytes),
                Duration::from_secs(10),
            )
            .await
            .map_err(|(e, _)| e)?;
    }
    Ok(poison.len())
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
    let registry = EmbeddedRegistry::start()
        .await
        .context("starting the embedded registry")?;
    settings.kafka.bootstrap_servers = cluster.bootstrap_servers();
    settings.registry.url = registry.url().to_string();

    // One SQLite database for the order service, the outbox and the consumers.
    let dir = tempfile::tempdir().context("temporary folder for the demo database")?;
    settings.database.url = format!("sqlite://{}/demo.db?mode=rwc", dir.path().display()).into();
    // One connection: SQLite allows one writer at a time anyway.
    let db = Db::connect(&settings.database, 1)?;
    db.migrate().await?;
    cluster.create_topic(&settings.topics.inventory_events.name, spec.partitions, 1)?;

    // Producer side: the order API (in-process) writes orders and outbox rows
    // in one transaction; the relay publishes them in Kafka transactions.
    let service = OrderService::new(db.clone(), &settings.producer, &settings.topics);
    generator::drive(&service, options.orders, options.seed).await?;
    let relay_options = RelayOptions {
        instance: "demo".into(),
        transactional_id_prefix: settings.producer.transactional_id_prefix.clone(),
        batch_size: 500,
        poll_interval: Duration::from_millis(50),
        lease_ttl: Duration::from_secs(10),
        sent_retention: Duration::from_secs(7 * 24 * 3600),
        until_idle: Some(Duration::from_secs(1)),
        crash_at: None,
        wake: None,
    };
    let relayed = Relay::new(
        crate::startup::relay_sections(&settings),
        db.clone(),
        relay_options,
    )
    .await?
    .run(std::future::pending())
    .await?;
    let events = crate::outbox::recorded_events(&db, &spec.name).await?;

    let catalog = SchemaCatalog::embedded();
    let codec = Arc::new(Codec::new(
        &settings.registry,
        &spec.name,
        catalog.order_events(),
        true,
    )?);
    codec.warm_up().await?;
    let producer = EventProducer::new(
        &settings.kafka,
        &settings.producer,
        codec.clone(),
        &spec.name,
    )?;
    producer.check_ready(Duration::from_secs(10)).await?;

    // What each order's sequence should be, in production order.
    let mut expected: HashMap<i64, Vec<Uuid>> = HashMap::new();
    for e in &events {
        expected
            .entry(e.data.order_id())
            .or_default()
            .push(e.event_id);
    }

    let consumer: BaseConsumer = client_config(&settings.kafka.client_options())
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
    let published = events.len() as u64;
    while consumed < published {
        if Instant::now() > deadline {
            bail!("read back only {consumed} of {published} events within 60s");
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
            ordering_violations.push(format!(
                "order {order}: partitions {partitions:?}, in order: {order_ok}"
            ));
        }
    }

    // Redelivery: every 10th event once more, after the originals.
    let duplicates: Vec<_> = events.iter().step_by(10).cloned().collect();
    let injected_duplicates = duplicates.len() as u64;
    let resent = producer
        .send_all(futures::stream::iter(duplicates), |_| {})
        .await;
    if resent.failed > 0 {
        bail!("duplicate injection failed: {:?}", resent.failures);
    }

    // The error tier: its topics, a quick schedule, and failures to show.
    for group in GROUPS.iter().map(|(g, _)| *g).chain([HTTP_GROUP]) {
        cluster.create_topic(&retry_topic(&spec.name, group), spec.partitions, 1)?;
    }
    cluster.create_topic(&settings.topics.dead_letter.name, spec.partitions, 1)?;
    settings.retry.initial_delay_ms = Some(500);
    let poison = inject_poison(&settings, &spec.name, &events).await?;
    let transient_order = first_order_with(&events, |e| matches!(e.data, EventData::Refunded(_)));
    let permanent_order = first_order_with(&events, |e| matches!(e.data, EventData::Canceled(_)));
    let mut chaos = ChaosSettings {
        transient_orders: vec![transient_order],
        transient_events: vec!["order.payment.succeeded".into()],
        transient_failures: 4,
        permanent_orders: vec![permanent_order],
        ..ChaosSettings::default()
    };

    let mut groups = Vec::new();
    for (group, names) in GROUPS {
        groups.push(run_built_in(&settings, &db, &chaos, group, names, &spec.name).await?);
    }

    // Operators' side: persist the DLQ, look, replay what can succeed, ignore the rest.
    crate::dlq::persist::run(
        &settings.kafka,
        &settings.dlq,
        &settings.topics.dead_letter,
        None,
        &db,
        Some(Duration::from_secs(2)),
        std::future::pending(),
    )
    .await?;
    let dead_letters = store::list(&db, &Filter::default(), 100).await?;
    let replay_filter = Filter {
        group: Some(GROUPS[0].0.to_string()),
        error_text: Some("fail permanently".into()),
        status: Some(store::Status::Pending.into()),
        ..Default::default()
    };
    chaos.permanent_orders.clear(); // the "fix" was deployed
    let to_replay = store::bound(&db, &replay_filter, 100).await?;
    let replay_options = ReplayOptions::default();
    let replayed = replay::replay(
        &settings.kafka,
        &settings.producer,
        &settings.topics.dead_letter.name,
        &db,
        &replay_filter,
        to_replay,
        replay_options,
        || {},
    )
    .await?;
    let poison_filter = Filter {
        status: Some(store::Status::Pending.into()),
        ..Default::default()
    };
    let poison_rows = store::records(&db, &poison_filter, 100).await?;
    // Poison parks its order's key too; nothing follows it here, so release.
    let reason = "not an order event (undecodable bytes)";
    crate::dlq::ignore::ignore(
        &db,
        &poison_rows,
        reason,
        Some(crate::dlq::ignore::Followers::Release),
    )
    .await?;
    let after_replay =
        run_built_in(&settings, &db, &chaos, GROUPS[0].0, GROUPS[0].1, &spec.name).await?;

    let mut group_order_violations = BTreeMap::new();
    for (group, _) in GROUPS {
        let (_, violations) = applied_order(&db, group, &events).await?;
        group_order_violations.insert(group.to_string(), violations.len());
    }
    let verification = verify(&db, GROUPS[0].0, &events).await?;
    let (transient_applied, applied_meanwhile) =
        parked_story(&db, GROUPS[0].0, transient_order).await?;
    let http = deliver_payments(&settings, &db, &spec.name, &events).await?;
    let tier = ErrorTierReport {
        poison_injected: poison,
        transient_order,
        transient_applied,
        applied_meanwhile,
        permanent_order,
        dead_letters,
        replayed: replayed.replayed,
        ignored: poison_rows.len() as u64,
        after_replay,
    };

    drop(registry);
    Ok(DemoReport {
        produced: published,
        relayed,
        http,
        consumed,
        orders: expected.len(),
        by_event,
        by_partition,
        ordering_violations,
        injected_duplicates,
        groups,
        tier,
        verification,
        group_order_violations,
        elapsed_ms: started.elapsed().as_millis(),
    })
}
