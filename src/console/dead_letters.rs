//! The dead-letter pages (`/dead-letters`): the list filtered by group,
//! class, event name, order id, status, time and error text, a page at a
//! time on the server (keyset on the id, newest first:
//! [`store::page_newest_first`]); the detail view (decoded envelope, every
//! header, the failure history, the original position, the parked key it
//! heads); and the actions, through the code `orderpipe dlq` runs:
//!
//! | action | route | the CLI's |
//! |---|---|---|
//! | replay one | `POST /dead-letters/{id}/replay` | `dlq replay --id` |
//! | replay a filter | `GET /dead-letters/replay` (dry-run count), then `POST` (confirmed) | `dlq replay --dry-run`, `dlq replay` |
//! | ignore one | `POST /dead-letters/{id}/ignore` (reason required; for a head with held followers, release or keep) | `dlq ignore --id ... --release-followers / --keep-held` |
//! | ignore a filter | `GET /dead-letters/ignore` (dry-run count), then `POST` (confirmed, reason required) | `dlq ignore --group ... --reason ... --yes` |
//!
//! A filter replay is fixed by its dry run: the confirmation form carries the
//! highest id counted ([`store::Bound`]), so a dead letter persisted after the
//! count waits for the next replay, as with the CLI. It runs in the console's
//! process; its progress (delivery reports settled of the count) is the page
//! `/dead-letters/replays/{run}`, which reloads itself while it runs.

use super::masking::{Masking, RevealQuery};
use askama::Template;
use axum::Router;
use axum::extract::{Form, Path, Query, State};
use axum::response::{Html, IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use serde::{Deserialize, Serialize};
use serde_json::json;

use super::auth::Principal;
use super::{Chrome, ConsoleError, ConsoleState, Page, audit, filters};
use crate::codec::Codec;
use crate::dlq::ignore::{self, Followers, IgnoreError};
use crate::dlq::progress::{self, Origin, ReplayRow, Tracker};
use crate::dlq::replay::{self, ReplayOptions, ReplaySummary};
use crate::dlq::store::{self, Bound, DeadLetter, Filter, Selection, Status};
use crate::schema::SchemaCatalog;

/// The dead-letter pages.
pub const PAGE: Page = Page {
    routes,
    nav: Some(("Dead letters", "/dead-letters")),
    actions: &[
        "/dead-letters/1/replay",
        "/dead-letters/1/ignore",
        "/dead-letters/replay",
        "/dead-letters/ignore",
    ],
};

/// Rows per page of the list.
pub const PAGE_ROWS: i64 = 50;

/// At most this many rows per filter replay (the CLI's `--limit` default).
pub const REPLAY_LIMIT: i64 = 1_000_000;

fn routes() -> Router<ConsoleState> {
    Router::new()
        .route("/dead-letters", get(list))
        .route(
            "/dead-letters/replay",
            get(confirm_replay).post(replay_filter),
        )
        .route(
            "/dead-letters/ignore",
            get(confirm_ignore).post(ignore_filter),
        )
        .route("/dead-letters/replays/{run}", get(progress))
        .route("/dead-letters/{id}", get(detail))
        .route("/dead-letters/{id}/replay", post(replay_one))
        .route("/dead-letters/{id}/ignore", post(ignore_one))
}

/// The list's filter as the query string (and the confirmation form) carry
/// it; every field optional, an empty one is no filter.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
pub struct FilterForm {
    /// Consumer group.
    #[serde(default)]
    pub group: String,
    /// Error class (one of [`crate::dlq::ERROR_CLASSES`]).
    #[serde(default)]
    pub class: String,
    /// Event name.
    #[serde(default)]
    pub event: String,
    /// Order id (the record key).
    #[serde(default)]
    pub order_id: String,
    /// pending, replayed or ignored.
    #[serde(default)]
    pub status: String,
    /// Last failure at or after (RFC 3339 or an age).
    #[serde(default)]
    pub since: String,
    /// Last failure before (RFC 3339 or an age).
    #[serde(default)]
    pub until: String,
    /// Error class or message contains.
    #[serde(default)]
    pub error: String,
}

/// The statuses the `status` field accepts.
const STATUSES: [Status; 3] = [Status::Pending, Status::Replayed, Status::Ignored];

fn some(text: &str) -> Option<String> {
    Some(text.trim().to_string()).filter(|t| !t.is_empty())
}

impl FilterForm {
    /// The store's [`Filter`]; a bad field is a 400 naming it and what it
    /// accepts (never a filter that silently matches everything).
    pub fn filter(&self) -> Result<Filter, ConsoleError> {
        let status = match some(&self.status) {
            None => None,
            Some(s) => Some(Selection::Status(STATUSES.into_iter().find(|x| x.as_str() == s).ok_or_else(|| {
                ConsoleError::bad_input("status", format!("`{s}` is not a status; accepted values: pending, replayed, ignored (or empty: any)"))
            })?)),
        };
        let classes = match some(&self.class) {
            None => vec![],
            Some(c) => {
                vec![crate::dlq::known_class(&c).map_err(|e| ConsoleError::bad_input("class", e))?]
            }
        };
        let time = |field: &str, text: &str| {
            some(text)
                .map(|t| store::parse_time(&t).map_err(|e| ConsoleError::bad_input(field, e)))
                .transpose()
        };
        Ok(Filter {
            group: some(&self.group),
            event_name: some(&self.event),
            status,
            since: time("since", &self.since)?,
            until: time("until", &self.until)?,
            error_text: some(&self.error),
            classes,
            key: some(&self.order_id),
            ..Default::default()
        })
    }

    /// The form of a replay's stored selection ([`Filter::to_json`]), so
    /// its page links to the list of what it replayed (CLI runs too).
    pub fn from_selection(selection: &serde_json::Value) -> Self {
        let text = |name: &str| {
            selection
                .get(name)
                .and_then(|v| v.as_str())
                .unwrap_or_default()
                .to_string()
        };
        let time = |name: &str| {
            selection
                .get(name)
                .and_then(|v| v.as_i64())
                .and_then(chrono::DateTime::from_timestamp_millis)
                .map(|t| t.to_rfc3339())
                .unwrap_or_default()
        };
        Self {
            group: text("group"),
            class: selection
                .get("classes")
                .and_then(|c| c.get(0))
                .and_then(|c| c.as_str())
                .unwrap_or_default()
                .to_string(),
            event: text("event"),
            order_id: text("key"),
            status: text("status"),
            since: time("since_ms"),
            until: time("until_ms"),
            error: text("error"),
        }
    }

    /// As a query string (for links carrying the filter).
    pub fn query(&self) -> String {
        let mut q = url::form_urlencoded::Serializer::new(String::new());
        for (name, value) in self.fields() {
            if !value.trim().is_empty() {
                q.append_pair(name, value);
            }
        }
        q.finish()
    }

    /// The same filter with another status (`""`: any).
    pub fn with_status(&self, status: &str) -> Self {
        Self {
            status: status.into(),
            ..self.clone()
        }
    }

    /// Non-empty fields, in form order: the confirmation's hidden inputs.
    pub fn fields(&self) -> Vec<(&'static str, &str)> {
        [
            ("group", &self.group),
            ("class", &self.class),
            ("event", &self.event),
            ("order_id", &self.order_id),
            ("status", &self.status),
            ("since", &self.since),
            ("until", &self.until),
            ("error", &self.error),
        ]
        .into_iter()
        .filter(|(_, v)| !v.trim().is_empty())
        .map(|(n, v)| (n, v.as_str()))
        .collect()
    }

    /// The filter in words, for pages and confirmations.
    pub fn describe(&self) -> String {
        let fields = self.fields();
        if fields.is_empty() {
            return "every dead letter".into();
        }
        fields
            .iter()
            .map(|(n, v)| format!("{n} = {v}"))
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// As JSON for the audit row.
    pub fn audit_json(&self) -> serde_json::Value {
        serde_json::Value::Object(
            self.fields()
                .into_iter()
                .map(|(n, v)| (n.to_string(), json!(v)))
                .collect(),
        )
    }
}

#[derive(Debug, Deserialize)]
struct ListQuery {
    #[serde(flatten)]
    filter: FilterForm,
    /// Keyset cursor: rows with a smaller id.
    #[serde(default)]
    before: String,
}

#[derive(Template)]
#[template(path = "dead_letters.html")]
struct ListPage {
    chrome: Chrome,
    form: FilterForm,
    query: String,
    classes: &'static [&'static str],
    rows: Vec<DeadLetter>,
    matching: i64,
    older: Option<i64>,
    first_page: bool,
    runs: Vec<RunView>,
}

async fn list(
    State(state): State<ConsoleState>,
    principal: Principal,
    Query(query): Query<ListQuery>,
) -> Result<Html<String>, ConsoleError> {
    let filter = query.filter.filter()?;
    let before = match some(&query.before) {
        None => None,
        Some(b) => Some(b.parse::<i64>().map_err(|_| {
            ConsoleError::bad_input("before", format!("`{b}` is not a row id (a whole number)"))
        })?),
    };
    let db = state.db();
    let (rows, matching, running) = tokio::try_join!(
        store::page_newest_first(db, &filter, before, PAGE_ROWS),
        store::count(db, &filter),
        progress::running(db),
    )?;
    let now = crate::clock::now_ms();
    let older = (rows.len() as i64 == PAGE_ROWS)
        .then(|| rows.last().map(|r| r.id))
        .flatten();
    super::render(&ListPage {
        chrome: state.chrome(&principal, "Dead letters", "/dead-letters"),
        query: query.filter.query(),
        form: query.filter,
        classes: &crate::dlq::ERROR_CLASSES,
        rows,
        matching,
        older,
        first_page: before.is_none(),
        runs: running.iter().map(|r| RunView::of(r, now)).collect(),
    })
}

#[derive(Template)]
#[template(path = "dead_letter.html")]
struct DetailPage {
    chrome: Chrome,
    row: DeadLetter,
    key: Option<String>,
    value_bytes: usize,
    headers: Vec<(String, String)>,
    envelope: String,
    undecodable: Option<String>,
    original_timestamp: Option<i64>,
    /// The parked key it heads: (key, state, records held behind it, its page).
    heads: Option<(String, String, i64, String)>,
    masking: Masking,
}

async fn detail(
    State(state): State<ConsoleState>,
    principal: Principal,
    uri: axum::http::Uri,
    Path(id): Path<i64>,
    Query(reveal): Query<RevealQuery>,
) -> Result<Html<String>, ConsoleError> {
    let masking = Masking::of(&state, &principal, &uri, reveal.reveal.as_deref()).await?;
    let db = state.db();
    let filter = Filter {
        ids: vec![id],
        ..Default::default()
    };
    let record = store::records(db, &filter, 1)
        .await?
        .into_iter()
        .next()
        .ok_or_else(|| ConsoleError::NotFound(format!("no dead letter with id {id}")))?;
    // Decoded as `orderpipe dlq show` decodes it; undecodable is shown as such.
    let codec = Codec::new(
        &state.settings().registry,
        &record.row.original_topic,
        SchemaCatalog::embedded().order_events(),
        false,
    )
    .map_err(|e| ConsoleError::Internal(format!("codec: {e}")))?;
    // cdc's dead letters are JSON (the row cut to fit, its place, size and limit).
    let (envelope, undecodable) = match (
        record.json_value(),
        codec.decode(record.payload.as_deref()).await,
    ) {
        (Some(json), _) => (
            serde_json::to_string_pretty(&masking.apply(json)).unwrap_or_default(),
            None,
        ),
        (None, Ok(envelope)) => (
            serde_json::to_value(&envelope)
                .map(|v| serde_json::to_string_pretty(&masking.apply(v)).unwrap_or_default())
                .unwrap_or_default(),
            None,
        ),
        (None, Err(e)) => (String::new(), Some(e.to_string())),
    };
    let headers: std::collections::BTreeMap<String, String> =
        serde_json::from_str(&record.headers).unwrap_or_default();
    let group = &record.row.consumer_group;
    let heads = ignore::heading(db, &record).await?.map(|(p, held)| {
        let page = super::held_key_page(group, &p.key_topic, &p.key);
        (p.key, p.state.to_string(), held, page)
    });
    super::render(&DetailPage {
        chrome: state.chrome(&principal, &format!("Dead letter {id}"), "/dead-letters"),
        key: record
            .key
            .as_ref()
            .map(|k| String::from_utf8_lossy(k).into_owned()),
        value_bytes: record.payload.as_ref().map_or(0, Vec::len),
        headers: headers.into_iter().collect(),
        envelope,
        undecodable,
        original_timestamp: record.original_timestamp,
        heads,
        row: record.row,
        masking,
    })
}

/// Replays `filter` up to `bound` with the CLI's defaults, as `dlq replay` does.
async fn run_replay(
    state: &ConsoleState,
    filter: &Filter,
    bound: Bound,
    progress: impl FnMut(),
) -> anyhow::Result<ReplaySummary> {
    let settings = state.settings();
    replay::replay(
        &settings.kafka,
        &settings.producer,
        &settings.topics.dead_letter.name,
        state.db(),
        filter,
        bound,
        ReplayOptions::default(),
        progress,
    )
    .await
}

/// An audit row; a failure to write it fails the request (an action that
/// cannot be audited is reported, not hidden).
async fn audit_row(
    state: &ConsoleState,
    principal: &Principal,
    action: &str,
    target: serde_json::Value,
    count: u64,
    outcome: &str,
) -> Result<(), ConsoleError> {
    audit::record(state.db(), principal, action, &target, count, outcome).await?;
    Ok(())
}

/// Replays dead letter `id` through `dlq replay --id`'s code and writes
/// the audit row `action`; an unsent row is an error page (it stays pending).
pub async fn replay_by_id(
    state: &ConsoleState,
    principal: &Principal,
    id: i64,
    action: &str,
) -> Result<ReplaySummary, ConsoleError> {
    let filter = Filter {
        ids: vec![id],
        ..Default::default()
    }
    .for_replay()
    .map_err(|e| ConsoleError::bad_input("id", e.to_string()))?;
    let bound = store::bound(state.db(), &filter, 1).await?;
    if bound.rows == 0 {
        return Err(ConsoleError::NotFound(format!(
            "no dead letter with id {id}"
        )));
    }
    let result = run_replay(state, &filter, bound, || {}).await;
    let (count, outcome) = match &result {
        Ok(s) if s.failed.is_empty() => (s.replayed, "ok".to_string()),
        Ok(s) => (s.replayed, format!("failed: {}", s.failed.join("; "))),
        Err(e) => (0, format!("failed: {e:#}")),
    };
    audit_row(state, principal, action, json!({"id": id}), count, &outcome).await?;
    match result {
        Ok(summary) if summary.failed.is_empty() => Ok(summary),
        _ => Err(ConsoleError::Unavailable(format!(
            "dead letter {id} was not replayed ({outcome}); it stays pending"
        ))),
    }
}

async fn replay_one(
    State(state): State<ConsoleState>,
    principal: Principal,
    Path(id): Path<i64>,
) -> Result<Response, ConsoleError> {
    replay_by_id(&state, &principal, id, "dead_letter.replay").await?;
    Ok(Redirect::to(&format!("/dead-letters/{id}")).into_response())
}

/// The ignore form: a reason, and for a head with held followers, what
/// happens to them.
#[derive(Debug, Deserialize)]
pub struct IgnoreForm {
    /// Why (kept with the row).
    #[serde(default)]
    pub reason: String,
    /// `release` or `keep` (required for a head with records held behind it).
    #[serde(default)]
    pub followers: String,
}

/// `followers` as the ignore's choice.
pub fn followers_choice(text: &str) -> Result<Option<Followers>, ConsoleError> {
    match text.trim() {
        "" => Ok(None),
        "release" => Ok(Some(Followers::Release)),
        "keep" => Ok(Some(Followers::KeepHeld)),
        other => Err(ConsoleError::bad_input(
            "followers",
            format!("`{other}` is not a choice; accepted values: release, keep"),
        )),
    }
}

/// Ignores dead letter `id` for `form.reason` through [`ignore::ignore`]:
/// the audit row names the choice made for its followers.
pub async fn ignore_row(
    state: &ConsoleState,
    principal: &Principal,
    id: i64,
    form: &IgnoreForm,
    action: &str,
) -> Result<ignore::IgnoreSummary, ConsoleError> {
    let followers = followers_choice(&form.followers)?;
    let filter = Filter {
        ids: vec![id],
        ..Default::default()
    }
    .for_ignore(&form.reason)
    .map_err(|e| {
        ConsoleError::bad_input(
            "reason",
            "required: say why the dead letter is ignored (it is kept with the row)".to_string()
                + &format!(" ({e})"),
        )
    })?;
    let rows = store::records(state.db(), &filter, 1).await?;
    if rows.is_empty() {
        return Err(ConsoleError::NotFound(format!(
            "no dead letter with id {id}"
        )));
    }
    let summary = match ignore::ignore(state.db(), &rows, form.reason.trim(), followers).await {
        Err(IgnoreError::ChoiceNeeded(why)) => {
            return Err(ConsoleError::bad_input(
                "followers",
                format!(
                    "choose release or keep: {}",
                    why.lines().next().unwrap_or_default()
                ),
            ));
        }
        Err(IgnoreError::Db(e)) => return Err(e.into()),
        Ok(summary) => summary,
    };
    let target = json!({"id": id, "reason": form.reason.trim(), "followers": form.followers.trim(),
        "released": summary.released, "kept_held": summary.kept_held});
    audit_row(
        state,
        principal,
        action,
        target,
        summary.ignored as u64,
        "ok",
    )
    .await?;
    Ok(summary)
}

async fn ignore_one(
    State(state): State<ConsoleState>,
    principal: Principal,
    Path(id): Path<i64>,
    Form(form): Form<IgnoreForm>,
) -> Result<Response, ConsoleError> {
    ignore_row(&state, &principal, id, &form, "dead_letter.ignore").await?;
    Ok(Redirect::to(&format!("/dead-letters/{id}")).into_response())
}

/// The two bulk actions a dry run counts and a confirmation starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Bulk {
    Replay,
    Ignore,
}

impl Bulk {
    /// In its path, its button's id and the page's words: `replay`, `ignore`.
    fn verb(&self) -> &'static str {
        match self {
            Self::Replay => "replay",
            Self::Ignore => "ignore",
        }
    }

    /// On its button and in the title: `Replay`, `Ignore`.
    fn button(&self) -> &'static str {
        match self {
            Self::Replay => "Replay",
            Self::Ignore => "Ignore",
        }
    }

    /// `Replaying`, `Ignoring`.
    fn gerund(&self) -> &'static str {
        match self {
            Self::Replay => "Replaying",
            Self::Ignore => "Ignoring",
        }
    }

    /// The ignore also asks for a reason and the followers' choice.
    fn ignores(&self) -> bool {
        *self == Self::Ignore
    }

    /// The dry run's count and highest id from the confirmation form. A
    /// replay takes a count of 0 (and then says nothing was counted); an
    /// ignore wants one above 0.
    fn counted(&self, form: &ConfirmForm) -> Result<(i64, i64), ConsoleError> {
        let (least, whole) = match self {
            Self::Replay => (0, "a whole number"),
            Self::Ignore => (1, "a whole number above 0"),
        };
        let number = |field: &str, text: &str| {
            text.trim().parse::<i64>().ok().filter(|n| *n >= least).ok_or_else(|| {
                let page = self.verb();
                ConsoleError::bad_input(field, format!("`{text}` is not a count from the dry run ({whole}): open the {page} page again"))
            })
        };
        Ok((number("count", &form.count)?, number("upto", &form.upto)?))
    }
}

/// The dry run of a bulk action: the selection, what it counts now, and
/// (for an operator) the form that confirms it.
#[derive(Template)]
#[template(path = "dead_letters_confirm.html")]
struct ConfirmPage {
    chrome: Chrome,
    form: FilterForm,
    query: String,
    description: String,
    bound: Bound,
    bulk: Bulk,
}

/// Renders the [`ConfirmPage`] of `bulk` for `form` and its dry run `bound`.
fn confirm_page(
    state: &ConsoleState,
    principal: &Principal,
    bulk: Bulk,
    form: FilterForm,
    bound: Bound,
) -> Result<Html<String>, ConsoleError> {
    super::render(&ConfirmPage {
        chrome: state.chrome(
            principal,
            &format!("{} dead letters", bulk.button()),
            "/dead-letters",
        ),
        query: form.query(),
        description: form.describe(),
        form,
        bound,
        bulk,
    })
}

async fn confirm_replay(
    State(state): State<ConsoleState>,
    principal: Principal,
    Query(form): Query<FilterForm>,
) -> Result<Html<String>, ConsoleError> {
    let filter = form
        .filter()?
        .for_replay()
        .map_err(|e| ConsoleError::bad_input("status", e.to_string()))?;
    // The dry run: how many rows, and the highest id, now.
    let bound = store::bound(state.db(), &filter, REPLAY_LIMIT).await?;
    // Without a status, a replay takes the pending ones (as `dlq replay`).
    let form = if some(&form.status).is_none() {
        form.with_status("pending")
    } else {
        form
    };
    confirm_page(&state, &principal, Bulk::Replay, form, bound)
}

/// The confirmation: the filter again, and what the dry run counted.
#[derive(Debug, Deserialize)]
struct ConfirmForm {
    #[serde(flatten)]
    filter: FilterForm,
    /// Rows counted by the dry run.
    #[serde(default)]
    count: String,
    /// Highest id counted.
    #[serde(default)]
    upto: String,
}

async fn replay_filter(
    State(state): State<ConsoleState>,
    principal: Principal,
    Form(form): Form<ConfirmForm>,
) -> Result<Response, ConsoleError> {
    let filter = form
        .filter
        .filter()?
        .for_replay()
        .map_err(|e| ConsoleError::bad_input("status", e.to_string()))?;
    let (count, upto) = Bulk::Replay.counted(&form)?;
    if count == 0 {
        return Err(ConsoleError::bad_input(
            "count",
            "the dry run counted no dead letter: nothing to replay",
        ));
    }
    let bound = Bound {
        rows: count,
        last_id: Some(upto),
    };
    // The run's row: its progress page, on any replica, and beside the CLI's.
    let tracker = Tracker::start(
        state.db(),
        Origin::Console,
        &principal.who,
        &filter.to_json(),
        count as u64,
    )
    .await?;
    let run = tracker.id;
    let target = json!({"filter": form.filter.audit_json(), "upto_id": upto, "run": run});
    audit_row(
        &state,
        &principal,
        "dead_letters.replay",
        target.clone(),
        count as u64,
        "started",
    )
    .await?;
    let task_state = state.clone();
    // Polled on a thread of its own, as the CLI's replay is (its runtime's
    // main thread), not on the workers that also serve the console's pages.
    let runtime = tokio::runtime::Handle::current();
    let replay_thread = std::thread::Builder::new().name(format!("console-replay-{run}"));
    let task = async move {
        let result = run_replay(&task_state, &filter, bound, || tracker.settle()).await;
        let (replayed, outcome) = match &result {
            Ok(s) if s.failed.is_empty() => (s.replayed, "ok".to_string()),
            Ok(s) => (
                s.replayed,
                format!("{} failed, e.g. {}", s.failed.len(), s.failed[0]),
            ),
            Err(e) => (0, format!("failed: {e:#}")),
        };
        if let Err(e) = tracker.finish(&result).await {
            tracing::warn!(error = %e, run, "console: the replay's progress row was not closed");
        }
        if let Err(e) = audit::record(
            task_state.db(),
            &principal,
            "dead_letters.replay.done",
            &target,
            replayed,
            &outcome,
        )
        .await
        {
            tracing::warn!(error = %e, run, "console: the replay's closing audit row failed");
        }
    };
    replay_thread
        .spawn(move || runtime.block_on(task))
        .map_err(|e| {
            ConsoleError::Unavailable(format!("replay {run} could not start a thread: {e}"))
        })?;
    Ok(Redirect::to(&format!("/dead-letters/replays/{run}")).into_response())
}

/// The dead letters an ignore by `form` takes: never every row for want of
/// a filter (as `dlq ignore`), and never held records. `reason` is checked
/// when given (the confirmation); the dry run passes a placeholder.
fn ignore_filter_of(form: &FilterForm, reason: &str) -> Result<Filter, ConsoleError> {
    form.filter()?.for_ignore(reason).map_err(|e| match e {
        store::SelectionError::NoReason => ConsoleError::bad_input("reason", "required: say why these dead letters are ignored (it is kept with each row)"),
        store::SelectionError::IgnoreNeedsSelection => ConsoleError::bad_input(
            "filter",
            "an ignore names what it closes: set at least one of group, class, event, order_id, status, since, until, error",
        ),
        other => ConsoleError::bad_input("status", other.to_string()),
    })
}

async fn confirm_ignore(
    State(state): State<ConsoleState>,
    principal: Principal,
    Query(form): Query<FilterForm>,
) -> Result<Html<String>, ConsoleError> {
    let filter = ignore_filter_of(&form, "(dry run)")?;
    let bound = store::bound(state.db(), &filter, REPLAY_LIMIT).await?;
    confirm_page(&state, &principal, Bulk::Ignore, form, bound)
}

/// The bulk ignore's confirmation: the replay's (the filter, the dry
/// run's count and highest id), the reason and the followers' choice.
#[derive(Debug, Deserialize)]
struct ConfirmIgnoreForm {
    #[serde(flatten)]
    confirmed: ConfirmForm,
    #[serde(default)]
    reason: String,
    #[serde(default)]
    followers: String,
}

async fn ignore_filter(
    State(state): State<ConsoleState>,
    principal: Principal,
    Form(form): Form<ConfirmIgnoreForm>,
) -> Result<Response, ConsoleError> {
    let filter = ignore_filter_of(&form.confirmed.filter, &form.reason)?;
    let followers = followers_choice(&form.followers)?;
    let (count, upto) = Bulk::Ignore.counted(&form.confirmed)?;
    // What the dry run counted, as it is now: none persisted since, none that left the filter.
    let rows = store::records_page(state.db(), &filter, i64::MIN, upto, count).await?;
    let summary = match ignore::ignore(state.db(), &rows, form.reason.trim(), followers).await {
        Err(IgnoreError::ChoiceNeeded(why)) => {
            return Err(ConsoleError::bad_input(
                "followers",
                format!(
                    "choose release or keep: {}",
                    why.lines().next().unwrap_or_default()
                ),
            ));
        }
        Err(IgnoreError::Db(e)) => return Err(e.into()),
        Ok(summary) => summary,
    };
    let target = json!({"filter": form.confirmed.filter.audit_json(), "upto_id": upto, "reason": form.reason.trim(),
        "followers": form.followers.trim(), "released": summary.released, "kept_held": summary.kept_held});
    audit_row(
        &state,
        &principal,
        "dead_letters.ignore",
        target,
        summary.ignored as u64,
        "ok",
    )
    .await?;
    Ok(Redirect::to(&format!(
        "/dead-letters?{}",
        form.confirmed.filter.with_status("ignored").query()
    ))
    .into_response())
}

/// A replay (the console's or the CLI's) as the pages show it.
#[derive(Debug, Clone)]
pub struct RunView {
    /// Run id.
    pub id: i64,
    /// Who started it, and where (`alice (cli)`).
    pub who: String,
    /// The selection in words.
    pub filter: String,
    /// The selection as the list's query string, any status.
    pub query: String,
    /// Rows counted.
    pub total: i64,
    /// Settled so far.
    pub settled: i64,
    /// Percent settled.
    pub percent: i64,
    /// Started (ms).
    pub started_ms: i64,
    /// Last written (ms).
    pub updated_ms: i64,
    /// running, done or stopped.
    pub state: String,
    /// Running, but its process stopped writing.
    pub stalled: bool,
    /// Rows marked replayed (when done).
    pub replayed: i64,
    /// Rows that failed (when done; they stay pending).
    pub failed: i64,
    /// Why it stopped, or its first failure.
    pub error: Option<String>,
}

impl RunView {
    fn of(row: &ReplayRow, now_ms: i64) -> Self {
        let selection: serde_json::Value = serde_json::from_str(&row.selection).unwrap_or_default();
        let form = FilterForm::from_selection(&selection).with_status("");
        Self {
            id: row.id,
            who: format!("{} ({})", row.started_by, row.origin),
            filter: FilterForm::from_selection(&selection).describe(),
            query: form.query(),
            total: row.total,
            settled: row.settled,
            percent: row.percent(),
            started_ms: row.started_ms,
            updated_ms: row.updated_ms,
            state: row.state.clone(),
            stalled: row.stalled(now_ms),
            replayed: row.replayed,
            failed: row.failed,
            error: row.error.clone(),
        }
    }

    /// Still running (and writing).
    pub fn running(&self) -> bool {
        self.state == "running" && !self.stalled
    }
}

#[derive(Template)]
#[template(path = "dead_letters_progress.html")]
struct ProgressPage {
    chrome: Chrome,
    run: RunView,
}

async fn progress(
    State(state): State<ConsoleState>,
    principal: Principal,
    Path(id): Path<i64>,
) -> Result<Html<String>, ConsoleError> {
    let row = progress::get(state.db(), id)
        .await?
        .ok_or_else(|| ConsoleError::NotFound(format!("no replay {id}")))?;
    let run = RunView::of(&row, crate::clock::now_ms());
    let mut chrome = state.chrome(&principal, &format!("Replay {id}"), "/dead-letters");
    // Reloads itself every second while it runs.
    chrome.refresh_secs = u32::from(run.running());
    super::render(&ProgressPage { chrome, run })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One template serves both confirmations: each keeps its own path,
    /// button and words, and only the ignore asks for a reason and the
    /// followers' choice.
    #[test]
    fn the_replay_and_ignore_confirmations_differ_where_they_should() {
        let page = |bulk: Bulk, can_act: bool| {
            let chrome = Chrome {
                title: "t".into(),
                who: "w".into(),
                role: "operator",
                can_act,
                read_only: false,
                csrf: "c".into(),
                nav: vec![],
                refresh_secs: 0,
            };
            let form = FilterForm {
                group: "g1".into(),
                ..FilterForm::default()
            };
            let bound = Bound {
                rows: 5,
                last_id: Some(42),
            };
            ConfirmPage {
                chrome,
                query: form.query(),
                description: form.describe(),
                form,
                bound,
                bulk,
            }
            .render()
            .unwrap()
        };
        let (replay, ignore) = (page(Bulk::Replay, true), page(Bulk::Ignore, true));
        assert!(
            replay.contains(r#"action="/dead-letters/replay""#)
                && replay.contains(r#"id="confirm-replay" class="danger">Replay 5 dead letters<"#),
            "{replay}"
        );
        assert!(
            replay.contains(r#"name="upto" value="42""#) && replay.contains("retry topic"),
            "{replay}"
        );
        assert!(
            !replay.contains(r#"name="reason""#) && !replay.contains(r#"name="followers""#),
            "{replay}"
        );
        assert!(
            ignore.contains(r#"action="/dead-letters/ignore""#)
                && ignore.contains(r#"id="confirm-ignore" class="danger">Ignore 5 dead letters<"#),
            "{ignore}"
        );
        assert!(
            ignore.contains(r#"<input name="reason" id="ignore-reason" required>"#)
                && ignore.contains(r#"name="followers" value="keep""#),
            "{ignore}"
        );
        assert!(
            ignore.contains("closes them without replaying") && !ignore.contains("retry topic"),
            "{ignore}"
        );
        assert!(page(Bulk::Ignore, false).contains("<p>Ignoring needs the operator role"));
        assert!(page(Bulk::Replay, false).contains("<p>Replaying needs the operator role"));
    }

    /// The confirmation's count: a replay takes 0 (and then says so), an ignore wants more.
    #[test]
    fn the_dry_run_count_of_a_confirmation_is_checked_per_action() {
        let form = |count: &str| ConfirmForm {
            filter: FilterForm::default(),
            count: count.into(),
            upto: "9".into(),
        };
        assert_eq!(Bulk::Replay.counted(&form("0")).unwrap(), (0, 9));
        assert_eq!(Bulk::Ignore.counted(&form(" 3 ")).unwrap(), (3, 9));
        let err = Bulk::Ignore.counted(&form("0")).unwrap_err().to_string();
        assert!(
            err.contains("count")
                && err.contains("(a whole number above 0): open the ignore page again"),
            "{err}"
        );
        let err = Bulk::Replay.counted(&form("-1")).unwrap_err().to_string();
        assert!(
            err.contains("(a whole number): open the replay page again"),
            "{err}"
        );
    }

    #[test]
    fn a_bad_filter_field_is_named_with_the_accepted_values() {
        let bad = |form: FilterForm| form.filter().unwrap_err().to_string();
        let e = bad(FilterForm {
            status: "done".into(),
            ..Default::default()
        });
        assert!(
            e.starts_with("status:") && e.contains("pending, replayed, ignored"),
            "{e}"
        );
        let e = bad(FilterForm {
            class: "handler_fatl".into(),
            ..Default::default()
        });
        assert!(
            e.starts_with("class:") && e.contains("accepted values: unavailable"),
            "{e}"
        );
        let e = bad(FilterForm {
            since: "yesterday".into(),
            ..Default::default()
        });
        assert!(e.starts_with("since:") && e.contains("RFC 3339"), "{e}");
        assert!(
            followers_choice("maybe")
                .unwrap_err()
                .to_string()
                .contains("release, keep")
        );
    }

    #[test]
    fn a_filter_round_trips_through_its_query_string() {
        let form = FilterForm {
            group: "g 1".into(),
            class: "handler_fatal".into(),
            order_id: "42".into(),
            ..Default::default()
        };
        assert_eq!(form.query(), "group=g+1&class=handler_fatal&order_id=42");
        let back: FilterForm = serde_urlencoded_like(&form.query());
        assert_eq!(back.filter().unwrap().group.as_deref(), Some("g 1"));
        let filter = form.filter().unwrap();
        assert_eq!(
            (
                filter.key.as_deref(),
                filter.classes.as_slice(),
                filter.status
            ),
            (Some("42"), &["handler_fatal".to_string()][..], None)
        );
        assert!(
            FilterForm::default().filter().unwrap().is_empty(),
            "an empty form is no filter"
        );
        assert_eq!(
            form.describe(),
            "group = g 1, class = handler_fatal, order_id = 42"
        );
        assert_eq!(FilterForm::default().describe(), "every dead letter");
    }

    fn serde_urlencoded_like(query: &str) -> FilterForm {
        let pairs: serde_json::Map<String, serde_json::Value> =
            url::form_urlencoded::parse(query.as_bytes())
                .map(|(k, v)| (k.into_owned(), json!(v.into_owned())))
                .collect();
        serde_json::from_value(serde_json::Value::Object(pairs)).unwrap()
    }
}
