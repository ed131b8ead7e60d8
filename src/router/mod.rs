//! The router: `orderpipe deliver` without `--subscription` serves every
//! enabled subscription of the control-plane tables ([`crate::subscriptions`]),
//! seed 003's one worker pool for every downstream.
//!
//! * One consumer group per (downstream consumer, bind_key): a
//!   [`Binding`] of [`crate::subscriptions::Store::desired`]. Subscriptions
//!   with one bind key share the group, so their changes reach the
//!   downstream in one ordered stream. Each group is the ordinary consumer
//!   ([`crate::consumer::run`]: dedup, error tier, per-key order) with one
//!   handler, [`handler::BindingDelivery`]: the binding's filters decide,
//!   then [`crate::delivery::post`] delivers; a change its filters reject is
//!   committed, not delivered and not retried.
//! * Changes take effect without a restart: the router polls the newest
//!   `control_requests` id every second (every CLI or admin API change
//!   writes one, and so do `POST /refresh` and `/reload`) and re-reads the
//!   tables when it moves, and every 30 s regardless. A new binding starts
//!   its group (creating its retry topic first), a binding left without an
//!   enabled subscription stops its group, and a changed URL, method,
//!   timeout, channel or filter is swapped into the running handler, so it
//!   applies to the next record. A changed retry schedule or topic set
//!   restarts the group (both are read at start). A group whose consumer
//!   ended (an error) is started again at the next re-read.
//! * [`reconcile`] compares the desired groups with the broker's groups and
//!   topics at start and every `--reconcile-interval` (5 min): orphans are
//!   reported as gauges and a log line, never deleted.
//!
//! A group reads every topic its binding's events live on: the order topic
//! for order events, `cdc.<db>.<table>` for row changes of `orderpipe cdc`
//! (decoded into [`crate::envelope::EventData::RowChange`], delivered with
//! `old`). Its retry topic is named after the order topic
//! (`<order topic>.retry.<group>`) whatever it reads, and holds the failures
//! of all of them.

pub mod handler;
pub mod reconcile;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use metrics::gauge;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use crate::config::Settings;
use crate::consumer::{self, ConsumeOptions, ConsumeSummary, ConsumerError, StartFrom};
use crate::db::Db;
use crate::ordering::OrderingMode;
use crate::subscriptions::store::Origin;
use crate::subscriptions::watch::{ChangeWatch, POLL_INTERVAL};
use crate::subscriptions::{ActualBinding, ActualState, Binding, Store};
use crate::topics::{EnsureOptions, TopicAdmin};
use handler::BindingDelivery;

/// The tables are re-read at least this often, with or without a request.
const FULL_RELOAD: Duration = Duration::from_secs(30);
/// The longest wait between two attempts to read an unavailable database.
const MAX_WAIT: Duration = Duration::from_secs(30);
/// A stopping group gets this long to finish its batch and commit.
const STOP_TIMEOUT: Duration = Duration::from_secs(30);

/// Groups running in this router.
pub const GROUPS: &str = "orderpipe_router_groups";

/// How the router runs its groups.
#[derive(Debug, Clone)]
pub struct RouterOptions {
    /// Where a new group starts.
    pub start_from: StartFrom,
    /// Per-key order of every group.
    pub ordering: OrderingMode,
    /// Time between two reconciliations of desired and actual state.
    pub reconcile_interval: Duration,
}

/// A group this router runs.
struct Running {
    binding: Arc<RwLock<Binding>>,
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<Result<ConsumeSummary, ConsumerError>>,
}

/// What the router runs, for `GET /bindings` of the admin API
/// ([`crate::subscriptions::admin::AdminState::with_actual`]).
#[derive(Debug, Clone, Default)]
pub struct Actual(Arc<Mutex<Vec<ActualBinding>>>);

#[async_trait::async_trait]
impl ActualState for Actual {
    async fn actual(&self) -> Result<Vec<ActualBinding>, String> {
        Ok(self.0.lock().expect("actual lock").clone())
    }
}

/// The router's state between two re-reads.
struct Router {
    settings: Settings,
    store: Store,
    options: RouterOptions,
    running: BTreeMap<String, Running>,
    actual: Actual,
    /// Each running group's total lag, as of the last reconciliation.
    lags: BTreeMap<String, i64>,
}

/// Runs the router until `shutdown` resolves; `actual` is kept up to date
/// with the groups it runs. A database that cannot be read (at start or
/// later) is retried with a backoff up to 30 s, the groups running as they are.
pub async fn run(
    settings: Settings,
    db: Db,
    options: RouterOptions,
    actual: Actual,
    shutdown: impl std::future::Future<Output = ()>,
) {
    crate::metrics::install();
    let store = Store::new(db, Origin::Router);
    let mut router = Router {
        settings,
        store,
        options,
        running: BTreeMap::new(),
        actual,
        lags: BTreeMap::new(),
    };
    // Acted on nothing until the first re-read succeeds.
    let mut changes = ChangeWatch::new(router.store.clone());
    let mut synced = Instant::now();
    let mut reconciled: Option<Instant> = None;
    let mut wait = POLL_INTERVAL;
    tokio::pin!(shutdown);
    loop {
        match changes.check().await {
            Ok(latest) => {
                if latest.is_new() || synced.elapsed() >= FULL_RELOAD {
                    match router.sync().await {
                        Ok(()) => {
                            changes.acted(latest);
                            (synced, wait) = (Instant::now(), POLL_INTERVAL);
                        }
                        Err(e) => {
                            wait = (wait * 2).min(MAX_WAIT);
                            tracing::warn!(error = %e, retry_in_ms = wait.as_millis() as u64, "subscriptions not read; the groups keep running as they are");
                        }
                    }
                }
            }
            Err(e) => {
                wait = (wait * 2).min(MAX_WAIT);
                tracing::warn!(error = %e, retry_in_ms = wait.as_millis() as u64, "control requests not read; the groups keep running as they are");
            }
        }
        // At start (once the tables were read) and every interval.
        if changes.has_acted()
            && reconciled.is_none_or(|r| r.elapsed() >= router.options.reconcile_interval)
        {
            router.reconcile().await;
            reconciled = Some(Instant::now());
        }
        tokio::select! {
            _ = &mut shutdown => break,
            _ = tokio::time::sleep(wait) => {}
        }
    }
    let groups: Vec<String> = router.running.keys().cloned().collect();
    for group in groups {
        router.stop(&group).await;
    }
}

impl Router {
    /// Re-reads the desired bindings and makes the running groups match.
    async fn sync(&mut self) -> Result<(), crate::subscriptions::SubsError> {
        let desired = self.store.desired(None).await?;
        let mut wanted = BTreeSet::new();
        for binding in desired {
            wanted.insert(binding.group.clone());
            let restart = match self.running.get(&binding.group) {
                None => true,
                Some(running) if running.task.is_finished() => true,
                Some(running) => {
                    let mut current = running.binding.write().expect("binding lock");
                    if current.consumer.retry != binding.consumer.retry
                        || current.topics != binding.topics
                    {
                        true
                    } else {
                        if *current != binding {
                            tracing::info!(group = %binding.group, url = %binding.consumer.url, subscriptions = ?binding.routes.iter().map(|r| r.subscription_id).collect::<Vec<_>>(), "binding reloaded");
                            *current = binding.clone();
                        }
                        false
                    }
                }
            };
            if restart {
                self.stop(&binding.group).await;
                self.start(binding).await;
            }
        }
        let gone: Vec<String> = self
            .running
            .keys()
            .filter(|g| !wanted.contains(*g))
            .cloned()
            .collect();
        for group in gone {
            tracing::info!(group = %group, "no enabled subscription binds this group any more: stopping it");
            self.stop(&group).await;
        }
        gauge!(GROUPS).set(self.running.len() as f64);
        self.publish_actual();
        Ok(())
    }

    /// Starts the group of `binding`: its retry topic, then a consumer.
    async fn start(&mut self, binding: Binding) {
        let group = binding.group.clone();
        let mut settings = self.settings.clone();
        if let Some(layer) = &binding.consumer.retry {
            settings.retry.top = Some((
                format!("downstream_consumers[{}].retry", binding.consumer.name),
                layer.clone(),
            ));
        }
        if let Err(e) = settings.retry.policy_for(&group) {
            tracing::error!(group = %group, error = %e, "group not started: its retry schedule is invalid");
            return;
        }
        let retry = crate::topics::retry_spec(&settings.topics, &group);
        let ensured = match TopicAdmin::new(&settings.kafka) {
            Ok(admin) => admin
                .ensure(
                    &[&retry],
                    EnsureOptions {
                        dry_run: false,
                        allow_repartition: false,
                    },
                )
                .await
                .map(drop),
            Err(e) => Err(e),
        };
        if let Err(e) = ensured {
            tracing::error!(group = %group, topic = %retry.name, error = %e, "group not started: its retry topic could not be ensured; tried again at the next re-read");
            return;
        }
        // The tier is named after the order topic; the binding says what is read.
        let topic = settings.topics.order_events.name.clone();
        let reads = binding.topics.clone();
        let shared = Arc::new(RwLock::new(binding));
        let options = ConsumeOptions {
            group: group.clone(),
            handlers: vec![Arc::new(BindingDelivery::new(shared.clone()))],
            topic,
            reads,
            start_from: self.options.start_from,
            until_idle: None,
            health_addr: None,
            error_tier: true,
            ordering: self.options.ordering,
            crash_before_forward_ack: false,
            commit_stamps: None,
        };
        // One worker per partition of every topic read and of the retry topic.
        let db = match Db::connect(
            &settings.database,
            consumer::connections_needed_for(&settings.topics, &options),
        ) {
            Ok(db) => db,
            Err(e) => {
                tracing::error!(group = %group, error = %e, "group not started: no database pool");
                return;
            }
        };
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            let sections = crate::startup::consumer_sections(&settings);
            consumer::run(sections, db, options, async {
                let _ = stopped.await;
            })
            .await
        });
        tracing::info!(group = %group, "group started");
        self.running.insert(
            group,
            Running {
                binding: shared,
                stop: Some(stop),
                task,
            },
        );
    }

    /// Stops `group` (if it runs) and waits for its last commit.
    async fn stop(&mut self, group: &str) {
        let Some(mut running) = self.running.remove(group) else {
            return;
        };
        if let Some(stop) = running.stop.take() {
            let _ = stop.send(());
        }
        match tokio::time::timeout(STOP_TIMEOUT, &mut running.task).await {
            Ok(Ok(Ok(summary))) => tracing::info!(
                group,
                delivered_or_skipped = summary.applied,
                "group stopped"
            ),
            Ok(Ok(Err(e))) => tracing::error!(group, error = %e, "group had ended with an error"),
            Ok(Err(e)) => tracing::error!(group, error = %e, "group task failed"),
            Err(_) => {
                running.task.abort();
                tracing::warn!(
                    group,
                    "group did not stop within {STOP_TIMEOUT:?}; aborted (uncommitted records are redelivered and skipped as duplicates)"
                );
            }
        }
        self.publish_actual();
    }

    /// Compares desired and actual state and reports orphans ([`reconcile`]),
    /// and measures the running groups' lag for the actual state.
    async fn reconcile(&mut self) {
        let running: Vec<String> = self.running.keys().cloned().collect();
        match reconcile::compare(&self.settings, &self.store, &running).await {
            Ok(report) => report.emit(),
            Err(e) => {
                tracing::warn!(error = %e, "router reconciliation failed; tried again at the next interval")
            }
        }
        // A group's lag is the sum over the topics it reads.
        let mut readers: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for (group, run) in &self.running {
            for topic in &run.binding.read().expect("binding lock").topics {
                readers
                    .entry(topic.clone())
                    .or_default()
                    .push(group.clone());
            }
        }
        let mut lags = BTreeMap::new();
        for (topic, groups) in readers {
            match crate::lag::measure(&self.settings.kafka, &topic, &groups, true).await {
                Ok(measured) => measured
                    .into_iter()
                    .for_each(|g| *lags.entry(g.group).or_insert(0) += g.total_lag),
                Err(e) => {
                    tracing::warn!(topic = %topic, error = %e, "router groups' lag not measured; the actual state shows the last values");
                    return self.publish_actual();
                }
            }
        }
        self.lags = lags;
        self.publish_actual();
    }

    fn publish_actual(&self) {
        let actual = self
            .running
            .iter()
            .map(|(group, running)| {
                let binding = running.binding.read().expect("binding lock");
                ActualBinding {
                    group: group.clone(),
                    topics: binding.topics.clone(),
                    subscriptions: binding.routes.iter().map(|r| r.subscription_id).collect(),
                    running: !running.task.is_finished(),
                    lag: self.lags.get(group).copied(),
                }
            })
            .collect();
        *self.actual.0.lock().expect("actual lock") = actual;
    }
}
