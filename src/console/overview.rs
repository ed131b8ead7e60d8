//! The overview (`/`): one card per consumer group with its lag per
//! partition (from the broker, so a group with every member down shows
//! too: [`crate::lag`]), applied/s and the failure rate over the last
//! [`WINDOW`], pending dead letters by class, parked keys and the oldest
//! parked age. Each figure links to the page behind it; the page reloads
//! itself every `console.refresh_secs`.
//!
//! The lag comes from a background measurement every [`LAG_INTERVAL`]
//! ([`LagCache`]): the page shows its age. Applied/s counts the group's
//! `event_dedup` rows of the window; the
//! failure rate is dead-lettered / (applied + dead-lettered) over it (a
//! dead letter counts when its last failure is in the window). Kafka not
//! answering is a notice on the page, not an error page: the database
//! figures still show.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use askama::Template;
use axum::Router;
use axum::extract::State;
use axum::response::Html;
use axum::routing::get;
use chrono::Utc;

use super::auth::Principal;
use super::{Chrome, ConsoleError, ConsoleState, Page, filters};
use crate::db::{Db, DbError};
use crate::lag::{self, GroupLag, GroupStatus};

/// The overview page.
pub const PAGE: Page = Page {
    routes,
    nav: Some(("Overview", "/")),
    actions: &[],
};

/// The window of applied/s and the failure rate.
pub const WINDOW: Duration = Duration::from_secs(60);

fn routes() -> Router<ConsoleState> {
    Router::new().route("/", get(show))
}

/// One partition's lag, as shown.
#[derive(Debug, Clone)]
pub struct PartitionRow {
    /// Topic (the order topic or the group's retry topic).
    pub topic: String,
    /// Partition.
    pub partition: i32,
    /// Committed offset, or `-` (none).
    pub committed: String,
    /// The committed offset to open in the explorer (log start when none).
    pub from_offset: i64,
    /// Log-end offset.
    pub end: i64,
    /// Records behind.
    pub lag: i64,
    /// Age of the oldest unconsumed record, or `-`.
    pub age: String,
    /// How long an open transaction has held the partition's last stable
    /// offset below its high watermark, or `-`.
    pub open_transaction: String,
}

/// One group's card.
#[derive(Debug, Clone, Default)]
pub struct GroupCard {
    /// The consumer group.
    pub group: String,
    /// What the broker says, in words (`consuming`, `no live member`, ...).
    pub status: String,
    /// Whether the status needs attention (no member while lagging, unknown).
    pub alarming: bool,
    /// Live members.
    pub members: usize,
    /// Sum of the partitions' lag.
    pub total_lag: i64,
    /// Partitions with their lag.
    pub partitions: Vec<PartitionRow>,
    /// Events applied per second over the window.
    pub applied_per_sec: String,
    /// Dead-lettered share of the window's outcomes (`-` when none).
    pub failure_rate: String,
    /// Pending dead letters by class, largest first.
    pub dead_letters: Vec<(String, i64)>,
    /// Their sum.
    pub dead_letters_total: i64,
    /// Keys parked now.
    pub parked_keys: i64,
    /// Records held behind them.
    pub held_records: i64,
    /// How long the oldest parked key has waited (`-` when none).
    pub oldest_parked: String,
    /// An operator's pause in force, if any.
    pub paused: Option<crate::consumer::group_pause::GroupPause>,
    /// Events applied over the window.
    pub applied_in_window: i64,
    /// Records dead-lettered over the window.
    pub failed_in_window: i64,
    /// Whether the broker measured its lag (`total_lag` means something).
    pub lag_measured: bool,
}

/// What the overview shows.
#[derive(Debug, Clone)]
pub struct Overview {
    /// One card per group, by name.
    pub groups: Vec<GroupCard>,
    /// Why the broker's lag is missing, if it is.
    pub lag_error: Option<String>,
    /// How old the lag measurement is (`3s`), when there is one.
    pub lag_age: Option<String>,
    /// The topic whose lag is shown.
    pub topic: String,
}

#[derive(Template)]
#[template(path = "overview.html")]
struct OverviewPage {
    chrome: Chrome,
    overview: Overview,
    window_secs: u64,
}

async fn show(
    State(state): State<ConsoleState>,
    principal: Principal,
) -> Result<Html<String>, ConsoleError> {
    let overview = collect(&state).await?;
    super::render(&OverviewPage {
        chrome: state.chrome(&principal, "Overview", "/").refreshing(&state),
        overview,
        window_secs: WINDOW.as_secs(),
    })
}

/// A duration in words, rounded to the second.
fn age(ms: i64) -> String {
    humantime::format_duration(Duration::from_secs((ms.max(0) as u64).div_ceil(1000))).to_string()
}

fn describe(status: GroupStatus, members: usize, lag: i64) -> (String, bool) {
    match status {
        GroupStatus::Consuming => (
            format!(
                "consuming ({members} member{})",
                if members == 1 { "" } else { "s" }
            ),
            false,
        ),
        GroupStatus::NoMembers => ("no live member: nobody consumes it".into(), lag > 0),
        GroupStatus::NoCommittedOffsets => ("no committed offset on these topics".into(), false),
        GroupStatus::Unknown => (
            "unknown to the broker (never ran, or its offsets expired)".into(),
            true,
        ),
    }
}

/// How often the console measures the broker's lag in the background.
/// Measuring every group of a busy broker takes seconds (one offsets
/// request per group), far over a page's budget, so a page shows the
/// latest measurement and its age instead of waiting for a new one.
pub const LAG_INTERVAL: Duration = Duration::from_secs(5);

/// How long the first page waits for the first measurement.
const FIRST_LAG_WAIT: Duration = Duration::from_secs(15);

/// One measurement of the lag: when, and what (or why not).
#[derive(Debug, Clone)]
pub struct LagSnapshot {
    /// When it was taken (ms since the epoch).
    pub at_ms: i64,
    /// The groups' lag, or why the broker did not tell.
    pub result: Result<Vec<GroupLag>, String>,
}

/// The latest [`LagSnapshot`], kept fresh by a task started on first use
/// that ends with the console (it holds the state weakly).
#[derive(Default)]
pub struct LagCache {
    latest: std::sync::OnceLock<tokio::sync::watch::Receiver<Option<LagSnapshot>>>,
}

impl LagCache {
    /// The latest measurement; the first call starts the measuring task and
    /// waits for its first result (at most [`FIRST_LAG_WAIT`]).
    pub async fn latest(&self, state: &ConsoleState) -> Option<LagSnapshot> {
        let mut latest = self.latest.get_or_init(|| start_measuring(state)).clone();
        let first = tokio::time::timeout(FIRST_LAG_WAIT, latest.wait_for(Option::is_some))
            .await
            .ok()
            .and_then(Result::ok)
            .and_then(|snapshot| snapshot.clone());
        first.or_else(|| latest.borrow().clone())
    }
}

fn start_measuring(state: &ConsoleState) -> tokio::sync::watch::Receiver<Option<LagSnapshot>> {
    let (publish, latest) = tokio::sync::watch::channel(None);
    let weak = state.downgrade();
    tokio::spawn(async move {
        loop {
            let Some(state) = ConsoleState::upgrade(&weak) else {
                return;
            };
            let settings = state.settings().clone();
            drop(state);
            let topic = settings.topics.order_events.name.clone();
            let result = async {
                let (groups, named) = lag::groups_to_measure(
                    &settings.kafka,
                    &settings.lag,
                    &settings.dlq.persister_group,
                    &[],
                )
                .await?;
                lag::measure(&settings.kafka, &topic, &groups, named).await
            }
            .await
            .map_err(|e| e.to_string());
            if publish
                .send(Some(LagSnapshot {
                    at_ms: crate::clock::now_ms(),
                    result,
                }))
                .is_err()
            {
                return;
            }
            tokio::time::sleep(LAG_INTERVAL).await;
        }
    });
    latest
}

/// Gathers every figure of the overview: the broker's lag (the latest
/// background measurement) and the database's counts, side by side.
pub async fn collect(state: &ConsoleState) -> Result<Overview, ConsoleError> {
    let topic = state.settings().topics.order_events.name.clone();
    let (lag, figures) = tokio::join!(state.lag_cache().latest(state), DbFigures::read(state.db()));
    let figures = figures?;
    let (lags, lag_error, lag_age) = match lag {
        Some(LagSnapshot {
            at_ms,
            result: Ok(lags),
        }) => (lags, None, Some(age(crate::clock::now_ms() - at_ms))),
        Some(LagSnapshot { result: Err(e), .. }) => (Vec::new(), Some(e), None),
        None => (
            Vec::new(),
            Some("not measured yet: the broker has not answered".into()),
            None,
        ),
    };
    Ok(Overview {
        groups: cards(lags, figures),
        lag_error,
        lag_age,
        topic,
    })
}

/// The database's figures, by group.
#[derive(Debug, Default)]
struct DbFigures {
    applied: BTreeMap<String, i64>,
    failed: BTreeMap<String, i64>,
    pending: BTreeMap<String, Vec<(String, i64)>>,
    parked: BTreeMap<String, (i64, Option<i64>)>,
    held: BTreeMap<String, i64>,
    paused: BTreeMap<String, crate::consumer::group_pause::GroupPause>,
}

impl DbFigures {
    async fn read(db: &Db) -> Result<Self, DbError> {
        let now = crate::clock::now_ms();
        let since_ms = now - WINDOW.as_millis() as i64;
        // event_dedup.created_at is a DATETIME written in UTC (as dedup::cleanup compares it).
        let since = Utc::now() - chrono::Duration::from_std(WINDOW).expect("a minute fits");
        let floor = crate::dedup::seq_floor(db, since).await?;
        let applied: Vec<(String, i64)> = sqlx::query_as(
            "SELECT g.name, COUNT(*) FROM event_dedup d JOIN dedup_groups g ON g.id = d.group_id \
             WHERE d.apply_seq >= ? AND d.created_at >= ? GROUP BY g.name",
        )
        .bind(floor)
        .bind(crate::dedup::db_time(since))
        .fetch_all(&db.pool)
        .await?;
        let failed: Vec<(String, i64)> =
            sqlx::query_as("SELECT consumer_group, COUNT(*) FROM dead_letters WHERE last_failure_ms >= ? GROUP BY consumer_group")
                .bind(since_ms)
                .fetch_all(&db.pool)
                .await?;
        let pending: Vec<(String, String, i64)> = sqlx::query_as(
            "SELECT consumer_group, error_class, COUNT(*) FROM dead_letters WHERE status = 'pending' \
             GROUP BY consumer_group, error_class",
        )
        .fetch_all(&db.pool)
        .await?;
        let parked: Vec<(String, i64, Option<i64>)> =
            sqlx::query_as("SELECT consumer_group, COUNT(*), MIN(parked_ms) FROM parked_keys GROUP BY consumer_group")
                .fetch_all(&db.pool)
                .await?;
        let held: Vec<(String, i64)> = sqlx::query_as(
            "SELECT consumer_group, COUNT(*) FROM held_records GROUP BY consumer_group",
        )
        .fetch_all(&db.pool)
        .await?;
        let paused = crate::consumer::group_pause::list(db).await?;
        let mut figures = Self {
            paused: paused.into_iter().map(|p| (p.group.clone(), p)).collect(),
            applied: applied.into_iter().collect(),
            failed: failed.into_iter().collect(),
            parked: parked
                .into_iter()
                .map(|(g, n, oldest)| (g, (n, oldest)))
                .collect(),
            held: held.into_iter().collect(),
            ..Self::default()
        };
        for (group, class, n) in pending {
            figures.pending.entry(group).or_default().push((class, n));
        }
        for classes in figures.pending.values_mut() {
            classes.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
        }
        Ok(figures)
    }

    fn groups(&self) -> BTreeSet<String> {
        let mut groups = BTreeSet::new();
        groups.extend(self.applied.keys().cloned());
        groups.extend(self.failed.keys().cloned());
        groups.extend(self.pending.keys().cloned());
        groups.extend(self.parked.keys().cloned());
        groups.extend(self.paused.keys().cloned());
        groups
    }
}

fn cards(lags: Vec<GroupLag>, figures: DbFigures) -> Vec<GroupCard> {
    let now = crate::clock::now_ms();
    let mut by_group: BTreeMap<String, Option<GroupLag>> =
        figures.groups().into_iter().map(|g| (g, None)).collect();
    for lag in lags {
        by_group.insert(lag.group.clone(), Some(lag));
    }
    by_group
        .into_iter()
        .map(|(group, lag)| {
            let applied = figures.applied.get(&group).copied().unwrap_or(0);
            let failed = figures.failed.get(&group).copied().unwrap_or(0);
            let dead_letters = figures.pending.get(&group).cloned().unwrap_or_default();
            let (parked_keys, oldest) = figures.parked.get(&group).copied().unwrap_or((0, None));
            let mut card = GroupCard {
                applied_per_sec: format!("{:.1}", applied as f64 / WINDOW.as_secs_f64()),
                failure_rate: match applied + failed {
                    0 => "-".into(),
                    total => format!("{:.1} %", 100.0 * failed as f64 / total as f64),
                },
                dead_letters_total: dead_letters.iter().map(|(_, n)| n).sum(),
                dead_letters,
                parked_keys,
                held_records: figures.held.get(&group).copied().unwrap_or(0),
                oldest_parked: oldest.map_or_else(|| "-".into(), |ms| age(now - ms)),
                paused: figures.paused.get(&group).cloned(),
                applied_in_window: applied,
                failed_in_window: failed,
                status: "not measured on the broker".into(),
                group,
                ..GroupCard::default()
            };
            if let Some(lag) = lag {
                (card.status, card.alarming) = describe(lag.status, lag.members, lag.total_lag);
                card.members = lag.members;
                card.total_lag = lag.total_lag;
                card.lag_measured = true;
                if let Some(p) = &card.paused {
                    // Its lag grows by design: say so instead of alarming.
                    card.status = format!("PAUSED by {}: {}", p.paused_by, card.status);
                    card.alarming = false;
                }
                card.partitions = lag
                    .partitions
                    .into_iter()
                    .map(|p| PartitionRow {
                        committed: p
                            .committed_offset
                            .map_or_else(|| "-".into(), |o| o.to_string()),
                        from_offset: p.committed_offset.unwrap_or(p.log_start_offset),
                        end: p.log_end_offset,
                        lag: p.lag,
                        age: p
                            .oldest_unconsumed_age_seconds
                            .map_or_else(|| "-".into(), |s| age((s * 1000.0) as i64)),
                        open_transaction: p.open_transaction_age_seconds.map_or_else(
                            || "-".into(),
                            |s| {
                                format!(
                                    "{} {}",
                                    age((s * 1000.0) as i64),
                                    p.open_transaction_holder()
                                )
                            },
                        ),
                        topic: p.topic,
                        partition: p.partition,
                    })
                    .collect();
            }
            card
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_group_known_only_to_the_database_still_gets_a_card() {
        let mut figures = DbFigures::default();
        figures.applied.insert("g".into(), 120);
        figures.failed.insert("g".into(), 30);
        figures.pending.insert(
            "g".into(),
            vec![("handler_fatal".into(), 3), ("unavailable".into(), 1)],
        );
        figures
            .parked
            .insert("g".into(), (2, Some(crate::clock::now_ms() - 90_000)));
        let cards = cards(Vec::new(), figures);
        assert_eq!(cards.len(), 1);
        let card = &cards[0];
        assert_eq!(card.applied_per_sec, "2.0");
        assert_eq!(card.failure_rate, "20.0 %");
        assert_eq!(card.dead_letters_total, 4);
        assert_eq!(card.parked_keys, 2);
        assert!(
            card.oldest_parked.starts_with("1m 3"),
            "{}",
            card.oldest_parked
        );
        assert_eq!(card.status, "not measured on the broker");
    }
}
