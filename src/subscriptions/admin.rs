//! The admin HTTP API of the control plane (seed 003's Go Admin API):
//! the CRUD of `orderpipe subs`, plus refresh, bindings and reload.
//!
//! | request | what it does |
//! |---|---|
//! | `GET /consumers`, `GET /consumers/{name}` | list, show |
//! | `POST /consumers` | add (body: [`NewConsumer`]) |
//! | `PATCH /consumers/{name}` | update (body: [`ConsumerPatch`]) |
//! | `POST /consumers/{name}/enable`, `.../disable` | enable, disable |
//! | `DELETE /consumers/{name}` | remove (refused while subscriptions name it) |
//! | `/subscriptions[/{id}]`, `/events[/{routing_key}]`, `/sources[/{name}]` | the same for the other kinds (events have no enable) |
//! | `POST /refresh[?consumer=NAME]` | routers recompute their groups and reconcile now (seed: `refresh_bindings`); answers the desired bindings |
//! | `GET /bindings[?consumer=NAME]` | desired bindings, the actual state when a router serves this API, and their difference |
//! | `POST /reload[?consumer=NAME]` | routers re-read the tables now (seed: `reload_config`) |
//! | `GET /groups/paused` | the consumer groups an operator paused ([`crate::consumer::group_pause`]) |
//! | `POST /groups/{group}/pause` | pause a group (body: [`PauseRequest`], `{}` for none), as `orderpipe group pause` |
//! | `POST /groups/{group}/resume` | resume it; answers whether it was paused |
//! | `POST /subscriptions/{id}/pause`, `POST /consumers/{name}/pause` | pause the group serving the subscription, or each of the consumer's groups (body: [`PauseRequest`]); answers every group with the subscriptions it holds ([`super::pause`]) |
//! | `POST /subscriptions/{id}/resume`, `POST /consumers/{name}/resume` | resume them |
//! | `POST /cdc/{source}/snapshot/{action}` | `start`, `stop`, `pause` or `resume` the cdc source's incremental snapshots (body: [`SnapshotRequest`]), as `orderpipe cdc snapshot`: answers the signal written ([`crate::snapshot_signals`]) |
//! | `GET /cdc/{source}/snapshot/signals` | its 20 newest signals and what became of them |
//!
//! Every request that changes state (every method but `GET`) needs
//! `Authorization: Bearer <admin.token>`: none or a malformed header is
//! 401, a wrong token 403, and so is any change while `admin.token` is
//! unset (the API is then read-only). The token is a
//! [`SecretString`]: never printed, never logged; compared by digest.
//! Errors are `{"error": "...", "field": "..."}` with 400 (bad input,
//! naming the field), 404, 409 (exists, in use) or 503 (database down).

use std::net::SocketAddr;
use std::sync::Arc;

use axum::extract::rejection::JsonRejection;
use axum::extract::{Path, Query, State};
use axum::http::{Method, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use secrecy::{ExposeSecret, SecretString};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use super::bindings::{ActualState, diff};
use super::model::*;
use super::pause::{GroupAction, PauseTarget};
use super::record::Record;
use super::store::{Origin, RequestKind, Store};
use super::{Invalid, SubsError};
use crate::consumer::group_pause::{self, GroupPause};
use crate::db::{Db, DbError};
use crate::metrics::name;
use crate::snapshot_signals::{self, SignalKind};

/// The `[admin]` section: the admin API's address and token.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AdminSettings {
    /// Listen address of `orderpipe subs serve` (port 0 = any free port).
    #[serde(default = "default_listen")]
    pub listen: String,
    /// The bearer token state changes need (`ORDERPIPE_ADMIN__TOKEN`);
    /// unset: the API is read-only. At least 16 characters.
    #[serde(default)]
    pub token: Option<SecretString>,
}

impl Default for AdminSettings {
    fn default() -> Self {
        Self {
            listen: default_listen(),
            token: None,
        }
    }
}

fn default_listen() -> String {
    "127.0.0.1:8090".into()
}

/// Shortest token accepted.
pub const MIN_TOKEN_CHARS: usize = 16;

impl AdminSettings {
    /// Checks the address and the token's length (never its value in the message).
    pub fn validate(&self) -> Result<(), String> {
        self.listen
            .parse::<SocketAddr>()
            .map_err(|_| format!("admin.listen: `{}` is not HOST:PORT with an IP address (e.g. 127.0.0.1:8090, 0.0.0.0:8090)", self.listen))?;
        if let Some(token) = &self.token
            && token.expose_secret().chars().count() < MIN_TOKEN_CHARS
        {
            return Err(format!(
                "admin.token: shorter than {MIN_TOKEN_CHARS} characters (its value is not shown)"
            ));
        }
        Ok(())
    }
}

/// What the API serves from: the store, the order topic (for event names
/// that are no CDC routing key), the token, and the actual state if a router runs here.
#[derive(Clone)]
pub struct AdminState {
    store: Store,
    order_topic: String,
    token_digest: Option<[u8; 32]>,
    actual: Option<Arc<dyn ActualState>>,
}

impl AdminState {
    /// Serves `db`'s tables; changes need `token` (None: read-only).
    pub fn new(db: Db, order_topic: &str, token: Option<&SecretString>) -> Self {
        Self {
            store: Store::new(db, Origin::Api),
            order_topic: order_topic.to_string(),
            token_digest: token.map(|t| digest(t.expose_secret())),
            actual: None,
        }
    }

    /// With a router's actual state, shown by `GET /bindings`.
    pub fn with_actual(mut self, actual: Arc<dyn ActualState>) -> Self {
        self.actual = Some(actual);
        self
    }
}

fn digest(text: &str) -> [u8; 32] {
    Sha256::digest(text.as_bytes()).into()
}

/// The routes (a router may merge them into its own server).
pub fn router(state: AdminState) -> Router {
    Router::new()
        .route("/sources", get(list::<Source>).post(add::<Source>))
        .route("/sources/{name}", record_routes::<Source>())
        .route("/sources/{name}/{toggle}", post(toggle_enabled::<Source>))
        .route(
            "/events",
            get(list::<EventDefinition>).post(add::<EventDefinition>),
        )
        .route("/events/{key}", record_routes::<EventDefinition>())
        .route("/consumers", get(list::<Consumer>).post(add::<Consumer>))
        .route("/consumers/{name}", record_routes::<Consumer>())
        .route("/consumers/{name}/pause", post(pause_consumer))
        .route("/consumers/{name}/resume", post(resume_consumer))
        .route(
            "/consumers/{name}/{toggle}",
            post(toggle_enabled::<Consumer>),
        )
        .route(
            "/subscriptions",
            get(list_subscriptions).post(add::<Subscription>),
        )
        .route("/subscriptions/{id}", record_routes::<Subscription>())
        .route("/subscriptions/{id}/pause", post(pause_subscription))
        .route("/subscriptions/{id}/resume", post(resume_subscription))
        .route(
            "/subscriptions/{id}/{toggle}",
            post(toggle_enabled::<Subscription>),
        )
        .route("/refresh", post(refresh))
        .route("/reload", post(reload))
        .route("/bindings", get(bindings))
        .route("/groups/paused", get(paused_groups))
        .route("/groups/{group}/pause", post(pause_group))
        .route("/groups/{group}/resume", post(resume_group))
        .route("/cdc/{source}/snapshot/signals", get(snapshot_signals_of))
        .route("/cdc/{source}/snapshot/{action}", post(snapshot_signal))
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            authorize,
        ))
        // Outside the token check: refused requests are counted too.
        .layer(axum::middleware::from_fn(count_requests))
        .with_state(state)
}

/// `GET`, `PATCH` and `DELETE` of one record of kind `R`.
fn record_routes<R: Record>() -> axum::routing::MethodRouter<AdminState> {
    get(show::<R>).patch(update::<R>).delete(remove::<R>)
}

/// Serves the API and the health endpoints on `addr` until `shutdown`;
/// reports the bound address through `bound`.
pub async fn serve(
    addr: SocketAddr,
    state: AdminState,
    health: Arc<crate::health::HealthState>,
    bound: impl FnOnce(SocketAddr),
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    crate::health::serve_app(addr, router(state), health, bound, shutdown).await
}

/// Counts each request by resource (the path's first segment), method
/// and status, refused ones included ([`name::ADMIN_REQUESTS`]).
async fn count_requests(request: axum::extract::Request, next: axum::middleware::Next) -> Response {
    let resource = match request.uri().path().split('/').nth(1).unwrap_or_default() {
        r @ ("consumers" | "subscriptions" | "events" | "sources" | "refresh" | "reload"
        | "bindings") => r,
        _ => "other",
    };
    let resource = resource.to_string();
    let method = request.method().to_string();
    let response = next.run(request).await;
    let status = response.status().as_u16().to_string();
    metrics::counter!(name::ADMIN_REQUESTS, "resource" => resource, "method" => method, "status" => status).increment(1);
    response
}

/// Lets reads through; a change needs the bearer token.
async fn authorize(
    State(state): State<AdminState>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    if request.method() == Method::GET || request.method() == Method::HEAD {
        return next.run(request).await;
    }
    let refuse = |status: StatusCode, why: &str| {
        let mut response = (
            status,
            Json(json!({"error": why, "field": "Authorization"})),
        )
            .into_response();
        if status == StatusCode::UNAUTHORIZED {
            response.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                "Bearer".parse().expect("static header"),
            );
        }
        response
    };
    let Some(expected) = state.token_digest else {
        return refuse(
            StatusCode::FORBIDDEN,
            "admin.token is not set: this API is read-only",
        );
    };
    let given = request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    match given {
        None => refuse(
            StatusCode::UNAUTHORIZED,
            "a change needs `Authorization: Bearer <admin.token>`",
        ),
        Some(token) if digest(token.trim()) != expected => {
            tracing::warn!(method = %request.method(), path = %request.uri().path(), "admin API: wrong token refused");
            refuse(StatusCode::FORBIDDEN, "the bearer token is not admin.token")
        }
        Some(_) => {
            let (method, path) = (request.method().clone(), request.uri().path().to_string());
            let response = next.run(request).await;
            tracing::info!(%method, %path, status = response.status().as_u16(), "admin API change");
            response
        }
    }
}

/// An error as the API answers it.
struct ApiError(SubsError);

impl From<SubsError> for ApiError {
    fn from(e: SubsError) -> Self {
        Self(e)
    }
}

impl From<Invalid> for ApiError {
    fn from(e: Invalid) -> Self {
        Self(SubsError::Invalid(e))
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = match &self.0 {
            SubsError::Invalid(_) => StatusCode::BAD_REQUEST,
            SubsError::NotFound { .. } => StatusCode::NOT_FOUND,
            SubsError::Exists { .. } | SubsError::InUse { .. } => StatusCode::CONFLICT,
            SubsError::Db(e) if e.is_retryable() => StatusCode::SERVICE_UNAVAILABLE,
            SubsError::Db(DbError::Other(_)) | SubsError::Db(_) => {
                StatusCode::INTERNAL_SERVER_ERROR
            }
        };
        let field = match &self.0 {
            SubsError::Invalid(i) => Some(i.field.clone()),
            _ => None,
        };
        (
            status,
            Json(json!({"error": self.0.to_string(), "field": field})),
        )
            .into_response()
    }
}

type Answer<T> = Result<Json<T>, ApiError>;

fn body<T>(payload: Result<Json<T>, JsonRejection>) -> Result<T, ApiError> {
    payload
        .map(|Json(v)| v)
        .map_err(|e| Invalid::new("<body>", e.body_text()).into())
}

/// `enable` / `disable` as a flag.
fn toggle(word: &str) -> Result<bool, ApiError> {
    match word {
        "enable" => Ok(true),
        "disable" => Ok(false),
        other => {
            Err(Invalid::new("<path>", format!("`{other}` is not one of enable, disable")).into())
        }
    }
}

/// The body of `POST /groups/{group}/pause`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PauseRequest {
    /// End the pause by itself after this many seconds.
    #[serde(default)]
    pub for_secs: Option<u64>,
    /// Why.
    #[serde(default)]
    pub reason: String,
    /// Who (default `admin-api`).
    #[serde(default)]
    pub by: Option<String>,
}

impl PauseRequest {
    /// When the pause ends by itself, if `for_secs` was given.
    fn until_ms(&self) -> Option<i64> {
        self.for_secs
            .map(|secs| crate::clock::now_ms() + (secs as i64) * 1000)
    }

    /// Who: `by`, else `admin-api`.
    fn by(&self) -> String {
        self.by.clone().unwrap_or_else(|| "admin-api".into())
    }
}

/// The body of `POST /cdc/{source}/snapshot/{action}`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SnapshotRequest {
    /// The tables, `<db>.<table>`: required by `start`; `stop` without
    /// any stops every snapshot.
    #[serde(default)]
    pub tables: Vec<String>,
    /// Who (default `admin-api`).
    #[serde(default)]
    pub by: Option<String>,
}

/// `POST /cdc/{source}/snapshot/{action}`: a signal to the source.
async fn snapshot_signal(
    State(s): State<AdminState>,
    Path((source, action)): Path<(String, String)>,
    payload: Result<Json<SnapshotRequest>, JsonRejection>,
) -> Answer<snapshot_signals::Signal> {
    let request = body(payload)?;
    let kind = match action.as_str() {
        "start" => SignalKind::Start,
        "stop" => SignalKind::Stop,
        "pause" => SignalKind::Pause,
        "resume" => SignalKind::Resume,
        other => {
            return Err(Invalid::new(
                "action",
                format!("`{other}` is not one of start, stop, pause, resume"),
            )
            .into());
        }
    };
    let by = request.by.unwrap_or_else(|| "admin-api".into());
    let signal = snapshot_signals::send(s.store.db(), &source, kind, &request.tables, &by)
        .await
        .map_err(|e| match e {
            snapshot_signals::SendError::Invalid { field, reason } => {
                SubsError::from(Invalid::new(field, reason))
            }
            snapshot_signals::SendError::Db(e) => SubsError::from(e),
        })?;
    Ok(Json(signal))
}

/// `GET /cdc/{source}/snapshot/signals`.
async fn snapshot_signals_of(
    State(s): State<AdminState>,
    Path(source): Path<String>,
) -> Answer<Vec<snapshot_signals::Signal>> {
    Ok(Json(
        snapshot_signals::recent(s.store.db(), &source, 20)
            .await
            .map_err(SubsError::from)?,
    ))
}

/// `GET /groups/paused`.
async fn paused_groups(State(s): State<AdminState>) -> Answer<Vec<GroupPause>> {
    Ok(Json(
        group_pause::list(s.store.db())
            .await
            .map_err(SubsError::from)?,
    ))
}

/// `POST /groups/{group}/pause`.
async fn pause_group(
    State(s): State<AdminState>,
    Path(group): Path<String>,
    payload: Result<Json<PauseRequest>, JsonRejection>,
) -> Answer<GroupPause> {
    let request = body(payload)?;
    if !crate::db::fits_column(&group, crate::db::CONSUMER_GROUP_CHARS) {
        return Err(Invalid::new(
            "group",
            format!("longer than {} characters", crate::db::CONSUMER_GROUP_CHARS),
        )
        .into());
    }
    let (until, by) = (request.until_ms(), request.by());
    let pause = group_pause::pause(s.store.db(), &group, until, &by, &request.reason)
        .await
        .map_err(SubsError::from)?;
    Ok(Json(pause))
}

/// `POST /groups/{group}/resume`.
async fn resume_group(State(s): State<AdminState>, Path(group): Path<String>) -> Answer<Value> {
    let was = group_pause::resume(s.store.db(), &group)
        .await
        .map_err(SubsError::from)?;
    Ok(Json(json!({"group": group, "was_paused": was})))
}

/// `POST /subscriptions/{id}/pause`: its group's pause (see [`super::pause`]).
async fn pause_subscription(
    State(s): State<AdminState>,
    Path(id): Path<String>,
    payload: Result<Json<PauseRequest>, JsonRejection>,
) -> Answer<Vec<GroupAction>> {
    let target = PauseTarget::Subscription(Subscription::parse_key(&id)?);
    pause_target(&s, &target, body(payload)?).await
}

/// `POST /consumers/{name}/pause`: the pause of each of its groups.
async fn pause_consumer(
    State(s): State<AdminState>,
    Path(name): Path<String>,
    payload: Result<Json<PauseRequest>, JsonRejection>,
) -> Answer<Vec<GroupAction>> {
    pause_target(&s, &PauseTarget::Consumer(name), body(payload)?).await
}

async fn pause_target(
    s: &AdminState,
    target: &PauseTarget,
    request: PauseRequest,
) -> Answer<Vec<GroupAction>> {
    let (until, by) = (request.until_ms(), request.by());
    let done = super::pause::pause(&s.store, target, until, &by, &request.reason).await?;
    Ok(Json(done))
}

/// `POST /subscriptions/{id}/resume`.
async fn resume_subscription(
    State(s): State<AdminState>,
    Path(id): Path<String>,
) -> Answer<Vec<GroupAction>> {
    let target = PauseTarget::Subscription(Subscription::parse_key(&id)?);
    Ok(Json(super::pause::resume(&s.store, &target).await?))
}

/// `POST /consumers/{name}/resume`.
async fn resume_consumer(
    State(s): State<AdminState>,
    Path(name): Path<String>,
) -> Answer<Vec<GroupAction>> {
    let target = PauseTarget::Consumer(name);
    Ok(Json(super::pause::resume(&s.store, &target).await?))
}

/// `GET /<kind>` (subscriptions: [`list_subscriptions`]).
async fn list<R: Record>(State(s): State<AdminState>) -> Answer<Vec<R>> {
    Ok(Json(R::list(&s.store).await?))
}

/// `GET /<kind>/{key}`.
async fn show<R: Record>(State(s): State<AdminState>, Path(key): Path<String>) -> Answer<R> {
    Ok(Json(R::get(&s.store, &R::parse_key(&key)?).await?))
}

/// `POST /<kind>`: 201 with the record added.
async fn add<R: Record>(
    State(s): State<AdminState>,
    payload: Result<Json<R::New>, JsonRejection>,
) -> Result<(StatusCode, Json<R>), ApiError> {
    let added = R::add(&s.store, &body(payload)?, &s.order_topic).await?;
    Ok((StatusCode::CREATED, Json(added)))
}

/// `PATCH /<kind>/{key}`.
async fn update<R: Record>(
    State(s): State<AdminState>,
    Path(key): Path<String>,
    payload: Result<Json<R::Patch>, JsonRejection>,
) -> Answer<R> {
    let key = R::parse_key(&key)?;
    Ok(Json(R::update(&s.store, &key, &body(payload)?).await?))
}

/// `POST /<kind>/{key}/enable` and `.../disable` (routed for the kinds
/// with an enabled flag only).
async fn toggle_enabled<R: Record>(
    State(s): State<AdminState>,
    Path((key, word)): Path<(String, String)>,
) -> Answer<R> {
    let enabled = toggle(&word)?;
    let patch = R::enabled_patch(enabled)
        .ok_or_else(|| Invalid::new("<path>", format!("a {} has no enabled flag", R::KIND)))?;
    Ok(Json(
        R::update(&s.store, &R::parse_key(&key)?, &patch).await?,
    ))
}

/// `DELETE /<kind>/{key}`: the record as it was.
async fn remove<R: Record>(State(s): State<AdminState>, Path(key): Path<String>) -> Answer<R> {
    Ok(Json(R::remove(&s.store, &R::parse_key(&key)?).await?))
}

/// `?consumer=&event=` of `GET /subscriptions`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct SubscriptionParams {
    consumer: Option<String>,
    event: Option<String>,
}

async fn list_subscriptions(
    State(s): State<AdminState>,
    Query(p): Query<SubscriptionParams>,
) -> Answer<Vec<Subscription>> {
    let query = super::store::SubscriptionQuery {
        consumer: p.consumer,
        event: p.event,
        served_only: false,
    };
    Ok(Json(s.store.list_subscriptions(&query).await?))
}
/// `?consumer=NAME` of refresh, reload and bindings.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ConsumerParam {
    consumer: Option<String>,
}

/// `GET /bindings` and `POST /refresh`.
#[derive(Debug, Serialize)]
struct BindingsView {
    /// The request routers act on (refresh only).
    #[serde(skip_serializing_if = "Option::is_none")]
    request: Option<super::store::ControlRequest>,
    desired: Vec<super::bindings::Binding>,
    /// Null when no router serves this API (`orderpipe subs serve`).
    actual: Option<Vec<super::bindings::ActualBinding>>,
    /// Group by group; empty without an actual state.
    diff: Vec<super::bindings::BindingDiff>,
}

async fn view(s: &AdminState, consumer: Option<&str>) -> Result<BindingsView, ApiError> {
    if let Some(name) = consumer {
        s.store.consumer(name).await?;
    }
    let desired = s.store.desired(consumer).await?;
    let actual = match &s.actual {
        Some(provider) => {
            let mut actual = provider
                .actual()
                .await
                .map_err(|e| SubsError::Db(DbError::Unavailable(format!("actual state: {e}"))))?;
            if let Some(name) = consumer {
                let prefix = format!("{name}.");
                actual.retain(|a| a.group.starts_with(&prefix));
            }
            Some(actual)
        }
        None => None,
    };
    let diff = actual
        .as_deref()
        .map(|a| diff(&desired, a))
        .unwrap_or_default();
    Ok(BindingsView {
        request: None,
        desired,
        actual,
        diff,
    })
}

async fn bindings(
    State(s): State<AdminState>,
    Query(p): Query<ConsumerParam>,
) -> Answer<BindingsView> {
    Ok(Json(view(&s, p.consumer.as_deref()).await?))
}

async fn refresh(
    State(s): State<AdminState>,
    Query(p): Query<ConsumerParam>,
) -> Answer<BindingsView> {
    let request = s
        .store
        .request(RequestKind::Refresh, p.consumer.as_deref())
        .await?;
    let mut answer = view(&s, p.consumer.as_deref()).await?;
    answer.request = Some(request);
    Ok(Json(answer))
}

async fn reload(State(s): State<AdminState>, Query(p): Query<ConsumerParam>) -> Answer<Value> {
    let request = s
        .store
        .request(RequestKind::Reload, p.consumer.as_deref())
        .await?;
    Ok(Json(json!({"request": request})))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::subscriptions::bindings::ActualBinding;
    use crate::subscriptions::model::{NewConsumer, NewSubscription};

    /// What a router reports: fixed groups.
    struct Running(Vec<ActualBinding>);

    #[async_trait::async_trait]
    impl ActualState for Running {
        async fn actual(&self) -> Result<Vec<ActualBinding>, String> {
            Ok(self.0.clone())
        }
    }

    #[test]
    fn settings_name_the_field_and_never_show_the_token() {
        AdminSettings::default().validate().unwrap();
        let bad_listen = AdminSettings {
            listen: "localhost:8090".into(),
            token: None,
        };
        assert!(
            bad_listen
                .validate()
                .unwrap_err()
                .starts_with("admin.listen: `localhost:8090` is not HOST:PORT")
        );
        let short = AdminSettings {
            listen: default_listen(),
            token: Some(SecretString::from("hunter2")),
        };
        let err = short.validate().unwrap_err();
        assert_eq!(
            err,
            "admin.token: shorter than 16 characters (its value is not shown)"
        );
        assert!(
            !format!("{short:?}").contains("hunter2"),
            "Debug redacts it"
        );
    }

    /// `POST /groups/{group}/pause` and `.../resume` with the token, as
    /// `orderpipe group pause|resume`; without it, refused; a bad body names
    /// the field.
    #[tokio::test]
    async fn groups_are_paused_and_resumed_with_the_token_and_listed() {
        let (_dir, db) = crate::db::sqlite_for_test().await;
        let token = SecretString::from("0123456789abcdef-token");
        let state = AdminState::new(db.clone(), "order.events.v1", Some(&token));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, router(state)).await });
        let client = reqwest::Client::builder().no_proxy().build().unwrap();
        let post = |path: &str, auth: bool, body: Value| {
            let mut request = client.post(format!("http://{addr}{path}")).json(&body);
            if auth {
                request = request.bearer_auth("0123456789abcdef-token");
            }
            request.send()
        };
        let refused = post("/groups/g1/pause", false, json!({})).await.unwrap();
        assert_eq!(refused.status(), 401);
        assert!(group_pause::active(&db, "g1").await.unwrap().is_none());

        let paused = post(
            "/groups/g1/pause",
            true,
            json!({"reason": "fix", "for_secs": 600}),
        )
        .await
        .unwrap();
        assert_eq!(paused.status(), 200);
        let paused: Value = paused.json().await.unwrap();
        assert_eq!(paused["paused_by"], "admin-api");
        assert!(group_pause::active(&db, "g1").await.unwrap().is_some());
        let listed: Value = client
            .get(format!("http://{addr}/groups/paused"))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        assert_eq!(listed[0]["group"], "g1", "{listed}");
        assert_eq!(listed[0]["reason"], "fix");

        let bad = post("/groups/g1/pause", true, json!({"for": "10m"}))
            .await
            .unwrap();
        assert_eq!(bad.status(), 400);
        let bad: Value = bad.json().await.unwrap();
        assert!(bad["error"].as_str().unwrap().contains("for"), "{bad}");

        let resumed: Value = post("/groups/g1/resume", true, json!({}))
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        assert_eq!(resumed, json!({"group": "g1", "was_paused": true}));
        assert!(group_pause::active(&db, "g1").await.unwrap().is_none());
    }

    /// `GET /bindings` with a router's actual state: desired, actual and the
    /// difference per group, scoped to one consumer on request.
    #[tokio::test]
    async fn bindings_show_desired_actual_and_their_difference() {
        let (_dir, db) = crate::db::sqlite_for_test().await;
        let store = Store::new(db.clone(), Origin::Cli);
        for name in ["sms", "log"] {
            let new = NewConsumer {
                name: name.into(),
                url: format!("http://{name}/x"),
                ..NewConsumer::default()
            };
            store.add_consumer(&new).await.unwrap();
        }
        let new = NewSubscription {
            event: "db.table_user.insert".into(),
            consumer: "sms".into(),
            bind_key: "user".into(),
            ..NewSubscription::default()
        };
        let sub = store
            .add_subscription(&new, "order.events.v1")
            .await
            .unwrap();
        let actual = |group: &str, subscriptions: Vec<i64>| ActualBinding {
            group: group.into(),
            topics: vec!["cdc.db.table_user".into()],
            subscriptions,
            running: true,
            lag: None,
        };
        let running = Running(vec![
            actual("sms.user.consumer", vec![sub.id]),
            actual("log.old.consumer", vec![99]),
        ]);
        let state = AdminState::new(db, "order.events.v1", None).with_actual(Arc::new(running));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, router(state)).await });
        let get = |path: &'static str| async move {
            let client = reqwest::Client::builder().no_proxy().build().unwrap();
            client
                .get(format!("http://{addr}{path}"))
                .send()
                .await
                .unwrap()
                .json::<Value>()
                .await
                .unwrap()
        };
        let all = get("/bindings").await;
        assert_eq!(
            all["diff"],
            json!([{"group": "log.old.consumer", "status": "orphaned"}, {"group": "sms.user.consumer", "status": "in_sync"}]),
            "{all}"
        );
        assert_eq!(all["actual"].as_array().unwrap().len(), 2);
        let log = get("/bindings?consumer=log").await;
        assert_eq!(log["desired"], json!([]));
        assert_eq!(
            log["diff"],
            json!([{"group": "log.old.consumer", "status": "orphaned"}]),
            "{log}"
        );
    }
}
