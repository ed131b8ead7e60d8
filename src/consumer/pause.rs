//! Pausing a partition on the consumer, for one reason or several.
//!
//! Two parties pause a partition: the dispatcher, while the partition's
//! worker's queue is full (`dispatch`), and the worker itself, while it waits
//! for a retry-topic record's due time (`worker`). Both go through
//! [`Pauses`]: a partition is paused while any reason holds, for the
//! generation of the assignment that set it, and resumed only when none is
//! left. Both depend on this module; it depends on neither.

use std::collections::HashMap;

use rdkafka::TopicPartitionList;
use rdkafka::consumer::Consumer;

use super::Shared;
use super::assignment::PartitionKey;
use super::events;

/// Why a partition is paused on the consumer. Several reasons can hold at
/// once; the partition is resumed when none is left.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PauseReason {
    /// Its worker's queue is full: the dispatcher holds records in the overflow.
    QueueFull,
    /// Its worker waits for a retry-topic record's due time.
    DueWait,
    /// An operator paused the group (`orderpipe group pause`).
    Operator,
}

impl PauseReason {
    fn bit(self) -> u8 {
        match self {
            Self::QueueFull => 1,
            Self::DueWait => 2,
            Self::Operator => 4,
        }
    }
}

/// What a change of pause reasons asks of the consumer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PauseChange {
    /// The first reason: pause the partition.
    Pause,
    /// The last reason went: resume it.
    Resume,
    /// Nothing to do.
    Keep,
}

/// The paused partitions: for each, the assignment generation that paused
/// it and the reasons (a bit set of [`PauseReason`]).
///
/// A reason set by an older generation (a worker of a partition revoked
/// and assigned again) never holds back the new one: a newer generation
/// replaces the entry, an older one changes nothing.
#[derive(Debug, Default)]
pub(crate) struct Pauses {
    paused: HashMap<PartitionKey, (u64, u8)>,
}

impl Pauses {
    /// Adds `reason` for `key` under `generation`.
    pub(crate) fn add(
        &mut self,
        key: &PartitionKey,
        generation: u64,
        reason: PauseReason,
    ) -> PauseChange {
        match self.paused.get_mut(key) {
            Some((held, _)) if *held > generation => PauseChange::Keep,
            Some((held, reasons)) if *held == generation => {
                *reasons |= reason.bit();
                PauseChange::Keep
            }
            _ => {
                self.paused.insert(key.clone(), (generation, reason.bit()));
                PauseChange::Pause
            }
        }
    }

    /// Removes `reason` for `key` under `generation`.
    pub(crate) fn remove(
        &mut self,
        key: &PartitionKey,
        generation: u64,
        reason: PauseReason,
    ) -> PauseChange {
        let Some((held, reasons)) = self.paused.get_mut(key) else {
            return PauseChange::Keep;
        };
        if *held != generation {
            return PauseChange::Keep;
        }
        *reasons &= !reason.bit();
        if *reasons != 0 {
            return PauseChange::Keep;
        }
        self.paused.remove(key);
        PauseChange::Resume
    }

    /// Forgets the entries of generations no longer current (`current`
    /// gives a partition's generation if it is owned). Returns the
    /// partitions owned now under another generation: resume them, so a
    /// pause left by a revoked worker does not stop the new one.
    pub(crate) fn forget_stale(
        &mut self,
        current: impl Fn(&PartitionKey) -> Option<u64>,
    ) -> Vec<PartitionKey> {
        let mut resume = Vec::new();
        self.paused.retain(|key, (held, _)| match current(key) {
            Some(generation) if generation == *held => true,
            Some(_) => {
                resume.push(key.clone());
                false
            }
            None => false,
        });
        resume
    }

    /// Partitions paused now.
    pub(crate) fn len(&self) -> usize {
        self.paused.len()
    }
}

impl Shared {
    /// Pauses `key` for `reason` (unless `generation` is no longer its owner).
    pub(crate) fn pause_partition(&self, key: &PartitionKey, generation: u64, reason: PauseReason) {
        let mut pauses = self.pauses.lock().expect("pauses lock");
        if !self.assignment.is_current(key, generation) {
            return;
        }
        let change = pauses.add(key, generation, reason);
        self.apply_pause_change(key, change, pauses.len());
    }

    /// Drops `reason` for `key`; resumes it when no reason is left.
    pub(crate) fn resume_partition(
        &self,
        key: &PartitionKey,
        generation: u64,
        reason: PauseReason,
    ) {
        let mut pauses = self.pauses.lock().expect("pauses lock");
        let change = pauses.remove(key, generation, reason);
        self.apply_pause_change(key, change, pauses.len());
    }

    /// Resumes partitions a revoked generation left paused.
    pub(crate) fn forget_stale_pauses(&self) {
        let mut pauses = self.pauses.lock().expect("pauses lock");
        for key in pauses.forget_stale(|key| self.assignment.generation(key)) {
            self.apply_pause_change(&key, PauseChange::Resume, pauses.len());
        }
        events::paused_partitions(&self.options.group, pauses.len());
    }

    /// Pauses or resumes on the consumer (called with the pauses lock held,
    /// so the consumer sees changes in the order they were decided).
    fn apply_pause_change(&self, key: &PartitionKey, change: PauseChange, paused: usize) {
        if change == PauseChange::Keep {
            return;
        }
        let mut list = TopicPartitionList::new();
        list.add_partition(&key.0, key.1);
        let done = if change == PauseChange::Pause {
            self.consumer.pause(&list)
        } else {
            self.consumer.resume(&list)
        };
        if let Err(e) = done {
            // Revoked meanwhile: the partition is no longer this consumer's.
            tracing::debug!(topic = %key.0, partition = key.1, ?change, error = %e, "pause state not changed");
        }
        events::paused_partitions(&self.options.group, paused);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key() -> PartitionKey {
        ("orders".into(), 3)
    }

    #[test]
    fn a_partition_paused_for_two_reasons_is_resumed_only_when_both_are_gone() {
        let mut pauses = Pauses::default();
        assert_eq!(
            pauses.add(&key(), 1, PauseReason::DueWait),
            PauseChange::Pause
        );
        assert_eq!(
            pauses.add(&key(), 1, PauseReason::QueueFull),
            PauseChange::Keep
        );
        // The worker's due time passed: the dispatcher's overflow still holds it.
        assert_eq!(
            pauses.remove(&key(), 1, PauseReason::DueWait),
            PauseChange::Keep
        );
        assert_eq!(pauses.len(), 1);
        assert_eq!(
            pauses.remove(&key(), 1, PauseReason::QueueFull),
            PauseChange::Resume
        );
        assert_eq!(pauses.len(), 0);
        // And the other way round.
        assert_eq!(
            pauses.add(&key(), 1, PauseReason::QueueFull),
            PauseChange::Pause
        );
        assert_eq!(
            pauses.add(&key(), 1, PauseReason::DueWait),
            PauseChange::Keep
        );
        assert_eq!(
            pauses.remove(&key(), 1, PauseReason::QueueFull),
            PauseChange::Keep
        );
        assert_eq!(
            pauses.remove(&key(), 1, PauseReason::DueWait),
            PauseChange::Resume
        );
        // Removing a reason that does not hold changes nothing.
        assert_eq!(
            pauses.remove(&key(), 1, PauseReason::DueWait),
            PauseChange::Keep
        );
    }

    #[test]
    fn an_older_generation_neither_resumes_nor_holds_back_a_newer_one() {
        let mut pauses = Pauses::default();
        assert_eq!(
            pauses.add(&key(), 1, PauseReason::DueWait),
            PauseChange::Pause
        );
        // Revoked and assigned again: generation 2 pauses for its own reason.
        assert_eq!(
            pauses.add(&key(), 2, PauseReason::QueueFull),
            PauseChange::Pause
        );
        // The old worker's wait ends: generation 2 stays paused.
        assert_eq!(
            pauses.remove(&key(), 1, PauseReason::DueWait),
            PauseChange::Keep
        );
        assert_eq!(
            pauses.add(&key(), 1, PauseReason::DueWait),
            PauseChange::Keep
        );
        assert_eq!(
            pauses.remove(&key(), 2, PauseReason::QueueFull),
            PauseChange::Resume
        );
    }

    #[test]
    fn a_pause_left_by_a_revoked_generation_is_forgotten_and_resumed() {
        let mut pauses = Pauses::default();
        let other: PartitionKey = ("orders".into(), 4);
        pauses.add(&key(), 1, PauseReason::DueWait);
        pauses.add(&other, 5, PauseReason::QueueFull);
        // Partition 3 is owned under generation 7 now; 4 is still generation 5's.
        let resume = pauses.forget_stale(|k| Some(if k.1 == 3 { 7 } else { 5 }));
        assert_eq!(resume, vec![key()]);
        assert_eq!(pauses.len(), 1);
        // Not owned at all: forgotten, nothing to resume.
        assert!(pauses.forget_stale(|_| None).is_empty());
        assert_eq!(pauses.len(), 0);
    }
}
