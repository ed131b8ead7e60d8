//! The state the dispatcher, the workers and the background tasks of one
//! group member share.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use rdkafka::consumer::StreamConsumer;

use super::assignment::{Assignment, AssignmentContext, PartitionKey};
use super::options::ConsumeOptions;
use super::pause;
use super::summary::ConsumeSummary;
use crate::codec::Codec;
use crate::db::Db;
use crate::health::HealthState;
use crate::retry::Forwarder;

/// Shared by the dispatcher and the workers.
pub(crate) struct Shared {
    pub consumer: StreamConsumer<AssignmentContext>,
    pub codec: Codec,
    pub forwarder: Forwarder,
    pub db: Db,
    pub options: ConsumeOptions,
    pub assignment: Arc<Assignment>,
    pub summary: Mutex<ConsumeSummary>,
    pub health: Arc<HealthState>,
    /// Records dispatched and not yet finished (applied, forwarded or
    /// dropped on revoke), per partition.
    pub in_flight: Mutex<HashMap<PartitionKey, usize>>,
    pub batch_size: usize,
    /// `consumer.overflow_batches`.
    pub overflow_batches: usize,
    /// `consumer.batch_linger_ms`.
    pub batch_linger: std::time::Duration,
    /// First record received, last batch settled (committed, or its
    /// failures forwarded): the span `active_secs` reports.
    pub active: Mutex<Option<(Instant, Instant)>>,
    /// Keys this consumer knows to be parked (mode `key`): only records of
    /// these keys, and retry-topic records, consult `parked_keys`.
    pub parked: Mutex<crate::ordering::ParkedSet>,
    /// Partitions paused on the consumer, and why (see `pause`).
    pub pauses: Mutex<pause::Pauses>,
    /// An operator's pause of the group is in force, as last read ([`super::group_pause`]).
    pub operator_paused: std::sync::atomic::AtomicBool,
    /// One release of a key at a time in this process (see [`Shared::release_locks`]).
    pub release_locks: ReleaseLocks,
    /// The group's metrics of applied records.
    pub applied_metrics: super::events::AppliedMetrics,
}

/// Locks that serialize the releases of a key in one consumer: the worker
/// that applied a head and the background release can both start releasing
/// it. Run together, both would read the same held record and, for an HTTP
/// effect (made before the database transaction), both POST it; one then
/// finds it applied. Striped by the key's hash: releases are rare (the
/// failure path), so sharing a stripe costs nothing that matters.
pub(crate) struct ReleaseLocks([tokio::sync::Mutex<()>; RELEASE_STRIPES]);

const RELEASE_STRIPES: usize = 64;

impl Default for ReleaseLocks {
    fn default() -> Self {
        Self(std::array::from_fn(|_| tokio::sync::Mutex::new(())))
    }
}

impl Shared {
    /// Moves the activity clock's end to now: a batch is settled.
    pub(crate) fn settled(&self) {
        if let Some((_, last)) = self.active.lock().expect("active lock").as_mut() {
            *last = Instant::now();
        }
    }

    /// Held while releasing `keys`: a second release of one of them waits,
    /// then finds what the first applied gone from `held_records`. The
    /// stripes are taken once each and in ascending order, so two releases
    /// of overlapping sets never wait on each other.
    pub(crate) async fn release_locks(
        &self,
        keys: &[crate::ordering::OrderKey],
    ) -> Vec<tokio::sync::MutexGuard<'_, ()>> {
        use std::hash::{BuildHasher, BuildHasherDefault, DefaultHasher};
        let hasher = BuildHasherDefault::<DefaultHasher>::default();
        let stripes: std::collections::BTreeSet<usize> = keys
            .iter()
            .map(|key| hasher.hash_one(key) as usize % RELEASE_STRIPES)
            .collect();
        let mut guards = Vec::with_capacity(stripes.len());
        for stripe in stripes {
            guards.push(self.release_locks.0[stripe].lock().await);
        }
        guards
    }

    /// Adds `delta` records to a partition's in-flight count.
    pub(crate) fn in_flight_change(&self, key: &PartitionKey, delta: isize) {
        let mut map = self.in_flight.lock().expect("in-flight lock");
        // Not `entry`: it takes an owned key, a String copy per record.
        match map.get_mut(key) {
            Some(n) => *n = n.saturating_add_signed(delta),
            None => {
                map.insert(key.clone(), 0usize.saturating_add_signed(delta));
            }
        }
    }

    /// Whether `key` of `topic` is in this consumer's parked set.
    pub(crate) fn is_parked(&self, topic: &str, key: &str) -> bool {
        self.parked
            .lock()
            .expect("parked lock")
            .contains(topic, key)
    }

    pub(super) fn in_flight_total(&self) -> usize {
        self.in_flight
            .lock()
            .expect("in-flight lock")
            .values()
            .sum()
    }

    pub(super) fn in_flight(&self, key: &PartitionKey) -> usize {
        self.in_flight
            .lock()
            .expect("in-flight lock")
            .get(key)
            .copied()
            .unwrap_or(0)
    }
}
