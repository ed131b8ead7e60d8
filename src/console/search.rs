//! Record search (`/search`): the records of a topic matching a key, an
//! event id, a time range and a predicate in the subscriptions' filter
//! language, over a bounded scan ([`crate::explore::search`]).
//!
//! | route | who | what |
//! |---|---|---|
//! | `GET /search` | any | the form, and the console's recent searches |
//! | `POST /search` | any signed-in user | starts a search in the background, then its page |
//! | `GET /search/{id}` | any | its progress (reloading every second while it runs), then its matches decoded |
//! | `POST /search/cancel` | any signed-in user | ends it at its next record; the matches so far stay |
//! | `GET /search/{id}/export` | any | the matches as JSON lines (`application/x-ndjson`) |
//! | `POST /search/replay` | operator, confirmed, audited | sends the matches to a group's retry topic ([`crate::retry::redrive`]) |
//!
//! Searches live in the console's memory: the last [`KEPT`], by id.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use askama::Template;
use axum::Router;
use axum::extract::{Form, Path, Query, State};
use axum::http::{Uri, header};
use axum::response::{Html, IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use serde::Deserialize;
use serde_json::json;

use super::auth::Principal;
use super::masking::{Masking, RevealQuery};
use super::topics::RecordRow;
use super::{Chrome, ConsoleError, ConsoleState, Page, audit, filters};
use crate::explore::RecordView;
use crate::explore::search::{Ended, Progress, SearchOutcome, SearchSpec};
use crate::retry::redrive::Found;

/// The search pages.
pub const PAGE: Page = Page {
    routes,
    nav: Some(("Search", "/search")),
    actions: &["/search/replay"],
};

/// Searches kept in memory.
pub const KEPT: usize = 20;

/// Matches shown on a search's page (all are exported and replayed).
const SHOWN: usize = 200;

fn routes() -> Router<ConsoleState> {
    Router::new()
        .route("/search", get(form).post(start))
        .route("/search/cancel", post(cancel))
        .route("/search/replay", post(replay))
        .route("/search/{id}", get(show))
        .route("/search/{id}/export", get(export))
}

/// A search's end: the outcome with its matches decoded and how long it
/// took (ms), or why it failed.
type JobResult = Result<(SearchOutcome, Vec<RecordView>, i64), String>;

/// One search: what, who, how far, and what it found.
pub struct Job {
    id: u64,
    spec: SearchSpec,
    started_by: String,
    started_ms: i64,
    progress: Arc<Progress>,
    /// Set when it ended: the outcome with the matches decoded, or why it failed.
    result: Mutex<Option<JobResult>>,
}

/// The console's recent searches.
#[derive(Default)]
pub struct Jobs {
    next: AtomicU64,
    recent: Mutex<VecDeque<Arc<Job>>>,
}

impl Jobs {
    fn add(&self, spec: SearchSpec, started_by: &str) -> Arc<Job> {
        let job = Arc::new(Job {
            id: self.next.fetch_add(1, Ordering::Relaxed) + 1,
            spec,
            started_by: started_by.to_string(),
            started_ms: crate::clock::now_ms(),
            progress: Arc::default(),
            result: Mutex::new(None),
        });
        let mut recent = self.recent.lock().expect("searches lock");
        recent.push_front(job.clone());
        while recent.len() > KEPT {
            if let Some(old) = recent.pop_back() {
                old.progress.cancel();
            }
        }
        job
    }

    fn get(&self, id: u64) -> Result<Arc<Job>, ConsoleError> {
        self.recent
            .lock()
            .expect("searches lock")
            .iter()
            .find(|j| j.id == id)
            .cloned()
            .ok_or_else(|| {
                ConsoleError::NotFound(format!(
                    "search {id}: not one of the last {KEPT} of this console"
                ))
            })
    }

    fn list(&self) -> Vec<Arc<Job>> {
        self.recent
            .lock()
            .expect("searches lock")
            .iter()
            .cloned()
            .collect()
    }
}

/// The form's fields (`where`: one condition per line).
#[derive(Debug, Default, Deserialize)]
struct SearchForm {
    #[serde(default)]
    topic: String,
    #[serde(default)]
    key: String,
    #[serde(default)]
    event_id: String,
    #[serde(default)]
    from: String,
    #[serde(default)]
    to: String,
    #[serde(default, rename = "where")]
    predicate: String,
    #[serde(default)]
    max_scan: String,
}

/// A search as the pages list it.
struct JobRow {
    id: u64,
    what: String,
    started_by: String,
    started_ms: i64,
    state: String,
    scanned: u64,
    total: u64,
    matched: u64,
    percent: u64,
    running: bool,
}

impl JobRow {
    fn of(job: &Job) -> Self {
        let s = &job.spec;
        let mut what = vec![format!("topic {}", s.topic)];
        what.extend(s.key.as_ref().map(|k| format!("key {k}")));
        what.extend(s.event_id.as_ref().map(|e| format!("event id {e}")));
        what.extend(s.from_ms.map(|t| format!("from {}", utc(t))));
        what.extend(s.to_ms.map(|t| format!("to {}", utc(t))));
        what.extend(s.predicate_text.iter().map(|p| format!("where {p}")));
        let (scanned, total) = (job.progress.scanned(), job.progress.total());
        let result = job.result.lock().expect("result lock");
        let state = match &*result {
            None if job.progress.is_cancelled() => "cancelling".to_string(),
            None => "running".to_string(),
            Some(Err(e)) => format!("failed: {e}"),
            Some(Ok((o, _, ms))) => match o.ended {
                Ended::Complete => format!("complete in {:.1} s", *ms as f64 / 1000.0),
                Ended::Cancelled => format!("cancelled after {:.1} s", *ms as f64 / 1000.0),
                Ended::ScanBound => format!("stopped at the scan bound ({} records)", s.max_scan),
                Ended::MatchBound => format!("stopped at {} matches", s.max_matches),
            },
        };
        Self {
            id: job.id,
            what: what.join(", "),
            started_by: job.started_by.clone(),
            started_ms: job.started_ms,
            running: result.is_none(),
            state,
            scanned,
            total,
            matched: job.progress.matched(),
            percent: (100 * scanned).checked_div(total).unwrap_or(100),
        }
    }
}

fn utc(ms: i64) -> String {
    chrono::DateTime::from_timestamp_millis(ms)
        .map(|t| crate::envelope::format_utc(&t))
        .unwrap_or_default()
}

#[derive(Template)]
#[template(path = "search.html")]
struct SearchFormPage {
    chrome: Chrome,
    topic: String,
    topics: Vec<crate::explore::TopicName>,
    recent: Vec<JobRow>,
}

#[derive(Template)]
#[template(path = "search_job.html")]
struct SearchJobPage {
    chrome: Chrome,
    job: JobRow,
    records: Vec<RecordRow>,
    more: usize,
    next_offsets: String,
    replayed: Option<u64>,
    masking: Masking,
}

#[derive(Debug, Default, Deserialize)]
struct FormQuery {
    topic: Option<String>,
}

async fn form(
    State(state): State<ConsoleState>,
    principal: Principal,
    Query(q): Query<FormQuery>,
) -> Result<Html<String>, ConsoleError> {
    let s = state.settings();
    let topics = super::topics::explorer(&state)?
        .topics()
        .await
        .unwrap_or_default();
    super::render(&SearchFormPage {
        chrome: state.chrome(&principal, "Record search", "/search"),
        topic: q
            .topic
            .unwrap_or_else(|| s.topics.order_events.name.clone()),
        topics,
        recent: state
            .searches()
            .list()
            .iter()
            .map(|j| JobRow::of(j))
            .collect(),
    })
}

async fn start(
    State(state): State<ConsoleState>,
    principal: Principal,
    Form(form): Form<SearchForm>,
) -> Result<Response, ConsoleError> {
    let max_scan = match form.max_scan.trim() {
        "" => None,
        t => Some(t.parse::<u64>().map_err(|_| {
            ConsoleError::bad_input("max_scan", format!("`{t}` is not a whole number"))
        })?),
    };
    let predicate: Vec<String> = form.predicate.lines().map(str::to_string).collect();
    let spec = SearchSpec::parse(
        form.topic.trim(),
        Some(&form.key),
        Some(&form.event_id),
        Some(&form.from),
        Some(&form.to),
        &predicate,
        max_scan,
    )?;
    super::topics::check_topic(&spec.topic)?;
    let explorer = super::topics::explorer(&state)?;
    let job = state.searches().add(spec, &principal.who);
    tracing::info!(search = job.id, who = principal.who, spec = ?job.spec, "record search started");
    let running = job.clone();
    tokio::spawn(async move {
        let started = std::time::Instant::now();
        let result = match explorer.search(&running.spec, &running.progress).await {
            Ok(outcome) => {
                let views = explorer.views(&outcome.matches).await;
                Ok((outcome, views, started.elapsed().as_millis() as i64))
            }
            Err(e) => Err(e.to_string()),
        };
        *running.result.lock().expect("result lock") = Some(result);
    });
    Ok(Redirect::to(&format!("/search/{}", job.id)).into_response())
}

/// `?replayed=N` after a replay; `?reveal=1`: an operator reveals masked fields.
#[derive(Debug, Default, Deserialize)]
struct ShowQuery {
    replayed: Option<u64>,
    reveal: Option<String>,
}

async fn show(
    State(state): State<ConsoleState>,
    principal: Principal,
    uri: Uri,
    Path(id): Path<u64>,
    Query(q): Query<ShowQuery>,
) -> Result<Html<String>, ConsoleError> {
    let job = state.searches().get(id)?;
    let masking = Masking::of(&state, &principal, &uri, q.reveal.as_deref()).await?;
    let row = JobRow::of(&job);
    let (records, more, next_offsets) = match &*job.result.lock().expect("result lock") {
        Some(Ok((outcome, views, _))) => (
            views
                .iter()
                .take(SHOWN)
                .cloned()
                .map(|r| RecordRow::of(r, &masking))
                .collect(),
            views.len().saturating_sub(SHOWN),
            outcome
                .next_offsets
                .iter()
                .map(|(p, o)| format!("{p}:{o}"))
                .collect::<Vec<_>>()
                .join(" "),
        ),
        _ => (Vec::new(), 0, String::new()),
    };
    let mut chrome = state.chrome(&principal, &format!("Search {id}"), "/search");
    if row.running {
        chrome.refresh_secs = 1;
    }
    super::render(&SearchJobPage {
        chrome,
        job: row,
        records,
        more,
        next_offsets,
        replayed: q.replayed,
        masking,
    })
}

/// The `id` field of the cancel and replay forms.
#[derive(Debug, Default, Deserialize)]
struct JobForm {
    #[serde(default)]
    id: String,
    #[serde(default)]
    group: String,
    #[serde(default)]
    confirm: String,
}

impl JobForm {
    fn job(&self, state: &ConsoleState) -> Result<Arc<Job>, ConsoleError> {
        let id = self.id.trim().parse::<u64>().map_err(|_| {
            ConsoleError::bad_input("id", format!("`{}` is not a search id", self.id))
        })?;
        state.searches().get(id)
    }
}

async fn cancel(
    State(state): State<ConsoleState>,
    Form(form): Form<JobForm>,
) -> Result<Response, ConsoleError> {
    let job = form.job(&state)?;
    job.progress.cancel();
    Ok(Redirect::to(&format!("/search/{}", job.id)).into_response())
}

async fn export(
    State(state): State<ConsoleState>,
    principal: Principal,
    uri: Uri,
    Path(id): Path<u64>,
    Query(q): Query<RevealQuery>,
) -> Result<Response, ConsoleError> {
    let job = state.searches().get(id)?;
    let masking = Masking::of(&state, &principal, &uri, q.reveal.as_deref()).await?;
    let result = job.result.lock().expect("result lock");
    let Some(Ok((_, views, _))) = &*result else {
        return Err(ConsoleError::Conflict(format!(
            "search {id} has not ended: export it once it has"
        )));
    };
    let mut lines = String::new();
    for view in views {
        let view = serde_json::to_value(view).map_err(|e| ConsoleError::Internal(e.to_string()))?;
        lines.push_str(&masking.apply_to_view(view).to_string());
        lines.push('\n');
    }
    Ok((
        [
            (header::CONTENT_TYPE, "application/x-ndjson".to_string()),
            (
                header::CONTENT_DISPOSITION,
                format!("attachment; filename=\"search-{id}.jsonl\""),
            ),
        ],
        lines,
    )
        .into_response())
}

async fn replay(
    State(state): State<ConsoleState>,
    principal: Principal,
    Form(form): Form<JobForm>,
) -> Result<Response, ConsoleError> {
    let job = form.job(&state)?;
    let group = form.group.trim();
    if group.is_empty() {
        return Err(ConsoleError::bad_input(
            "group",
            "required: the consumer group whose retry topic gets the matches",
        ));
    }
    if form.confirm.trim() != group {
        return Err(ConsoleError::bad_input(
            "confirm",
            format!("type the group's name, `{group}`, to confirm"),
        ));
    }
    let records = match &*job.result.lock().expect("result lock") {
        Some(Ok((outcome, _, _))) => outcome.matches.clone(),
        _ => {
            return Err(ConsoleError::Conflict(format!(
                "search {} has not ended: replay its matches once it has",
                job.id
            )));
        }
    };
    let found: Vec<Found<'_>> = records
        .iter()
        .map(|r| Found {
            partition: r.partition,
            offset: r.offset,
            timestamp_ms: r.timestamp_ms,
            key: r.key.as_deref(),
            headers: &r.headers,
            value: r.value.as_deref(),
        })
        .collect();
    let s = state.settings();
    let sent = crate::retry::redrive::to_retry_topic(
        &s.kafka,
        &s.producer,
        &s.topics.dead_letter.name,
        &job.spec.topic,
        group,
        &found,
        &principal.who,
    )
    .await
    .map_err(|e| ConsoleError::Unavailable(e.to_string()))?;
    let target = json!({"search": job.id, "topic": job.spec.topic, "group": group,
        "key": job.spec.key, "event_id": job.spec.event_id, "where": job.spec.predicate_text});
    audit::record(
        state.db(),
        &principal,
        "search.replay",
        &target,
        sent as u64,
        "sent to the retry topic",
    )
    .await?;
    Ok(Redirect::to(&format!("/search/{}?replayed={sent}", job.id)).into_response())
}
