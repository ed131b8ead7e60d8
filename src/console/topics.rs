//! The topic explorer (read-only): `/topics` lists the broker's topics and
//! finds an order's events by its id; `/topics/{topic}` reads a partition
//! from an offset, a time or its tail. Records are decoded through the
//! registry ([`crate::explore`]); a record that does not decode is shown as
//! undecodable with its class and the first bytes in hex, never as an
//! error page.

use askama::Template;
use axum::Router;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Path, Query, State};
use axum::http::Uri;
use axum::response::Html;
use axum::routing::get;
use serde::Deserialize;

use super::masking::Masking;
use super::{Chrome, ConsoleError, ConsoleState, Page, Principal};
use crate::explore::{
    self, Decoded, ExploreError, Explorer, OrderSearch, PartitionRange, RecordView, Start,
};

/// The explorer's pages; no actions (read-only).
pub const PAGE: Page = Page {
    routes,
    nav: Some(("Topics", "/topics")),
    actions: &[],
};

fn routes() -> Router<ConsoleState> {
    Router::new()
        .route("/topics", get(list))
        .route("/topics/{topic}", get(show))
}

impl From<ExploreError> for ConsoleError {
    fn from(e: ExploreError) -> Self {
        match e {
            ExploreError::Invalid { field, reason } => Self::bad_input(field, reason),
            ExploreError::NoTopic(topic) => {
                Self::NotFound(format!("topic `{topic}` does not exist on the broker"))
            }
            other => Self::Unavailable(other.to_string()),
        }
    }
}

/// Kafka's rule for topic names: 1 to 249 of `[a-zA-Z0-9._-]`.
pub(super) fn check_topic(topic: &str) -> Result<(), ConsoleError> {
    let ok = (1..=249).contains(&topic.len())
        && topic
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b));
    if ok {
        Ok(())
    } else {
        Err(ConsoleError::bad_input(
            "topic",
            format!("`{topic}` is not a topic name (1 to 249 of a-z, A-Z, 0-9, `.`, `_`, `-`)"),
        ))
    }
}

pub(super) fn explorer(state: &ConsoleState) -> Result<Explorer, ConsoleError> {
    let s = state.settings();
    Ok(Explorer::new(&s.kafka, &s.producer, &s.registry)?)
}

/// The query of both pages.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct ReadQuery {
    #[serde(default)]
    topic: Option<String>,
    #[serde(default)]
    partition: Option<String>,
    #[serde(default)]
    from: Option<String>,
    #[serde(default)]
    offset: Option<String>,
    #[serde(default)]
    time: Option<String>,
    #[serde(default)]
    limit: Option<String>,
    #[serde(default)]
    order_id: Option<String>,
    /// `1`: an operator reveals the masked fields ([`Masking`]).
    #[serde(default)]
    reveal: Option<String>,
}

fn query(q: Result<Query<ReadQuery>, QueryRejection>) -> Result<ReadQuery, ConsoleError> {
    q.map(|Query(q)| q).map_err(|e| {
        ConsoleError::bad_input(
            "query",
            format!(
                "{}; accepted fields: topic, partition, from, offset, time, limit, order_id",
                e.body_text()
            ),
        )
    })
}

fn blank(s: &Option<String>) -> Option<&str> {
    s.as_deref().map(str::trim).filter(|s| !s.is_empty())
}

/// One record, ready for the template (`explore_record.html`).
pub(super) struct RecordRow {
    pub(super) partition: i32,
    pub(super) offset: i64,
    pub(super) time: String,
    pub(super) key: String,
    pub(super) headers: Vec<(String, String)>,
    pub(super) schema_id: String,
    /// `envelope`, `invalid`, `undecodable`, `empty`.
    pub(super) kind: &'static str,
    /// Event name, or the class of what is wrong.
    pub(super) title: String,
    /// Why it does not decode.
    pub(super) reason: String,
    /// The decoded value, pretty JSON.
    pub(super) json: String,
    pub(super) value_bytes: usize,
    pub(super) value_hex: String,
}

impl RecordRow {
    pub(super) fn of(r: RecordView, masking: &Masking) -> Self {
        let schema_id = r
            .decoded
            .schema_id()
            .map(|id| id.to_string())
            .unwrap_or_else(|| "—".into());
        // The row owns the view: its JSON is masked in place, not copied.
        let pretty = |v: serde_json::Value| {
            serde_json::to_string_pretty(&masking.apply(v)).unwrap_or_default()
        };
        let (kind, title, reason, json) = match r.decoded {
            Decoded::Empty => (
                "empty",
                "no value (tombstone)".to_string(),
                String::new(),
                String::new(),
            ),
            Decoded::Envelope {
                event_name, json, ..
            } => ("envelope", event_name, String::new(), pretty(json)),
            Decoded::Invalid { reason, json, .. } => (
                "invalid",
                "undecodable: invalid_envelope".into(),
                reason,
                pretty(json),
            ),
            Decoded::Undecodable { class, reason, .. } => (
                "undecodable",
                format!("undecodable: {class}"),
                reason,
                String::new(),
            ),
        };
        Self {
            partition: r.partition,
            offset: r.offset,
            time: r.time.unwrap_or_else(|| "—".into()),
            key: r.key.unwrap_or_else(|| "(no key)".into()),
            headers: r.headers,
            schema_id,
            kind,
            title,
            reason,
            json,
            value_bytes: r.value_bytes,
            value_hex: r.value_hex,
        }
    }
}

#[derive(Template)]
#[template(path = "topics.html")]
struct TopicsPage {
    chrome: Chrome,
    topics: Vec<explore::TopicName>,
    /// The order search form's topic.
    search_topic: String,
    order_id: String,
    partitioner: String,
    search: Option<SearchView>,
    masking: Masking,
}

struct SearchView {
    topic: String,
    order_id: String,
    partition: i32,
    scanned: u64,
    start_offset: i64,
    next_offset: i64,
    reached_end: bool,
    records: Vec<RecordRow>,
}

impl SearchView {
    fn of(topic: &str, s: OrderSearch, masking: &Masking) -> Self {
        Self {
            topic: topic.to_string(),
            order_id: s.order_id,
            partition: s.page.partition,
            scanned: s.page.scanned,
            start_offset: s.page.start_offset,
            next_offset: s.page.next_offset,
            reached_end: s.page.reached_end,
            records: s
                .page
                .records
                .into_iter()
                .map(|r| RecordRow::of(r, masking))
                .collect(),
        }
    }
}

/// `/topics`: every topic, and the order search (`?order_id=&topic=`).
async fn list(
    State(state): State<ConsoleState>,
    principal: Principal,
    uri: Uri,
    q: Result<Query<ReadQuery>, QueryRejection>,
) -> Result<Html<String>, ConsoleError> {
    let q = query(q)?;
    let masking = Masking::of(&state, &principal, &uri, blank(&q.reveal)).await?;
    let explorer = explorer(&state)?;
    let order_topic = state.settings().topics.order_events.name.clone();
    let search_topic = blank(&q.topic).unwrap_or(&order_topic).to_string();
    check_topic(&search_topic)?;
    let search = match blank(&q.order_id) {
        Some(order_id) => {
            let start = Start::parse(
                blank(&q.from).or(Some("beginning")),
                blank(&q.offset),
                blank(&q.time),
            )?;
            let limit = explore::parse_limit(blank(&q.limit))?;
            Some(SearchView::of(
                &search_topic,
                explorer
                    .find_order(&search_topic, order_id, start, limit)
                    .await?,
                &masking,
            ))
        }
        None => None,
    };
    let topics = explorer.topics().await?;
    super::render(&TopicsPage {
        chrome: state.chrome(&principal, "Topics", "/topics"),
        topics,
        order_id: blank(&q.order_id).unwrap_or_default().to_string(),
        search_topic,
        partitioner: explorer.partitioner().name.clone(),
        search,
        masking,
    })
}

#[derive(Template)]
#[template(path = "topic.html")]
struct TopicPage {
    chrome: Chrome,
    topic: String,
    partitions: Vec<PartitionRange>,
    /// The form's values, as given.
    partition: String,
    from: String,
    offset: String,
    time: String,
    limit: String,
    read: Option<ReadView>,
    masking: Masking,
}

struct ReadView {
    partition: i32,
    low: i64,
    high: i64,
    start_offset: i64,
    next_offset: i64,
    reached_end: bool,
    limit: usize,
    records: Vec<RecordRow>,
}

/// `/topics/{topic}`: its partitions, and with `?partition=` the records
/// from `from`/`offset`/`time`.
async fn show(
    State(state): State<ConsoleState>,
    principal: Principal,
    uri: Uri,
    Path(topic): Path<String>,
    q: Result<Query<ReadQuery>, QueryRejection>,
) -> Result<Html<String>, ConsoleError> {
    let q = query(q)?;
    let masking = Masking::of(&state, &principal, &uri, blank(&q.reveal)).await?;
    check_topic(&topic)?;
    let explorer = explorer(&state)?;
    let summary = explorer.describe(&topic).await?;
    let read = match blank(&q.partition) {
        Some(p) => {
            let partition = p.parse::<i32>().map_err(|_| {
                ConsoleError::bad_input(
                    "partition",
                    format!(
                        "`{p}` is not a partition (0 to {})",
                        summary.partitions.len() - 1
                    ),
                )
            })?;
            let start = Start::parse(blank(&q.from), blank(&q.offset), blank(&q.time))?;
            let limit = explore::parse_limit(blank(&q.limit))?;
            let page = explorer.read(&topic, partition, start, limit).await?;
            Some(ReadView {
                partition,
                low: page.range.low,
                high: page.range.high,
                start_offset: page.start_offset,
                next_offset: page.next_offset,
                reached_end: page.reached_end,
                limit,
                records: page
                    .records
                    .into_iter()
                    .map(|r| RecordRow::of(r, &masking))
                    .collect(),
            })
        }
        None => None,
    };
    let value = |s: &Option<String>| s.clone().unwrap_or_default();
    super::render(&TopicPage {
        chrome: state.chrome(&principal, &format!("Topic {topic}"), "/topics"),
        partitions: summary.partitions,
        partition: value(&q.partition),
        from: blank(&q.from).unwrap_or("tail").to_string(),
        offset: value(&q.offset),
        time: value(&q.time),
        limit: value(&q.limit),
        read,
        topic,
        masking,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn topic_names_follow_kafkas_rule() {
        check_topic("order.events.v1").unwrap();
        check_topic("cdc.shop.table_user").unwrap();
        let e = check_topic("a/b").unwrap_err().to_string();
        assert!(e.starts_with("topic: `a/b` is not a topic name"), "{e}");
        assert!(check_topic("").is_err() && check_topic(&"x".repeat(250)).is_err());
    }
}
