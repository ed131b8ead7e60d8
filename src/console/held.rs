//! The held-orders pages (`/held`): keys parked for a group (per-key
//! ordering, [`crate::ordering`]) with their head and the records held
//! behind it, in the order they will be applied; and the actions on a
//! parked key whose head was dead-lettered, through the code of
//! `orderpipe dlq replay` / `dlq ignore`:
//!
//! | action | route | the CLI's |
//! |---|---|---|
//! | replay the head (its followers follow, in order) | `POST /held/replay-head` | `dlq replay --id HEAD` |
//! | release: ignore the head, apply the followers in order | `POST /held/release` | `dlq ignore --id HEAD --release-followers` |
//! | keep: ignore the head, keep the followers held | `POST /held/keep` | `dlq ignore --id HEAD --keep-held` |
//!
//! A key whose head is still in the retry topic has no action: its retries
//! decide. The group's consumer applies released records within seconds.
//!
//! A parked key is named by `group`, `key` and, since a group may read
//! several topics (order 7 and row 7 of a table are different keys),
//! `topic`: optional while the key is parked in one topic of the group, and
//! asked for by name when it is parked in several.

use askama::Template;
use axum::Router;
use axum::extract::{Form, Query, State};
use axum::response::{Html, IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use serde::Deserialize;

use super::auth::Principal;
use super::dead_letters::IgnoreForm;
use super::{Chrome, ConsoleError, ConsoleState, Page, filters, held_key_page};
use crate::dlq::held::{self, HeldView, ParkedFilter, ParkedView};

/// The held-orders pages.
pub const PAGE: Page = Page {
    routes,
    nav: Some(("Held orders", "/held")),
    actions: &["/held/replay-head", "/held/release", "/held/keep"],
};

/// Parked keys listed, at most.
pub const KEYS_SHOWN: i64 = 500;

/// Held records of one key shown, at most.
pub const HELD_SHOWN: i64 = 1_000;

fn routes() -> Router<ConsoleState> {
    Router::new()
        .route("/held", get(list))
        .route("/held/key", get(key))
        .route("/held/replay-head", post(replay_head))
        .route("/held/release", post(release))
        .route("/held/keep", post(keep))
}

#[derive(Debug, Default, Deserialize)]
struct GroupQuery {
    #[serde(default)]
    group: String,
}

#[derive(Template)]
#[template(path = "held.html")]
struct ListPage {
    chrome: Chrome,
    group: String,
    keys: Vec<ParkedView>,
    now_ms: i64,
}

async fn list(
    State(state): State<ConsoleState>,
    principal: Principal,
    Query(query): Query<GroupQuery>,
) -> Result<Html<String>, ConsoleError> {
    let group = query.group.trim().to_string();
    let filter = ParkedFilter {
        group: Some(group.as_str()).filter(|g| !g.is_empty()),
        ..Default::default()
    };
    let keys = held::parked_views(state.db(), filter, KEYS_SHOWN).await?;
    super::render(&ListPage {
        chrome: state
            .chrome(&principal, "Held orders", "/held")
            .refreshing(&state),
        group,
        keys,
        now_ms: crate::clock::now_ms(),
    })
}

/// A parked key: `group` and `key`, both required, and `topic` when the
/// key is parked in several topics of the group.
#[derive(Debug, Default, Deserialize)]
pub struct KeyForm {
    /// The consumer group.
    #[serde(default)]
    pub group: String,
    /// The key's topic (the main topic the group reads it from).
    #[serde(default)]
    pub topic: String,
    /// The record key (order id).
    #[serde(default)]
    pub key: String,
    /// Why (release and keep ignore the head: the reason is kept with it).
    #[serde(default)]
    pub reason: String,
}

impl KeyForm {
    /// The parked key named, or 400 naming the missing field (or `topic`
    /// when the key is parked in several topics of the group) / 404.
    async fn parked(&self, state: &ConsoleState) -> Result<ParkedView, ConsoleError> {
        let group = self.group.trim();
        let key = self.key.trim();
        let topic = Some(self.topic.trim()).filter(|t| !t.is_empty());
        if group.is_empty() {
            return Err(ConsoleError::bad_input(
                "group",
                "required: the consumer group the key is parked for",
            ));
        }
        if key.is_empty() {
            return Err(ConsoleError::bad_input(
                "key",
                "required: the parked key (order id)",
            ));
        }
        let filter = ParkedFilter {
            group: Some(group),
            topic,
            key: Some(key),
        };
        let mut found = held::parked_views(state.db(), filter, KEYS_SHOWN).await?;
        if found.len() > 1 {
            let topics: Vec<&str> = found.iter().map(|p| p.parked.key_topic.as_str()).collect();
            return Err(ConsoleError::bad_input(
                "topic",
                format!(
                    "key {key} is parked for group {group} in {} topics; name one of: {}",
                    topics.len(),
                    topics.join(", ")
                ),
            ));
        }
        found.pop().ok_or_else(|| {
            let topic = topic.map(|t| format!(" in topic {t}")).unwrap_or_default();
            ConsoleError::NotFound(format!(
                "key {key} is not parked for group {group}{topic} (released already?)"
            ))
        })
    }

    /// The head's dead letter, or 409 when the head is not dead-lettered.
    async fn head_dead_letter(
        &self,
        state: &ConsoleState,
    ) -> Result<(ParkedView, i64), ConsoleError> {
        let parked = self.parked(state).await?;
        let id = parked.head_dead_letter.ok_or_else(|| {
            ConsoleError::Conflict(format!(
                "the head of key {} is {} and has no dead letter: its retries decide, nothing to replay or ignore",
                parked.parked.key, parked.parked.state
            ))
        })?;
        Ok((parked, id))
    }

    /// The group's list of parked keys.
    fn group_page(&self) -> String {
        let mut q = url::form_urlencoded::Serializer::new(String::new());
        q.append_pair("group", self.group.trim());
        format!("/held?{}", q.finish())
    }

    /// This key's page.
    fn page(&self) -> String {
        held_key_page(self.group.trim(), self.topic.trim(), self.key.trim())
    }
}

#[derive(Template)]
#[template(path = "held_key.html")]
struct KeyPage {
    chrome: Chrome,
    parked: ParkedView,
    records: Vec<HeldView>,
}

async fn key(
    State(state): State<ConsoleState>,
    principal: Principal,
    Query(form): Query<KeyForm>,
) -> Result<Html<String>, ConsoleError> {
    let parked = form.parked(&state).await?;
    let records = held::key_views(
        state.db(),
        &parked.group,
        &parked.parked.order_key(),
        HELD_SHOWN,
    )
    .await?;
    super::render(&KeyPage {
        chrome: state.chrome(
            &principal,
            &format!(
                "Order {} of {} ({})",
                parked.parked.key, parked.group, parked.parked.key_topic
            ),
            "/held",
        ),
        parked,
        records,
    })
}

async fn replay_head(
    State(state): State<ConsoleState>,
    principal: Principal,
    Form(form): Form<KeyForm>,
) -> Result<Response, ConsoleError> {
    let (_, id) = form.head_dead_letter(&state).await?;
    super::dead_letters::replay_by_id(&state, &principal, id, "held.replay_head").await?;
    // The key leaves the list once the group applied the head and its followers.
    Ok(Redirect::to(&form.group_page()).into_response())
}

async fn release(
    State(state): State<ConsoleState>,
    principal: Principal,
    Form(form): Form<KeyForm>,
) -> Result<Response, ConsoleError> {
    ignore_head(&state, &principal, &form, "release", "held.release").await
}

async fn keep(
    State(state): State<ConsoleState>,
    principal: Principal,
    Form(form): Form<KeyForm>,
) -> Result<Response, ConsoleError> {
    ignore_head(&state, &principal, &form, "keep", "held.keep").await
}

/// Ignores the key's head for `form.reason`, deciding for its followers.
async fn ignore_head(
    state: &ConsoleState,
    principal: &Principal,
    form: &KeyForm,
    followers: &str,
    action: &str,
) -> Result<Response, ConsoleError> {
    let (_, id) = form.head_dead_letter(state).await?;
    let ignore = IgnoreForm {
        reason: form.reason.clone(),
        followers: followers.into(),
    };
    super::dead_letters::ignore_row(state, principal, id, &ignore, action).await?;
    // A released key leaves the list once the consumer applied its records.
    Ok(Redirect::to(&if followers == "release" {
        form.group_page()
    } else {
        form.page()
    })
    .into_response())
}
