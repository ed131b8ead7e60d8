//! The driver of one partition's worker ([`PartitionWorker`]): serves the
//! partition's channel batch after batch, sends each batch through the
//! stages in order (decode, the batch's transaction, parking) and takes the
//! records a transaction left out through the error tier (local retries,
//! then the retry topic or the dead-letter topic). It is the one place that
//! calls more than one stage: the stages call none of each other.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use crate::kafka::consumed::ConsumedRecord;
use rdkafka::Message;
use tokio::sync::mpsc;
use tracing::Instrument;

use super::apply::{BatchApplier, BatchError, Committed, Deferred};
use super::decode::{Decoded, Decoder};
use super::parking::Parking;
use super::state::{Item, PartitionState, Revoked};
use crate::backoff::{Backoff, retry, until_available};
use crate::clock::now_ms;
use crate::consumer::Shared;
use crate::consumer::assignment::PartitionKey;
use crate::consumer::events::{DeadLettered, ProcessingFailed, SentToRetry};
use crate::consumer::handler::HandlerError;
use crate::consumer::pause::PauseReason;
use crate::kafka::record::{Failure, header, header_text};
use crate::metrics::InternalEvent;
use crate::ordering::{HeldRecord, OrderKey, ParkState};
use crate::retry::Routed;

/// The worker of one assigned partition: the partition's state and the
/// stages that work on it.
pub struct PartitionWorker {
    state: Arc<PartitionState>,
    decoder: Decoder,
    batches: BatchApplier,
    parking: Parking,
}

impl PartitionWorker {
    pub(crate) fn new(shared: Arc<Shared>, key: PartitionKey, generation: u64) -> Self {
        let state = Arc::new(PartitionState {
            shared,
            key,
            generation,
        });
        Self {
            decoder: Decoder::new(state.clone()),
            batches: BatchApplier::new(state.clone()),
            parking: Parking::new(state.clone()),
            state,
        }
    }

    /// Processes records until the channel closes or the partition is revoked.
    pub async fn run(self, mut rx: mpsc::Receiver<ConsumedRecord>) {
        if let Err(Revoked) = self.serve(&mut rx).await {
            // Whatever is queued belongs to the partition's next owner.
            rx.close();
            while rx.recv().await.is_some() {
                self.state.shared.in_flight_change(&self.state.key, -1);
            }
        }
    }

    /// Loads the parked keys, then processes batch after batch.
    async fn serve(&self, rx: &mut mpsc::Receiver<ConsumedRecord>) -> Result<(), Revoked> {
        if self.state.ordered() && !self.state.is_retry_partition() {
            self.parking.load_parked_keys().await?;
        }
        while let Some(first) = rx.recv().await {
            let mut batch = vec![first];
            if !self.state.shared.batch_linger.is_zero() {
                tokio::time::sleep(self.state.shared.batch_linger).await;
            }
            while batch.len() < self.state.shared.batch_size {
                match rx.try_recv() {
                    Ok(m) => batch.push(m),
                    Err(_) => break,
                }
            }
            let n = batch.len();
            let processed = if self.state.is_retry_partition() {
                self.process_when_due(batch).await
            } else {
                self.process(batch).await
            };
            self.state
                .shared
                .in_flight_change(&self.state.key, -(n as isize));
            processed?;
        }
        Ok(())
    }

    /// Retry-topic records: each waits for its due time; records already
    /// due are processed together as one batch (a replay is all due at once).
    async fn process_when_due(&self, batch: Vec<ConsumedRecord>) -> Result<(), Revoked> {
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
    async fn wait_until_due(&self, message: &ConsumedRecord) -> Result<(), Revoked> {
        let wait = due_ms(message) - now_ms();
        if wait <= 0 {
            return Ok(());
        }
        let reason = PauseReason::DueWait;
        self.state
            .shared
            .pause_partition(&self.state.key, self.state.generation, reason);
        let deadline = tokio::time::Instant::now() + Duration::from_millis(wait as u64);
        let mut owned = self.state.still_owned();
        while owned.is_ok() && tokio::time::Instant::now() < deadline {
            let step = deadline
                .saturating_duration_since(tokio::time::Instant::now())
                .min(Duration::from_secs(1));
            tokio::time::sleep(step).await;
            owned = self.state.still_owned();
        }
        self.state
            .shared
            .resume_partition(&self.state.key, self.state.generation, reason);
        owned
    }

    /// Decodes and applies a batch.
    ///
    /// Poison splits the batch: the records before it are applied first, so
    /// that it parks its key only after them.
    async fn process(&self, batch: Vec<ConsumedRecord>) -> Result<(), Revoked> {
        let mut items = Vec::with_capacity(batch.len());
        let mut poison = Vec::with_capacity(batch.len());
        for message in batch {
            let mut item = Item {
                message,
                envelope: None,
                held_id: None,
            };
            match self.decoder.decode(&item.message).await? {
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
                let held = self.parking.held_poison(&items[end]).await?;
                if !held && self.state.shared.options.error_tier {
                    self.forward_and_park(&[(&items[end], failure)]).await?;
                }
                self.state.store_offset(items[end].message.offset());
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
        self.state.still_owned()?;
        let Committed {
            heads, deferred, ..
        } = self.batches.apply_until_available(items).await?;
        self.state.shared.health.db_up().await;
        let last = items.last().expect("non-empty").message.offset();
        match deferred.first().map(|d| d.index) {
            None => {
                self.state.store_offset(last);
                return self.release(heads).await;
            }
            Some(first) if first > 0 => self.state.store_offset(items[first - 1].message.offset()),
            Some(_) => {}
        }
        self.release(heads).await?;
        let (mut failed, mut behind) = (Vec::new(), Vec::new());
        for Deferred { index, error } in deferred {
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
        self.state.store_offset(last);
        Ok(())
    }

    /// Logs and counts a record's handler failure.
    fn failed(&self, item: &Item, error: &HandlerError) {
        self.state.count(|s| s.apply_failures += 1);
        let _in_record = self
            .state
            .span(&item.message, item.envelope.as_ref())
            .entered();
        ProcessingFailed {
            group: &self.state.shared.options.group,
            event_name: item
                .envelope
                .as_ref()
                .map_or("unknown", |e| e.event_name.as_str()),
            class: error.class(),
            error: &error.to_string(),
        }
        .emit();
    }

    /// Settles failed records (of distinct keys), in order: each gets its
    /// local retries; those still failing are forwarded together (sent at
    /// once, the broker's acknowledgements awaited together) and their keys
    /// parked in one transaction. What local retries committed.
    async fn settle_all(&self, failed: Vec<(&Item, HandlerError)>) -> Result<Committed, Revoked> {
        let mut committed = Committed::default();
        let mut forwards = Vec::with_capacity(failed.len());
        for (item, error) in failed {
            let span = self.state.span(&item.message, item.envelope.as_ref());
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
        let local_retries = self.state.shared.forwarder.policy().local_retries;
        let tier = self.state.shared.options.error_tier;
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
            match self.batches.apply_one(item).await {
                Ok(committed) => {
                    self.state.count(|s| s.recovered_locally += 1);
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
        self.state.still_owned()?;
        let forwards = failed.iter().map(|(item, failure)| {
            let message = &item.message;
            let forward = move || {
                self.state
                    .shared
                    .forwarder
                    .forward(message, failure)
                    .instrument(self.state.span(message, None))
            };
            until_available(
                self.state.at("forwarding a failed record failed"),
                forward,
                retry,
                || self.state.still_owned(),
            )
        });
        let mut routed = std::pin::pin!(futures::future::try_join_all(forwards));
        if self.state.shared.options.crash_before_forward_ack {
            // Test hook (tests/it/crash.rs): one poll hands every forward to
            // the producer; die before any acknowledgement.
            let _ = futures::FutureExt::now_or_never(routed.as_mut());
            std::process::abort();
        }
        let routed = routed.await?;
        let group = self.state.shared.options.group.as_str();
        let mut parks = Vec::with_capacity(failed.len());
        for ((item, failure), routed) in failed.iter().zip(routed) {
            let message = &item.message;
            let _in_record = self.state.span(message, None).entered();
            let event_name =
                header_text(message, header::EVENT_NAME).unwrap_or_else(|| "unknown".into());
            let state = match routed {
                Routed::Retry { attempt, delay } => {
                    self.state.count(|s| s.sent_to_retry += 1);
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
                    self.state.count(|s| s.dead_lettered += 1);
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
        self.parking.park(&parks).await?;
        self.state.shared.settled();
        Ok(())
    }

    /// Release, the one entry point: for the keys whose head is done,
    /// applies the records held behind them together, in one batch
    /// transaction whose waves keep each key's order; each leaves
    /// `held_records` in the transaction that applies it. A held record
    /// that fails becomes its key's new head (through the error tier like
    /// any failure) and the records behind it stay held. Again until
    /// nothing is left to release; a key is unparked when none remain.
    pub(crate) async fn release(
        &self,
        heads: impl IntoIterator<Item = OrderKey>,
    ) -> Result<(), Revoked> {
        let mut keys: Vec<OrderKey> = heads.into_iter().collect();
        if keys.is_empty() {
            return Ok(());
        }
        keys.sort();
        keys.dedup();
        // The background release may be releasing some of these keys too.
        let _one_release_at_a_time = self.state.shared.release_locks(&keys).await;
        loop {
            self.state.still_owned()?;
            let read = until_available(
                self.state
                    .at("cannot read the records held behind the released keys"),
                || self.parking.held_behind_done_heads(&keys),
                retry,
                || self.state.still_owned(),
            );
            let held = read.await?;
            if held.is_empty() {
                return Ok(());
            }
            let items = self.decode_held(held).await?;
            if items.is_empty() {
                // Only undecodable records, now heads: read again.
                continue;
            }
            let Committed { deferred, .. } = self.batches.apply_until_available(&items).await?;
            // A record behind a failed one (no error) stays held.
            let failed: Vec<(&Item, HandlerError)> = deferred
                .into_iter()
                .filter_map(|Deferred { index, error }| {
                    let (item, error) = (&items[index], error?);
                    self.failed(item, &error);
                    Some((item, error))
                })
                .collect();
            // A held record is never a head, so a local retry has nothing to release.
            self.settle_all(failed).await?;
        }
    }

    /// Held records (oldest first) as items to apply. An undecodable one
    /// that is the first of its key becomes the key's head, dead-lettered;
    /// the records of its key from it on stay held, read again next time.
    async fn decode_held(&self, held: Vec<HeldRecord>) -> Result<Vec<Item>, Revoked> {
        let (mut started, mut stopped) = (HashSet::new(), HashSet::new());
        let mut items: Vec<Item> = Vec::with_capacity(held.len());
        for record in held {
            let key = record.order_key();
            if stopped.contains(&key) {
                continue;
            }
            let mut item = Item {
                message: record.to_message(),
                envelope: None,
                held_id: Some(record.id),
            };
            match self.decoder.decode(&item.message).await? {
                Decoded::Envelope(envelope) => {
                    item.envelope = Some(envelope);
                    items.push(item);
                    started.insert(key);
                }
                Decoded::Poison(failure) => {
                    if !started.contains(&key) {
                        self.forward_and_park(&[(&item, failure)]).await?;
                    }
                    stopped.insert(key);
                }
            }
        }
        Ok(items)
    }
}

/// When a retry-topic record is due (ms since the epoch; 0 = now).
fn due_ms(message: &ConsumedRecord) -> i64 {
    header_text(message, header::DUE)
        .and_then(|d| d.parse().ok())
        .unwrap_or(0)
}
