//! One partition's worker: applies its records in offset order, in batches,
//! and sends failures through the error tier.
//!
//! A batch is every record already waiting (up to `consumer.batch_size`),
//! applied in one DB transaction: one commit instead of one per record.
//! Failures:
//!
//! * a record that cannot be decoded or validated is poison: straight to
//!   the dead-letter topic with its reason (no retries can fix it); so is
//!   a record of an `event_version` major the handlers do not declare
//!   (`unsupported_version`, see [`super::version`]);
//! * the infrastructure being down (database unavailable, lock timeout,
//!   registry unreachable) rolls back and retries the same batch in place
//!   with exponential backoff; the offset does not move, health reports it,
//!   and the records keep their retry budget;
//! * a handler failure rolls back; the records before the failing one are
//!   applied on their own; the failing one gets `retry.local_retries`
//!   immediate retries (if retryable), then goes to the group's retry topic
//!   or, when fatal or out of attempts, to the dead-letter topic. Its offset
//!   is stored only once the broker acknowledged the forward.
//!
//! A worker of the group's retry topic waits for each record's due time
//! with its partition paused (no busy polling), then processes it the same way.
//!
//! With `consumer.ordering = key` (see [`crate::ordering`]) a forwarded
//! record parks its key; later records of a parked key are held in the
//! batch's transaction instead of applied, and released in order, by
//! `PartitionWorker::release`, once the head is applied (`worker/parking.rs`).

mod parking;

use std::sync::Arc;
use std::time::Duration;

use rdkafka::consumer::Consumer;
use rdkafka::message::OwnedMessage;
use rdkafka::{Message, Offset, TopicPartitionList};
use tokio::sync::mpsc;
use tracing::Instrument;

use super::assignment::PartitionKey;
use super::handler::{Effect, HandlerError};
use super::version::{self, UNSUPPORTED_VERSION};
use super::{ConsumeSummary, Shared};
use crate::dedup::{self, RecordOrigin};
use crate::envelope::Envelope;
use crate::metrics::{Applied, ConflictingDuplicate, DeadLettered, DuplicateSkipped, Held, InternalEvent, ProcessingFailed, SentToRetry};
use crate::ordering::{self, Gate, ParkState};
use crate::clock::now_ms;
use crate::kafka::record::{Failure, header, header_text};
use crate::retry::Routed;

/// Largest record value accepted (order events are small by rule).
pub const MAX_VALUE_BYTES: usize = 64 * 1024;

/// A record and its decoded envelope (None = poison, already dead-lettered).
struct Item {
    message: OwnedMessage,
    envelope: Option<Envelope>,
    /// Set when the record is being released from `held_records`: it skips
    /// the parked-key gate and its held row is deleted as it is applied.
    held_id: Option<i64>,
}

/// What a committed batch leaves to do.
#[derive(Default)]
struct Committed {
    /// Keys whose head was applied in the batch: release their followers.
    heads: Vec<String>,
}

/// Why a batch was not committed.
enum BatchError {
    /// Infrastructure down: retry the whole batch later, in place.
    Unavailable(String),
    /// The record at this index failed in a handler.
    Record { index: usize, error: HandlerError },
    /// The partition is no longer ours.
    Revoked,
}

/// Exponential backoff: 100 ms doubling to 30 s.
struct Backoff(Duration);

impl Backoff {
    fn new() -> Self {
        Self(Duration::from_millis(100))
    }
    async fn wait(&mut self) {
        tokio::time::sleep(self.0).await;
        self.0 = (self.0 * 2).min(Duration::from_secs(30));
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
        Self { shared, key, generation }
    }

    fn owned(&self) -> bool {
        self.shared.assignment.is_current(&self.key, self.generation)
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

    /// Processes records until the channel closes or the partition is revoked.
    pub async fn run(self, mut rx: mpsc::Receiver<OwnedMessage>) {
        if self.ordered() && !self.is_retry_partition() && !self.load_parked_keys().await {
            return;
        }
        while let Some(first) = rx.recv().await {
            let mut batch = vec![first];
            while batch.len() < self.shared.batch_size {
                match rx.try_recv() {
                    Ok(m) => batch.push(m),
                    Err(_) => break,
                }
            }
            let n = batch.len();
            let still_owned = if self.is_retry_partition() {
                self.process_when_due(batch).await
            } else {
                self.process(batch).await
            };
            self.shared.in_flight_change(&self.key, -(n as isize));
            if !still_owned {
                // Whatever is queued belongs to the partition's next owner.
                rx.close();
                while rx.recv().await.is_some() {
                    self.shared.in_flight_change(&self.key, -1);
                }
                return;
            }
        }
    }

    /// Runs a database step until it succeeds, waiting with backoff and
    /// reporting the database down meanwhile; None if the partition was
    /// revoked first (its next owner re-reads the records and redoes it).
    async fn until_db_ok<T, F: Future<Output = Result<T, crate::db::DbError>>>(&self, what: &str, mut step: impl FnMut() -> F) -> Option<T> {
        let mut backoff = Backoff::new();
        loop {
            match step().await {
                Ok(value) => return Some(value),
                Err(e) => {
                    tracing::warn!(partition = self.key.1, error = %e, "{what}; retrying");
                    self.shared.health.db_down(&e.to_string()).await;
                    backoff.wait().await;
                    if !self.owned() {
                        return None;
                    }
                }
            }
        }
    }

    /// Retry-topic records: each waits for its due time; records already
    /// due are processed together as one batch (a replay is all due at once).
    async fn process_when_due(&self, batch: Vec<OwnedMessage>) -> bool {
        let mut due = Vec::with_capacity(batch.len());
        for message in batch {
            if due_ms(&message) > now_ms() {
                if !due.is_empty() && !self.process(std::mem::take(&mut due)).await {
                    return false;
                }
                if !self.wait_until_due(&message).await {
                    return false;
                }
            }
            due.push(message);
        }
        due.is_empty() || self.process(due).await
    }

    /// Sleeps until the record's due time with the partition paused, so the
    /// consumer fetches nothing for it meanwhile; false if revoked.
    async fn wait_until_due(&self, message: &OwnedMessage) -> bool {
        let wait = due_ms(message) - now_ms();
        if wait <= 0 {
            return true;
        }
        let mut list = TopicPartitionList::new();
        list.add_partition(&self.key.0, self.key.1);
        let _ = self.shared.consumer.pause(&list);
        let deadline = tokio::time::Instant::now() + Duration::from_millis(wait as u64);
        while tokio::time::Instant::now() < deadline {
            if !self.owned() {
                return false;
            }
            let step = deadline.saturating_duration_since(tokio::time::Instant::now()).min(Duration::from_secs(1));
            tokio::time::sleep(step).await;
        }
        let _ = self.shared.consumer.resume(&list);
        self.owned()
    }

    /// Decodes and applies a batch; false if the partition was revoked meanwhile.
    ///
    /// Poison splits the batch: the records before it are applied first, so
    /// that it parks its key only after them.
    async fn process(&self, batch: Vec<OwnedMessage>) -> bool {
        let mut items = Vec::with_capacity(batch.len());
        let mut poison = Vec::with_capacity(batch.len());
        for message in batch {
            let mut item = Item { message, envelope: None, held_id: None };
            match self.decode(&item.message).await {
                None => return false,
                Some(Ok(envelope)) => {
                    item.envelope = Some(envelope);
                    poison.push(None);
                }
                Some(Err(failure)) => poison.push(Some(failure)),
            }
            items.push(item);
        }
        let mut start = 0;
        while start < items.len() {
            let end = poison[start..].iter().position(Option::is_some).map_or(items.len(), |p| start + p);
            if end > start && !self.apply_in_order(&items[start..end]).await {
                return false;
            }
            if let Some(failure) = poison.get_mut(end).and_then(Option::take) {
                let settled = match self.held_poison(&items[end]).await {
                    None => return false,
                    Some(true) => true,
                    Some(false) => !self.shared.options.error_tier || self.is_owned_after_forward(&items[end], failure).await,
                };
                if !settled {
                    return false;
                }
                self.store_offset(items[end].message.offset());
            }
            start = end + 1;
        }
        true
    }

    /// Applies decoded records in order: as one batch, or, when one fails,
    /// the ones before it, then the failing one through the error tier, then
    /// the rest. False if the partition was revoked meanwhile.
    async fn apply_in_order(&self, items: &[Item]) -> bool {
        let mut start = 0;
        let mut backoff = Backoff::new();
        while start < items.len() {
            if !self.owned() {
                return false;
            }
            match self.apply(&items[start..]).await {
                Ok(committed) => {
                    self.shared.health.db_up().await;
                    self.store_offset(items.last().expect("non-empty").message.offset());
                    return self.release_all(committed).await;
                }
                Err(BatchError::Revoked) => return false,
                Err(BatchError::Unavailable(reason)) => {
                    self.count(|s| s.apply_failures += 1);
                    self.shared.health.db_down(&reason).await;
                    tracing::warn!(partition = self.key.1, %reason, "batch not applied; retrying in place with backoff");
                    backoff.wait().await;
                }
                Err(BatchError::Record { index, error }) => {
                    self.failed(&items[start + index], &error);
                    if index > 0 {
                        // Apply what precedes the failing record on its own first.
                        match self.apply(&items[start..start + index]).await {
                            Ok(committed) => {
                                self.store_offset(items[start + index - 1].message.offset());
                                if !self.release_all(committed).await {
                                    return false;
                                }
                            }
                            Err(BatchError::Revoked) => return false,
                            Err(_) => {
                                backoff.wait().await;
                                continue;
                            }
                        }
                    }
                    let failing = start + index;
                    let span = self.span(&items[failing].message, items[failing].envelope.as_ref());
                    let Some(committed) = self.settle(&items[failing], error).instrument(span).await else {
                        return false;
                    };
                    if !self.release_all(committed).await {
                        return false;
                    }
                    self.store_offset(items[failing].message.offset());
                    start = failing + 1;
                    backoff = Backoff::new();
                }
            }
        }
        true
    }

    /// Logs and counts a record's handler failure.
    fn failed(&self, item: &Item, error: &HandlerError) {
        self.count(|s| s.apply_failures += 1);
        let _in_record = self.span(&item.message, item.envelope.as_ref()).entered();
        ProcessingFailed {
            group: &self.shared.options.group,
            event_name: item.envelope.as_ref().map_or("unknown", |e| e.event_name.as_str()),
            class: error.class(),
            error: &error.to_string(),
        }
        .emit();
    }

    /// Local retries for a retryable failure, then forward to the retry
    /// topic or the DLQ. What a local retry committed (heads to release);
    /// None if the partition was revoked meanwhile.
    async fn settle(&self, item: &Item, mut error: HandlerError) -> Option<Committed> {
        let mut executions = 1;
        let mut backoff = Backoff::new();
        let local_retries = self.shared.forwarder.policy().local_retries;
        let tier = self.shared.options.error_tier;
        while !tier || matches!(error, HandlerError::Retryable(_) | HandlerError::Unavailable(_)) {
            if !tier || matches!(error, HandlerError::Unavailable(_)) {
                // Infrastructure: wait in place; it does not use up attempts.
                backoff.wait().await;
            } else if executions > local_retries {
                break;
            } else {
                executions += 1;
            }
            match self.apply(std::slice::from_ref(item)).await {
                Ok(committed) => {
                    self.count(|s| s.recovered_locally += 1);
                    return Some(committed);
                }
                Err(BatchError::Revoked) => return None,
                Err(BatchError::Unavailable(reason)) => error = HandlerError::Unavailable(reason),
                Err(BatchError::Record { error: e, .. }) => error = e,
            }
        }
        let failure = Failure {
            class: error.class().to_string(),
            message: error.to_string(),
            retryable: matches!(error, HandlerError::Retryable(_)),
            executions,
        };
        self.is_owned_after_forward(item, failure).await.then(Committed::default)
    }

    /// Forwards a failed record and waits for the broker; retries with
    /// backoff while Kafka refuses. Then, with per-key ordering, parks its
    /// key with it as the head. False if the partition was revoked meanwhile.
    async fn is_owned_after_forward(&self, item: &Item, failure: Failure) -> bool {
        let message = &item.message;
        let mut backoff = Backoff::new();
        let routed = loop {
            if !self.owned() {
                return false;
            }
            let forwarded = self.shared.forwarder.forward(message, &failure).instrument(self.span(message, None)).await;
            match forwarded {
                Ok(routed) => break routed,
                Err(e) => {
                    tracing::warn!(error = %e, "forwarding a failed record failed; retrying");
                    backoff.wait().await;
                }
            }
        };
        {
            let _in_record = self.span(message, None).entered();
            let group = self.shared.options.group.as_str();
            let event_name = header_text(message, header::EVENT_NAME).unwrap_or_else(|| "unknown".into());
            match routed {
                Routed::Retry { attempt, delay } => {
                    self.count(|s| s.sent_to_retry += 1);
                    SentToRetry { group, attempt, delay, class: &failure.class, error: &failure.message }.emit();
                }
                Routed::DeadLetter => {
                    self.count(|s| s.dead_lettered += 1);
                    DeadLettered { group, event_name: &event_name, class: &failure.class, error: &failure.message }.emit();
                }
            }
        }
        let state = match routed {
            Routed::Retry { .. } => ParkState::Retrying,
            Routed::DeadLetter => ParkState::Dead,
        };
        self.park(item, state).await
    }

    /// Decodes and checks one record: the envelope, or the poison failure to
    /// dead-letter; `None` if revoked while waiting for the registry.
    async fn decode(&self, message: &OwnedMessage) -> Option<Result<Envelope, Failure>> {
        let mut backoff = Backoff::new();
        let result = loop {
            let payload = message.payload();
            if payload.is_some_and(|p| p.len() > MAX_VALUE_BYTES) {
                break Err((
                    "oversized",
                    format!("value of {} bytes exceeds the {MAX_VALUE_BYTES}-byte limit for an order event", payload.map_or(0, <[u8]>::len)),
                ));
            }
            match self.shared.codec.decode(payload).await {
                Ok(envelope) => {
                    break check_key(message, envelope).and_then(|envelope| {
                        version::check(&envelope, &self.shared.options.handlers).map(|()| envelope).map_err(|why| (UNSUPPORTED_VERSION, why))
                    });
                }
                Err(e) if e.is_retryable() => {
                    tracing::warn!(partition = self.key.1, offset = message.offset(), error = %e, "registry unavailable; retrying");
                    backoff.wait().await;
                    if !self.owned() {
                        return None;
                    }
                }
                Err(e) => break Err((e.class(), e.to_string())),
            }
        };
        Some(result.map_err(|(class, reason)| {
            let _in_record = self.span(message, None).entered();
            self.count(|s| {
                s.decode_failures += 1;
                s.unsupported_versions += u64::from(class == UNSUPPORTED_VERSION);
            });
            ProcessingFailed { group: &self.shared.options.group, event_name: "unknown", class, error: &reason }.emit();
            tracing::error!(topic = %self.key.0, partition = self.key.1, offset = message.offset(), class, error = %reason,
                "poison record: sending to the dead-letter topic");
            Failure {
                class: class.to_string(),
                message: reason,
                retryable: false,
                executions: 0,
            }
        }))
    }

    /// One transaction for `items`: dedup rows and effects (or holds behind
    /// parked keys), committed together.
    async fn apply(&self, items: &[Item]) -> Result<Committed, BatchError> {
        let shared = &self.shared;
        let dialect = shared.db.dialect;
        let group = shared.options.group.as_str();
        let mut tx = shared.db.begin().await.map_err(|e| BatchError::Unavailable(e.to_string()))?;
        let mut delta = ConsumeSummary::default();
        let mut committed = Committed::default();
        let mut applied = Vec::new();
        let mut duplicates = Vec::new();
        let mut held = Vec::new();
        let mut open = Vec::new();
        let mut conflicts = Vec::new();
        for (index, item) in items.iter().enumerate() {
            let Some(envelope) = &item.envelope else { continue };
            let fail = |error: HandlerError| match error {
                HandlerError::Unavailable(r) => BatchError::Unavailable(r),
                error => BatchError::Record { index, error },
            };
            let origin = RecordOrigin {
                topic: item.message.topic().to_string(),
                partition: item.message.partition(),
                offset: item.message.offset(),
                key: envelope.key(),
            };
            // Every log line about this record carries its trace id.
            let span = self.span(&item.message, Some(envelope));
            let started = std::time::Instant::now();
            let outcome = async {
                if let Some(id) = item.held_id {
                    ordering::delete_held(&mut tx, id).await.map_err(|e| fail(e.into()))?;
                } else if self.ordered() && (self.is_retry_partition() || shared.is_parked(&origin.key)) {
                    match ordering::gate(&mut tx, dialect, group, &origin.key, &item.message, Some(envelope)).await.map_err(|e| fail(e.into()))? {
                        // Parked in this consumer's set but released elsewhere.
                        Gate::Open if !self.is_retry_partition() => open.push(origin.key.clone()),
                        Gate::Open => {}
                        Gate::Head => committed.heads.push(origin.key.clone()),
                        Gate::Duplicate => {
                            conflicts.extend(dedup::check_duplicate(&mut tx, dialect, group, envelope, &origin).await.map_err(|e| fail(e.into()))?);
                            return Ok(Gate::Duplicate);
                        }
                        Gate::Hold => {
                            ordering::hold(&mut tx, dialect, group, &origin.key, &item.message, Some(envelope)).await.map_err(|e| fail(e.into()))?;
                            return Ok(Gate::Hold);
                        }
                    }
                }
                let fresh = dedup::claim(&mut tx, dialect, group, envelope, &origin)
                    .await
                    .map_err(|e| fail(e.into()))?;
                if !fresh {
                    tracing::debug!("duplicate: already applied by this group");
                    conflicts.extend(dedup::check_duplicate(&mut tx, dialect, group, envelope, &origin).await.map_err(|e| fail(e.into()))?);
                    return Ok(Gate::Duplicate);
                }
                for handler in &shared.options.handlers {
                    let effect: Effect = handler.apply(&mut tx, dialect, envelope).await.map_err(fail)?;
                    delta.record_effect(handler.name(), effect);
                }
                tracing::debug!("effects written");
                Ok::<Gate, BatchError>(Gate::Open)
            }
            .instrument(span)
            .await?;
            match outcome {
                Gate::Duplicate => {
                    delta.duplicates += 1;
                    duplicates.push((item, envelope));
                }
                Gate::Hold => {
                    delta.held += 1;
                    held.push((item, envelope));
                }
                Gate::Open | Gate::Head => {
                    applied.push((item, envelope, started.elapsed()));
                    delta.applied += 1;
                }
            }
        }
        if !self.owned() {
            let _ = tx.rollback().await;
            return Err(BatchError::Revoked);
        }
        delta.conflicting_duplicates = conflicts.len() as u64;
        tx.commit().await.map_err(|e| BatchError::Unavailable(e.to_string()))?;
        if let Some((_, last)) = shared.active.lock().expect("active lock").as_mut() {
            *last = std::time::Instant::now();
        }
        shared.summary.lock().expect("summary lock").merge(delta);
        if !open.is_empty() {
            // Forget them. Only this main-partition worker parks its keys'
            // main-path failures, so none of them was parked again since.
            let mut parked = shared.parked.lock().expect("parked lock");
            for key in &open {
                parked.remove(key);
            }
        }
        let now = chrono::Utc::now();
        for (item, envelope, handler_time) in applied {
            let _in_record = self.span(&item.message, Some(envelope)).entered();
            Applied {
                group,
                event_name: envelope.event_name.as_str(),
                handler_time,
                end_to_end: (now - envelope.event_time).to_std().ok(),
            }
            .emit();
        }
        for (item, envelope) in duplicates {
            let _in_record = self.span(&item.message, Some(envelope)).entered();
            DuplicateSkipped { group, event_name: envelope.event_name.as_str() }.emit();
        }
        for conflict in &conflicts {
            ConflictingDuplicate { conflict }.emit();
        }
        for (item, envelope) in held {
            let _in_record = self.span(&item.message, Some(envelope)).entered();
            Held { group, event_name: envelope.event_name.as_str() }.emit();
        }
        Ok(committed)
    }

    /// The span of one record: trace id (from the envelope, else the
    /// `trace_id` header), event id and where the record sits. Exported over
    /// OTLP as a child of the record's `traceparent`.
    fn span(&self, message: &OwnedMessage, envelope: Option<&Envelope>) -> tracing::Span {
        let trace_id = envelope.map(|e| e.trace_id.clone()).or_else(|| header_text(message, header::TRACE_ID)).unwrap_or_default();
        let event_id = envelope.map(|e| e.event_id.to_string()).or_else(|| header_text(message, header::EVENT_ID)).unwrap_or_default();
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
        {
            if let Err(e) = self.shared.consumer.store_offsets(&list) {
                // The partition was revoked after the commit: the next owner
                // re-reads these records and skips them as duplicates.
                tracing::debug!(partition = self.key.1, error = %e, "offset not stored");
            }
        }
    }
}

/// When a retry-topic record is due (ms since the epoch; 0 = now).
fn due_ms(message: &OwnedMessage) -> i64 {
    header_text(message, header::DUE).and_then(|d| d.parse().ok()).unwrap_or(0)
}

/// Order events are keyed by order id: a record without that key would
/// break per-order ordering, so it is refused.
fn check_key(message: &OwnedMessage, envelope: Envelope) -> Result<Envelope, (&'static str, String)> {
    let want = envelope.key();
    match message.key() {
        None => Err(("invalid_key", format!("record has no key; order events are keyed by order_id ({want})"))),
        Some(k) if k != want.as_bytes() => Err((
            "invalid_key",
            format!("record key `{}` is not the order_id {want}", String::from_utf8_lossy(k)),
        )),
        Some(_) => Ok(envelope),
    }
}
