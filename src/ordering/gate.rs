//! The partition worker's ordering decisions: what happens to a record of
//! a key that may be parked ([`gate`]), whether a record is its key's head
//! ([`is_head`]), whether a head is done with ([`head_done`]), and parking
//! or re-heading keys when records leave the main path ([`park_all`]). The
//! statements they run are in [`super::store`].

use crate::kafka::consumed::ConsumedRecord;
use rdkafka::Message;

use super::store::{self, Head, Parked};
use super::{OrderKey, Origin, ParkState};
use crate::db::{DbError, Tx};
use crate::envelope::Envelope;

/// What to do with a record of a key that may be parked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Gate {
    /// The key is not parked: apply as usual.
    Open,
    /// The record is the parked key's head: apply it, then release.
    Head,
    /// The record waits behind the head.
    Hold,
    /// The record was applied already (a redelivery): skip it.
    Duplicate,
}

/// Decides what happens to a record of `key` (`event` is None when it could
/// not be decoded) if the key may be parked; locks the parked row until `tx` ends.
pub async fn gate(
    tx: &mut Tx,
    group: &str,
    key: &OrderKey,
    message: &impl Message,
    event: Option<&Envelope>,
) -> Result<Gate, DbError> {
    let parked = store::lock(tx, group, key).await?;
    decide(tx, group, parked.as_ref(), message, event).await
}

/// [`gate`]'s decision once the key's parked row (None: not parked) was
/// read and locked, e.g. for a whole batch by [`store::lock_keys`].
pub async fn decide(
    tx: &mut Tx,
    group: &str,
    parked: Option<&Parked>,
    message: &impl Message,
    event: Option<&Envelope>,
) -> Result<Gate, DbError> {
    let Some(parked) = parked else {
        return Ok(Gate::Open);
    };
    let event_id = event.map(|e| e.event_id.to_string());
    if is_head(parked, &Origin::of(message), event_id.as_deref()) {
        return Ok(Gate::Head);
    }
    match event_id {
        Some(id) if crate::dedup::applied(tx, group, &id).await? => Ok(Gate::Duplicate),
        _ => Ok(Gate::Hold),
    }
}

/// Whether the record first consumed at `origin` (with `event_id`) is the
/// head of `parked`: same origin, or same event (a replay to the original
/// topic has new coordinates).
pub fn is_head(parked: &Parked, origin: &Origin, event_id: Option<&str>) -> bool {
    parked.head() == *origin || (event_id.is_some() && parked.head_event_id.as_deref() == event_id)
}

/// Whether the parked key's head is done with: applied, or released by an operator.
pub async fn head_done(tx: &mut Tx, group: &str, parked: &Parked) -> Result<bool, DbError> {
    if parked.state == ParkState::Release {
        return Ok(true);
    }
    match &parked.head_event_id {
        Some(id) => crate::dedup::applied(tx, group, id).await,
        None => Ok(false),
    }
}

/// A key to park and the forwarded record that becomes, or updates, its
/// head ([`park_all`]).
#[derive(Debug, Clone, Copy)]
pub struct Park<'a, M: Message = ConsumedRecord> {
    /// The key.
    pub key: &'a OrderKey,
    /// The record forwarded to the retry topic or the DLQ.
    pub message: &'a M,
    /// Its event (None when undecodable).
    pub event: Option<&'a Envelope>,
    /// Where it went.
    pub state: ParkState,
    /// Whether it takes its head's place: a released record that failed.
    pub rehead: bool,
}

/// Parks each key of `parks` with its record as its head, once the records
/// were forwarded to the retry topic or the DLQ, in set statements
/// ([`crate::db::rows`]'s pieces; the re-heads in their own). A key
/// parked already only has its head's state updated, unless `rehead`: a
/// forwarded record that is not the head comes back from the retry topic
/// to be held behind the head.
pub async fn park_all<M: Message>(
    tx: &mut Tx,
    group: &str,
    parks: &[Park<'_, M>],
) -> Result<(), DbError> {
    for rehead in [false, true] {
        let mut rows: Vec<store::NewPark> = parks
            .iter()
            .filter(|p| p.rehead == rehead)
            .map(|p| {
                let origin = Origin::of(p.message);
                store::NewPark {
                    key: p.key,
                    // The partition of the key's topic: the head's origin's (a
                    // retry topic may have another partition count than a
                    // `cdc.*` topic).
                    partition: origin.partition,
                    origin: origin.to_string(),
                    head: Head {
                        origin,
                        event_id: p.event.map(|e| e.event_id.to_string()),
                        event_name: p.event.map(|e| e.event_name.to_string()),
                        state: p.state,
                    },
                }
            })
            .collect();
        if !rows.is_empty() {
            store::park_keys(tx, group, &mut rows, rehead).await?;
        }
    }
    Ok(())
}

/// [`park_all`] of one key.
pub async fn park(
    tx: &mut Tx,
    group: &str,
    key: &OrderKey,
    message: &impl Message,
    event: Option<&Envelope>,
    state: ParkState,
    rehead: bool,
) -> Result<(), DbError> {
    let park = Park {
        key,
        message,
        event,
        state,
        rehead,
    };
    park_all(tx, group, &[park]).await
}
