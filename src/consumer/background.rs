//! The background tasks of a group member, beside its dispatcher: the lag
//! report and the release of parked keys no worker will meet.

use std::sync::Arc;
use std::time::Duration;

use rdkafka::Offset;
use rdkafka::consumer::Consumer;

use super::shared::Shared;
use super::worker::PartitionWorker;
use crate::kafka::offsets::offsets_at;

/// Every 5 s: lag per assigned partition (the end of the partition minus
/// the committed offset) into the gauges and, summed, into `/health/mq`. The
/// gauges hold only the partitions owned now: a revoked partition's series
/// goes at the revoke (see [`crate::lag::PartitionLagGauges`]).
///
/// A transactional producer leaves a commit marker after each transaction;
/// it takes an offset but is never delivered, so a caught-up partition
/// would show a lag of 1 forever. When nothing of a partition is in flight,
/// everything fetched so far was applied, so the fetch position (past the
/// marker) is used instead of the committed offset.
pub(super) async fn report_lag(shared: Arc<Shared>) {
    loop {
        tokio::time::sleep(Duration::from_secs(5)).await;
        let s = shared.clone();
        let lags = tokio::task::spawn_blocking(move || partition_lags(&s))
            .await
            .ok()
            .flatten();
        if let Some(mut lags) = lags {
            shared.health.set_lag(lags.iter().map(|l| l.2).sum());
            // A partition revoked while this was measured gets no series back.
            lags.retain(|(topic, partition, _)| {
                shared
                    .assignment
                    .generation(&(topic.clone(), *partition))
                    .is_some()
            });
            shared.consumer.context().lag_gauges.report(&lags);
        }
    }
}

/// Each assigned partition's lag, or none when the broker did not answer.
///
/// The ends (and, where nothing is committed yet, the starts) are read for
/// every partition at once ([`offsets_at`]): one request per partition
/// waited behind a caught-up member's held fetch each (500 ms), 24
/// partitions took 12 s, and a stopping member waited for it.
fn partition_lags(s: &Shared) -> Option<Vec<(String, i32, i64)>> {
    let assignment = s.consumer.assignment().ok()?;
    let committed = s.consumer.committed_offsets(assignment, LAG_TIMEOUT).ok()?;
    let positions = s.consumer.position().ok()?;
    let elements = committed.elements();
    // Nothing assigned: nothing behind (an empty answer, lag 0).
    let ends = offsets_at(
        &s.consumer,
        elements.iter().map(|e| (e.topic(), e.partition())),
        Offset::End,
        LAG_TIMEOUT,
    )
    .ok()?;
    let starts = offsets_at(
        &s.consumer,
        elements
            .iter()
            .filter(|e| !matches!(e.offset(), Offset::Offset(_)))
            .map(|e| (e.topic(), e.partition())),
        Offset::Beginning,
        LAG_TIMEOUT,
    )
    .ok()?;
    let mut lags = Vec::with_capacity(elements.len());
    for e in elements {
        let key = (e.topic().to_string(), e.partition());
        let committed = match e.offset() {
            Offset::Offset(o) => o,
            _ => *starts.get(&key)?,
        };
        let position = positions
            .find_partition(e.topic(), e.partition())
            .and_then(|p| match p.offset() {
                Offset::Offset(o) => Some(o),
                _ => None,
            });
        let from = match position {
            Some(p) if p > committed && s.in_flight(&key) == 0 => p,
            _ => committed,
        };
        let end = *ends.get(&key)?;
        lags.push((key.0, key.1, (end - from).max(0)));
    }
    Some(lags)
}

/// How long one lag measurement's requests may take.
const LAG_TIMEOUT: Duration = Duration::from_secs(5);

/// Every 2 s (mode `key`): the parked-key gauges, and releases that no
/// worker will start by itself: heads an operator ignored with
/// `--release-followers`, and heads applied just before a crash.
pub(super) async fn release_parked(shared: Arc<Shared>) {
    if !shared.options.keeps_key_order() {
        return;
    }
    let group = shared.options.group.clone();
    loop {
        match crate::ordering::gauges(&shared.db, &group).await {
            Ok(gauges) => gauges.report(&group),
            Err(e) => tracing::debug!(error = %e, "parked-key gauges not read"),
        }
        let keys = crate::ordering::releasable(&shared.db, &group)
            .await
            .unwrap_or_else(|e| {
                tracing::debug!(error = %e, "releasable keys not read");
                Vec::new()
            });
        for (key, partition) in keys {
            // Only the owner of the key's partition (of its topic) releases it.
            let pk = (key.topic.clone(), partition);
            if let Some(generation) = shared.assignment.generation(&pk) {
                // Revoked meanwhile: the partition's next owner releases it.
                let _ = PartitionWorker::new(shared.clone(), pk, generation)
                    .release([key])
                    .await;
            }
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
}
