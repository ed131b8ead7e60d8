//! One leased shard's pipeline: claim → encode → Kafka transaction → mark
//! sent, with the database work of one batch overlapping the Kafka
//! transaction of another.
//!
//! ```text
//!            claim+encode N+1 ─┐
//! Kafka tx N (send, acks, commit) ─┴─► mark N sent (marker task) ─► …
//!                                  Kafka tx N+1 ─► mark N+1 …
//! ```
//!
//! * **Claim** is a plain read (no row locks): the oldest unsent rows of the
//!   shard through the `(shard, sent_ms, id)` index, skipping the rows this
//!   pipeline already has in flight (claimed, or committed to Kafka but not
//!   yet marked), completed to whole business transactions (`tx_id`). It
//!   needs no lock because the shard's lease and its `transactional.id` make
//!   this task the shard's only publisher: a previous owner that still runs
//!   was fenced when we called `init_transactions`, so its next commit fails.
//! * **Kafka transaction**: one per batch, with the batch's acknowledgements
//!   awaited before `commit_transaction` (the client's commit flushes in
//!   100 ms polling steps while anything is in flight; with nothing in
//!   flight it returns at once). The next batch is claimed and encoded
//!   meanwhile.
//! * **Mark** runs on its own task, strictly after the commit it covers,
//!   while the next Kafka transaction runs. At most [`MARK_DEPTH`] committed
//!   batches wait for their mark; a slower database holds the pipeline back
//!   rather than growing it.
//!
//! Order: one order's rows are in one shard, claimed in id order, and a
//! batch's Kafka transaction commits before the next one begins (one
//! producer, one transaction at a time). A row that commits to the database
//! after later ids were claimed (ids are allocated at insert, not at commit)
//! is claimed by the next batch: it belongs to an order with no later row in
//! flight, because the order service writes an order's next event only after
//! the previous one committed. An aborted transaction drops the batch
//! claimed meanwhile, so nothing after it is published before it.
//!
//! A crash after a commit and before its mark publishes up to
//! [`MARK_DEPTH`] + 1 batches again (same event ids) when the shard's next
//! owner starts: consumers skip them as duplicates.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use metrics::histogram;
use rdkafka::error::KafkaError;
use rdkafka::message::OwnedHeaders;
use rdkafka::producer::{DeliveryFuture, FutureRecord, Producer};
use sqlx::Row;
use tokio::sync::{mpsc, watch};

use super::{CrashPoint, STALL_MARKER, ShardOutcome, abort_or_fatal};
use crate::backoff::Backoff;
use crate::clock::now_ms;
use crate::codec::Codec;
use crate::db::{Db, DbError, rows};
use crate::envelope::Envelope;
use crate::kafka::client::MeasuredProducer;
use crate::metrics::name;
use crate::producer::record_headers;

/// Committed batches that may wait for their mark at once.
pub const MARK_DEPTH: usize = 2;

/// What a shard's pipeline needs, shared by the relay's shard tasks.
pub(super) struct ShardShared {
    pub db: Db,
    pub codecs: BTreeMap<String, Codec>,
    /// Rows per Kafka transaction (completed to whole business transactions).
    pub batch_size: usize,
    /// Longest wait of an idle shard before it looks at the outbox again.
    pub poll_interval: Duration,
    /// How long a stopping shard keeps trying to mark what it committed.
    pub stop_grace: Duration,
    /// Bumped when new outbox rows may be there (a wake-up): idle shards
    /// claim at once.
    pub wake: watch::Receiver<u64>,
    /// Shards that have not found their outbox empty since they started or
    /// last published: the relay is not idle while any is.
    pub busy: AtomicUsize,
    /// Milliseconds per batch of each stage, for the run's summary
    /// (bounded: the first [`MAX_STAGE_SAMPLES`] batches of each stage).
    pub stage_samples: Mutex<BTreeMap<&'static str, Vec<f64>>>,
}

/// Batches whose stage times a run's summary keeps, per stage.
const MAX_STAGE_SAMPLES: usize = 1_000_000;

/// Reports from the shard tasks to the relay's main loop.
pub(super) enum ShardEvent {
    /// A Kafka transaction of `shard` committed these rows (per topic).
    Committed { shard: i64, rows: u64, by_topic: BTreeMap<String, u64> },
    /// A Kafka transaction aborted; its rows are claimed again.
    Aborted,
}

/// Why a shard task ended.
pub(super) enum ShardExit {
    /// Told to stop (lease given back, shutdown); its marks are done.
    Stopped,
    /// Its producer failed fatally (fenced, or librdkafka's fatal state).
    Fatal(KafkaError),
}

/// Where every shard task meets before a crash point fires, so that the
/// crash catches every shard in the same state (tests of the crash
/// guarantees: "killed inside the transaction" means no shard committed).
pub(super) struct CrashGate {
    point: CrashPoint,
    barrier: tokio::sync::Barrier,
    /// Set once the stalled process was continued (SIGCONT).
    continued: watch::Sender<bool>,
}

impl CrashGate {
    /// A gate for `shards` tasks started together.
    pub fn new(point: CrashPoint, shards: usize) -> Self {
        Self {
            point,
            barrier: tokio::sync::Barrier::new(shards.max(1)),
            continued: watch::channel(false).0,
        }
    }

    /// Every shard arrives here once; the last one fires the crash point:
    /// the process aborts, or stops itself (SIGSTOP) and, once continued,
    /// lets every shard go on.
    async fn arrive(&self) {
        let mut continued = self.continued.subscribe();
        if self.barrier.wait().await.is_leader() {
            match self.point {
                CrashPoint::BeforeKafkaCommit | CrashPoint::AfterKafkaCommit => {
                    tracing::error!(point = ?self.point, "crash point: aborting the process");
                    std::process::abort();
                }
                CrashPoint::StallBeforeKafkaCommit => {
                    eprintln!("{STALL_MARKER} (pid {})", std::process::id());
                    // SAFETY: raise only sends a signal to this process.
                    unsafe { libc::raise(libc::SIGSTOP) };
                    self.continued.send_replace(true);
                }
            }
        }
        let _ = continued.wait_for(|c| *c).await;
    }
}

/// One outbox row, encoded and ready to send.
struct Encoded {
    id: i64,
    topic: String,
    key: String,
    payload: Vec<u8>,
    headers: OwnedHeaders,
    event_name: String,
}

/// A claimed batch: whole business transactions, in id order.
struct Batch {
    records: Vec<Encoded>,
}

impl Batch {
    fn ids(&self) -> Vec<i64> {
        self.records.iter().map(|r| r.id).collect()
    }
}

/// Why a claim failed (the shard retries it with backoff).
#[derive(Debug, thiserror::Error)]
enum ClaimError {
    #[error(transparent)]
    Db(#[from] DbError),
    #[error("outbox row {0}: {1}")]
    Row(i64, String),
}

impl From<sqlx::Error> for ClaimError {
    fn from(e: sqlx::Error) -> Self {
        Self::Db(e.into())
    }
}

/// Runs shard `shard`'s pipeline with `producer` (fenced in) until `stop`
/// turns true or the producer fails fatally. The caller raised
/// [`ShardShared::busy`] for it.
pub(super) async fn run(
    shard: i64,
    producer: MeasuredProducer,
    shared: Arc<ShardShared>,
    mut stop: watch::Receiver<bool>,
    events: mpsc::UnboundedSender<ShardEvent>,
    crash: Option<Arc<CrashGate>>,
) -> ShardExit {
    // Rows claimed or committed but not yet marked: the next claim skips them.
    let in_flight: Arc<Mutex<BTreeSet<i64>>> = Arc::default();
    let (marks, marks_rx) = mpsc::channel::<Vec<i64>>(MARK_DEPTH - 1);
    let marker = tokio::spawn(mark_sent(shared.clone(), marks_rx, in_flight.clone(), stop.clone()));
    let mut wake = shared.wake.clone();
    let mut backoff = Backoff::capped(Duration::from_secs(5));
    let mut next: Option<Batch> = None;
    let mut gate_passed = crash.is_none();
    // Committed batches held unmarked while the after-commit crash point is armed.
    let mut held_unmarked = 0;
    // Busy from the start until a claim finds nothing.
    let mut busy = Busy::adopt(&shared.busy);
    let exit = loop {
        if *stop.borrow() {
            break ShardExit::Stopped;
        }
        let batch = match next.take() {
            Some(batch) => batch,
            None => {
                wake.borrow_and_update();
                match claim(&shared, shard, &in_flight).await {
                    Ok(batch) => batch,
                    Err(e) => {
                        tracing::warn!(shard, error = %e, "outbox claim failed; retrying with backoff");
                        tokio::select! {
                            _ = backoff.wait() => {}
                            _ = stop.changed() => {}
                        }
                        continue;
                    }
                }
            }
        };
        busy.set(!batch.records.is_empty());
        if batch.records.is_empty() {
            if !gate_passed {
                // Nothing to publish: this shard does not hold the crash back.
                gate_passed = true;
                crash.as_ref().expect("armed").arrive().await;
                continue;
            }
            tokio::select! {
                _ = wake.changed() => {}
                _ = tokio::time::sleep(shared.poll_interval) => {}
                _ = stop.changed() => {}
            }
            continue;
        }
        let ids = batch.ids();
        in_flight.lock().expect("not poisoned").extend(ids.iter().copied());
        // The next batch is claimed and encoded while this one's Kafka
        // transaction runs; it skips this batch's rows (in flight).
        let (outcome, prefetched) = tokio::join!(
            transaction(shard, &producer, &batch, &shared, crash.as_deref(), &mut gate_passed),
            claim(&shared, shard, &in_flight),
        );
        super::transaction(if matches!(outcome, ShardOutcome::Committed) { "committed" } else { "aborted" });
        match outcome {
            ShardOutcome::Committed => {
                backoff.reset();
                // One counter update per topic and event name, not per record.
                let mut by_event: BTreeMap<(&str, &str), u64> = BTreeMap::new();
                for r in &batch.records {
                    *by_event.entry((r.topic.as_str(), r.event_name.as_str())).or_default() += 1;
                }
                let mut by_topic: BTreeMap<String, u64> = BTreeMap::new();
                for ((topic, event_name), n) in by_event {
                    crate::producer::produced(topic, event_name, n);
                    *by_topic.entry(topic.to_string()).or_default() += n;
                }
                let _ = events.send(ShardEvent::Committed { shard, rows: ids.len() as u64, by_topic });
                next = match prefetched {
                    Ok(batch) => Some(batch),
                    Err(e) => {
                        tracing::warn!(shard, error = %e, "outbox claim failed; retrying");
                        None
                    }
                };
                if let Some(gate) = crash.as_ref().filter(|g| g.point == CrashPoint::AfterKafkaCommit) {
                    // Armed: nothing is marked; the crash fires once this
                    // shard holds the pipeline's depth of unmarked commits.
                    held_unmarked += 1;
                    if held_unmarked >= MARK_DEPTH || next.as_ref().is_none_or(|b| b.records.is_empty()) {
                        gate.arrive().await;
                    }
                    continue;
                }
                if marks.send(ids).await.is_err() {
                    break ShardExit::Stopped;
                }
            }
            ShardOutcome::Aborted(error) => {
                // What was claimed meanwhile may hold later events of the
                // aborted batch's orders: dropped, claimed again after it.
                remove(&in_flight, &ids);
                tracing::warn!(shard, error = %error, "Kafka transaction aborted; its rows stay unsent and are retried");
                let _ = events.send(ShardEvent::Aborted);
                tokio::select! {
                    _ = backoff.wait() => {}
                    _ = stop.changed() => {}
                }
            }
            ShardOutcome::Fatal(error) => {
                remove(&in_flight, &ids);
                break ShardExit::Fatal(error);
            }
        }
    };
    // The marks of what was committed, before the shard's lease goes back.
    drop(marks);
    let _ = marker.await;
    exit
}

/// This shard's share of [`ShardShared::busy`], given back when dropped.
struct Busy<'a> {
    count: &'a AtomicUsize,
    on: bool,
}

impl<'a> Busy<'a> {
    /// The share counted by the relay when it spawned the shard's task
    /// ([`ShardShared::busy`] is raised before the task first runs, so the
    /// relay never sees a starting shard as idle).
    fn adopt(count: &'a AtomicUsize) -> Self {
        Self { count, on: true }
    }

    fn set(&mut self, on: bool) {
        if on != self.on {
            if on {
                self.count.fetch_add(1, Ordering::Relaxed);
            } else {
                self.count.fetch_sub(1, Ordering::Relaxed);
            }
            self.on = on;
        }
    }
}

impl Drop for Busy<'_> {
    fn drop(&mut self) {
        self.set(false);
    }
}

fn remove(in_flight: &Mutex<BTreeSet<i64>>, ids: &[i64]) {
    let mut set = in_flight.lock().expect("not poisoned");
    for id in ids {
        set.remove(id);
    }
}

/// The oldest unsent rows of `shard` that are not in flight, completed to
/// whole business transactions, encoded.
async fn claim(shared: &ShardShared, shard: i64, in_flight: &Mutex<BTreeSet<i64>>) -> Result<Batch, ClaimError> {
    let started = Instant::now();
    let skip: BTreeSet<i64> = in_flight.lock().expect("not poisoned").clone();
    let mut tx = shared.db.begin().await?;
    // The index (shard, sent_ms, id) gives these in id order, ids only.
    let limit = (shared.batch_size + skip.len()) as i64;
    let candidates: Vec<(i64,)> = sqlx::query_as(
        "SELECT id FROM outbox_messages WHERE shard = ? AND sent_ms IS NULL ORDER BY id LIMIT ?",
    )
    .bind(shard)
    .bind(limit)
    .fetch_all(&mut *tx)
    .await?;
    let ids: Vec<i64> = candidates
        .into_iter()
        .map(|(id,)| id)
        .filter(|id| !skip.contains(id))
        .take(shared.batch_size)
        .collect();
    const COLUMNS: &str = "SELECT id, tx_id, topic, message_key, envelope FROM outbox_messages";
    let mut found = rows::select_in(&mut tx, COLUMNS, "id", "", &ids).await?;
    let mut read = Vec::with_capacity(found.len());
    for r in found.drain(..) {
        read.push(OutboxRow::from_row(&r)?);
    }
    read.sort_unstable_by_key(|r| r.id);
    // Whole business transactions: the rest of the last one's rows.
    if let Some(last) = read.last() {
        let rest = sqlx::query(
            "SELECT id, tx_id, topic, message_key, envelope FROM outbox_messages \
             WHERE tx_id = ? AND shard = ? AND id > ? AND sent_ms IS NULL ORDER BY id",
        )
        .bind(last.tx_id.clone())
        .bind(shard)
        .bind(last.id)
        .fetch_all(&mut *tx)
        .await?;
        for r in rest {
            let row = OutboxRow::from_row(&r)?;
            if !skip.contains(&row.id) {
                read.push(row);
            }
        }
    }
    tx.rollback().await?;
    stage_time(shared, "claim", started);
    let started = Instant::now();
    let mut records = Vec::with_capacity(read.len());
    for row in read {
        records.push(encode(shared, row).await?);
    }
    if !records.is_empty() {
        stage_time(shared, "encode", started);
    }
    Ok(Batch { records })
}

/// An outbox row as read.
struct OutboxRow {
    id: i64,
    tx_id: String,
    topic: String,
    key: String,
    envelope: String,
}

impl OutboxRow {
    fn from_row(r: &sqlx::any::AnyRow) -> Result<Self, sqlx::Error> {
        Ok(Self {
            id: r.try_get(0)?,
            tx_id: r.try_get(1)?,
            topic: r.try_get(2)?,
            key: r.try_get(3)?,
            envelope: r.try_get(4)?,
        })
    }
}

/// A row as the record it becomes: a row that cannot be encoded fails the
/// claim (retried with backoff, reported) before any transaction opens.
async fn encode(shared: &ShardShared, row: OutboxRow) -> Result<Encoded, ClaimError> {
    let envelope = Envelope::from_json(&row.envelope).map_err(|e| ClaimError::Row(row.id, e.to_string()))?;
    let codec = shared
        .codecs
        .get(&row.topic)
        .ok_or_else(|| ClaimError::Row(row.id, format!("no schema for topic {}", row.topic)))?;
    let payload = codec.encode(&envelope).await.map_err(|e| ClaimError::Row(row.id, e.to_string()))?;
    Ok(Encoded {
        id: row.id,
        headers: record_headers(&envelope),
        event_name: envelope.event_name.as_str().to_string(),
        topic: row.topic,
        key: row.key,
        payload,
    })
}

/// Publishes `batch` in one Kafka transaction of `producer`: send every
/// record, await every acknowledgement, commit. A refused record aborts it.
async fn transaction(
    shard: i64,
    producer: &MeasuredProducer,
    batch: &Batch,
    shared: &ShardShared,
    crash: Option<&CrashGate>,
    gate_passed: &mut bool,
) -> ShardOutcome {
    let started = Instant::now();
    let deliveries = match produce(producer, batch) {
        Ok(deliveries) => deliveries,
        Err(e) => return abort_or_fatal(producer, e).await,
    };
    if !*gate_passed
        && let Some(gate) = crash.filter(|g| g.point != CrashPoint::AfterKafkaCommit)
    {
        // Crash inside the transaction: every shard's records reach the
        // log (uncommitted) before the process dies or stops.
        let _ = producer.flush(Duration::from_secs(10));
        *gate_passed = true;
        gate.arrive().await;
    }
    let refused = futures::future::join_all(deliveries).await.into_iter().find_map(|delivery| match delivery {
        Ok(Ok(_)) => None,
        Ok(Err((e, _))) => Some(e),
        Err(_canceled) => Some(KafkaError::Canceled),
    });
    stage_time(shared, "produce", started);
    if let Some(e) = refused {
        tracing::warn!(shard, error = %e, "a record of the Kafka transaction was refused");
        return abort_or_fatal(producer, e).await;
    }
    let started = Instant::now();
    let p = producer.clone();
    let committed = tokio::task::spawn_blocking(move || p.commit_transaction(Duration::from_secs(60)))
        .await
        .expect("commit task does not panic");
    match committed {
        Ok(()) => {
            histogram!(name::RELAY_COMMIT_SECONDS).record(started.elapsed().as_secs_f64());
            sample(shared, "commit", started);
            ShardOutcome::Committed
        }
        Err(e) => abort_or_fatal(producer, e).await,
    }
}

/// Opens a transaction on `producer` and queues `batch` in it.
fn produce(producer: &MeasuredProducer, batch: &Batch) -> Result<Vec<DeliveryFuture>, KafkaError> {
    producer.begin_transaction()?;
    let mut deliveries = Vec::with_capacity(batch.records.len());
    for r in &batch.records {
        let record = FutureRecord::to(&r.topic).key(&r.key).payload(&r.payload).headers(r.headers.clone());
        deliveries.push(producer.send_result(record).map_err(|(e, _)| e)?);
    }
    Ok(deliveries)
}

/// The marker: marks each committed batch sent, in commit order, retrying
/// a failed mark with backoff (an unmarked row would be published again),
/// then lets the claim see its rows' ids again (they are no longer unsent).
/// After `stop`, it keeps trying for the shard's stop grace only.
async fn mark_sent(
    shared: Arc<ShardShared>,
    mut batches: mpsc::Receiver<Vec<i64>>,
    in_flight: Arc<Mutex<BTreeSet<i64>>>,
    stop: watch::Receiver<bool>,
) {
    while let Some(ids) = batches.recv().await {
        let started = Instant::now();
        let mut backoff = Backoff::capped(Duration::from_secs(5));
        let mut stopping_since: Option<Instant> = None;
        loop {
            match mark(&shared.db, &ids).await {
                Ok(()) => break,
                Err(e) => {
                    if *stop.borrow() {
                        let since = *stopping_since.get_or_insert_with(Instant::now);
                        if since.elapsed() >= shared.stop_grace {
                            tracing::warn!(rows = ids.len(), error = %e, "stopping with committed rows unmarked: the shard's next owner publishes them again (consumers skip the duplicates)");
                            break;
                        }
                    }
                    tracing::warn!(rows = ids.len(), error = %e, "marking published outbox rows failed; retrying with backoff");
                    backoff.wait().await;
                }
            }
        }
        stage_time(&shared, "mark", started);
        remove(&in_flight, &ids);
    }
}

/// `UPDATE outbox_messages SET sent_ms = now WHERE id IN (ids)`, in one
/// database transaction.
async fn mark(db: &Db, ids: &[i64]) -> Result<(), DbError> {
    let mut tx = db.begin().await?;
    rows::update_in(&mut tx, "UPDATE outbox_messages SET sent_ms = ", rows::Bound::Int(now_ms()), "id", " AND sent_ms IS NULL", ids)
        .await?;
    tx.commit().await?;
    Ok(())
}

/// Time spent in one stage of a shard's pipeline: the metric and the
/// run's summary.
fn stage_time(shared: &ShardShared, stage: &'static str, started: Instant) {
    histogram!(name::RELAY_STAGE_SECONDS, "stage" => stage).record(started.elapsed().as_secs_f64());
    sample(shared, stage, started);
}

/// Keeps one batch's stage time for the run's summary.
fn sample(shared: &ShardShared, stage: &'static str, started: Instant) {
    let ms = started.elapsed().as_secs_f64() * 1000.0;
    let mut samples = shared.stage_samples.lock().expect("not poisoned");
    let list = samples.entry(stage).or_default();
    if list.len() < MAX_STAGE_SAMPLES {
        list.push(ms);
    }
}
