//! A batch's transaction, set-based: a fixed, small number of statements
//! whatever the batch's size.
//!
//! 1. **gate** ([`BatchApplier::gate`]), for records whose key may be
//!    parked and retry-topic records (per-key ordering): their keys' parked
//!    rows are read and locked in one statement, then each record is held
//!    behind its head (the hold is written), the head itself (noted for
//!    release), a redelivery, or open;
//! 2. the open records are cut into **waves**: the k-th record of each key
//!    goes into wave k, so a wave has at most one record per order and the
//!    waves run in offset order: an order's records are applied in order,
//!    and `apply_seq` grows with them. Each wave, behind a savepoint:
//!    * a released record leaves `held_records` (unless another release
//!      took it first);
//!    * **dedup** ([`dedup::claim_all`]): one `INSERT IGNORE` claims the
//!      wave's events for the group and counts them. Should a row be kept
//!      out (a redelivery), the wave rolls back to its savepoint and claims
//!      again with `... RETURNING` ([`dedup::claim_batch`]), which says
//!      which events are new; a redelivery is skipped, and noted if its
//!      content differs from the event first applied under its id;
//!    * **handlers**: each handler's [`apply_batch`](crate::consumer::handler::Handler::apply_batch)
//!      writes its effects for the whole wave; a handler acting outside the
//!      database (HTTP) ran before the transaction opened (`worker/outside.rs`)
//!      and its results are taken from there;
//!    * a record a handler failed is taken out: the attempt stops at that
//!      handler (the ones after it do not run on a wave about to be rolled
//!      back), the wave rolls back to a second savepoint taken after its
//!      claim, takes back the failed record's claim ([`dedup::unclaim`])
//!      and runs its handlers again without it; the other claims stay. (A
//!      failed record released from `held_records` in this wave, or a wave
//!      whose every record failed, rolls the whole wave back instead, which
//!      puts a held row back.) The later records of its key are left out
//!      too ([`Deferred`]). The batch is not split: the rest commits, and
//!      the worker takes the deferred records through the error tier
//!      afterwards;
//! 3. **commit**, only while the partition is still ours;
//! 4. **bookkeeping**, after the commit: the summary, the consumer's parked
//!    set and the metrics, from the [`Ledger`] the stages filled.

use std::collections::{HashMap, HashSet, VecDeque};
use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rdkafka::Message;
use tracing::Instrument;

use super::outside::Outside;
use super::state::{Item, PartitionState, Revoked};
use super::waves::waves;
use crate::backoff::until_available;
use crate::consumer::ConsumeSummary;
use crate::consumer::events::{Applied, ConflictingDuplicate, DuplicateSkipped, Held, Released};
use crate::consumer::handler::HandlerError;
use crate::db::{DbError, Tx};
use crate::dedup::{self, Conflict, RecordOrigin};
use crate::envelope::Envelope;
use crate::metrics::InternalEvent;
use crate::ordering::{self, Gate, OrderKey};

/// What became of one record in the batch's transaction.
enum Outcome {
    /// Effects written.
    Applied,
    /// Applied by this group before: skipped.
    Duplicate,
    /// Held behind its parked key's head.
    Held,
    /// A released record whose `held_records` row another release of the
    /// key already deleted: that release applied it, so this one skips it.
    AlreadyReleased,
}

/// What a batch's transaction did, for the bookkeeping after its commit.
#[derive(Default)]
struct Ledger<'a> {
    /// Counts to add to the run's summary.
    delta: ConsumeSummary,
    /// Applied records and their time in the stages.
    applied: Vec<(&'a Item, &'a Envelope, Duration)>,
    duplicates: Vec<(&'a Item, &'a Envelope)>,
    held: Vec<(&'a Item, &'a Envelope)>,
    /// Duplicates whose content differs from the event first applied.
    conflicts: Vec<Conflict>,
    /// Keys in this consumer's parked set that were released elsewhere.
    reopened: Vec<OrderKey>,
    /// Keys whose head was applied: release their followers.
    heads: Vec<OrderKey>,
}

/// A record left out of the batch's transaction, for the error tier after
/// the commit: one a handler failed (with its error), or a later record of
/// a failed record's key (applied only once that one is settled, so the
/// key's order holds).
pub(super) struct Deferred {
    /// Its position in the batch.
    pub index: usize,
    /// Why it failed; None for a record behind a failed one.
    pub error: Option<HandlerError>,
}

/// What a committed batch leaves to do.
#[derive(Default)]
pub(super) struct Committed {
    /// Keys whose head was applied in the batch: release their followers.
    pub heads: Vec<OrderKey>,
    /// Records left out of the transaction, in offset order: to settle
    /// through the error tier, or to apply once those before them are.
    pub deferred: Vec<Deferred>,
}

/// Why a batch's transaction was not committed.
pub(super) enum BatchError {
    /// Infrastructure down: retry the whole batch later, in place.
    Unavailable(String),
    /// The one record applied failed in a handler ([`BatchApplier::apply_one`]).
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

/// What one attempt at a wave gave.
// Done is the common case: boxing it would allocate once per wave for nothing.
#[allow(clippy::large_enum_variant)]
enum Wave<'a> {
    /// Written: what to add to the batch's ledger, and the records a
    /// handler failed, taken out of the wave (their claims undone).
    Done(Ledger<'a>, Vec<(usize, HandlerError)>),
    /// These records failed in a handler, and either one of them was
    /// released from `held_records` in this wave or none is left: nothing
    /// of the wave is kept (the rollback puts a held row back).
    Failed(Vec<(usize, HandlerError)>),
    /// The claim without its result set had a row kept out, an event the
    /// group applied before ([`dedup::claim_all`]): the wave runs again
    /// with the claim that says which.
    Recount,
}

impl<'a> Ledger<'a> {
    /// Adds a wave's ledger to the batch's.
    fn merge(&mut self, wave: Ledger<'a>) {
        self.delta.merge(wave.delta);
        self.applied.extend(wave.applied);
        self.duplicates.extend(wave.duplicates);
        self.held.extend(wave.held);
        self.conflicts.extend(wave.conflicts);
        self.reopened.extend(wave.reopened);
        self.heads.extend(wave.heads);
    }

    fn note(
        &mut self,
        item: &'a Item,
        envelope: &'a Envelope,
        outcome: Outcome,
        elapsed: Duration,
    ) {
        if item.held_id.is_some() && matches!(outcome, Outcome::Applied | Outcome::Duplicate) {
            self.delta.released += 1;
        }
        match outcome {
            Outcome::Applied => {
                self.delta.applied += 1;
                self.applied.push((item, envelope, elapsed));
            }
            Outcome::Duplicate => {
                self.delta.duplicates += 1;
                self.duplicates.push((item, envelope));
            }
            Outcome::Held => {
                self.delta.held += 1;
                self.held.push((item, envelope));
            }
            // Another release of its key applied it (the first delete wins).
            Outcome::AlreadyReleased => {}
        }
    }
}

/// The batch-transaction stage of one partition: applies a batch of
/// decoded records in one DB transaction (the module doc).
pub(super) struct BatchApplier {
    state: Arc<PartitionState>,
    /// The group's dedup id, read on the pool before the first transaction.
    group: tokio::sync::OnceCell<dedup::Group>,
}

impl BatchApplier {
    pub(super) fn new(state: Arc<PartitionState>) -> Self {
        Self {
            state,
            group: tokio::sync::OnceCell::new(),
        }
    }

    /// The group's dedup id; [`BatchApplier::apply`] reads it before it
    /// opens a transaction (on the pool: SQLite's has one connection).
    fn group(&self) -> &dedup::Group {
        self.group.get().expect("read before the transaction")
    }

    /// Applies `items` in one transaction, retrying in place with backoff
    /// while the database is unavailable (counted, and reported to health).
    pub(super) async fn apply_until_available(&self, items: &[Item]) -> Result<Committed, Revoked> {
        let failed = |error: BatchError| async move {
            match error {
                BatchError::Revoked(revoked) => Err(revoked),
                error => {
                    let reason = error.to_string();
                    self.state.count(|s| s.apply_failures += 1);
                    self.state.shared.health.db_down(&reason).await;
                    Ok(error)
                }
            }
        };
        until_available(
            self.state.at("batch not applied"),
            || self.apply(items),
            failed,
            || self.state.still_owned(),
        )
        .await
    }

    /// Applies one record alone: its handler failure, if any, is the error.
    pub(super) async fn apply_one(&self, item: &Item) -> Result<Committed, BatchError> {
        let mut committed = self.apply(std::slice::from_ref(item)).await?;
        match committed.deferred.pop() {
            Some(Deferred {
                error: Some(error), ..
            }) => Err(BatchError::Record(error)),
            _ => Ok(committed),
        }
    }

    /// One transaction for `items`: dedup rows and effects (or holds behind
    /// parked keys), committed together. Poison items are skipped; records
    /// that fail in a handler, and the later records of their keys, are
    /// left out and returned in [`Committed::deferred`].
    async fn apply(&self, items: &[Item]) -> Result<Committed, BatchError> {
        let unavailable = |e: DbError| BatchError::Unavailable(e.to_string());
        // Before the transaction: no transaction waits on a downstream.
        let outside = Outside::deliver(&self.state, items)
            .await
            .map_err(unavailable)?;
        let shared = &self.state.shared;
        self.group
            .get_or_try_init(|| dedup::group(&shared.db, &shared.options.group))
            .await
            .map_err(unavailable)?;
        let mut tx = shared.db.begin().await.map_err(unavailable)?;
        let mut ledger = Ledger::default();
        let keys: Vec<Option<OrderKey>> = items
            .iter()
            .map(|item| {
                item.envelope
                    .as_ref()
                    .map(|e| self.state.order_key(&item.message, e.key()))
            })
            .collect();
        // Stage 1 reads the parked rows of every key it asks about at once.
        let asked: HashSet<&OrderKey> = keys
            .iter()
            .zip(items)
            .filter_map(|(key, item)| {
                key.as_ref()
                    .filter(|k| item.held_id.is_none() && self.state.gated(k))
            })
            .collect();
        let parked = if asked.is_empty() {
            HashMap::new()
        } else {
            let asked: Vec<&OrderKey> = asked.into_iter().collect();
            ordering::lock_keys(&mut tx, &self.state.shared.options.group, &asked)
                .await
                .map_err(unavailable)?
        };
        let mut open = Vec::with_capacity(items.len());
        for (index, (item, key)) in items.iter().zip(&keys).enumerate() {
            let (Some(envelope), Some(key)) = (&item.envelope, key) else {
                continue;
            };
            if item.held_id.is_some() || !self.state.gated(key) {
                // Released records pass by leaving `held_records`, in their wave.
                open.push(index);
                continue;
            }
            let span = self.state.span(&item.message, Some(envelope));
            let gated = async {
                match self
                    .gate(&mut tx, item, envelope, key, parked.get(key), &mut ledger)
                    .await?
                {
                    Gate::Hold => ledger.note(item, envelope, Outcome::Held, Duration::ZERO),
                    Gate::Duplicate => {
                        self.note_conflict(&mut tx, envelope, &origin(item, envelope), &mut ledger)
                            .await?;
                        ledger.note(item, envelope, Outcome::Duplicate, Duration::ZERO);
                    }
                    Gate::Open | Gate::Head => open.push(index),
                }
                Ok::<_, DbError>(())
            };
            gated.instrument(span).await.map_err(unavailable)?;
        }
        let deferred = self
            .apply_waves(&mut tx, items, &keys, &open, &outside, &mut ledger)
            .await?;
        self.commit(tx).await?;
        Ok(Committed {
            deferred,
            ..self.bookkeeping(ledger)
        })
    }

    /// Stage 2: the open records, wave after wave, each behind a savepoint
    /// (see the module doc). The records left out, in offset order.
    /// `keys` are the records' keys, by position (None for poison).
    async fn apply_waves<'a>(
        &self,
        tx: &mut Tx,
        items: &'a [Item],
        keys: &[Option<OrderKey>],
        open: &[usize],
        outside: &Outside,
        ledger: &mut Ledger<'a>,
    ) -> Result<Vec<Deferred>, BatchError> {
        let unavailable = |e: sqlx::Error| BatchError::Unavailable(e.to_string());
        let keys: HashMap<usize, &OrderKey> = open
            .iter()
            .map(|&i| (i, keys[i].as_ref().expect("only decoded records are open")))
            .collect();
        let mut pending: VecDeque<Vec<usize>> = waves(open, &keys).into();
        let mut failed_keys: HashSet<&OrderKey> = HashSet::new();
        let mut deferred = Vec::new();
        // Once a wave met a redelivery, the batch's later waves (likely
        // redelivered too) claim with the result set at once.
        let mut recount = false;
        while let Some(mut wave) = pending.pop_front() {
            // Behind a failed record of its key: after it, once it is settled.
            wave.retain(|i| {
                let behind = failed_keys.contains(keys[i]);
                if behind {
                    deferred.push(Deferred {
                        index: *i,
                        error: None,
                    });
                }
                !behind
            });
            if wave.is_empty() {
                continue;
            }
            tx.savepoint().await.map_err(unavailable)?;
            // The records a handler failed, and whether the wave runs again
            // from its savepoint without them (else it is done: they were
            // taken out of it in place).
            let (failures, rerun) = match self.apply_wave(tx, items, &wave, outside, recount).await
            {
                Ok(Wave::Done(done, failures)) => {
                    ledger.merge(done);
                    (failures, false)
                }
                Ok(Wave::Recount) => {
                    tx.rollback_to_savepoint().await.map_err(unavailable)?;
                    recount = true;
                    pending.push_front(wave);
                    continue;
                }
                Ok(Wave::Failed(failures)) => (failures, true),
                Err(HandlerError::Unavailable(reason)) => {
                    return Err(BatchError::Unavailable(reason));
                }
                // A set statement refused (not a handler's verdict on one
                // event): find the record by applying the wave one at a time.
                Err(error) if wave.len() == 1 => (vec![(wave[0], error)], true),
                Err(_) => {
                    tx.rollback_to_savepoint().await.map_err(unavailable)?;
                    for index in wave.into_iter().rev() {
                        pending.push_front(vec![index]);
                    }
                    continue;
                }
            };
            if rerun {
                tx.rollback_to_savepoint().await.map_err(unavailable)?;
                wave.retain(|i| failures.iter().all(|(f, _)| f != i));
                pending.push_front(wave);
            }
            for (index, error) in failures {
                failed_keys.insert(keys[&index]);
                deferred.push(Deferred {
                    index,
                    error: Some(error),
                });
            }
        }
        deferred.sort_by_key(|d| d.index);
        Ok(deferred)
    }

    /// One attempt at a wave (records of distinct keys): released records
    /// leave `held_records`, then one claim and each handler's batch. The
    /// claim reads back which events are new only with `recount`; without,
    /// it only counts them, and a wave with a redelivery asks for a recount.
    async fn apply_wave<'a>(
        &self,
        tx: &mut Tx,
        items: &'a [Item],
        wave: &[usize],
        outside: &Outside,
        recount: bool,
    ) -> Result<Wave<'a>, HandlerError> {
        let started = Instant::now();
        let mut ledger = Ledger::default();
        let mut claiming = Vec::with_capacity(wave.len());
        for &index in wave {
            let item = &items[index];
            // The worker's and the background task's releases of a key may
            // race: the first delete wins, the other skips the record.
            if let Some(id) = item.held_id
                && !ordering::delete_held(tx, id).await?
            {
                ledger.note(
                    item,
                    envelope_of(item),
                    Outcome::AlreadyReleased,
                    Duration::ZERO,
                );
                continue;
            }
            claiming.push((index, origin(item, envelope_of(item))));
        }
        let claims: Vec<(&Envelope, &RecordOrigin)> = claiming
            .iter()
            .map(|(i, o)| (envelope_of(&items[*i]), o))
            .collect();
        let fresh = if recount {
            dedup::claim_batch(tx, self.group(), &claims).await?
        } else if dedup::claim_all(tx, self.group(), &claims).await? {
            vec![true; claims.len()]
        } else {
            return Ok(Wave::Recount);
        };
        let mut applying = Vec::with_capacity(claiming.len());
        for ((index, origin), fresh) in claiming.iter().zip(fresh) {
            let (item, envelope) = (&items[*index], envelope_of(&items[*index]));
            if fresh {
                applying.push(*index);
            } else {
                self.note_conflict(tx, envelope, origin, &mut ledger)
                    .await?;
                ledger.note(item, envelope, Outcome::Duplicate, Duration::ZERO);
            }
        }
        // Handler failures roll back to here: the wave's other claims stay.
        tx.inner_savepoint().await?;
        let mut failed = Vec::new();
        let delta = loop {
            let failures = match self.run_handlers(tx, items, &applying, outside).await? {
                Ok(delta) => break delta,
                Err(failures) => failures,
            };
            let none_left = failures.len() == applying.len();
            failed.extend(failures);
            // A released record's held row was deleted before the claim:
            // only the wave's own savepoint puts it back. And when no
            // record is left, that rollback is the cheaper way to undo all.
            if none_left || failed.iter().any(|(i, _)| items[*i].held_id.is_some()) {
                return Ok(Wave::Failed(failed));
            }
            tx.rollback_to_inner_savepoint().await?;
            // Every failure so far: the rollback undid the last unclaim too.
            let ids: Vec<_> = failed
                .iter()
                .map(|(i, _)| envelope_of(&items[*i]).event_id)
                .collect();
            dedup::unclaim(tx, self.group(), &ids).await?;
            applying.retain(|i| failed.iter().all(|(f, _)| f != i));
        };
        ledger.delta.merge(delta);
        let elapsed = started.elapsed();
        for &index in &applying {
            ledger.note(
                &items[index],
                envelope_of(&items[index]),
                Outcome::Applied,
                elapsed,
            );
        }
        tracing::debug!(records = applying.len(), "effects written");
        Ok(Wave::Done(ledger, failed))
    }

    /// Each handler's batch over the claimed records `applying`: the
    /// effects' counts, or the records the first failing handler refused
    /// (the handlers after it do not run on a wave about to be rolled back).
    async fn run_handlers(
        &self,
        tx: &mut Tx,
        items: &[Item],
        applying: &[usize],
        outside: &Outside,
    ) -> Result<Result<ConsumeSummary, Vec<(usize, HandlerError)>>, HandlerError> {
        let envelopes: Vec<&Envelope> = applying.iter().map(|&i| envelope_of(&items[i])).collect();
        let mut delta = ConsumeSummary::default();
        for (h, handler) in self.state.shared.options.handlers.iter().enumerate() {
            let results = if handler.acts_outside() {
                // Done before the transaction opened ([`super::outside`]).
                applying.iter().map(|&i| outside.result(i, h)).collect()
            } else {
                handler.apply_batch(tx, &envelopes).await?
            };
            let mut failures: Vec<(usize, HandlerError)> = Vec::new();
            for (&index, result) in applying.iter().zip(results) {
                match result {
                    Ok(effect) => delta.record_effect(handler.name(), effect),
                    Err(HandlerError::Unavailable(reason)) => {
                        return Err(HandlerError::Unavailable(reason));
                    }
                    Err(error) => failures.push((index, error)),
                }
            }
            if !failures.is_empty() {
                return Ok(Err(failures));
            }
        }
        Ok(Ok(delta))
    }

    /// Stage 1, the ordering gate, for a record read from Kafka whose key
    /// asks ([`PartitionState::gated`]), given its key's parked row (locked): held
    /// behind the head (the hold is written here), the head itself (noted
    /// for release), a redelivery, or open.
    async fn gate(
        &self,
        tx: &mut Tx,
        item: &Item,
        envelope: &Envelope,
        key: &OrderKey,
        parked: Option<&ordering::Parked>,
        ledger: &mut Ledger<'_>,
    ) -> Result<Gate, DbError> {
        let group = self.state.shared.options.group.as_str();
        let gate = ordering::decide(tx, group, parked, &item.message, Some(envelope)).await?;
        match gate {
            // Parked in this consumer's set but released elsewhere.
            Gate::Open if !self.state.is_retry_partition() => ledger.reopened.push(key.clone()),
            Gate::Open | Gate::Duplicate => {}
            Gate::Head => ledger.heads.push(key.clone()),
            Gate::Hold => ordering::hold(tx, group, key, &item.message, Some(envelope)).await?,
        }
        Ok(gate)
    }

    /// A skipped duplicate whose content differs from the event first
    /// applied under its id goes to the ledger (and `dedup_conflicts`).
    async fn note_conflict(
        &self,
        tx: &mut Tx,
        envelope: &Envelope,
        origin: &RecordOrigin,
        ledger: &mut Ledger<'_>,
    ) -> Result<(), DbError> {
        let conflict = dedup::check_duplicate(tx, self.group(), envelope, origin).await?;
        ledger.conflicts.extend(conflict);
        Ok(())
    }

    /// Stage 3: commits, unless the partition was revoked meanwhile (then
    /// rolls back: the next owner redoes the batch).
    async fn commit(&self, tx: Tx) -> Result<(), BatchError> {
        if let Err(revoked) = self.state.still_owned() {
            let _ = tx.rollback().await;
            return Err(revoked.into());
        }
        tx.commit()
            .await
            .map_err(|e| BatchError::Unavailable(e.to_string()))
    }

    /// Stage 4, after the commit: the activity clock, the summary, the
    /// consumer's parked set and the metrics. Leaves the heads to release.
    fn bookkeeping(&self, mut ledger: Ledger<'_>) -> Committed {
        let shared = &self.state.shared;
        let group = shared.options.group.as_str();
        shared.settled();
        ledger.delta.conflicting_duplicates = ledger.conflicts.len() as u64;
        shared
            .summary
            .lock()
            .expect("summary lock")
            .merge(ledger.delta);
        if !ledger.reopened.is_empty() {
            // Forget them. Only this main-partition worker parks its keys'
            // main-path failures, so none of them was parked again since.
            let mut parked = shared.parked.lock().expect("parked lock");
            for key in &ledger.reopened {
                parked.remove(key);
            }
        }
        if let Some(stamps) = &shared.options.commit_stamps {
            use rdkafka::Message;
            let events: Vec<(uuid::Uuid, Option<i64>)> = ledger
                .applied
                .iter()
                .map(|(item, envelope, _)| {
                    (envelope.event_id, item.message.timestamp().to_millis())
                })
                .collect();
            stamps.applied(&events);
        }
        let now = chrono::Utc::now();
        for (item, envelope, handler_time) in &ledger.applied {
            let _in_record = self.state.debug_span(&item.message, envelope).entered();
            Applied {
                metrics: &shared.applied_metrics,
                event_name: envelope.event_name.as_str(),
                handler_time: *handler_time,
                end_to_end: (now - envelope.event_time).to_std().ok(),
            }
            .emit();
        }
        let applied = ledger
            .applied
            .iter()
            .map(|(item, envelope, _)| (*item, *envelope));
        for (item, envelope) in applied.chain(ledger.duplicates.iter().copied()) {
            if item.held_id.is_some() {
                let _in_record = self.state.span(&item.message, Some(envelope)).entered();
                Released {
                    group,
                    event_name: envelope.event_name.as_str(),
                }
                .emit();
            }
        }
        for (item, envelope) in ledger.duplicates {
            let _in_record = self.state.debug_span(&item.message, envelope).entered();
            DuplicateSkipped {
                group,
                event_name: envelope.event_name.as_str(),
            }
            .emit();
        }
        for conflict in &ledger.conflicts {
            ConflictingDuplicate { conflict }.emit();
        }
        for (item, envelope) in ledger.held {
            let _in_record = self.state.span(&item.message, Some(envelope)).entered();
            Held {
                group,
                event_name: envelope.event_name.as_str(),
            }
            .emit();
        }
        Committed {
            heads: ledger.heads,
            deferred: Vec::new(),
        }
    }
}

/// The envelope of a record past decoding (poison never gets this far).
fn envelope_of(item: &Item) -> &Envelope {
    item.envelope
        .as_ref()
        .expect("only decoded records are applied")
}

/// Where the record came from, for its dedup row.
fn origin(item: &Item, envelope: &Envelope) -> RecordOrigin {
    RecordOrigin {
        topic: item.message.topic().to_string(),
        partition: item.message.partition(),
        offset: item.message.offset(),
        key: envelope.key(),
    }
}
