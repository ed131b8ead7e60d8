//! `orderpipe console`: the operator's web UI, served by the binary itself.
//!
//! Server-side HTML from askama templates (`src/console/templates/`, checked
//! at compile time), one stylesheet, no JavaScript needed to read; pages
//! that refresh themselves use `<meta http-equiv="refresh">`.
//!
//! | module | what it is |
//! |---|---|
//! | [`config`] | the `[console]` section: listen, tokens, proxy headers, read-only |
//! | [`auth`] | who asks ([`Principal`]) and their [`Role`]: proxy header, bearer token, login cookie |
//! | [`csrf`] | the gate of every POST: CSRF token, operator role, read-only |
//! | [`audit`] | the `console_audit` rows of every state change, and the `/audit` page |
//! | [`overview`] | `/`: per group lag, applied/s, failure rate, dead letters, parked keys, an operator's pause |
//! | [`groups`] | pause and resume a group from its card (confirmed, audited) |
//! | [`masking`] | `console.masked_fields` shown as `•••`, revealed per page by an operator (audited) |
//! | [`search`] | `/search`: records of a topic by key, event id, time and a predicate; progress, cancel, export, replay |
//! | [`history`] | `/history`: charts of the last hour or day, from Prometheus or the console's own samples |
//! | [`snapshots`] | `/snapshots`: a cdc source's incremental snapshots, their progress and recent signals |
//!
//! Adding a page: a module with a `pub const PAGE: Page` (its routes, its nav
//! link, example paths of its POST routes), listed in [`PAGES`]; handlers take
//! `State<ConsoleState>` and a [`Principal`], render a template whose struct
//! has a `chrome: Chrome` field, and return `Result<Html<String>, ConsoleError>`.
//! Action (POST) routes are guarded by [`csrf::guard`] without any code of
//! their own, and write an audit row with [`audit::record`].

pub mod audit;
pub mod auth;
pub mod csrf;
pub mod dead_letters;
pub mod groups;
pub mod held;
pub mod history;
pub mod masking;
pub mod overview;
pub mod schemas;
pub mod search;
pub mod snapshots;
pub mod subscriptions;
pub mod topics;

use std::net::SocketAddr;
use std::sync::Arc;

use askama::Template;
use axum::Router;
use axum::extract::{Query, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{Html, IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use secrecy::SecretString;
use serde::Deserialize;

pub use crate::config::console::ConsoleSettings;
pub use auth::{Principal, Role};

use crate::config::Settings;
use crate::db::{Db, DbError};
use crate::metrics::name;

/// One page of the console: its routes, its link in the navigation, and
/// example paths of its POST (action) routes, which the security tests
/// walk (a viewer's forged POST must get 403, a POST without a CSRF token too).
pub struct Page {
    /// The page's routes (GET pages and POST actions).
    pub routes: fn() -> Router<ConsoleState>,
    /// Label and path in the navigation bar, if it has one.
    pub nav: Option<(&'static str, &'static str)>,
    /// An example concrete path of every POST route (`/dead-letters/1/replay`).
    pub actions: &'static [&'static str],
}

/// Every page, in navigation order.
pub const PAGES: &[Page] = &[
    overview::PAGE,
    history::PAGE,
    dead_letters::PAGE,
    held::PAGE,
    groups::PAGE,
    topics::PAGE,
    search::PAGE,
    schemas::PAGE,
    subscriptions::PAGE,
    snapshots::PAGE,
    audit::PAGE,
];

/// Example paths of every action route of every page (for the tests).
pub fn action_paths() -> Vec<&'static str> {
    PAGES
        .iter()
        .flat_map(|p| p.actions.iter().copied())
        .collect()
}

/// What a console request can fail with; renders as an HTML error page
/// with the matching status.
#[derive(Debug, thiserror::Error)]
pub enum ConsoleError {
    /// 400: a bad input, naming the field and what it accepts.
    #[error("{field}: {message}")]
    BadInput {
        /// The form or query field.
        field: String,
        /// What is wrong and the accepted values.
        message: String,
    },
    /// 401: nobody signed in.
    #[error("not signed in: {0}")]
    Unauthenticated(String),
    /// 403: signed in, but not allowed (viewer, read-only, CSRF token).
    #[error("refused: {0}")]
    Forbidden(String),
    /// 404: no such page or item.
    #[error("not found: {0}")]
    NotFound(String),
    /// 409: the item's state forbids it now.
    #[error("conflict: {0}")]
    Conflict(String),
    /// 503: the database, Kafka or the registry did not answer.
    #[error("unavailable: {0}")]
    Unavailable(String),
    /// 500: anything else.
    #[error("internal error: {0}")]
    Internal(String),
}

impl ConsoleError {
    /// A bad input of `field`.
    pub fn bad_input(field: &str, message: impl Into<String>) -> Self {
        Self::BadInput {
            field: field.into(),
            message: message.into(),
        }
    }

    /// The HTTP status of this error.
    pub fn status(&self) -> StatusCode {
        match self {
            Self::BadInput { .. } => StatusCode::BAD_REQUEST,
            Self::Unauthenticated(_) => StatusCode::UNAUTHORIZED,
            Self::Forbidden(_) => StatusCode::FORBIDDEN,
            Self::NotFound(_) => StatusCode::NOT_FOUND,
            Self::Conflict(_) => StatusCode::CONFLICT,
            Self::Unavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
            Self::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }
}

impl From<DbError> for ConsoleError {
    fn from(e: DbError) -> Self {
        match e {
            DbError::Other(why) => Self::Internal(format!("database: {why}")),
            e => Self::Unavailable(e.to_string()),
        }
    }
}

#[derive(Template)]
#[template(path = "error.html")]
struct ErrorPage<'a> {
    status: u16,
    reason: &'a str,
    field: Option<&'a str>,
    message: String,
    sign_in: bool,
}

impl IntoResponse for ConsoleError {
    fn into_response(self) -> Response {
        let status = self.status();
        let (field, message) = match &self {
            Self::BadInput { field, message } => (Some(field.as_str()), message.clone()),
            other => (None, other.to_string()),
        };
        if status.is_server_error() {
            tracing::warn!(error = %self, "console request failed");
        }
        let page = ErrorPage {
            status: status.as_u16(),
            reason: status.canonical_reason().unwrap_or("Error"),
            field,
            message,
            sign_in: status == StatusCode::UNAUTHORIZED,
        };
        match page.render() {
            Ok(html) => (status, Html(html)).into_response(),
            Err(e) => (status, format!("{self} (and the error page failed: {e})")).into_response(),
        }
    }
}

/// Renders a page template.
pub fn render(template: &impl Template) -> Result<Html<String>, ConsoleError> {
    template
        .render()
        .map(Html)
        .map_err(|e| ConsoleError::Internal(format!("template: {e}")))
}

/// The held-orders page of `key` parked for `group` in `topic` (`/held/key`
/// of [`held`]; `topic` left out when empty: the page then asks for it only
/// if the key is parked in several topics). It lives here, not in [`held`],
/// because the dead-letters page links to it too, and [`held`] builds on
/// the dead-letters page's actions: [`dead_letters`] does not import [`held`].
fn held_key_page(group: &str, topic: &str, key: &str) -> String {
    let mut q = url::form_urlencoded::Serializer::new(String::new());
    q.append_pair("group", group).append_pair("key", key);
    if !topic.is_empty() {
        q.append_pair("topic", topic);
    }
    format!("/held/key?{}", q.finish())
}

/// Template filters shared by the pages (`use super::filters;` next to
/// the template struct): `{{ ms|utc }}` prints ms since the epoch as UTC.
pub mod filters {
    /// `2026-12-01 08:40:03 UTC` from ms since the epoch.
    #[askama::filter_fn]
    pub fn utc(ms: &i64, _: &dyn askama::Values) -> askama::Result<String> {
        Ok(chrono::DateTime::from_timestamp_millis(*ms).map_or_else(
            || ms.to_string(),
            |t| t.format("%Y-%m-%d %H:%M:%S UTC").to_string(),
        ))
    }
}

/// A link of the navigation bar.
#[derive(Debug, Clone)]
pub struct NavLink {
    /// Shown text.
    pub label: &'static str,
    /// Target path.
    pub path: &'static str,
    /// Whether it is the current page.
    pub current: bool,
}

/// What the layout (`base.html`) needs on every page: give each page
/// template struct a `chrome: Chrome` field ([`ConsoleState::chrome`]).
#[derive(Debug, Clone)]
pub struct Chrome {
    /// The page title.
    pub title: String,
    /// Who is signed in.
    pub who: String,
    /// Their role (`viewer`, `operator`).
    pub role: &'static str,
    /// Whether to render action buttons and forms: operator, not read-only.
    /// Templates wrap every action in `{% if chrome.can_act %}`.
    pub can_act: bool,
    /// Whether the console is `--read-only`.
    pub read_only: bool,
    /// The CSRF token: every form has `<input type="hidden" name="csrf_token" value="{{ chrome.csrf }}">`.
    pub csrf: String,
    /// The navigation bar.
    pub nav: Vec<NavLink>,
    /// Seconds until the page reloads itself; 0 = never ([`Chrome::refreshing`]).
    pub refresh_secs: u32,
}

impl Chrome {
    /// The page reloads itself every `console.refresh_secs`.
    pub fn refreshing(mut self, state: &ConsoleState) -> Self {
        self.refresh_secs = state.settings().console.refresh_secs;
        self
    }
}

/// Everything a handler needs: settings (Kafka, topics, registry, ...),
/// the database pool, authentication and the CSRF key. Cheap to clone.
#[derive(Clone)]
pub struct ConsoleState(Arc<Inner>);

struct Inner {
    settings: Settings,
    db: Db,
    auth: auth::Authenticator,
    csrf: csrf::CsrfKey,
    lag: overview::LagCache,
    searches: search::Jobs,
    mask: crate::masking::FieldMask,
}

/// A [`ConsoleState`] that does not keep the console alive (background tasks hold it).
pub struct WeakConsoleState(std::sync::Weak<Inner>);

impl ConsoleState {
    /// The console of `settings` (its `[console]` section) on `db`.
    /// Refused without a way to sign in: the console is never open.
    pub fn new(settings: Settings, db: Db) -> Result<Self, ConsoleError> {
        if !settings.console.has_authentication() {
            return Err(ConsoleError::Forbidden(
                "the console needs a way to sign in: set console.viewer_token and/or console.operator_token \
                 (ORDERPIPE_CONSOLE__VIEWER_TOKEN, ORDERPIPE_CONSOLE__OPERATOR_TOKEN), or console.proxy_user_header \
                 behind an authenticating proxy"
                    .into(),
            ));
        }
        let mask = crate::masking::FieldMask::parse(&settings.console.masked_fields)
            .map_err(ConsoleError::Internal)?;
        Ok(Self(Arc::new(Inner {
            mask,
            auth: auth::Authenticator::new(&settings.console),
            csrf: csrf::CsrfKey::random(),
            lag: overview::LagCache::default(),
            searches: search::Jobs::default(),
            settings,
            db,
        })))
    }

    /// All settings (Kafka, topics, registry, dlq, console, ...).
    pub fn settings(&self) -> &Settings {
        &self.0.settings
    }

    /// The database pool.
    pub fn db(&self) -> &Db {
        &self.0.db
    }

    /// Whether the console changes nothing (`--read-only`).
    pub fn read_only(&self) -> bool {
        self.0.settings.console.read_only
    }

    /// Authentication.
    pub fn auth(&self) -> &auth::Authenticator {
        &self.0.auth
    }

    /// The CSRF key.
    pub fn csrf(&self) -> &csrf::CsrfKey {
        &self.0.csrf
    }

    /// The broker lag measured in the background (the overview's).
    pub fn lag_cache(&self) -> &overview::LagCache {
        &self.0.lag
    }

    /// The fields masked on the pages that show decoded records.
    pub fn field_mask(&self) -> &crate::masking::FieldMask {
        &self.0.mask
    }

    /// The record searches of this console.
    pub fn searches(&self) -> &search::Jobs {
        &self.0.searches
    }

    /// A handle that does not keep the console alive.
    pub fn downgrade(&self) -> WeakConsoleState {
        WeakConsoleState(Arc::downgrade(&self.0))
    }

    /// The console of `weak`, unless it is gone.
    pub fn upgrade(weak: &WeakConsoleState) -> Option<Self> {
        weak.0.upgrade().map(Self)
    }

    /// The layout's data for `principal` on the page `title` at `path`
    /// (the nav link whose path is `path` is marked current).
    pub fn chrome(&self, principal: &Principal, title: &str, path: &str) -> Chrome {
        Chrome {
            title: title.to_string(),
            who: principal.who.clone(),
            role: principal.role.as_str(),
            can_act: principal.can_act(self.read_only()),
            read_only: self.read_only(),
            csrf: self.csrf().token(principal),
            nav: PAGES
                .iter()
                .filter_map(|p| p.nav)
                .map(|(label, target)| NavLink {
                    label,
                    path: target,
                    current: target == path,
                })
                .collect(),
            refresh_secs: 0,
        }
    }
}

/// The console's routes: every page, sign in/out, the stylesheet, all
/// behind [`csrf::guard`] and the request metrics.
pub fn router(state: ConsoleState) -> Router {
    let mut app = Router::new()
        .route("/login", get(login_form).post(login))
        .route("/logout", post(logout))
        .route("/assets/console.css", get(stylesheet));
    for page in PAGES {
        app = app.merge((page.routes)());
    }
    app.fallback(|| async { ConsoleError::NotFound("no such page".into()) })
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            csrf::guard,
        ))
        // Outside the gate: refused requests are counted too.
        .layer(axum::middleware::from_fn(observe))
        .with_state(state)
}

/// Serves the console and `/metrics`, `/health/*` on `addr` until
/// `shutdown`; reports the bound address through `bound`.
pub async fn serve(
    addr: SocketAddr,
    state: ConsoleState,
    bound: impl FnOnce(SocketAddr),
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let health = crate::health::HealthState::service();
    crate::health::watch_db(state.db().clone(), health.clone());
    // The first lag measurement starts now, so the first overview need not wait for it.
    let warm = state.clone();
    tokio::spawn(async move { warm.lag_cache().latest(&warm).await });
    history::sampler::start(&state);
    crate::health::serve_app(addr, router(state), health, bound, shutdown).await
}

/// The page label of a path for the metrics: its first segment when a
/// page owns it, else `other` (bounded: never an id).
fn page_label(path: &str) -> String {
    let first = path
        .trim_start_matches('/')
        .split('/')
        .next()
        .unwrap_or_default();
    let known = |prefix: &str| prefix.trim_start_matches('/').split('/').next() == Some(first);
    match first {
        "" => "overview".into(),
        "login" | "logout" | "assets" => first.into(),
        _ if PAGES.iter().any(|p| {
            p.nav.is_some_and(|(_, path)| known(path)) || p.actions.iter().any(|a| known(a))
        }) =>
        {
            first.into()
        }
        _ => "other".into(),
    }
}

/// Counts each request by page, method and status, and times it.
async fn observe(request: axum::extract::Request, next: axum::middleware::Next) -> Response {
    let page = page_label(request.uri().path());
    let method = request.method().to_string();
    let started = std::time::Instant::now();
    let response = next.run(request).await;
    let status = response.status().as_u16().to_string();
    metrics::histogram!(name::CONSOLE_RENDER, "page" => page.clone())
        .record(started.elapsed().as_secs_f64());
    metrics::counter!(name::CONSOLE_REQUESTS, "page" => page, "method" => method, "status" => status).increment(1);
    response
}

async fn stylesheet() -> impl IntoResponse {
    (
        [
            (header::CONTENT_TYPE, "text/css; charset=utf-8"),
            (header::CACHE_CONTROL, "max-age=300"),
        ],
        include_str!("assets/console.css"),
    )
}

#[derive(Template)]
#[template(path = "login.html")]
struct LoginPage {
    next: String,
    has_tokens: bool,
    proxy_header: Option<String>,
    error: Option<String>,
}

#[derive(Debug, Deserialize)]
struct LoginQuery {
    #[serde(default)]
    next: Option<String>,
}

/// Where to go after signing in: a local path only (no open redirect).
fn local_path(next: Option<&str>) -> String {
    match next {
        Some(p) if p.starts_with('/') && !p.starts_with("//") && !p.contains('\\') => p.to_string(),
        _ => "/".into(),
    }
}

async fn login_form(
    State(state): State<ConsoleState>,
    Query(query): Query<LoginQuery>,
) -> Result<Html<String>, ConsoleError> {
    render(&LoginPage {
        next: local_path(query.next.as_deref()),
        has_tokens: state.auth().has_tokens(),
        proxy_header: state.settings().console.proxy_user_header.clone(),
        error: None,
    })
}

async fn login(State(state): State<ConsoleState>, body: axum::body::Bytes) -> Response {
    let next = local_path(csrf::form_value(&body, "next").as_deref());
    let token = csrf::form_value(&body, "token").unwrap_or_default();
    let failed = |error: &str| {
        let page = LoginPage {
            next: next.clone(),
            has_tokens: state.auth().has_tokens(),
            proxy_header: state.settings().console.proxy_user_header.clone(),
            error: Some(error.to_string()),
        };
        match render(&page) {
            Ok(html) => (StatusCode::UNAUTHORIZED, html).into_response(),
            Err(e) => e.into_response(),
        }
    };
    if token.trim().is_empty() {
        return failed("token: required (the viewer or operator token you were given)");
    }
    match state
        .auth()
        .login(&SecretString::from(token.trim().to_string()))
    {
        Some((id, principal)) => {
            tracing::info!(who = %principal.who, "console: signed in");
            let mut response = Redirect::to(&next).into_response();
            response.headers_mut().insert(
                header::SET_COOKIE,
                auth::session_set_cookie(Some(&id))
                    .parse()
                    .expect("cookie is a valid header value"),
            );
            response
        }
        None => failed("token: not a console token (neither the viewer nor the operator token)"),
    }
}

async fn logout(State(state): State<ConsoleState>, headers: HeaderMap) -> Response {
    state.auth().logout(&headers);
    let mut response = Redirect::to("/login").into_response();
    response.headers_mut().insert(
        header::SET_COOKIE,
        auth::session_set_cookie(None)
            .parse()
            .expect("cookie is a valid header value"),
    );
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_are_bounded_and_redirects_local() {
        assert_eq!(page_label("/"), "overview");
        assert_eq!(page_label("/audit"), "audit");
        assert_eq!(page_label("/no-such/123"), "other");
        assert_eq!(local_path(Some("https://evil.example/")), "/");
        assert_eq!(local_path(Some("//evil.example/")), "/");
        assert_eq!(
            local_path(Some("/dead-letters?group=a")),
            "/dead-letters?group=a"
        );
    }
}
