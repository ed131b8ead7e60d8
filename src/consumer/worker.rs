//! One partition's worker: applies its records in offset order, in batches.
//!
//! A batch is every record already waiting (up to `consumer.batch_size`),
//! applied in one DB transaction: one commit instead of one per record.
//! Failures:
//!
//! * a record that does not decode is poison: counted, logged, skipped
//!   (the dead-letter topic takes them once it exists);
//! * a retryable failure (database down, lock timeout, registry down)
//!   rolls back and retries the same batch with exponential backoff; the
//!   offset does not move and health reports the database down;
//! * a fatal handler failure rolls back; the records before it are applied
//!   on their own, and the failing record is retried with backoff, never
//!   committed past.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use rdkafka::consumer::Consumer;
use rdkafka::message::OwnedMessage;
use rdkafka::{Message, Offset, TopicPartitionList};
use tokio::sync::mpsc;

use super::assignment::PartitionKey;
use super::handler::{Effect, HandlerError};
use super::{ConsumeSummary, Shared};
use crate::db::DbError;
use crate::dedup::{self, RecordOrigin};
use crate::envelope::Envelope;

/// A record and its decoded envelope (None = poison).
struct Item {
    message: OwnedMessage,
    envelope: Option<Envelope>,
}

/// Why a batch was not committed.
enum BatchError {
    /// Retry the whole batch later.
    Retryable(String),
    /// The record at this index cannot be applied.
    Fatal { index: usize, reason: String },
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

    /// Processes records until the channel closes or the partition is revoked.
    pub async fn run(self, mut rx: mpsc::Receiver<OwnedMessage>) {
        while let Some(first) = rx.recv().await {
            let mut batch = vec![first];
            while batch.len() < self.shared.batch_size {
                match rx.try_recv() {
                    Ok(m) => batch.push(m),
                    Err(_) => break,
                }
            }
            let n = batch.len();
            let revoked = !self.process(batch).await;
            self.shared.pending.fetch_sub(n, Ordering::SeqCst);
            if revoked {
                // Whatever is queued belongs to the partition's next owner.
                rx.close();
                while rx.recv().await.is_some() {
                    self.shared.pending.fetch_sub(1, Ordering::SeqCst);
                }
                return;
            }
        }
    }

    /// Decodes and applies a batch; false if the partition was revoked meanwhile.
    async fn process(&self, batch: Vec<OwnedMessage>) -> bool {
        let mut items = Vec::with_capacity(batch.len());
        for message in batch {
            match self.decode(&message).await {
                Some(envelope) => items.push(Item { message, envelope }),
                None => return false,
            }
        }
        let mut start = 0;
        let mut backoff = Backoff::new();
        while start < items.len() {
            if !self.owned() {
                return false;
            }
            match self.apply(&items[start..]).await {
                Ok(()) => {
                    self.shared.health.db_up().await;
                    self.store_offset(items.last().expect("non-empty").message.offset());
                    return true;
                }
                Err(BatchError::Revoked) => return false,
                Err(BatchError::Retryable(reason)) => {
                    self.shared.summary.lock().expect("summary lock").apply_failures += 1;
                    self.shared.health.db_down(&reason).await;
                    tracing::warn!(partition = self.key.1, %reason, "batch not applied; retrying with backoff");
                    backoff.wait().await;
                }
                Err(BatchError::Fatal { index: 0, reason }) => {
                    let item = &items[start];
                    self.shared.summary.lock().expect("summary lock").apply_failures += 1;
                    tracing::error!(
                        partition = self.key.1,
                        offset = item.message.offset(),
                        event_id = ?item.envelope.as_ref().map(|e| e.event_id),
                        %reason,
                        "record cannot be applied; holding the partition and retrying with backoff"
                    );
                    backoff.wait().await;
                }
                Err(BatchError::Fatal { index, .. }) => {
                    // Apply what precedes the failing record on its own.
                    match self.apply(&items[start..start + index]).await {
                        Ok(()) => {
                            let last = items[start + index - 1].message.offset();
                            self.store_offset(last);
                            start += index;
                            backoff = Backoff::new();
                        }
                        Err(BatchError::Revoked) => return false,
                        Err(_) => backoff.wait().await,
                    }
                }
            }
        }
        true
    }

    /// Decodes one record; `Some(None)` for poison, `None` if revoked while
    /// waiting for the registry.
    async fn decode(&self, message: &OwnedMessage) -> Option<Option<Envelope>> {
        let mut backoff = Backoff::new();
        loop {
            match self.shared.codec.decode(message.payload()).await {
                Ok(envelope) => return Some(Some(envelope)),
                Err(e) if e.is_retryable() => {
                    tracing::warn!(partition = self.key.1, offset = message.offset(), error = %e, "registry unavailable; retrying");
                    backoff.wait().await;
                    if !self.owned() {
                        return None;
                    }
                }
                Err(e) => {
                    self.shared.summary.lock().expect("summary lock").decode_failures += 1;
                    tracing::error!(
                        topic = %self.key.0,
                        partition = self.key.1,
                        offset = message.offset(),
                        class = e.class(),
                        error = %e,
                        "poison record skipped"
                    );
                    return Some(None);
                }
            }
        }
    }

    /// One transaction for `items`: dedup rows and effects, committed together.
    async fn apply(&self, items: &[Item]) -> Result<(), BatchError> {
        let shared = &self.shared;
        let dialect = shared.db.dialect;
        let retryable = |e: DbError| BatchError::Retryable(e.to_string());
        let mut tx = shared.db.begin().await.map_err(retryable)?;
        let mut delta = ConsumeSummary::default();
        for (index, item) in items.iter().enumerate() {
            let Some(envelope) = &item.envelope else { continue };
            let origin = RecordOrigin {
                topic: self.key.0.clone(),
                partition: self.key.1,
                offset: item.message.offset(),
                key: item
                    .message
                    .key()
                    .map(|k| String::from_utf8_lossy(k).to_string())
                    .unwrap_or_default(),
            };
            let fail = |e: HandlerError| match e {
                HandlerError::Retryable(r) => BatchError::Retryable(r),
                HandlerError::Fatal(reason) => BatchError::Fatal { index, reason },
            };
            let fresh = dedup::claim(&mut tx, dialect, &shared.options.group, envelope, &origin)
                .await
                .map_err(|e| fail(e.into()))?;
            if !fresh {
                delta.duplicates += 1;
                continue;
            }
            for handler in &shared.options.handlers {
                let effect: Effect = handler.apply(&mut tx, dialect, envelope).await.map_err(fail)?;
                delta.record_effect(handler.name(), effect);
            }
            delta.applied += 1;
        }
        if !self.owned() {
            let _ = tx.rollback().await;
            return Err(BatchError::Revoked);
        }
        tx.commit().await.map_err(|e| retryable(e.into()))?;
        if let Some((_, last)) = shared.active.lock().expect("active lock").as_mut() {
            *last = std::time::Instant::now();
        }
        let mut summary = shared.summary.lock().expect("summary lock");
        summary.applied += delta.applied;
        summary.duplicates += delta.duplicates;
        for (name, counts) in delta.handlers {
            let total = summary.handlers.entry(name).or_default();
            total.applied += counts.applied;
            total.ignored += counts.ignored;
            total.already_done += counts.already_done;
        }
        Ok(())
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
