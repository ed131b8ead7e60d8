//! Per-key ordering in a partition worker (`consumer.ordering = key`; the
//! tables and queries are in [`crate::ordering`]):
//!
//! * a worker of a main partition loads its parked keys before its first record;
//! * a forwarded record parks its key ([`PartitionWorker::park`]);
//! * an undecodable record behind a parked key is held, not forwarded;
//! * once a head is applied, [`PartitionWorker::release`] applies what was
//!   held behind it, in order.
//!
//! Holding a decoded record happens inside the batch's transaction, in
//! [`PartitionWorker::apply`](super::PartitionWorker).

use rdkafka::Message;
use rdkafka::message::OwnedMessage;
use tracing::Instrument;

use super::{Backoff, BatchError, Committed, Item, PartitionWorker};
use crate::metrics::{InternalEvent, Released};
use crate::ordering::{self, Gate, ParkState};

impl PartitionWorker {
    /// Loads the parked keys of this partition into the consumer's set before
    /// its first record (they may have been parked by its previous owner).
    pub(super) async fn load_parked_keys(&self) -> bool {
        let (db, group, partition) = (&self.shared.db, self.shared.options.group.as_str(), self.key.1);
        let loaded = self.until_db_ok("cannot load parked keys", || ordering::keys_of_partition(db, group, partition));
        let Some(keys) = loaded.await else { return false };
        self.shared.parked.lock().expect("parked lock").extend(keys);
        true
    }

    /// Holds an undecodable record behind its key if the key is parked by
    /// another record (it fails again when released, and only then becomes
    /// the head). Some(true) if held; None if revoked meanwhile.
    pub(super) async fn held_poison(&self, item: &Item) -> Option<bool> {
        let Some(key) = record_key(&item.message) else {
            return Some(false);
        };
        if !self.ordered() || !(self.is_retry_partition() || self.shared.is_parked(&key)) {
            return Some(false);
        }
        let (db, group, key) = (&self.shared.db, self.shared.options.group.as_str(), key.as_str());
        self.until_db_ok("cannot check the parked key of a poison record", move || async move {
            let dialect = db.dialect;
            let mut tx = db.begin().await?;
            let gate = ordering::gate(&mut tx, dialect, group, key, &item.message, None).await?;
            if gate == Gate::Hold {
                ordering::hold(&mut tx, dialect, group, key, &item.message, None).await?;
            }
            tx.commit().await?;
            Ok(gate == Gate::Hold)
        })
        .await
    }

    /// Releases the followers of every head the batch applied.
    pub(super) async fn release_all(&self, committed: Committed) -> bool {
        for key in committed.heads {
            if !self.release(&key).await {
                return false;
            }
        }
        true
    }

    /// Applies the records held behind `key`, oldest first, once its head is
    /// done; each is deleted from `held_records` in the transaction that
    /// applies it. A held record that fails becomes the new head (it goes
    /// through the error tier like any failure) and the rest stay held.
    /// Unparks the key when none remain. False if the partition was revoked.
    pub(crate) async fn release(&self, key: &str) -> bool {
        let mut backoff = Backoff::new();
        loop {
            if !self.owned() {
                return false;
            }
            let held = match self.next_held(key).await {
                Ok(Some(held)) => held,
                Ok(None) => return true,
                Err(e) => {
                    tracing::warn!(key, error = %e, "cannot read held records; retrying");
                    backoff.wait().await;
                    continue;
                }
            };
            let mut next = Item { message: held.to_message(), envelope: None, held_id: Some(held.id) };
            match self.decode(&next.message).await {
                None => return false,
                Some(Ok(envelope)) => next.envelope = Some(envelope),
                Some(Err(failure)) => {
                    // Undecodable: it becomes the head, dead-lettered.
                    if !self.is_owned_after_forward(&next, failure).await {
                        return false;
                    }
                    continue;
                }
            }
            match self.apply(std::slice::from_ref(&next)).await {
                Ok(_) => {
                    self.count(|s| s.released += 1);
                    let _in_record = self.span(&next.message, next.envelope.as_ref()).entered();
                    let event_name = next.envelope.as_ref().map_or("unknown", |e| e.event_name.as_str());
                    Released { group: &self.shared.options.group, event_name }.emit();
                }
                Err(BatchError::Revoked) => return false,
                Err(BatchError::Unavailable(reason)) => {
                    tracing::warn!(key, %reason, "held record not applied; retrying with backoff");
                    backoff.wait().await;
                }
                Err(BatchError::Record { error, .. }) => {
                    self.failed(&next, &error);
                    // A held record is never a head, so a local retry has nothing to release.
                    let span = self.span(&next.message, next.envelope.as_ref());
                    if self.settle(&next, error).instrument(span).await.is_none() {
                        return false;
                    }
                }
            }
        }
    }

    /// The oldest record held behind `key`; None when its head is not done
    /// yet, or when nothing is held any more, in which case the key is unparked.
    async fn next_held(&self, key: &str) -> Result<Option<ordering::HeldRecord>, crate::db::DbError> {
        let shared = &self.shared;
        let group = shared.options.group.as_str();
        let mut tx = shared.db.begin().await?;
        let Some(parked) = ordering::lock(&mut tx, shared.db.dialect, group, key).await? else {
            tx.commit().await?;
            return Ok(None);
        };
        if !ordering::head_done(&mut tx, group, &parked).await? {
            tx.commit().await?;
            return Ok(None);
        }
        let held = ordering::first_held(&mut tx, group, key).await?;
        if held.is_none() {
            ordering::unpark(&mut tx, group, key).await?;
            // Forget it before the commit: a park of the key by this consumer
            // waits for the row lock, so it lands after this.
            shared.parked.lock().expect("parked lock").remove(key);
        }
        tx.commit().await?;
        if held.is_none() {
            tracing::info!(group, key, "key unparked: every record held behind it was applied");
        }
        Ok(held)
    }

    /// Makes a forwarded record the head of its parked key (mode `key`;
    /// records without a key have no order to keep). A released record that
    /// failed leaves `held_records` in the same transaction. False if revoked.
    pub(super) async fn park(&self, item: &Item, state: ParkState) -> bool {
        let Some(key) = record_key(&item.message) else {
            return true;
        };
        if !self.ordered() {
            return true;
        }
        if !crate::db::fits_column(&key, crate::db::RECORD_KEY_CHARS) {
            // Not an order id (the record failed its key check): no record
            // of this key can be applied, so there is no order to keep, and
            // parking it would cut the key to fit the column.
            tracing::warn!(chars = key.chars().count(), limit = crate::db::RECORD_KEY_CHARS, "record key too long to park; not parked");
            return true;
        }
        let (db, group, key_ref) = (&self.shared.db, self.shared.options.group.as_str(), key.as_str());
        let rehead = item.held_id.is_some();
        let parked = self.until_db_ok("cannot park the key", move || async move {
            let mut tx = db.begin().await?;
            ordering::park(&mut tx, db.dialect, group, key_ref, &item.message, item.envelope.as_ref(), state, rehead).await?;
            if let Some(id) = item.held_id {
                ordering::delete_held(&mut tx, id).await?;
            }
            Ok(tx.commit().await?)
        });
        if parked.await.is_none() {
            return false;
        }
        self.shared.parked.lock().expect("parked lock").insert(key.clone());
        let _in_record = self.span(&item.message, item.envelope.as_ref()).entered();
        tracing::info!(key, state = state.as_str(), "key parked: its later records wait behind this one");
        true
    }
}

/// The record's Kafka key as text (the order id), the unit of ordering.
pub(super) fn record_key(message: &OwnedMessage) -> Option<String> {
    message.key().map(|k| String::from_utf8_lossy(k).into_owned())
}
