//! The parking stage of a partition worker ([`Parking`]), per-key ordering
//! (`consumer.ordering = key`; the tables and queries are in
//! [`crate::ordering`]):
//!
//! * a worker of a main partition loads its parked keys before its first
//!   record ([`Parking::load_parked_keys`]);
//! * a forwarded record parks its key ([`Parking::park`]);
//! * an undecodable record behind a parked key is held, not forwarded
//!   ([`Parking::held_poison`]);
//! * once heads are applied, the records held behind them are read back
//!   together ([`Parking::held_behind_done_heads`]), and a key unparked when
//!   none is left. Applying them is the worker's release
//!   ([`PartitionWorker::release`](super::PartitionWorker::release), in
//!   `worker/partition.rs`): a released record is decoded, applied and, if
//!   it fails, settled like any record, which are other stages.
//!
//! Holding a decoded record happens inside the batch's transaction, in the
//! gate stage of the batch applier (`worker/apply.rs`).

use std::sync::Arc;

use crate::kafka::consumed::ConsumedRecord;
use rdkafka::Message;

use super::state::{Item, PartitionState, Revoked};
use crate::ordering::{self, Gate, OrderKey, ParkState};

/// Held records read at once per statement of a release (a topic of its keys).
const RELEASE_LIMIT: usize = 512;

/// Parked keys and the records held behind them, for one partition.
pub(super) struct Parking {
    state: Arc<PartitionState>,
}

impl Parking {
    pub(super) fn new(state: Arc<PartitionState>) -> Self {
        Self { state }
    }

    /// Loads the parked keys of this partition into the consumer's set before
    /// its first record (they may have been parked by its previous owner).
    pub(super) async fn load_parked_keys(&self) -> Result<(), Revoked> {
        let (db, group, (topic, partition)) = (
            &self.state.shared.db,
            self.state.shared.options.group.as_str(),
            &self.state.key,
        );
        let keys = self
            .state
            .until_db_ok("cannot load parked keys", || {
                ordering::keys_of_partition(db, group, topic, *partition)
            })
            .await?;
        self.state
            .shared
            .parked
            .lock()
            .expect("parked lock")
            .extend(keys);
        Ok(())
    }

    /// Holds an undecodable record behind its key if the key is parked by
    /// another record (it fails again when released, and only then becomes
    /// the head). True if held.
    pub(super) async fn held_poison(&self, item: &Item) -> Result<bool, Revoked> {
        let Some(key) = record_key(&item.message) else {
            return Ok(false);
        };
        let key = self.state.order_key(&item.message, key);
        if !self.state.gated(&key) {
            return Ok(false);
        }
        let (db, group, key) = (
            &self.state.shared.db,
            self.state.shared.options.group.as_str(),
            &key,
        );
        self.state
            .until_db_ok(
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

    /// The records held behind those of `keys` whose head is done, oldest
    /// first (at most [`RELEASE_LIMIT`] per statement: a prefix of each key's),
    /// read in one transaction that locks the keys' parked rows. A key
    /// whose head is done and that has nothing held any more is unparked.
    pub(super) async fn held_behind_done_heads(
        &self,
        keys: &[OrderKey],
    ) -> Result<Vec<ordering::HeldRecord>, crate::db::DbError> {
        let shared = &self.state.shared;
        let group = shared.options.group.as_str();
        let mut tx = shared.db.begin().await?;
        let asked: Vec<&OrderKey> = keys.iter().collect();
        let parked = ordering::lock_keys(&mut tx, group, &asked).await?;
        let mut done = Vec::with_capacity(parked.len());
        for key in keys {
            if let Some(row) = parked.get(key)
                && ordering::head_done(&mut tx, group, row).await?
            {
                done.push(key);
            }
        }
        if done.is_empty() {
            tx.commit().await?;
            return Ok(Vec::new());
        }
        let (held, complete) = ordering::held_of(&mut tx, group, &done, RELEASE_LIMIT).await?;
        // Unparked only when the read was complete: a key cut off by the
        // limit may still have records held.
        let emptied: Vec<&OrderKey> = match complete {
            true => done
                .into_iter()
                .filter(|key| {
                    !held
                        .iter()
                        .any(|h| h.key_topic == key.topic && h.key == key.key)
                })
                .collect(),
            false => Vec::new(),
        };
        for key in &emptied {
            ordering::unpark(&mut tx, group, key).await?;
        }
        if !emptied.is_empty() {
            // Forget them before the commit: a park of one by this consumer
            // waits for the row lock, so it lands after this.
            let mut parked = shared.parked.lock().expect("parked lock");
            for key in &emptied {
                parked.remove(key);
            }
        }
        tx.commit().await?;
        for key in emptied {
            tracing::info!(group, key = %key.key, topic = %key.topic, "key unparked: every record held behind it was applied");
        }
        Ok(held)
    }

    /// Makes forwarded records the heads of their parked keys (mode
    /// `key`; records without a key have no order to keep), in one
    /// transaction of set statements ([`ordering::park_all`]), not one
    /// per key. Released records that failed leave `held_records` in the
    /// same transaction.
    pub(super) async fn park(&self, forwarded: &[(&Item, ParkState)]) -> Result<(), Revoked> {
        if !self.state.ordered() {
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
                Some((*item, *state, self.state.order_key(&item.message, key)))
            })
            .collect();
        if parks.is_empty() {
            return Ok(());
        }
        let (db, group) = (
            &self.state.shared.db,
            self.state.shared.options.group.as_str(),
        );
        let requests: Vec<ordering::Park> = parks
            .iter()
            .map(|(item, state, key)| ordering::Park {
                key,
                message: &item.message,
                event: item.envelope.as_ref(),
                state: *state,
                rehead: item.held_id.is_some(),
            })
            .collect();
        let released: Vec<i64> = parks.iter().filter_map(|(item, ..)| item.held_id).collect();
        let (requests, released) = (&requests, &released);
        self.state
            .until_db_ok("cannot park the keys", move || async move {
                let mut tx = db.begin().await?;
                ordering::park_all(&mut tx, group, requests).await?;
                ordering::delete_held_all(&mut tx, released).await?;
                Ok(tx.commit().await?)
            })
            .await?;
        self.state
            .shared
            .parked
            .lock()
            .expect("parked lock")
            .extend(parks.iter().map(|(_, _, key)| key.clone()));
        for (item, state, key) in &parks {
            let _in_record = self
                .state
                .span(&item.message, item.envelope.as_ref())
                .entered();
            tracing::info!(key = %key.key, topic = %key.topic, state = state.as_str(), "key parked: its later records wait behind this one");
        }
        Ok(())
    }
}

/// The record's Kafka key as text (the order id), the unit of ordering.
fn record_key(message: &ConsumedRecord) -> Option<String> {
    message
        .key()
        .map(|k| String::from_utf8_lossy(k).into_owned())
}
