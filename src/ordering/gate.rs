//! The partition worker's ordering decisions: what happens to a record of
//! a key that may be parked ([`gate`]), whether a record is its key's head
//! ([`is_head`]), whether a head is done with ([`head_done`]), and parking
//! or re-heading a key when a record leaves the main path ([`park`]). The
//! statements they run are in [`super::store`].

use rdkafka::message::OwnedMessage;

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
    message: &OwnedMessage,
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
    message: &OwnedMessage,
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

/// Parks `key` with `message` as its head, once the record was forwarded
/// to the retry topic or the DLQ. If the key is parked already, only its
/// head's state is updated, unless `rehead` (a released record failed and
/// takes the head's place): a forwarded record that is not the head comes
/// back from the retry topic to be held behind the head.
pub async fn park(
    tx: &mut Tx,
    group: &str,
    key: &OrderKey,
    message: &OwnedMessage,
    event: Option<&Envelope>,
    state: ParkState,
    rehead: bool,
) -> Result<(), DbError> {
    let head = Head {
        origin: Origin::of(message),
        event_id: event.map(|e| e.event_id.to_string()),
        event_name: event.map(|e| e.event_name.to_string()),
        state,
    };
    // The partition of the key's topic: the head's origin's (a retry
    // topic may have another partition count than a `cdc.*` topic).
    let partition = head.origin.partition;
    if store::insert_parked(tx, group, key, partition, &head).await? {
        return Ok(());
    }
    let current = store::lock(tx, group, key).await?;
    if !rehead && current.is_some_and(|p| !is_head(&p, &head.origin, head.event_id.as_deref())) {
        return Ok(());
    }
    store::set_head(tx, group, key, &head).await
}
