//! `orderpipe dlq replay`: republish dead letters and mark them replayed.
//!
//! By default a dead letter goes back to the failing group's retry topic,
//! due now, with a fresh retry budget, so only that group re-runs it. That
//! is the retry topic of the topic the group reads (the row's original
//! topic), not of the configured order topic: a group run with
//! `consume --topic X` gets its replays on `X.retry.<group>`. Its original
//! key, value and headers are kept byte for byte, and it carries the
//! failure headers a forwarded record does (the one writer is
//! [`crate::retry::tier_record`]), its origin (`orderpipe.original-*`)
//! included: if it fails again, the persister turns the same row back to
//! pending instead of adding one. `--to-original` republishes to the
//! original topic instead (every group sees it; groups that applied it
//! skip it as a duplicate).
//!
//! Replaying twice applies nothing twice: the event id is unchanged, so the
//! group's `event_dedup` row skips it.
//!
//! cdc's dead letters (group `cdc:<source>`: row changes that never reached
//! their change topic) and the relay's (group
//! [`crate::outbox::dead_letter::GROUP`]: outbox rows over the record limit)
//! are refused, each reported in the summary: their record holds a value
//! cut to fit, not the event, and no group waits for it on a retry topic
//! ([`not_replayable`]); the relay's outbox row is re-queued instead.

use std::collections::BTreeMap;
use std::time::Duration;

use futures::channel::oneshot::Canceled;
use futures::stream::FuturesUnordered;
use futures::{FutureExt, StreamExt};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::producer::FutureProducer;
use rdkafka::producer::future_producer::OwnedDeliveryResult;
use serde::Serialize;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::store::{self, Bound, DeadLetterRecord, Filter};
use crate::clock::now_ms;
use crate::db::{Db, DbError};
use crate::kafka::client::{KafkaSettings, client_config, producer_options};
use crate::kafka::record::{FailureHistory, header};
use crate::producer::ProducerSettings;
use crate::retry::{Hop, LastFailure, TierRecord, TierTopics, tier_record, topic_read_by};

/// How to replay.
#[derive(Debug, Clone, Copy)]
pub struct ReplayOptions {
    /// Republish to the original topic instead of the group's retry topic.
    pub to_original: bool,
    /// Records per second at most (None = unpaced).
    pub rate: Option<u32>,
    /// Rows read from the table per query.
    pub page_size: usize,
    /// Records sent and not yet acknowledged, at most.
    pub in_flight: usize,
}

impl Default for ReplayOptions {
    fn default() -> Self {
        Self {
            to_original: false,
            rate: None,
            page_size: PAGE_SIZE,
            in_flight: IN_FLIGHT,
        }
    }
}

/// What a replay did.
#[derive(Debug, Default, Clone, Serialize)]
pub struct ReplaySummary {
    /// Rows republished and marked replayed.
    pub replayed: u64,
    /// Rows that could not be republished, with the reason.
    pub failed: Vec<String>,
    /// Republished per destination topic.
    pub by_topic: BTreeMap<String, u64>,
    /// Republished per error class (the class each row failed with).
    pub by_class: BTreeMap<String, u64>,
}

/// A row's record as `dlq replay` republishes it: to the retry topic of
/// the topic its group reads (or to that topic, `--to-original`), with the
/// headers a forwarded record carries (see [`crate::retry::tier_record`]);
/// `dead_letter_topic` is where it goes if it fails again.
pub fn replayed_record(
    dead_letter_topic: &str,
    dead: &DeadLetterRecord,
    options: ReplayOptions,
    now_ms: i64,
) -> TierRecord {
    let row = &dead.row;
    let history = FailureHistory {
        original_topic: row.original_topic.clone(),
        original_partition: row.original_partition,
        original_offset: row.original_offset,
        original_timestamp: dead.original_timestamp,
        attempt: 0,
        executions: 0,
        first_failure_ms: Some(row.first_failure_ms),
    };
    let hop = if options.to_original {
        Hop::ReplayToOriginal { row_id: row.id }
    } else {
        Hop::Replay {
            row_id: row.id,
            due_ms: now_ms,
        }
    };
    let last = LastFailure {
        class: &row.error_class,
        message: &row.error_message,
        at_ms: row.last_failure_ms,
    };
    let original: BTreeMap<String, String> =
        serde_json::from_str(&dead.headers).unwrap_or_default();
    // The group's retry topic as its forwarder named it; dead letters
    // written before that header: the one of the topic the group read.
    let topics = match original.get(header::RETRY_TOPIC) {
        Some(retry) => TierTopics {
            retry: retry.clone(),
            dead_letter: dead_letter_topic.to_string(),
        },
        None => TierTopics::of(
            topic_read_by(&row.original_topic, &row.consumer_group),
            &row.consumer_group,
            dead_letter_topic,
        ),
    };
    let original = original
        .iter()
        .map(|(k, v)| (k.as_str(), Some(v.as_bytes())));
    tier_record(original, &history, &row.consumer_group, hop, last, &topics)
}

/// Where a row would go.
fn destination(dead_letter_topic: &str, row: &DeadLetterRecord, options: ReplayOptions) -> String {
    match not_replayable(row) {
        Some(_) => "(not replayable: a value cut to fit)".into(),
        None => replayed_record(dead_letter_topic, row, options, 0).topic,
    }
}

/// Why `dead` cannot be replayed: a cdc or relay dead letter (see the module docs).
pub fn not_replayable(dead: &DeadLetterRecord) -> Option<String> {
    if dead.row.consumer_group == crate::outbox::dead_letter::GROUP {
        // The relay's dead letters hold a cut value: the event is in the outbox, re-queued there.
        return Some(format!(
            "dead letter {}: an outbox row the relay could not publish (its value is cut): re-queue outbox row {} instead \
             (docs/operations.md, \"Outbox rows over the record limit\")",
            dead.row.id, dead.row.original_offset
        ));
    }
    dead.row.consumer_group.starts_with("cdc:").then(|| {
        format!(
            "dead letter {}: a row change {} could not publish ({}); its record holds the row cut to fit, not the change: \
             read the row from the database by its key (docs/cdc.md, \"Rows that cannot be published\"), then `dlq ignore` it",
            dead.row.id, dead.row.consumer_group, dead.row.error_class
        )
    })
}

/// A row of `dlq replay --dry-run`: a dead letter and where it would go.
/// (Fields in name order: the order its JSON always printed.)
#[derive(Debug, Clone, Serialize)]
pub struct Planned {
    /// Event id (from the headers).
    pub event_id: Option<String>,
    /// Event name (from the headers).
    pub event_name: Option<String>,
    /// Group that failed it.
    pub group: String,
    /// Row id.
    pub id: i64,
    /// The topic it would be republished to.
    pub to: String,
}

/// What replaying `rows` would do, changing nothing.
pub fn plan(
    dead_letter_topic: &str,
    rows: &[DeadLetterRecord],
    options: ReplayOptions,
) -> Vec<Planned> {
    rows.iter()
        .map(|r| Planned {
            event_id: r.row.event_id.clone(),
            event_name: r.row.event_name.clone(),
            group: r.row.consumer_group.clone(),
            id: r.row.id,
            to: destination(dead_letter_topic, r, options),
        })
        .collect()
}

/// What replaying the rows `filter` selects up to `bound` would do,
/// changing nothing; read a page at a time as [`replay`] reads them.
pub async fn dry_run(
    db: &Db,
    dead_letter_topic: &str,
    filter: &Filter,
    bound: Bound,
    options: ReplayOptions,
) -> Result<Vec<Planned>, DbError> {
    let mut planned = Vec::new();
    let Some(last_id) = bound.last_id else {
        return Ok(planned);
    };
    let mut pages = read_pages(
        db.clone(),
        filter.clone(),
        last_id,
        options.page_size.max(1),
    );
    while let Some(page) = pages.recv().await {
        planned.extend(plan(dead_letter_topic, &page?, options));
    }
    Ok(planned)
}

/// Rows read from the table per query, by default.
pub const PAGE_SIZE: usize = 2_000;

/// Records sent and not yet acknowledged, at most, by default.
pub const IN_FLIGHT: usize = 5_000;

/// Acknowledged rows marked per UPDATE, at most.
const MARK_BATCH: usize = 1_000;

/// Acknowledged rows wait at most this long to be marked (a paced replay
/// acknowledges fewer than a batch per second).
const MARK_EVERY: Duration = Duration::from_secs(1);

/// Republishes the rows `filter` selects up to `bound` (see
/// [`store::Bound`]) as a stream, and marks them replayed once the broker
/// acknowledged them:
///
/// * rows are read a page at a time (`options.page_size`, keyset on the id;
///   the next page is read while this one is sent);
/// * up to `options.in_flight` records are sent and not yet acknowledged;
///   a key's records keep their order (one producer, sent in id order);
/// * acknowledged rows are marked in acknowledgement order, in batches (one
///   UPDATE per batch), by a task of their own while sending goes on; a
///   failed send is reported in the summary and its row stays pending;
/// * a crash leaves every row not yet marked pending: a second replay sends
///   an acknowledged-but-unmarked row again, and the group's `event_dedup`
///   skips it.
///
/// `progress` is called once per delivery report (acknowledged or failed).
/// The producer is built from `kafka` and `producer`; `dead_letter_topic` is
/// the `topics.dead_letter` name.
#[allow(clippy::too_many_arguments)]
pub async fn replay(
    kafka: &KafkaSettings,
    producer: &ProducerSettings,
    dead_letter_topic: &str,
    db: &Db,
    filter: &Filter,
    bound: Bound,
    options: ReplayOptions,
    mut progress: impl FnMut(),
) -> anyhow::Result<ReplaySummary> {
    let Some(last_id) = bound.last_id else {
        return Ok(ReplaySummary::default());
    };
    let producer: FutureProducer = client_config(&producer_options(
        &kafka.client_options(),
        &producer.options,
    )?)
    .create()?;
    let mut pages = read_pages(
        db.clone(),
        filter.clone(),
        last_id,
        options.page_size.max(1),
    );
    let (marks, marker) = spawn_marker(db.clone());
    let mut acks = Acks {
        summary: ReplaySummary::default(),
        acked: Vec::with_capacity(MARK_BATCH),
        marks,
        last_mark: Instant::now(),
    };
    let window = options.in_flight.max(1);
    let mut in_flight = FuturesUnordered::new();
    let started = Instant::now();
    let mut sent = 0_u64;
    let mut read_error = None;
    'pages: while let Some(page) = pages.recv().await {
        let page = match page {
            Ok(rows) => rows,
            // Stop sending; what is in flight is still settled and marked.
            Err(e) => {
                read_error = Some(e);
                break;
            }
        };
        let now = now_ms();
        for dead in page {
            if let Some(rate) = options.rate.filter(|r| *r > 0) {
                tokio::time::sleep_until(
                    started + Duration::from_secs_f64(sent as f64 / f64::from(rate)),
                )
                .await;
            }
            sent += 1;
            if let Some(why) = not_replayable(&dead) {
                acks.summary.failed.push(why);
                progress();
                continue;
            }
            let (id, class, record) = (
                dead.row.id,
                dead.row.error_class.clone(),
                replayed_record(dead_letter_topic, &dead, options, now),
            );
            loop {
                while in_flight.len() >= window {
                    let done = in_flight.next().await.expect("the window is not empty");
                    if !acks.settle(done, &mut progress).await {
                        break 'pages;
                    }
                }
                match producer
                    .send_result(record.to_send(dead.key.as_deref(), dead.payload.as_deref()))
                {
                    Ok(delivery) => {
                        let topic = record.topic.clone();
                        let class = class.clone();
                        in_flight.push(async move { (id, topic, class, delivery.await) });
                        break;
                    }
                    // librdkafka's own queue is full: wait for an acknowledgement, then send again.
                    Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), _)) => {
                        match in_flight.next().await {
                            Some(done) => {
                                if !acks.settle(done, &mut progress).await {
                                    break 'pages;
                                }
                            }
                            None => tokio::time::sleep(Duration::from_millis(10)).await,
                        }
                    }
                    Err((e, _)) => {
                        acks.summary.failed.push(format!("dead letter {id}: {e}"));
                        progress();
                        break;
                    }
                }
            }
            // Settle what is acknowledged already, without waiting.
            while let Some(Some(done)) = in_flight.next().now_or_never() {
                if !acks.settle(done, &mut progress).await {
                    break 'pages;
                }
            }
        }
    }
    while let Some(done) = in_flight.next().await {
        if !acks.settle(done, &mut progress).await {
            break;
        }
    }
    let Acks {
        mut summary,
        acked,
        marks,
        ..
    } = acks;
    if !acked.is_empty() {
        let _ = marks.send(acked).await;
    }
    drop(marks);
    // The marker's error first: it is why sending stopped early, if it did.
    summary.replayed = marker.await??;
    match read_error {
        Some(e) => Err(anyhow::Error::new(e).context(format!(
            "reading dead letters stopped the replay after {} rows marked replayed",
            summary.replayed
        ))),
        None => Ok(summary),
    }
}

/// Acknowledgements being settled: counted, and their rows handed to the
/// marker in acknowledgement order.
struct Acks {
    summary: ReplaySummary,
    acked: Vec<i64>,
    marks: mpsc::Sender<Vec<i64>>,
    last_mark: Instant,
}

impl Acks {
    /// Settles one delivery report; false when the marker stopped (its
    /// error ends the replay).
    async fn settle(
        &mut self,
        done: (i64, String, String, Result<OwnedDeliveryResult, Canceled>),
        progress: &mut impl FnMut(),
    ) -> bool {
        let (id, topic, class, delivered) = done;
        match delivered {
            Ok(Ok(_)) => {
                self.acked.push(id);
                *self.summary.by_topic.entry(topic).or_default() += 1;
                *self.summary.by_class.entry(class).or_default() += 1;
            }
            Ok(Err((e, _))) => self.summary.failed.push(format!("dead letter {id}: {e}")),
            Err(Canceled) => self.summary.failed.push(format!(
                "dead letter {id}: the producer closed before a delivery report"
            )),
        }
        progress();
        if self.acked.len() >= MARK_BATCH
            || (!self.acked.is_empty() && self.last_mark.elapsed() >= MARK_EVERY)
        {
            self.last_mark = Instant::now();
            let batch = std::mem::replace(&mut self.acked, Vec::with_capacity(MARK_BATCH));
            return self.marks.send(batch).await.is_ok();
        }
        true
    }
}

/// Reads `filter`'s rows up to `last_id` a page at a time (keyset on the
/// id), one page ahead of the sender.
fn read_pages(
    db: Db,
    filter: Filter,
    last_id: i64,
    page_size: usize,
) -> mpsc::Receiver<Result<Vec<DeadLetterRecord>, DbError>> {
    let (pages, receiver) = mpsc::channel(1);
    tokio::spawn(async move {
        let mut after = i64::MIN;
        loop {
            let page =
                match store::records_page(&db, &filter, after, last_id, page_size as i64).await {
                    Ok(rows) => rows,
                    Err(e) => {
                        let _ = pages.send(Err(e)).await;
                        return;
                    }
                };
            let Some(last) = page.last().map(|r| r.row.id) else {
                return;
            };
            // A short page is the last: nothing more matches up to `last_id`.
            let full = page.len() == page_size;
            if pages.send(Ok(page)).await.is_err() || !full {
                return;
            }
            after = last;
        }
    });
    receiver
}

/// Marks acknowledged rows replayed, a batch per UPDATE, in the order they
/// arrive; batches that queued up meanwhile go together (up to
/// [`MARK_BATCH`] per statement). Returns the rows marked.
fn spawn_marker(db: Db) -> (mpsc::Sender<Vec<i64>>, JoinHandle<Result<u64, DbError>>) {
    let (marks, mut batches) = mpsc::channel::<Vec<i64>>(8);
    let marker = tokio::spawn(async move {
        let mut marked = 0_u64;
        while let Some(mut ids) = batches.recv().await {
            while ids.len() < MARK_BATCH {
                match batches.try_recv() {
                    Ok(more) => ids.extend(more),
                    Err(_) => break,
                }
            }
            for chunk in ids.chunks(MARK_BATCH) {
                store::mark_replayed(&db, chunk).await?;
                marked += chunk.len() as u64;
            }
        }
        Ok(marked)
    });
    (marks, marker)
}
