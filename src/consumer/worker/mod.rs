//! One partition's worker: applies its records in offset order, in batches,
//! and sends failures through the error tier.
//!
//! # States
//!
//! A worker serves its partition until the channel closes or the partition
//! is revoked. Revocation is the one way out of every step: each step that
//! can notice it returns `Result<_, Revoked>`, and `?` carries it up to
//! [`PartitionWorker::run`], which hands what is still queued back (the next
//! owner re-reads every record whose offset was not stored). A step that
//! waits for the database, the registry or the broker does so through
//! [`crate::backoff::until_available`], which checks ownership after each wait.
//!
//! # A batch
//!
//! A batch is every record already waiting (up to `consumer.batch_size`):
//!
//! 1. decode: a record that cannot be decoded or validated is poison, sent
//!    straight to the dead-letter topic with its reason (no retries can fix
//!    it); so is a record of an `event_version` major the handlers do not
//!    declare (`unsupported_version`, see [`super::version`]); the registry
//!    being down is waited out in place;
//! 2. effects outside the database (HTTP deliveries), with no transaction
//!    open (`worker/outside.rs`);
//! 3. apply, in one DB transaction (`worker/apply.rs`): the *gate*
//!    (per-key ordering), then waves of set-based *dedup* and *handlers*
//!    (a fixed, small number of statements whatever the batch's size),
//!    then *commit* and *bookkeeping* (counts, the parked set, metrics);
//! 4. store the offset of the last record, and release what waited behind
//!    the heads the batch applied ([`PartitionWorker::release`]).
//!
//! Failures while applying:
//!
//! * the infrastructure being down (database unavailable, lock timeout)
//!   rolls back and retries the same batch in place with exponential
//!   backoff; the offset does not move, health reports it, and the records
//!   keep their retry budget;
//! * a record a handler fails is taken out of the transaction (its wave
//!   rolls back to a savepoint and runs again without it), together with
//!   the later records of its key; the rest of the batch commits. Then the
//!   failed record gets `retry.local_retries` immediate retries (if
//!   retryable) and goes to the group's retry topic or, when fatal or out
//!   of attempts, to the dead-letter topic; then the records behind it are
//!   applied (or held behind it). The batch's offset is stored only once
//!   all of that is done and the broker acknowledged every forward.
//!
//! A worker of the group's retry topic waits for each record's due time
//! with its partition paused (no busy polling), then processes it the same way.
//!
//! With `consumer.ordering = key` (see [`crate::ordering`]) a forwarded
//! record parks its key; later records of a parked key are held in the
//! batch's transaction instead of applied, and released in order once the
//! head is applied (`worker/parking.rs`).

mod apply;
mod outside;
mod parking;
mod waves;

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use rdkafka::consumer::Consumer;
use rdkafka::message::OwnedMessage;
use rdkafka::{Message, Offset, TopicPartitionList};
use tokio::sync::mpsc;
use tracing::Instrument;

use super::assignment::PartitionKey;
use super::handler::HandlerError;
use super::pause::PauseReason;
use super::version::{self, UNSUPPORTED_VERSION};
use super::{ConsumeSummary, Shared};
use crate::backoff::{Backoff, retry, until_available};
use crate::clock::now_ms;
use crate::consumer::events::{DeadLettered, ProcessingFailed, SentToRetry};
use crate::envelope::Envelope;
use crate::kafka::record::{Failure, header, header_text};
use crate::metrics::InternalEvent;
use crate::ordering::ParkState;
use crate::retry::Routed;

/// Largest record value accepted (order events are small by rule).
pub const MAX_VALUE_BYTES: usize = 64 * 1024;

/// The partition is no longer this worker's: stop. Its next owner re-reads
/// the records whose offsets were not stored and redoes their work.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Revoked;

/// A record and its decoded envelope (None = poison, already dead-lettered).
#[derive(Clone)]
struct Item {
    message: OwnedMessage,
    envelope: Option<Envelope>,
    /// Set when the record is being released from `held_records`: it skips
    /// the parked-key gate and its held row is deleted as it is applied.
    held_id: Option<i64>,
}

/// What decoding a record gave.
// Envelope is the common case: boxing it would allocate once per record for nothing.
#[allow(clippy::large_enum_variant)]
enum Decoded {
    /// The envelope, checked.
    Envelope(Envelope),
    /// Poison: the failure to dead-letter it with.
    Poison(Failure),
}

/// What a committed batch leaves to do.
#[derive(Default)]
struct Committed {
    /// Keys whose head was applied in the batch: release their followers.
    heads: Vec<crate::ordering::OrderKey>,
    /// Released records that another release of their key had already
    /// applied (both read the same held row; the first delete wins).
    released_elsewhere: u64,
    /// Records left out of the transaction, in offset order: to settle
    /// through the error tier, or to apply once those before them are.
    deferred: Vec<apply::Deferred>,
}

/// Why a batch's transaction was not committed.
enum BatchError {
    /// Infrastructure down: retry the whole batch later, in place.
    Unavailable(String),
    /// The one record applied failed in a handler ([`PartitionWorker::apply_one`]).
    Record(HandlerError),
    /// The partition is no longer ours.
    Revoked(Revoked),
}

impl From<Revoked> for BatchError {
    fn from(revoked: Revoked) -> Self {
        Self::Revoked(revoked)
    }
}

impl fmt::Display for BatchError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Unavailable(reason) => f.write_str(reason),
            Self::Record(error) => error.fmt(f),
            Self::Revoked(_) => f.write_str("partition revoked"),
        }
    }
}

/// Names a retried step and where it runs, for its log line:
/// `cannot park the key (order.events.v1/3)`; formatted only when logged.
struct At<'a> {
    what: &'a str,
    partition: &'a PartitionKey,
    offset: Option<i64>,
}

impl fmt::Display for At<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} ({}/{}",
            self.what, self.partition.0, self.partition.1
        )?;
        if let Some(offset) = self.offset {
            write!(f, " at offset {offset}")?;
        }
        f.write_str(")")
    }
}

/// The worker of one assigned partition.
pub struct PartitionWorker {
    shared: Arc<Shared>,
    key: PartitionKey,
    generation: u64,
}

impl PartitionWorker {
    pub(crate) fn new(shared: Arc<Shared>, key: PartitionKey, generation: u64) -> Self {
        Self {
            shared,
            key,
            generation,
        }
    }

    /// Ok while the partition is still this worker's.
    fn still_owned(&self) -> Result<(), Revoked> {
        if self
            .shared
            .assignment
            .is_current(&self.key, self.generation)
        {
            Ok(())
        } else {
            Err(Revoked)
        }
    }

    fn is_retry_partition(&self) -> bool {
        self.key.0 == self.shared.forwarder.topics.retry
    }

    fn count(&self, f: impl FnOnce(&mut ConsumeSummary)) {
        f(&mut self.shared.summary.lock().expect("summary lock"));
    }

    fn ordered(&self) -> bool {
        self.shared.options.keeps_key_order()
    }

    fn at<'a>(&'a self, what: &'a str) -> At<'a> {
        At {
            what,
            partition: &self.key,
            offset: None,
        }
    }

    /// Processes records until the channel closes or the partition is revoked.
    pub async fn run(self, mut rx: mpsc::Receiver<OwnedMessage>) {
        if let Err(Revoked) = self.serve(&mut rx).await {
            // Whatever is queued belongs to the partition's next owner.
            rx.close();
            while rx.recv().await.is_some() {
                self.shared.in_flight_change(&self.key, -1);
            }
        }
    }

    /// Loads the parked keys, then processes batch after batch.
    async fn serve(&self, rx: &mut mpsc::Receiver<OwnedMessage>) -> Result<(), Revoked> {
        if self.ordered() && !self.is_retry_partition() {
            self.load_parked_keys().await?;
        }
        while let Some(first) = rx.recv().await {
            let mut batch = vec![first];
            if !self.shared.batch_linger.is_zero() {
                tokio::time::sleep(self.shared.batch_linger).await;
            }
            while batch.len() < self.shared.batch_size {
                match rx.try_recv() {
                    Ok(m) => batch.push(m),
                    Err(_) => break,
                }
            }
            let n = batch.len();
            let processed = if self.is_retry_partition() {
                self.process_when_due(batch).await
            } else {
                self.process(batch).await
            };
            self.shared.in_flight_change(&self.key, -(n as isize));
            processed?;
        }
        Ok(())
    }

    /// Runs a database step until it succeeds, waiting with backoff and
    /// reporting the database down meanwhile (its next owner re-reads the
    /// records and redoes the step if the partition is revoked first).
    async fn until_db_ok<T, F: Future<Output = Result<T, crate::db::DbError>>>(
        &self,
        what: &str,
        step: impl FnMut() -> F,
    ) -> Result<T, Revoked> {
        let health = &self.shared.health;
        let report = |e: crate::db::DbError| async move {
            health.db_down(&e.to_string()).await;
            Ok(e)
        };
        until_available(self.at(what), step, report, || self.still_owned()).await
    }

    /// Retry-topic records: each waits for its due time; records already
    /// due are processed together as one batch (a replay is all due at once).
    async fn process_when_due(&self, batch: Vec<OwnedMessage>) -> Result<(), Revoked> {
        let mut due = Vec::with_capacity(batch.len());
        for message in batch {
            if due_ms(&message) > now_ms() {
                if !due.is_empty() {
                    self.process(std::mem::take(&mut due)).await?;
                }
                self.wait_until_due(&message).await?;
            }
            due.push(message);
        }
        if due.is_empty() {
            Ok(())
        } else {
            self.process(due).await
        }
    }

    /// Sleeps until the record's due time with the partition paused, so the
    /// consumer fetches nothing for it meanwhile. The pause is one reason
    /// among others (the dispatcher pauses a partition whose queue is full):
    /// the partition is resumed only once no reason is left.
    async fn wait_until_due(&self, message: &OwnedMessage) -> Result<(), Revoked> {
        let wait = due_ms(message) - now_ms();
        if wait <= 0 {
            return Ok(());
        }
        let reason = PauseReason::DueWait;
        self.shared
            .pause_partition(&self.key, self.generation, reason);
        let deadline = tokio::time::Instant::now() + Duration::from_millis(wait as u64);
        let mut owned = self.still_owned();
        while owned.is_ok() && tokio::time::Instant::now() < deadline {
            let step = deadline
                .saturating_duration_since(tokio::time::Instant::now())
                .min(Duration::from_secs(1));
            tokio::time::sleep(step).await;
            owned = self.still_owned();
        }
        self.shared
            .resume_partition(&self.key, self.generation, reason);
        owned
    }

    /// Decodes and applies a batch.
    ///
    /// Poison splits the batch: the records before it are applied first, so
    /// that it parks its key only after them.
    async fn process(&self, batch: Vec<OwnedMessage>) -> Result<(), Revoked> {
        let mut items = Vec::with_capacity(batch.len());
        let mut poison = Vec::with_capacity(batch.len());
        for message in batch {
            let mut item = Item {
                message,
                envelope: None,
                held_id: None,
            };
            match self.decode(&item.message).await? {
                Decoded::Envelope(envelope) => {
                    item.envelope = Some(envelope);
                    poison.push(None);
                }
                Decoded::Poison(failure) => poison.push(Some(failure)),
            }
            items.push(item);
        }
        let mut start = 0;
        while start < items.len() {
            let end = poison[start..]
                .iter()
                .position(Option::is_some)
                .map_or(items.len(), |p| start + p);
            if end > start {
                self.apply_in_order(&items[start..end]).await?;
            }
            if let Some(failure) = poison.get_mut(end).and_then(Option::take) {
                let held = self.held_poison(&items[end]).await?;
                if !held && self.shared.options.error_tier {
                    self.forward_and_park(&[(&items[end], failure)]).await?;
                }
                self.store_offset(items[end].message.offset());
            }
            start = end + 1;
        }
        Ok(())
    }

    /// Applies decoded records in one transaction; then the records it
    /// left out, in order: each failed one through the error tier, then
    /// those behind them (again as one batch). The offset moves past the
    /// records before the first one left out at once, and past the batch
    /// once all of them are settled.
    async fn apply_in_order(&self, items: &[Item]) -> Result<(), Revoked> {
        self.still_owned()?;
        let Committed {
            heads, deferred, ..
        } = self.apply_until_available(items).await?;
        self.shared.health.db_up().await;
        let last = items.last().expect("non-empty").message.offset();
        match deferred.first().map(|d| d.index) {
            None => {
                self.store_offset(last);
                return self.release(heads).await;
            }
            Some(first) if first > 0 => self.store_offset(items[first - 1].message.offset()),
            Some(_) => {}
        }
        self.release(heads).await?;
        let (mut failed, mut behind) = (Vec::new(), Vec::new());
        for apply::Deferred { index, error } in deferred {
            let item = &items[index];
            match error {
                Some(error) => {
                    self.failed(item, &error);
                    failed.push((item, error));
                }
                None => behind.push(item.clone()),
            }
        }
        let committed = self.settle_all(failed).await?;
        self.release(committed.heads).await?;
        if !behind.is_empty() {
            Box::pin(self.apply_in_order(&behind)).await?;
        }
        self.store_offset(last);
        Ok(())
    }

    /// Applies `items` in one transaction, retrying in place with backoff
    /// while the database is unavailable (counted, and reported to health).
    async fn apply_until_available(&self, items: &[Item]) -> Result<Committed, Revoked> {
        let failed = |error: BatchError| async move {
            match error {
                BatchError::Revoked(revoked) => Err(revoked),
                error => {
                    let reason = error.to_string();
                    self.count(|s| s.apply_failures += 1);
                    self.shared.health.db_down(&reason).await;
                    Ok(error)
                }
            }
        };
        until_available(
            self.at("batch not applied"),
            || self.apply(items),
            failed,
            || self.still_owned(),
        )
        .await
    }

    /// Applies one record alone: its handler failure, if any, is the error.
    async fn apply_one(&self, item: &Item) -> Result<Committed, BatchError> {
        let mut committed = self.apply(std::slice::from_ref(item)).await?;
        match committed.deferred.pop() {
            Some(apply::Deferred {
                error: Some(error), ..
            }) => Err(BatchError::Record(error)),
            _ => Ok(committed),
        }
    }

    /// Logs and counts a record's handler failure.
    fn failed(&self, item: &Item, error: &HandlerError) {
        self.count(|s| s.apply_failures += 1);
        let _in_record = self.span(&item.message, item.envelope.as_ref()).entered();
        ProcessingFailed {
            group: &self.shared.options.group,
            event_name: item
                .envelope
                .as_ref()
                .map_or("unknown", |e| e.event_name.as_str()),
            class: error.class(),
            error: &error.to_string(),
        }
        .emit();
    }

    /// Local retries for a retryable failure, then forward to the retry
    /// topic or the DLQ. What a local retry committed (heads to release).
    async fn settle(&self, item: &Item, error: HandlerError) -> Result<Committed, Revoked> {
        self.settle_all(vec![(item, error)]).await
    }

    /// Settles failed records (of distinct keys), in order: each gets its
    /// local retries; those still failing are forwarded together (sent at
    /// once, the broker's acknowledgements awaited together) and their keys
    /// parked in one transaction. What local retries committed.
    async fn settle_all(&self, failed: Vec<(&Item, HandlerError)>) -> Result<Committed, Revoked> {
        let mut committed = Committed::default();
        let mut forwards = Vec::with_capacity(failed.len());
        for (item, error) in failed {
            let span = self.span(&item.message, item.envelope.as_ref());
            match self.retry_locally(item, error).instrument(span).await? {
                Ok(applied) => committed.heads.extend(applied.heads),
                Err(failure) => forwards.push((item, failure)),
            }
        }
        self.forward_and_park(&forwards).await?;
        Ok(committed)
    }

    /// The error tier's local retries of one failed record: what a retry
    /// committed, or the failure to forward it with.
    ///
    /// This is the error tier's policy, not a wait for availability: local
    /// retries run at once and use up attempts, the database being down is
    /// waited out in place and does not, and without the error tier
    /// (`consumer.error_tier = false`) every failure is retried in place.
    async fn retry_locally(
        &self,
        item: &Item,
        mut error: HandlerError,
    ) -> Result<Result<Committed, Failure>, Revoked> {
        let mut executions = 1;
        let mut backoff = Backoff::new();
        let local_retries = self.shared.forwarder.policy().local_retries;
        let tier = self.shared.options.error_tier;
        loop {
            match error {
                _ if !tier => backoff.wait().await,
                // Infrastructure: wait in place; it does not use up attempts.
                HandlerError::Unavailable(_) => backoff.wait().await,
                HandlerError::Retryable(_) if executions <= local_retries => executions += 1,
                // An immediate retry would ignore the downstream's hint: the
                // retry topic waits for it instead.
                HandlerError::Retryable(_)
                | HandlerError::RetryAfter { .. }
                | HandlerError::Fatal(_)
                | HandlerError::Rejected(_) => {
                    break;
                }
            }
            match self.apply_one(item).await {
                Ok(committed) => {
                    self.count(|s| s.recovered_locally += 1);
                    return Ok(Ok(committed));
                }
                Err(BatchError::Revoked(revoked)) => return Err(revoked),
                Err(BatchError::Unavailable(reason)) => error = HandlerError::Unavailable(reason),
                Err(BatchError::Record(failed)) => error = failed,
            }
        }
        Ok(Err(Failure {
            class: error.class().to_string(),
            message: error.to_string(),
            retryable: matches!(
                error,
                HandlerError::Retryable(_) | HandlerError::RetryAfter { .. }
            ),
            executions,
            retry_after: match error {
                HandlerError::RetryAfter { after, .. } => Some(after),
                _ => None,
            },
        }))
    }

    /// Forwards failed records, all sent at once, and waits for the
    /// broker's acknowledgement of every one (each retried with backoff
    /// while Kafka refuses). Then, with per-key ordering, parks their keys
    /// with them as the heads.
    async fn forward_and_park(&self, failed: &[(&Item, Failure)]) -> Result<(), Revoked> {
        if failed.is_empty() {
            return Ok(());
        }
        self.still_owned()?;
        let forwards = failed.iter().map(|(item, failure)| {
            let message = &item.message;
            let forward = move || {
                self.shared
                    .forwarder
                    .forward(message, failure)
                    .instrument(self.span(message, None))
            };
            until_available(
                self.at("forwarding a failed record failed"),
                forward,
                retry,
                || self.still_owned(),
            )
        });
        let mut routed = std::pin::pin!(futures::future::try_join_all(forwards));
        if self.shared.options.crash_before_forward_ack {
            // Test hook (tests/it/crash.rs): one poll hands every forward to
            // the producer; die before any acknowledgement.
            let _ = futures::FutureExt::now_or_never(routed.as_mut());
            std::process::abort();
        }
        let routed = routed.await?;
        let group = self.shared.options.group.as_str();
        let mut parks = Vec::with_capacity(failed.len());
        for ((item, failure), routed) in failed.iter().zip(routed) {
            let message = &item.message;
            let _in_record = self.span(message, None).entered();
            let event_name =
                header_text(message, header::EVENT_NAME).unwrap_or_else(|| "unknown".into());
            let state = match routed {
                Routed::Retry { attempt, delay } => {
                    self.count(|s| s.sent_to_retry += 1);
                    SentToRetry {
                        group,
                        attempt,
                        delay,
                        class: &failure.class,
                        error: &failure.message,
                    }
                    .emit();
                    ParkState::Retrying
                }
                Routed::DeadLetter => {
                    self.count(|s| s.dead_lettered += 1);
                    DeadLettered {
                        group,
                        event_name: &event_name,
                        class: &failure.class,
                        error: &failure.message,
                    }
                    .emit();
                    ParkState::Dead
                }
            };
            parks.push((*item, state));
        }
        self.park(&parks).await
    }

    /// Decodes and checks one record, waiting in place while the registry
    /// is unavailable.
    async fn decode(&self, message: &OwnedMessage) -> Result<Decoded, Revoked> {
        let payload = message.payload();
        let checked = if payload.is_some_and(|p| p.len() > MAX_VALUE_BYTES) {
            Err((
                "oversized",
                format!(
                    "value of {} bytes exceeds the {MAX_VALUE_BYTES}-byte limit for an order event",
                    payload.map_or(0, <[u8]>::len)
                ),
            ))
        } else {
            let decode = || async {
                match self.shared.codec.decode(payload).await {
                    Ok(envelope) => Ok(check_key(message, envelope).and_then(|envelope| {
                        version::check(&envelope, &self.shared.options.handlers)
                            .map(|()| envelope)
                            .map_err(|why| (UNSUPPORTED_VERSION, why))
                    })),
                    Err(e) if e.is_retryable() => Err(e),
                    Err(e) => Ok(Err((e.class(), e.to_string()))),
                }
            };
            let what = At {
                offset: Some(message.offset()),
                ..self.at("registry unavailable")
            };
            until_available(what, decode, retry, || self.still_owned()).await?
        };
        Ok(match checked {
            Ok(envelope) => Decoded::Envelope(envelope),
            Err((class, reason)) => Decoded::Poison(self.poison(message, class, reason)),
        })
    }

    /// Logs and counts a poison record; the failure to dead-letter it with.
    fn poison(&self, message: &OwnedMessage, class: &'static str, reason: String) -> Failure {
        let _in_record = self.span(message, None).entered();
        self.count(|s| {
            s.decode_failures += 1;
            s.unsupported_versions += u64::from(class == UNSUPPORTED_VERSION);
        });
        ProcessingFailed {
            group: &self.shared.options.group,
            event_name: "unknown",
            class,
            error: &reason,
        }
        .emit();
        tracing::error!(topic = %self.key.0, partition = self.key.1, offset = message.offset(), class, error = %reason,
            "poison record: sending to the dead-letter topic");
        Failure {
            class: class.to_string(),
            message: reason,
            retryable: false,
            executions: 0,
            retry_after: None,
        }
    }

    /// The span of one record: trace id (from the envelope, else the
    /// `trace_id` header), event id and where the record sits. Exported over
    /// OTLP as a child of the record's `traceparent`.
    fn span(&self, message: &OwnedMessage, envelope: Option<&Envelope>) -> tracing::Span {
        let trace_id = envelope
            .map(|e| e.trace_id.clone())
            .or_else(|| header_text(message, header::TRACE_ID))
            .unwrap_or_default();
        let event_id = envelope
            .map(|e| e.event_id.to_string())
            .or_else(|| header_text(message, header::EVENT_ID))
            .unwrap_or_default();
        let span = tracing::info_span!(
            "record",
            trace_id = %trace_id,
            event_id = %event_id,
            group = %self.shared.options.group,
            topic = %self.key.0,
            partition = self.key.1,
            offset = message.offset()
        );
        crate::telemetry::continue_trace(&span, || header_text(message, header::TRACEPARENT));
        span
    }

    /// Stores `offset + 1` as the next offset to commit for this partition.
    fn store_offset(&self, offset: i64) {
        let mut list = TopicPartitionList::new();
        if list
            .add_partition_offset(&self.key.0, self.key.1, Offset::Offset(offset + 1))
            .is_ok()
            && let Err(e) = self.shared.consumer.store_offsets(&list)
        {
            // The partition was revoked after the commit: the next owner
            // re-reads these records and skips them as duplicates.
            tracing::debug!(partition = self.key.1, error = %e, "offset not stored");
        }
    }
}

/// When a retry-topic record is due (ms since the epoch; 0 = now).
fn due_ms(message: &OwnedMessage) -> i64 {
    header_text(message, header::DUE)
        .and_then(|d| d.parse().ok())
        .unwrap_or(0)
}

/// Order events are keyed by order id: a record without that key would
/// break per-order ordering, so it is refused.
fn check_key(
    message: &OwnedMessage,
    envelope: Envelope,
) -> Result<Envelope, (&'static str, String)> {
    let want = envelope.key();
    match message.key() {
        None => Err((
            "invalid_key",
            format!("record has no key; order events are keyed by order_id ({want})"),
        )),
        Some(k) if k != want.as_bytes() => Err((
            "invalid_key",
            format!(
                "record key `{}` is not the order_id {want}",
                String::from_utf8_lossy(k)
            ),
        )),
        Some(_) => Ok(envelope),
    }
}
