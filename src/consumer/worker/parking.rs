//! Per-key ordering in a partition worker (`consumer.ordering = key`; the
//! tables and queries are in [`crate::ordering`]):
//!
//! * a worker of a main partition loads its parked keys before its first record;
//! * a forwarded record parks its key ([`PartitionWorker::park`]);
//! * an undecodable record behind a parked key is held, not forwarded;
//! * once a head is applied, [`PartitionWorker::release`] applies what was
//!   held behind it, in order. It is the one entry point of release: the
//!   worker calls it after each commit that applied heads, and the
//!   consumer's background task for heads no worker will meet (ignored with
//!   `--release-followers`, or applied just before a crash).
//!
//! Holding a decoded record happens inside the batch's transaction, in the
//! gate stage of [`PartitionWorker::apply`](super::PartitionWorker) (`worker/apply.rs`).

use rdkafka::Message;
use rdkafka::message::OwnedMessage;
use tracing::Instrument;

use super::{Backoff, BatchError, Committed, Decoded, Item, PartitionWorker, Revoked};
use crate::backoff::{retry, until_available};
use crate::consumer::events::Released;
use crate::metrics::InternalEvent;
use crate::ordering::{self, Gate, OrderKey, ParkState};

impl PartitionWorker {
    /// Loads the parked keys of this partition into the consumer's set before
    /// its first record (they may have been parked by its previous owner).
    pub(super) async fn load_parked_keys(&self) -> Result<(), Revoked> {
        let (db, group, (topic, partition)) = (
            &self.shared.db,
            self.shared.options.group.as_str(),
            &self.key,
        );
        let keys = self
            .until_db_ok("cannot load parked keys", || {
                ordering::keys_of_partition(db, group, topic, *partition)
            })
            .await?;
        self.shared.parked.lock().expect("parked lock").extend(keys);
        Ok(())
    }

    /// Holds an undecodable record behind its key if the key is parked by
    /// another record (it fails again when released, and only then becomes
    /// the head). True if held.
    pub(super) async fn held_poison(&self, item: &Item) -> Result<bool, Revoked> {
        let Some(key) = record_key(&item.message) else {
            return Ok(false);
        };
        let key = self.order_key(&item.message, key);
        if !self.ordered()
            || !(self.is_retry_partition() || self.shared.is_parked(&key.topic, &key.key))
        {
            return Ok(false);
        }
        let (db, group, key) = (&self.shared.db, self.shared.options.group.as_str(), &key);
        self.until_db_ok(
            "cannot check the parked key of a poison record",
            move || async move {
                let mut tx = db.begin().await?;
                let gate = ordering::gate(&mut tx, group, key, &item.message, None).await?;
                if gate == Gate::Hold {
                    ordering::hold(&mut tx, group, key, &item.message, None).await?;
                }
                tx.commit().await?;
                Ok(gate == Gate::Hold)
            },
        )
        .await
    }

    /// Release, the one entry point: for each key whose head is done, applies
    /// the records held behind it, oldest first; each is deleted from
    /// `held_records` in the transaction that applies it. A held record that
    /// fails becomes the new head (it goes through the error tier like any
    /// failure) and the rest stay held. Unparks a key when none remain.
    pub(crate) async fn release(
        &self,
        heads: impl IntoIterator<Item = OrderKey>,
    ) -> Result<(), Revoked> {
        for key in heads {
            self.release_key(&key).await?;
        }
        Ok(())
    }

    async fn release_key(&self, key: &OrderKey) -> Result<(), Revoked> {
        let mut backoff = Backoff::new();
        loop {
            self.still_owned()?;
            let what = format!("cannot read the records held behind key {key}");
            let next_held = until_available(
                self.at(&what),
                || self.next_held(key),
                retry,
                || self.still_owned(),
            );
            let Some(held) = next_held.await? else {
                return Ok(());
            };
            let mut next = Item {
                message: held.to_message(),
                envelope: None,
                held_id: Some(held.id),
            };
            match self.decode(&next.message).await? {
                Decoded::Envelope(envelope) => next.envelope = Some(envelope),
                Decoded::Poison(failure) => {
                    // Undecodable: it becomes the head, dead-lettered.
                    self.forward_and_park(&[(&next, failure)]).await?;
                    continue;
                }
            }
            // Not retried in place: after a wait, the next held record is
            // read again (another release of the key may have applied it).
            match self.apply_one(&next).await {
                // The other release of this key applied it first.
                Ok(Committed {
                    released_elsewhere: 1..,
                    ..
                }) => {}
                Ok(_) => {
                    self.count(|s| s.released += 1);
                    let _in_record = self.span(&next.message, next.envelope.as_ref()).entered();
                    let event_name = next
                        .envelope
                        .as_ref()
                        .map_or("unknown", |e| e.event_name.as_str());
                    Released {
                        group: &self.shared.options.group,
                        event_name,
                    }
                    .emit();
                }
                Err(BatchError::Revoked(revoked)) => return Err(revoked),
                Err(BatchError::Unavailable(reason)) => {
                    tracing::warn!(key = %key.key, topic = %key.topic, %reason, "held record not applied; retrying with backoff");
                    backoff.wait().await;
                }
                Err(BatchError::Record(error)) => {
                    self.failed(&next, &error);
                    // A held record is never a head, so a local retry has nothing to release.
                    let span = self.span(&next.message, next.envelope.as_ref());
                    self.settle(&next, error).instrument(span).await?;
                }
            }
        }
    }

    /// The oldest record held behind `key`; None when its head is not done
    /// yet, or when nothing is held any more, in which case the key is unparked.
    async fn next_held(
        &self,
        key: &OrderKey,
    ) -> Result<Option<ordering::HeldRecord>, crate::db::DbError> {
        let shared = &self.shared;
        let group = shared.options.group.as_str();
        let mut tx = shared.db.begin().await?;
        let Some(parked) = ordering::lock(&mut tx, group, key).await? else {
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
            tracing::info!(group, key = %key.key, topic = %key.topic, "key unparked: every record held behind it was applied");
        }
        Ok(held)
    }

    /// Makes forwarded records the heads of their parked keys (mode
    /// `key`; records without a key have no order to keep), in one
    /// transaction. A released record that failed leaves `held_records` in
    /// the same transaction.
    pub(super) async fn park(&self, forwarded: &[(&Item, ParkState)]) -> Result<(), Revoked> {
        if !self.ordered() {
            return Ok(());
        }
        let parks: Vec<(&Item, ParkState, OrderKey)> = forwarded
            .iter()
            .filter_map(|(item, state)| {
                let key = record_key(&item.message)?;
                if !crate::db::fits_column(&key, crate::db::RECORD_KEY_CHARS) {
                    // Not an order id (the record failed its key check): no record
                    // of this key can be applied, so there is no order to keep, and
                    // parking it would cut the key to fit the column.
                    tracing::warn!(
                        chars = key.chars().count(),
                        limit = crate::db::RECORD_KEY_CHARS,
                        "record key too long to park; not parked"
                    );
                    return None;
                }
                Some((*item, *state, self.order_key(&item.message, key)))
            })
            .collect();
        if parks.is_empty() {
            return Ok(());
        }
        let (db, group, parks_ref) = (&self.shared.db, self.shared.options.group.as_str(), &parks);
        self.until_db_ok("cannot park the key", move || async move {
            let mut tx = db.begin().await?;
            for (item, state, key) in parks_ref {
                let rehead = item.held_id.is_some();
                ordering::park(
                    &mut tx,
                    group,
                    key,
                    &item.message,
                    item.envelope.as_ref(),
                    *state,
                    rehead,
                )
                .await?;
                if let Some(id) = item.held_id {
                    ordering::delete_held(&mut tx, id).await?;
                }
            }
            Ok(tx.commit().await?)
        })
        .await?;
        self.shared
            .parked
            .lock()
            .expect("parked lock")
            .extend(parks.iter().map(|(_, _, key)| key.clone()));
        for (item, state, key) in &parks {
            let _in_record = self.span(&item.message, item.envelope.as_ref()).entered();
            tracing::info!(key = %key.key, topic = %key.topic, state = state.as_str(), "key parked: its later records wait behind this one");
        }
        Ok(())
    }

    /// The unit of order of a record of `key`: the key within the record's
    /// main topic ([`ordering::key_topic`]).
    pub(super) fn order_key(&self, message: &OwnedMessage, key: String) -> OrderKey {
        let group = self.shared.options.group.as_str();
        OrderKey {
            topic: ordering::key_topic(message, &self.shared.forwarder.topics.retry, group),
            key,
        }
    }
}

/// The record's Kafka key as text (the order id), the unit of ordering.
pub(super) fn record_key(message: &OwnedMessage) -> Option<String> {
    message
        .key()
        .map(|k| String::from_utf8_lossy(k).into_owned())
}
