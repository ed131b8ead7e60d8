//! A batch's transaction, in stages with one job each:
//!
//! 1. **gate** ([`PartitionWorker::gate`]): per-key ordering; a record of a
//!    parked key is held behind its head, a head is noted for release, a
//!    released record leaves `held_records`;
//! 2. **dedup** ([`PartitionWorker::dedup`]): claims the event for the group
//!    (`event_dedup`); a redelivery is skipped, and noted if its content
//!    differs from the event first applied under its id;
//! 3. **handlers** ([`PartitionWorker::handlers`]): the business effects;
//! 4. **commit** ([`PartitionWorker::commit`]): only while the partition is
//!    still ours;
//! 5. **bookkeeping** ([`PartitionWorker::bookkeeping`]), after the commit:
//!    the summary, the consumer's parked set and the metrics.
//!
//! Stages 1–3 run per record, inside the one transaction, and collect what
//! stage 5 reports in a [`Ledger`].

use std::time::{Duration, Instant};

use rdkafka::Message;
use tracing::Instrument;

use super::{BatchError, Committed, ConsumeSummary, Item, PartitionWorker, RecordFailed};
use crate::consumer::handler::{Effect, HandlerError};
use crate::db::{DbError, Tx};
use crate::dedup::{self, Conflict, RecordOrigin};
use crate::envelope::Envelope;
use crate::consumer::events::{Applied, ConflictingDuplicate, DuplicateSkipped, Held};
use crate::metrics::InternalEvent;
use crate::ordering::{self, Gate};

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
    reopened: Vec<String>,
    /// Keys whose head was applied: release their followers.
    heads: Vec<String>,
    /// Released records another release had applied first.
    released_elsewhere: u64,
}

impl<'a> Ledger<'a> {
    fn note(&mut self, item: &'a Item, envelope: &'a Envelope, outcome: Outcome, elapsed: Duration) {
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
            Outcome::AlreadyReleased => self.released_elsewhere += 1,
        }
    }
}

impl PartitionWorker {
    /// One transaction for `items`: dedup rows and effects (or holds behind
    /// parked keys), committed together. Poison items are skipped.
    pub(super) async fn apply(&self, items: &[Item]) -> Result<Committed, BatchError> {
        let mut tx = self.shared.db.begin().await.map_err(|e| BatchError::Unavailable(e.to_string()))?;
        let mut ledger = Ledger::default();
        for (index, item) in items.iter().enumerate() {
            let Some(envelope) = &item.envelope else { continue };
            let started = Instant::now();
            // Every log line about this record carries its trace id.
            let outcome = self
                .apply_record(&mut tx, item, envelope, &mut ledger)
                .instrument(self.span(&item.message, Some(envelope)))
                .await
                .map_err(|error| match error {
                    HandlerError::Unavailable(reason) => BatchError::Unavailable(reason),
                    error => BatchError::Record(RecordFailed { index, error }),
                })?;
            ledger.note(item, envelope, outcome, started.elapsed());
        }
        self.commit(tx).await?;
        Ok(self.bookkeeping(ledger))
    }

    /// Stages 1–3 for one record.
    async fn apply_record<'a>(&self, tx: &mut Tx, item: &'a Item, envelope: &'a Envelope, ledger: &mut Ledger<'a>) -> Result<Outcome, HandlerError> {
        let origin = RecordOrigin {
            topic: item.message.topic().to_string(),
            partition: item.message.partition(),
            offset: item.message.offset(),
            key: envelope.key(),
        };
        if let Some(id) = item.held_id {
            // Stage 1 for a released record: it leaves `held_records`, unless
            // the worker's and the background task's releases raced and the
            // other one took it first.
            if !ordering::delete_held(tx, id).await? {
                return Ok(Outcome::AlreadyReleased);
            }
        } else {
            match self.gate(tx, item, envelope, &origin.key, ledger).await? {
                Gate::Hold => return Ok(Outcome::Held),
                Gate::Duplicate => {
                    self.note_conflict(tx, envelope, &origin, ledger).await?;
                    return Ok(Outcome::Duplicate);
                }
                Gate::Open | Gate::Head => {}
            }
        }
        if !self.dedup(tx, envelope, &origin, ledger).await? {
            return Ok(Outcome::Duplicate);
        }
        self.handlers(tx, envelope, &mut ledger.delta).await?;
        Ok(Outcome::Applied)
    }

    /// Stage 1, the ordering gate (for a record read from Kafka; a released
    /// one passes by leaving `held_records`): a record of a key that may be
    /// parked asks the table: held behind the head (the hold is written
    /// here), the head itself (noted for release), a redelivery, or open.
    async fn gate(&self, tx: &mut Tx, item: &Item, envelope: &Envelope, key: &str, ledger: &mut Ledger<'_>) -> Result<Gate, DbError> {
        if !(self.ordered() && (self.is_retry_partition() || self.shared.is_parked(key))) {
            return Ok(Gate::Open);
        }
        let group = self.shared.options.group.as_str();
        let gate = ordering::gate(tx, group, key, &item.message, Some(envelope)).await?;
        match gate {
            // Parked in this consumer's set but released elsewhere.
            Gate::Open if !self.is_retry_partition() => ledger.reopened.push(key.to_string()),
            Gate::Open | Gate::Duplicate => {}
            Gate::Head => ledger.heads.push(key.to_string()),
            Gate::Hold => ordering::hold(tx, group, key, &item.message, Some(envelope)).await?,
        }
        Ok(gate)
    }

    /// Stage 2, dedup: claims the event for this group; false if the group
    /// applied it before (a redelivery).
    async fn dedup(&self, tx: &mut Tx, envelope: &Envelope, origin: &RecordOrigin, ledger: &mut Ledger<'_>) -> Result<bool, DbError> {
        let fresh = dedup::claim(tx, &self.shared.options.group, envelope, origin).await?;
        if !fresh {
            tracing::debug!("duplicate: already applied by this group");
            self.note_conflict(tx, envelope, origin, ledger).await?;
        }
        Ok(fresh)
    }

    /// A skipped duplicate whose content differs from the event first
    /// applied under its id goes to the ledger (and `dedup_conflicts`).
    async fn note_conflict(&self, tx: &mut Tx, envelope: &Envelope, origin: &RecordOrigin, ledger: &mut Ledger<'_>) -> Result<(), DbError> {
        let conflict = dedup::check_duplicate(tx, &self.shared.options.group, envelope, origin).await?;
        ledger.conflicts.extend(conflict);
        Ok(())
    }

    /// Stage 3: every handler's effect, in order.
    async fn handlers(&self, tx: &mut Tx, envelope: &Envelope, delta: &mut ConsumeSummary) -> Result<(), HandlerError> {
        for handler in &self.shared.options.handlers {
            let effect: Effect = handler.apply(tx, envelope).await?;
            delta.record_effect(handler.name(), effect);
        }
        tracing::debug!("effects written");
        Ok(())
    }

    /// Stage 4: commits, unless the partition was revoked meanwhile (then
    /// rolls back: the next owner redoes the batch).
    async fn commit(&self, tx: Tx) -> Result<(), BatchError> {
        if let Err(revoked) = self.still_owned() {
            let _ = tx.rollback().await;
            return Err(revoked.into());
        }
        tx.commit().await.map_err(|e| BatchError::Unavailable(e.to_string()))
    }

    /// Stage 5, after the commit: the activity clock, the summary, the
    /// consumer's parked set and the metrics. Leaves the heads to release.
    fn bookkeeping(&self, mut ledger: Ledger<'_>) -> Committed {
        let shared = &self.shared;
        let group = shared.options.group.as_str();
        if let Some((_, last)) = shared.active.lock().expect("active lock").as_mut() {
            *last = Instant::now();
        }
        ledger.delta.conflicting_duplicates = ledger.conflicts.len() as u64;
        shared.summary.lock().expect("summary lock").merge(ledger.delta);
        if !ledger.reopened.is_empty() {
            // Forget them. Only this main-partition worker parks its keys'
            // main-path failures, so none of them was parked again since.
            let mut parked = shared.parked.lock().expect("parked lock");
            for key in &ledger.reopened {
                parked.remove(key);
            }
        }
        let now = chrono::Utc::now();
        for (item, envelope, handler_time) in ledger.applied {
            let _in_record = self.span(&item.message, Some(envelope)).entered();
            Applied {
                group,
                event_name: envelope.event_name.as_str(),
                handler_time,
                end_to_end: (now - envelope.event_time).to_std().ok(),
            }
            .emit();
        }
        for (item, envelope) in ledger.duplicates {
            let _in_record = self.span(&item.message, Some(envelope)).entered();
            DuplicateSkipped { group, event_name: envelope.event_name.as_str() }.emit();
        }
        for conflict in &ledger.conflicts {
            ConflictingDuplicate { conflict }.emit();
        }
        for (item, envelope) in ledger.held {
            let _in_record = self.span(&item.message, Some(envelope)).entered();
            Held { group, event_name: envelope.event_name.as_str() }.emit();
        }
        Committed { heads: ledger.heads, released_elsewhere: ledger.released_elsewhere }
    }
}
