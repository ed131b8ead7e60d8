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
//!
//! Rows over the record limit: the claim sizes each record against its
//! topic's limit ([`crate::outbox::limits`]) before any transaction opens;
//! a row over it (or refused by the broker twice) goes into the batch's
//! Kafka transaction as a dead-letter record instead
//! ([`crate::outbox::dead_letter`]) and is marked dead with the batch. The
//! claim holds back the rows of an order with a dead row (read first, in
//! the same database transaction, so a re-queued row is never overtaken by
//! the rows behind it): per-key order, as consumers keep it for their dead
//! letters; other orders flow on.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use metrics::histogram;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
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
use crate::kafka::size_limit::RecordLimit;
use crate::metrics::{InternalEvent, name};
use crate::outbox::dead_letter::{DeadRow, RowDeadLettered};
use crate::outbox::limits::Limits;
use crate::producer::record_headers;
use crate::stages::StageClock;

/// A row that looks over its topic's limit is measured again against a
/// limit read from the broker at most this long ago (an operator may have
/// raised it, and re-queued the row) before it is dead-lettered: a limit
/// raised a second before a re-queue is seen; a flood of big rows asks the
/// broker once a second at most.
const RECHECK_AFTER: Duration = Duration::from_secs(1);

/// Times the broker may refuse a row's record before it is dead-lettered
/// even though it looks within the limit (the first refusal re-reads the
/// limit; a batch of several records may also have been too big together).
const REFUSALS: u32 = 2;

/// Committed batches that may wait for their mark at once.
pub const MARK_DEPTH: usize = 2;

/// What a shard's pipeline needs, shared by the relay's shard tasks.
pub(super) struct ShardShared {
    pub db: Db,
    pub codecs: BTreeMap<String, Codec>,
    /// The record limits of the topics it writes.
    pub limits: Arc<Limits>,
    /// Where rows that cannot be published go (`topics.dead_letter`).
    pub dead_letter_topic: String,
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
    /// Each batch's time per stage: the metric and the run's summary.
    pub stages: StageClock,
}

/// Reports from the shard tasks to the relay's main loop.
pub(super) enum ShardEvent {
    /// A Kafka transaction of `shard` committed these rows (per topic), and
    /// `dead` dead-lettered ones.
    Committed {
        shard: i64,
        rows: u64,
        dead: u64,
        by_topic: BTreeMap<String, u64>,
    },
    /// A Kafka transaction aborted; its rows are claimed again.
    Aborted,
}

/// Why a shard task ended.
pub(super) enum ShardExit {
    /// Told to stop (lease given back, shutdown); its marks are done.
    Stopped,
    /// Its producer failed fatally (fenced, or librdkafka's fatal state).
    Fatal(KafkaError),
    /// A transaction timed out (the broker away longer than
    /// `transaction.timeout.ms`) and was aborted. The producer is renewed
    /// rather than reused: a reused one was seen to abort every later
    /// transaction and never deliver again, while a new one starts a new
    /// epoch. Not counted as a fatal error: an outage can time out many.
    TimedOut(KafkaError),
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

/// A row that cannot be published, with its dead-letter record.
struct Dead {
    row: DeadRow,
    headers: OwnedHeaders,
    value: Vec<u8>,
}

/// A claimed batch: whole business transactions, in id order; rows over
/// the limit as dead letters.
struct Batch {
    records: Vec<Encoded>,
    dead: Vec<Dead>,
}

impl Batch {
    /// Every row of the batch, published or dead-lettered.
    fn ids(&self) -> Vec<i64> {
        self.records
            .iter()
            .map(|r| r.id)
            .chain(self.dead.iter().map(|d| d.row.id))
            .collect()
    }

    fn is_empty(&self) -> bool {
        self.records.is_empty() && self.dead.is_empty()
    }
}

/// What the marker writes for a committed batch.
struct Marks {
    sent: Vec<i64>,
    dead: Vec<(i64, String)>,
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
    // Rows a claim dead-lettered, by id, with their key, until the marker
    // marked them dead: the claims hold their orders' rows meanwhile.
    let dying: Arc<Mutex<BTreeMap<i64, String>>> = Arc::default();
    let (marks, marks_rx) = mpsc::channel::<Marks>(MARK_DEPTH - 1);
    let marker = tokio::spawn(mark_sent(
        shared.clone(),
        marks_rx,
        in_flight.clone(),
        dying.clone(),
        stop.clone(),
    ));
    let mut wake = shared.wake.clone();
    let mut backoff = Backoff::capped(Duration::from_secs(5));
    let mut next: Option<Batch> = None;
    // Rows the broker refused as too large: times, and what it said.
    let mut refused: BTreeMap<i64, (u32, String)> = BTreeMap::new();
    // Rows waiting behind a dead row of their order (re-read by each claim).
    let mut held: BTreeSet<i64> = BTreeSet::new();
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
                match claim(&shared, shard, &in_flight, &dying, &refused, &mut held).await {
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
        busy.set(!batch.is_empty());
        if batch.is_empty() {
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
        in_flight
            .lock()
            .expect("not poisoned")
            .extend(ids.iter().copied());
        // The next batch is claimed and encoded while this one's Kafka
        // transaction runs; it skips this batch's rows (in flight).
        let ((outcome, too_large), prefetched) = tokio::join!(
            transaction(
                shard,
                &producer,
                &batch,
                &shared,
                crash.as_deref(),
                &mut gate_passed
            ),
            claim(&shared, shard, &in_flight, &dying, &refused, &mut held),
        );
        super::transaction(if matches!(outcome, ShardOutcome::Committed) {
            "committed"
        } else {
            "aborted"
        });
        match outcome {
            ShardOutcome::Committed => {
                backoff.reset();
                // One counter update per topic and event name, not per record.
                let mut by_event: BTreeMap<(&str, &str), u64> = BTreeMap::new();
                for r in &batch.records {
                    *by_event
                        .entry((r.topic.as_str(), r.event_name.as_str()))
                        .or_default() += 1;
                }
                let mut by_topic: BTreeMap<String, u64> = BTreeMap::new();
                for ((topic, event_name), n) in by_event {
                    crate::producer::produced(topic, event_name, n);
                    *by_topic.entry(topic.to_string()).or_default() += n;
                }
                for dead in &batch.dead {
                    RowDeadLettered(&dead.row).emit();
                    refused.remove(&dead.row.id);
                }
                let published = batch.records.len() as u64;
                let _ = events.send(ShardEvent::Committed {
                    shard,
                    rows: published,
                    dead: batch.dead.len() as u64,
                    by_topic,
                });
                next = match prefetched {
                    Ok(batch) => Some(batch),
                    Err(e) => {
                        tracing::warn!(shard, error = %e, "outbox claim failed; retrying");
                        None
                    }
                };
                if let Some(gate) = crash
                    .as_ref()
                    .filter(|g| g.point == CrashPoint::AfterKafkaCommit)
                {
                    // Armed: nothing is marked; the crash fires once this
                    // shard holds the pipeline's depth of unmarked commits.
                    held_unmarked += 1;
                    if held_unmarked >= MARK_DEPTH || next.as_ref().is_none_or(Batch::is_empty) {
                        gate.arrive().await;
                    }
                    continue;
                }
                let dead = batch
                    .dead
                    .into_iter()
                    .map(|d| (d.row.id, d.row.reason()))
                    .collect();
                let sent = batch.records.iter().map(|r| r.id).collect();
                if marks.send(Marks { sent, dead }).await.is_err() {
                    break ShardExit::Stopped;
                }
            }
            ShardOutcome::Aborted(error) => {
                // What was claimed meanwhile may hold later events of the
                // aborted batch's orders: dropped, claimed again after it.
                remove(&in_flight, &ids);
                forget_dying(&dying, &batch, prefetched.as_ref().ok());
                for (id, topic, reason) in too_large {
                    // Asked again before the row is claimed again; refused
                    // again, it is dead-lettered.
                    shared.limits.forget(&topic);
                    let entry = refused.entry(id).or_insert((0, String::new()));
                    *entry = (entry.0 + 1, reason);
                }
                tracing::warn!(shard, error = %error, "Kafka transaction aborted; its rows stay unsent and are retried");
                let _ = events.send(ShardEvent::Aborted);
                if super::is_timeout(&error) {
                    break ShardExit::TimedOut(error);
                }
                tokio::select! {
                    _ = backoff.wait() => {}
                    _ = stop.changed() => {}
                }
            }
            ShardOutcome::Fatal(error) => {
                remove(&in_flight, &ids);
                forget_dying(&dying, &batch, prefetched.as_ref().ok());
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

/// The dead rows of batches that did not commit are not dying any more
/// (they are claimed, and judged, again).
fn forget_dying(dying: &Mutex<BTreeMap<i64, String>>, batch: &Batch, prefetched: Option<&Batch>) {
    let mut dying = dying.lock().expect("not poisoned");
    for dead in batch
        .dead
        .iter()
        .chain(prefetched.into_iter().flat_map(|b| b.dead.iter()))
    {
        dying.remove(&dead.row.id);
    }
}

fn remove(in_flight: &Mutex<BTreeSet<i64>>, ids: &[i64]) {
    let mut set = in_flight.lock().expect("not poisoned");
    for id in ids {
        set.remove(id);
    }
}

/// The oldest unsent rows of `shard` that are not in flight, completed to
/// whole business transactions, encoded, and sized: a row over its
/// topic's limit (or refused by the broker [`REFUSALS`] times) becomes a
/// dead letter. Rows of an order with a dead row (marked, or `dying`: in a
/// batch not yet marked) are left unsent and listed in `held`.
async fn claim(
    shared: &ShardShared,
    shard: i64,
    in_flight: &Mutex<BTreeSet<i64>>,
    dying: &Mutex<BTreeMap<i64, String>>,
    refused: &BTreeMap<i64, (u32, String)>,
    held: &mut BTreeSet<i64>,
) -> Result<Batch, ClaimError> {
    let started = Instant::now();
    let skip: BTreeSet<i64> = in_flight.lock().expect("not poisoned").clone();
    // Dying before marked, so a key leaving the one is in the other.
    let mut dead_keys: BTreeSet<String> = dying
        .lock()
        .expect("not poisoned")
        .values()
        .cloned()
        .collect();
    let mut tx = shared.db.begin().await?;
    // Before the candidates: a row re-queued by an operator in between is
    // held with its followers this time, never overtaken by them.
    let marked: Vec<(String,)> = sqlx::query_as(
        "SELECT DISTINCT message_key FROM outbox_messages WHERE shard = ? AND dead_ms IS NOT NULL",
    )
    .bind(shard)
    .fetch_all(&mut *tx)
    .await?;
    dead_keys.extend(marked.into_iter().map(|(k,)| k));
    // The index (shard, sent_ms, id) gives these in id order, ids only;
    // the rows held last time are among the oldest and read again.
    let limit = (shared.batch_size + skip.len() + held.len()) as i64;
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
        .take(shared.batch_size + held.len())
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
    shared.stages.record("claim", started);
    let started = Instant::now();
    let mut batch = Batch {
        records: Vec::with_capacity(read.len()),
        dead: Vec::new(),
    };
    held.clear();
    for row in read {
        if dead_keys.contains(&row.key) {
            held.insert(row.id);
            continue;
        }
        match encode(shared, row, refused).await? {
            Judged::Publish(record) => batch.records.push(record),
            Judged::Dead(dead) => {
                // The rest of its order waits behind it, in this batch too.
                dead_keys.insert(dead.row.key.clone());
                dying
                    .lock()
                    .expect("not poisoned")
                    .insert(dead.row.id, dead.row.key.clone());
                batch.dead.push(*dead);
            }
        }
    }
    if !batch.is_empty() {
        shared.stages.record("encode", started);
    }
    Ok(batch)
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

/// What a claimed row becomes.
enum Judged {
    Publish(Encoded),
    Dead(Box<Dead>),
}

/// A row as the record it becomes, or as a dead letter when the record is
/// over its topic's limit (measured against a freshly read limit first) or
/// the broker refused it [`REFUSALS`] times. A row that cannot be encoded
/// fails the claim (retried with backoff, reported) before any transaction
/// opens.
async fn encode(
    shared: &ShardShared,
    row: OutboxRow,
    refused: &BTreeMap<i64, (u32, String)>,
) -> Result<Judged, ClaimError> {
    let envelope =
        Envelope::from_json(&row.envelope).map_err(|e| ClaimError::Row(row.id, e.to_string()))?;
    let codec = shared
        .codecs
        .get(&row.topic)
        .ok_or_else(|| ClaimError::Row(row.id, format!("no schema for topic {}", row.topic)))?;
    let payload = codec
        .encode(&envelope)
        .await
        .map_err(|e| ClaimError::Row(row.id, e.to_string()))?;
    let headers = record_headers(&envelope);
    let size = RecordLimit::record_size_with(row.key.as_bytes(), &payload, &headers);
    let refusals = refused.get(&row.id);
    let mut limit = shared.limits.cached(&row.topic);
    if !limit.fits(size) || refusals.is_some() {
        limit = shared.limits.confirmed(&row.topic, RECHECK_AFTER).await;
    }
    let refused_for_good = refusals.filter(|(n, _)| *n >= REFUSALS);
    if !limit.fits(size) || refused_for_good.is_some() {
        let dead = DeadRow {
            id: row.id,
            topic: row.topic,
            key: row.key,
            event_id: envelope.event_id.to_string(),
            event_name: envelope.event_name.as_str().to_string(),
            size,
            limit,
            refused: refused_for_good.map(|(_, e)| e.clone()),
            envelope_json: row.envelope,
        };
        let dlq_limit = shared.limits.cached(&shared.dead_letter_topic);
        let (headers, value) = dead.record(&envelope, &dlq_limit);
        return Ok(Judged::Dead(Box::new(Dead {
            row: dead,
            headers,
            value,
        })));
    }
    Ok(Judged::Publish(Encoded {
        id: row.id,
        headers,
        event_name: envelope.event_name.as_str().to_string(),
        topic: row.topic,
        key: row.key,
        payload,
    }))
}

/// Rows whose record the broker (or librdkafka) refused as too large:
/// id, topic, what it said.
type TooLarge = Vec<(i64, String, String)>;

/// Publishes `batch` in one Kafka transaction of `producer`: send every
/// record and every dead letter, await every acknowledgement, commit. A
/// refused record aborts it; the rows refused as too large are returned.
async fn transaction(
    shard: i64,
    producer: &MeasuredProducer,
    batch: &Batch,
    shared: &ShardShared,
    crash: Option<&CrashGate>,
    gate_passed: &mut bool,
) -> (ShardOutcome, TooLarge) {
    let started = Instant::now();
    let mut too_large = TooLarge::new();
    let deliveries = match produce(producer, batch, &shared.dead_letter_topic) {
        Ok(deliveries) => deliveries,
        Err((e, index)) => {
            if let Some(r) = index
                .and_then(|i| batch.records.get(i))
                .filter(|_| is_too_large(&e))
            {
                too_large.push((r.id, r.topic.clone(), e.to_string()));
            }
            return (abort_or_fatal(producer, e).await, too_large);
        }
    };
    if !*gate_passed && let Some(gate) = crash.filter(|g| g.point != CrashPoint::AfterKafkaCommit) {
        // Crash inside the transaction: every shard's records reach the
        // log (uncommitted) before the process dies or stops.
        let _ = producer.flush(Duration::from_secs(10));
        *gate_passed = true;
        gate.arrive().await;
    }
    let mut refused = None;
    for (i, delivery) in futures::future::join_all(deliveries)
        .await
        .into_iter()
        .enumerate()
    {
        let error = match delivery {
            Ok(Ok(_)) => continue,
            Ok(Err((e, _))) => e,
            Err(_canceled) => KafkaError::Canceled,
        };
        if let Some(r) = batch.records.get(i).filter(|_| is_too_large(&error)) {
            too_large.push((r.id, r.topic.clone(), error.to_string()));
        }
        refused.get_or_insert(error);
    }
    shared.stages.record("produce", started);
    if let Some(e) = refused {
        tracing::warn!(shard, error = %e, too_large = too_large.len(), "a record of the Kafka transaction was refused");
        return (abort_or_fatal(producer, e).await, too_large);
    }
    let started = Instant::now();
    let committed = crate::producer::transactional::commit(producer, Duration::from_secs(60)).await;
    let outcome = match committed {
        Ok(()) => {
            histogram!(name::RELAY_COMMIT_SECONDS).record(started.elapsed().as_secs_f64());
            shared.stages.sample("commit", started);
            ShardOutcome::Committed
        }
        Err(e) => abort_or_fatal(producer, e).await,
    };
    (outcome, too_large)
}

/// A record refused for its size (by librdkafka's `message.max.bytes`
/// check, or by the broker's `max.message.bytes`).
fn is_too_large(error: &KafkaError) -> bool {
    error.rdkafka_error_code() == Some(RDKafkaErrorCode::MessageSizeTooLarge)
}

/// Opens a transaction on `producer` and queues `batch` in it: its records,
/// then its dead letters to `dead_letter_topic`. A send refused at once
/// says which (its index among the records; None: a dead letter).
fn produce(
    producer: &MeasuredProducer,
    batch: &Batch,
    dead_letter_topic: &str,
) -> Result<Vec<DeliveryFuture>, (KafkaError, Option<usize>)> {
    producer.begin_transaction().map_err(|e| (e, None))?;
    let mut deliveries = Vec::with_capacity(batch.records.len() + batch.dead.len());
    for (i, r) in batch.records.iter().enumerate() {
        let record = FutureRecord::to(&r.topic)
            .key(&r.key)
            .payload(&r.payload)
            .headers(r.headers.clone());
        deliveries.push(
            producer
                .send_result(record)
                .map_err(|(e, _)| (e, Some(i)))?,
        );
    }
    for d in &batch.dead {
        let record = FutureRecord::to(dead_letter_topic)
            .key(&d.row.key)
            .payload(&d.value)
            .headers(d.headers.clone());
        deliveries.push(producer.send_result(record).map_err(|(e, _)| (e, None))?);
    }
    Ok(deliveries)
}

/// The marker: marks each committed batch sent (its dead rows dead), in
/// commit order, retrying a failed mark with backoff (an unmarked row would
/// be published again), then lets the claim see its rows' ids again (they
/// are no longer unsent) and its dead rows leave `dying` (they are marked).
/// After `stop`, it keeps trying for the shard's stop grace only.
async fn mark_sent(
    shared: Arc<ShardShared>,
    mut batches: mpsc::Receiver<Marks>,
    in_flight: Arc<Mutex<BTreeSet<i64>>>,
    dying: Arc<Mutex<BTreeMap<i64, String>>>,
    stop: watch::Receiver<bool>,
) {
    while let Some(marks) = batches.recv().await {
        let started = Instant::now();
        let mut backoff = Backoff::capped(Duration::from_secs(5));
        let mut stopping_since: Option<Instant> = None;
        let rows = marks.sent.len() + marks.dead.len();
        loop {
            match mark(&shared.db, &marks).await {
                Ok(()) => break,
                Err(e) => {
                    if *stop.borrow() {
                        let since = *stopping_since.get_or_insert_with(Instant::now);
                        if since.elapsed() >= shared.stop_grace {
                            tracing::warn!(rows, error = %e, "stopping with committed rows unmarked: the shard's next owner publishes them again (consumers skip the duplicates)");
                            break;
                        }
                    }
                    tracing::warn!(rows, error = %e, "marking published outbox rows failed; retrying with backoff");
                    backoff.wait().await;
                }
            }
        }
        shared.stages.record("mark", started);
        let dead: Vec<i64> = marks.dead.iter().map(|(id, _)| *id).collect();
        remove(&in_flight, &marks.sent);
        remove(&in_flight, &dead);
        let mut dying = dying.lock().expect("not poisoned");
        for id in dead {
            dying.remove(&id);
        }
    }
}

/// `UPDATE outbox_messages SET sent_ms = now WHERE id IN (sent)`, and each
/// dead row's `sent_ms`, `dead_ms` and reason, in one database transaction.
async fn mark(db: &Db, marks: &Marks) -> Result<(), DbError> {
    let now = now_ms();
    let mut tx = db.begin().await?;
    if !marks.sent.is_empty() {
        rows::update_in(
            &mut tx,
            "outbox_messages",
            "sent_ms",
            rows::Bound::Int(now),
            "id",
            " AND sent_ms IS NULL",
            &marks.sent,
        )
        .await?;
    }
    // Few: one statement each.
    for (id, reason) in &marks.dead {
        sqlx::query("UPDATE outbox_messages SET sent_ms = ?, dead_ms = ?, dead_reason = ? WHERE id = ? AND sent_ms IS NULL")
            .bind(now)
            .bind(now)
            .bind(reason)
            .bind(*id)
            .execute(&mut *tx)
            .await?;
    }
    tx.commit().await?;
    Ok(())
}
