//! Pausing a subscription or a whole downstream consumer (`orderpipe subs
//! pause|resume`, `POST /subscriptions/{id}/pause`, `/consumers/{name}/pause`):
//! the groups that serve it, paused as groups ([`crate::consumer::group_pause`]).
//!
//! A group is one ordered stream to its downstream: the subscriptions of a
//! consumer that share a bind key share it. Holding one subscription's
//! changes while the others of its group flow on would reorder what the
//! downstream sees, so a subscription's pause is its group's, and the answer
//! names every subscription it holds. A consumer's pause is the pause of
//! each of its groups (a downstream down for maintenance).

use std::collections::BTreeMap;

use serde::Serialize;

use super::SubsError;
use super::store::{Store, SubscriptionQuery};
use crate::consumer::group_pause::{self, GroupPause};

/// What to pause: a downstream consumer (by name) or one subscription (by id).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PauseTarget {
    /// Every group of the consumer.
    Consumer(String),
    /// The group serving the subscription.
    Subscription(i64),
}

/// One group a pause or resume acted on.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct GroupAction {
    /// The consumer group.
    pub group: String,
    /// Every subscription the group serves (the pause holds them all).
    pub subscriptions: Vec<i64>,
    /// The pause now in force (after a pause), if any.
    pub pause: Option<GroupPause>,
    /// Whether it was paused before (after a resume).
    pub was_paused: bool,
}

/// The groups serving `target`, each with every subscription it serves
/// (enabled or not: a disabled one comes back into the same group).
pub async fn groups(
    store: &Store,
    target: &PauseTarget,
) -> Result<BTreeMap<String, Vec<i64>>, SubsError> {
    let chosen: Vec<String> = match target {
        PauseTarget::Subscription(id) => vec![store.subscription(*id).await?.group],
        PauseTarget::Consumer(name) => {
            store.consumer(name).await?;
            let query = SubscriptionQuery {
                consumer: Some(name.clone()),
                ..SubscriptionQuery::default()
            };
            store
                .list_subscriptions(&query)
                .await?
                .into_iter()
                .map(|s| s.group)
                .collect()
        }
    };
    let mut groups: BTreeMap<String, Vec<i64>> =
        chosen.into_iter().map(|g| (g, Vec::new())).collect();
    for s in store
        .list_subscriptions(&SubscriptionQuery::default())
        .await?
    {
        if let Some(ids) = groups.get_mut(&s.group) {
            ids.push(s.id);
        }
    }
    Ok(groups)
}

/// Pauses every group serving `target`.
#[tracing::instrument(skip(store))]
pub async fn pause(
    store: &Store,
    target: &PauseTarget,
    until_ms: Option<i64>,
    paused_by: &str,
    reason: &str,
) -> Result<Vec<GroupAction>, SubsError> {
    let mut done = Vec::new();
    for (group, subscriptions) in groups(store, target).await? {
        let was_paused = group_pause::active(store.db(), &group).await?.is_some();
        let pause = group_pause::pause(store.db(), &group, until_ms, paused_by, reason).await?;
        tracing::info!(
            group,
            ?subscriptions,
            paused_by,
            reason,
            "subscription group paused"
        );
        done.push(GroupAction {
            group,
            subscriptions,
            pause: Some(pause),
            was_paused,
        });
    }
    Ok(done)
}

/// Resumes every group serving `target`.
#[tracing::instrument(skip(store))]
pub async fn resume(store: &Store, target: &PauseTarget) -> Result<Vec<GroupAction>, SubsError> {
    let mut done = Vec::new();
    for (group, subscriptions) in groups(store, target).await? {
        let was_paused = group_pause::resume(store.db(), &group).await?;
        tracing::info!(
            group,
            ?subscriptions,
            was_paused,
            "subscription group resumed"
        );
        done.push(GroupAction {
            group,
            subscriptions,
            pause: None,
            was_paused,
        });
    }
    Ok(done)
}
