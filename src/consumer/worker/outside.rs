//! Effects outside the database (an HTTP delivery): run before the
//! batch's transaction opens, so no transaction waits on a downstream.
//!
//! For the handlers that [act outside](crate::consumer::handler::Handler::acts_outside),
//! a batch goes:
//!
//! 1. **check**, with no transaction: the records whose dedup rows exist
//!    (committed before: a redelivery) are left out, and so are records
//!    the ordering gate would hold (their key's parked row, read without a
//!    lock, names another head);
//! 2. **deliver**, with no transaction: the rest are cut into the same
//!    *waves* as the transaction's (the k-th record of each key in wave k,
//!    [`super::waves`]), run wave after wave, each wave's records at once
//!    (the handler bounds how many are in flight). So records of one key
//!    are never in flight together and go in offset order; once a record
//!    of a key fails, the later ones of its key are not delivered (the
//!    transaction defers them behind it);
//! 3. the batch's transaction then claims the dedup rows and takes each
//!    record's result from here instead of running the handler, commits,
//!    and only then does the offset move.
//!
//! A crash between 2 and 3 redelivers the records, which are delivered
//! again with the same `Idempotency-Key` (the event id): exactly once in
//! effect for a downstream that honours the key. A record whose
//! transaction finds it open but that has no result here (its key was
//! released between the check and the gate's lock) makes the batch wait
//! and run again, as for the database being down.

use std::collections::{HashMap, HashSet};

use rdkafka::Message;

use super::state::{Item, PartitionState};
use crate::consumer::handler::{EventResult, HandlerError};
use crate::db::DbError;
use crate::ordering::{self, OrderKey, Origin};

/// The results of the effects outside the database, by (record position
/// in the batch, handler position in the consumer's handlers).
#[derive(Default)]
pub(super) struct Outside {
    results: HashMap<(usize, usize), EventResult>,
}

impl Outside {
    /// Handler `handler`'s result for the record at `index`; a record
    /// without one was not expected open (see the module doc): the batch
    /// waits and runs again.
    pub(super) fn result(&self, index: usize, handler: usize) -> EventResult {
        self.results
            .get(&(index, handler))
            .cloned()
            .unwrap_or_else(|| {
                Err(HandlerError::Unavailable(
                "a record became open after its delivery check (its key was released meanwhile); \
                 the batch runs again"
                    .into(),
            ))
            })
    }
}

impl Outside {
    /// Steps 1 and 2 of the module doc for `items`; nothing when no handler
    /// acts outside the database.
    pub(super) async fn deliver(
        state: &PartitionState,
        items: &[Item],
    ) -> Result<Outside, DbError> {
        let handlers: Vec<usize> = (state.shared.options.handlers.iter().enumerate())
            .filter(|(_, h)| h.acts_outside())
            .map(|(i, _)| i)
            .collect();
        let mut outside = Outside::default();
        if handlers.is_empty() {
            return Ok(outside);
        }
        let group = state.shared.options.group.as_str();
        let mut keys: HashMap<usize, OrderKey> = HashMap::new();
        for (index, item) in items.iter().enumerate() {
            let Some(envelope) = &item.envelope else {
                continue;
            };
            let key = state.order_key(&item.message, envelope.key());
            if item.held_id.is_none() && state.gated(&key) {
                let parked = ordering::store::parked(&state.shared.db, group, &key).await?;
                let event_id = envelope.event_id.to_string();
                let open = parked.is_none_or(|p| {
                    ordering::gate::is_head(&p, &Origin::of(&item.message), Some(&event_id))
                });
                if !open {
                    continue;
                }
            }
            keys.insert(index, key);
        }
        let ids: Vec<String> = keys
            .keys()
            .map(|&i| envelope(&items[i]).event_id.to_string())
            .collect();
        let done = crate::dedup::applied_ids(&state.shared.db, group, &ids).await?;
        let mut open: Vec<usize> = keys
            .keys()
            .copied()
            .filter(|&i| !done.contains(&envelope(&items[i]).event_id.to_string()))
            .collect();
        open.sort_unstable();
        let mut failed: HashSet<&OrderKey> = HashSet::new();
        for mut wave in super::waves::waves(&open, &keys) {
            wave.retain(|i| !failed.contains(&keys[i]));
            if wave.is_empty() {
                continue;
            }
            let events: Vec<_> = wave.iter().map(|&i| envelope(&items[i])).collect();
            for &h in &handlers {
                let results = state.shared.options.handlers[h]
                    .apply_outside(&events)
                    .await;
                for (&index, result) in wave.iter().zip(results) {
                    if result.is_err() {
                        failed.insert(&keys[&index]);
                    }
                    outside.results.insert((index, h), result);
                }
            }
        }
        tracing::debug!(
            records = outside.results.len(),
            offset = items.first().map(|i| i.message.offset()),
            "effects outside the database done"
        );
        Ok(outside)
    }
}

/// The envelope of a decoded record.
fn envelope(item: &Item) -> &crate::envelope::Envelope {
    item.envelope.as_ref().expect("only decoded records")
}
