//! Which partitions this group member owns right now.
//!
//! librdkafka calls the context on rebalance. Every assignment of a
//! partition gets a new generation number; a worker remembers the
//! generation it was started for and checks it before committing, so work
//! for a partition that was revoked (and maybe reassigned elsewhere) is
//! rolled back instead of committed. Dedup would catch the duplicate anyway;
//! this keeps the contract "never apply a record of a partition the
//! consumer no longer owns".

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use rdkafka::ClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext, Rebalance};
use rdkafka::error::KafkaError;
use rdkafka::types::RDKafkaRespErr;

use super::coordinator_watch::CoordinatorWatch;
use crate::health::HealthState;

/// (topic, partition).
pub type PartitionKey = (String, i32);

/// The current assignment with a generation per partition.
pub struct Assignment {
    owned: Mutex<HashMap<PartitionKey, u64>>,
    changed_at: Mutex<Option<std::time::Instant>>,
    next_generation: AtomicU64,
    health: Arc<HealthState>,
}

impl Assignment {
    /// Nothing assigned yet.
    pub fn new(health: Arc<HealthState>) -> Self {
        Self {
            owned: Mutex::new(HashMap::new()),
            changed_at: Mutex::new(None),
            next_generation: AtomicU64::new(1),
            health,
        }
    }

    /// The generation of `key` if this member owns it.
    pub fn generation(&self, key: &PartitionKey) -> Option<u64> {
        self.owned
            .lock()
            .expect("assignment lock")
            .get(key)
            .copied()
    }

    /// True if `key` is still owned under `generation`.
    pub fn is_current(&self, key: &PartitionKey, generation: u64) -> bool {
        self.generation(key) == Some(generation)
    }

    /// Time since the assignment last changed; None before the first
    /// rebalance (a member still joining the group is not idle).
    pub fn since_change(&self) -> Option<std::time::Duration> {
        self.changed_at
            .lock()
            .expect("assignment lock")
            .map(|t| t.elapsed())
    }

    fn touch(&self) {
        *self.changed_at.lock().expect("assignment lock") = Some(std::time::Instant::now());
    }

    fn assign(&self, keys: impl Iterator<Item = PartitionKey>) {
        let mut owned = self.owned.lock().expect("assignment lock");
        for key in keys {
            let generation = self.next_generation.fetch_add(1, Ordering::SeqCst);
            owned.insert(key, generation);
        }
        self.health.set_assigned(owned.len());
        self.touch();
    }

    fn revoke(&self, keys: impl Iterator<Item = PartitionKey>) {
        let mut owned = self.owned.lock().expect("assignment lock");
        for key in keys {
            owned.remove(&key);
        }
        self.health.set_assigned(owned.len());
        self.touch();
    }
}

/// The librdkafka context that keeps [`Assignment`] up to date, and gives
/// the statistics to the member's [`CoordinatorWatch`].
pub struct AssignmentContext {
    assignment: Arc<Assignment>,
    /// This member's per-partition lag gauges; a revoked partition's goes at once.
    pub lag_gauges: crate::lag::PartitionLagGauges,
    coordinator: Arc<CoordinatorWatch>,
    /// The group runs the cooperative protocol (an incremental
    /// `partition.assignment.strategy`), as configured.
    cooperative: bool,
}

impl AssignmentContext {
    /// A context updating `assignment` for a member of `group` created
    /// with `config`.
    pub(crate) fn new(
        assignment: Arc<Assignment>,
        group: &str,
        coordinator: Arc<CoordinatorWatch>,
        config: &rdkafka::ClientConfig,
    ) -> Self {
        let strategy = config.get("partition.assignment.strategy").unwrap_or("");
        Self {
            assignment,
            lag_gauges: crate::lag::PartitionLagGauges::new(group),
            coordinator,
            cooperative: strategy.contains("cooperative"),
        }
    }
}

impl ClientContext for AssignmentContext {
    fn stats(&self, statistics: rdkafka::Statistics) {
        crate::kafka::client::kafka_statistics(&statistics);
        self.coordinator.observe(&statistics);
    }
}

fn keys(list: &rdkafka::TopicPartitionList) -> impl Iterator<Item = PartitionKey> + '_ {
    list.elements()
        .into_iter()
        .map(|e| (e.topic().to_string(), e.partition()))
}

impl ConsumerContext for AssignmentContext {
    /// rdkafka's own `rebalance`, but with the protocol this member was
    /// configured with instead of asking librdkafka for it: that question is
    /// a request to the group's thread, and a consumer closing (a SIGTERM)
    /// that gets its last revoke while the group handler is gone waits for
    /// the answer forever (librdkafka #4041; seen in the serial ordering
    /// test: a member hung in `rd_kafka_rebalance_protocol` on drop).
    fn rebalance(
        &self,
        consumer: &BaseConsumer<Self>,
        err: RDKafkaRespErr,
        partitions: &mut rdkafka::TopicPartitionList,
    ) {
        let partitions = &*partitions;
        let rebalance = match err {
            RDKafkaRespErr::RD_KAFKA_RESP_ERR__ASSIGN_PARTITIONS => Rebalance::Assign(partitions),
            RDKafkaRespErr::RD_KAFKA_RESP_ERR__REVOKE_PARTITIONS => Rebalance::Revoke(partitions),
            other => Rebalance::Error(KafkaError::Rebalance(other.into())),
        };
        self.pre_rebalance(consumer, &rebalance);
        let done = match (&rebalance, self.cooperative) {
            (Rebalance::Assign(list), true) => consumer.incremental_assign(list),
            (Rebalance::Assign(list), false) => consumer.assign(list),
            (Rebalance::Revoke(list), true) => consumer.incremental_unassign(list),
            _ => consumer.unassign(),
        };
        if let Err(error) = done {
            tracing::warn!(%error, "rebalance not applied");
        }
        self.post_rebalance(consumer, &rebalance);
    }

    fn pre_rebalance(&self, _: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        match rebalance {
            Rebalance::Revoke(list) => {
                tracing::info!(partitions = list.count(), "partitions revoked");
                self.assignment.revoke(keys(list));
                for (topic, partition) in keys(list) {
                    self.lag_gauges.revoked(&topic, partition);
                }
            }
            Rebalance::Assign(_) => {}
            Rebalance::Error(e) => tracing::warn!(error = %e, "rebalance error"),
        }
    }

    fn post_rebalance(&self, _: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        if let Rebalance::Assign(list) = rebalance {
            tracing::info!(partitions = list.count(), "partitions assigned");
            self.assignment.assign(keys(list));
        }
    }
}
