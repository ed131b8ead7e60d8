//! Gauges read from the database, exported by the roles that run anyway.
//!
//! A gauge exported by one role only goes silent when that role is down: a
//! dead-letter alert that relies on the DLQ persister alone says nothing
//! exactly when the persister is the thing that broke. So [`export`] runs
//! in the persister for every group ([`Scope::AllGroups`]) and in every
//! `consume` and `deliver` process for its own group ([`Scope::Group`]);
//! alerts take `max by (group, event_name, class)` over the copies.
//!
//! Each tick runs every gauge's query once ([`tick`]). Today that is
//! [`dead_letters_pending`]: `orderpipe_dead_letters_pending{group,
//! event_name, class}`, the pending rows of `dead_letters`. Its labels are
//! bounded: `class` is one of [`super::ERROR_CLASSES`] or `other`;
//! `event_name` one of the known events ([`KNOWN_EVENTS`]), `undecodable`
//! (no event name header) or `other`; and one process exports at most
//! [`MAX_SERIES`] series, the smallest folded into one `other` series. A
//! series goes from `/metrics` when its count drops to 0. A failed query
//! keeps the last values (and logs a warning): the database's own health
//! is on `/health/ready`.
//!
//! The same tick exports the latest `orderpipe reconcile` run of each group
//! ([`crate::reconcile::export_gauges`]: `orderpipe_reconcile_missing_events`,
//! `orderpipe_reconcile_applied_not_in_topic`,
//! `orderpipe_reconcile_last_run_timestamp_seconds`, labelled by group).
//!
//! The persister's tick also exports `orderpipe_group_paused{group}` = 1 for
//! each group an operator paused ([`crate::consumer::group_pause`]).
//!
//! Another gauge read from the database joins by adding its query to
//! [`tick`], writing its series through the same [`SeriesOwner`].

use std::collections::BTreeMap;
use std::time::Duration;

use sqlx::{Any, QueryBuilder};

use crate::db::{Db, DbError};
use crate::envelope::data::KNOWN_EVENTS;
use crate::metrics::{Labels, SeriesOwner, name};

/// Series one process exports of a labelled gauge, at most (the rest are
/// summed into one `other` series).
pub const MAX_SERIES: usize = 50;

/// Label value of what the bounds fold away.
pub const OTHER: &str = "other";

/// Label value of dead letters without an event name (undecodable records).
pub const UNDECODABLE: &str = "undecodable";

/// Which groups a process exports gauges for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Scope {
    /// Every group (the DLQ persister).
    AllGroups,
    /// One group (a `consume` or `deliver` member: its own).
    Group(String),
}

impl Scope {
    /// The group this scope is limited to, if any.
    pub fn group(&self) -> Option<&str> {
        match self {
            Self::AllGroups => None,
            Self::Group(g) => Some(g),
        }
    }
}

/// Exports the database gauges of `scope` every `every` (or ten times the
/// last tick's duration, if longer), forever (abort the task to stop). `db` is best a pool of its own (one connection is
/// enough), so the queries never wait behind a consumer's workers.
pub async fn export(db: Db, scope: Scope, every: Duration) {
    let owner = SeriesOwner::default();
    loop {
        let started = std::time::Instant::now();
        tick(&db, &scope, &owner).await;
        // A slow tick (a huge backlog, a loaded database) spaces the next:
        // the gauges never take more than a tenth of a connection's time.
        tokio::time::sleep(every.max(started.elapsed() * 10)).await;
    }
}

/// One export: every gauge's query, its series replaced through `owner`.
pub async fn tick(db: &Db, scope: &Scope, owner: &SeriesOwner) {
    match dead_letters_pending(db, scope).await {
        Ok(series) => owner.replace(name::DEAD_LETTERS_PENDING, series),
        Err(e) => {
            tracing::warn!(error = %e, gauge = name::DEAD_LETTERS_PENDING, "database gauge not measured; keeping its last values")
        }
    }
    // The latest `orderpipe reconcile` run of each group (crate::reconcile::store).
    if let Err(e) = crate::reconcile::export_gauges(db, scope.group(), owner).await {
        tracing::warn!(error = %e, gauge = name::RECONCILE_MISSING, "database gauge not measured; keeping its last values");
    }
    // The operators' pauses, from the persister only (a member exports its
    // own group's): a paused group with no member left still silences its
    // lag alerts.
    if scope.group().is_none() {
        match crate::consumer::group_pause::list(db).await {
            Ok(pauses) => owner.replace(
                name::GROUP_PAUSED,
                pauses.into_iter().map(|p| (vec![("group", p.group)], 1.0)),
            ),
            Err(e) => {
                tracing::warn!(error = %e, gauge = name::GROUP_PAUSED, "database gauge not measured; keeping its last values")
            }
        }
    }
}

/// The series of `orderpipe_dead_letters_pending` for `scope`: pending rows
/// by group, event name and class, labels bounded (see the module doc).
pub async fn dead_letters_pending(db: &Db, scope: &Scope) -> Result<Vec<(Labels, f64)>, DbError> {
    let mut q = QueryBuilder::<Any>::new(
        "SELECT consumer_group, event_name, error_class, COUNT(*) FROM dead_letters WHERE status = 'pending'",
    );
    if let Some(group) = scope.group() {
        q.push(" AND consumer_group = ")
            .push_bind(group.to_string());
    }
    // In the order of idx_dead_letters_group_class_event, which covers it.
    q.push(" GROUP BY consumer_group, error_class, event_name");
    let rows: Vec<(String, Option<String>, String, i64)> =
        q.build_query_as().fetch_all(&db.pool).await?;
    Ok(bounded(rows.into_iter().map(|(group, event, class, n)| {
        (group, event_label(event.as_deref()), class_label(&class), n)
    })))
}

/// The `event_name` label of a stored event name.
pub fn event_label(event_name: Option<&str>) -> String {
    match event_name {
        None => UNDECODABLE.into(),
        Some(e) if KNOWN_EVENTS.iter().any(|(known, _)| *known == e) => e.into(),
        Some(_) => OTHER.into(),
    }
}

/// The `class` label of a stored error class.
pub fn class_label(class: &str) -> String {
    if super::ERROR_CLASSES.contains(&class) {
        class.into()
    } else {
        OTHER.into()
    }
}

/// Counts by (group, event label, class label), summed, largest first, at
/// most [`MAX_SERIES`] series: past that, the smallest are summed into one
/// series labelled `other` (its group kept when they all share one).
fn bounded(counts: impl IntoIterator<Item = (String, String, String, i64)>) -> Vec<(Labels, f64)> {
    let mut summed: BTreeMap<(String, String, String), i64> = BTreeMap::new();
    for (group, event, class, n) in counts {
        *summed.entry((group, event, class)).or_default() += n;
    }
    let mut series: Vec<_> = summed.into_iter().collect();
    // Largest first; ties by labels, so every process folds the same way.
    series.sort_by(|(a, n), (b, m)| m.cmp(n).then_with(|| a.cmp(b)));
    let folded = if series.len() > MAX_SERIES {
        series.split_off(MAX_SERIES - 1)
    } else {
        Vec::new()
    };
    let labels = |(group, event, class): (String, String, String)| -> Labels {
        vec![("group", group), ("event_name", event), ("class", class)]
    };
    let mut out: Vec<(Labels, f64)> = series
        .into_iter()
        .map(|(k, n)| (labels(k), n as f64))
        .collect();
    if let Some(((first_group, ..), _)) = folded.first() {
        let group = if folded.iter().all(|((g, ..), _)| g == first_group) {
            first_group.clone()
        } else {
            OTHER.into()
        };
        let total: i64 = folded.iter().map(|(_, n)| n).sum();
        out.push((labels((group, OTHER.into(), OTHER.into())), total as f64));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(group: &str, event: &str, class: &str, n: i64) -> (String, String, String, i64) {
        (group.into(), event.into(), class.into(), n)
    }

    #[test]
    fn labels_are_bounded_to_known_events_and_classes() {
        assert_eq!(event_label(Some("order.created")), "order.created");
        assert_eq!(event_label(Some("order.teleported")), OTHER);
        assert_eq!(event_label(None), UNDECODABLE);
        assert_eq!(class_label("handler_fatal"), "handler_fatal");
        assert_eq!(class_label("something a header said"), OTHER);
    }

    #[test]
    fn unknown_labels_are_summed_and_the_series_capped() {
        let got = bounded([
            row("g", OTHER, "handler_fatal", 2),
            row("g", OTHER, "handler_fatal", 3),
        ]);
        assert_eq!(
            got,
            [(
                vec![
                    ("group", "g".into()),
                    ("event_name", OTHER.into()),
                    ("class", "handler_fatal".into())
                ],
                5.0
            )]
        );
        // 60 groups of 1..=60 rows: the 49 largest kept, the 11 smallest summed.
        let many: Vec<_> = (1..=60)
            .map(|i| row(&format!("g{i:02}"), "order.created", "unavailable", i))
            .collect();
        let got = bounded(many.clone());
        assert_eq!(got.len(), MAX_SERIES);
        assert_eq!(got[0].1, 60.0);
        assert_eq!(
            got.last().unwrap(),
            &(
                vec![
                    ("group", OTHER.into()),
                    ("event_name", OTHER.into()),
                    ("class", OTHER.into())
                ],
                (1..=11).sum::<i64>() as f64
            )
        );
        let total: f64 = got.iter().map(|(_, n)| n).sum();
        assert_eq!(
            total,
            (1..=60).sum::<i64>() as f64,
            "nothing is lost by folding"
        );
        // One group's overflow keeps its group.
        let one: Vec<_> = (1..=60)
            .map(|i| row("g", &format!("e{i:02}"), "unavailable", i))
            .collect();
        let got = bounded(one);
        assert_eq!(got.last().unwrap().0[0], ("group", "g".into()));
    }
}
