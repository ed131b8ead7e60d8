//! The subscriptions pages (seed 003's admin back office): the list of
//! subscriptions, consumers and events; create, edit, enable/disable a
//! subscription; "apply now"; and desired versus actual state.
//!
//! Every change goes through [`Store`] (the code `orderpipe subs` and the
//! admin API use), with [`Origin::Console`] on its control request, and
//! writes an audit row (`subs.create`, `subs.update`, `subs.enable`,
//! `subs.disable`, `subs.apply`) whatever the outcome. "Apply now" is the
//! admin API's `POST /refresh`: a refresh request that routers act on at
//! their next poll (within `router` reload seconds). Desired versus actual
//! is `orderpipe subs reconcile`'s comparison
//! ([`crate::router::reconcile::compare_with_broker`]): the groups the
//! enabled subscriptions want, which of them have no live member on the
//! broker, and router-named groups and `cdc.*` topics nothing wants.

use std::collections::BTreeMap;

use askama::Template;
use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::response::{Html, IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use serde::Deserialize;
use serde_json::json;

use super::{Chrome, ConsoleError, ConsoleState, Page, Principal, audit, filters};
use crate::subscriptions::model::{NewSubscription, SubscriptionPatch};
use crate::subscriptions::store::{ControlRequest, Origin, RequestKind, SubscriptionQuery};
use crate::subscriptions::{
    Consumer, EventDefinition, FilterSpec, PropertyFilter, Store, SubsError, Subscription,
};

/// The subscriptions pages and their actions.
pub const PAGE: Page = Page {
    routes,
    nav: Some(("Subscriptions", "/subscriptions")),
    actions: &[
        "/subscriptions",
        "/subscriptions/1",
        "/subscriptions/1/enable",
        "/subscriptions/1/disable",
        "/subscriptions/apply",
    ],
};

fn routes() -> Router<ConsoleState> {
    Router::new()
        .route("/subscriptions", get(list).post(create))
        .route("/subscriptions/new", get(new_form))
        .route("/subscriptions/apply", post(apply))
        .route("/subscriptions/{id}", post(update))
        .route("/subscriptions/{id}/edit", get(edit_form))
        .route("/subscriptions/{id}/{toggle}", post(toggle))
}

fn store(state: &ConsoleState) -> Store {
    Store::new(state.db().clone(), Origin::Console)
}

impl From<SubsError> for ConsoleError {
    fn from(e: SubsError) -> Self {
        match e {
            SubsError::Invalid(i) => Self::BadInput {
                field: i.field,
                message: i.reason,
            },
            e @ SubsError::NotFound { .. } => Self::NotFound(e.to_string()),
            e @ (SubsError::Exists { .. } | SubsError::InUse { .. }) => {
                Self::Conflict(e.to_string())
            }
            SubsError::Db(e) => e.into(),
        }
    }
}

/// A subscription id from the path, or which field is wrong.
fn subscription_id(text: &str) -> Result<i64, ConsoleError> {
    text.parse().map_err(|_| {
        ConsoleError::bad_input(
            "id",
            format!("`{text}` is not a subscription id (a number)"),
        )
    })
}

/// A submitted form's fields, by name (the last value wins).
struct Fields(BTreeMap<String, String>);

impl Fields {
    /// The fields of a urlencoded body.
    fn parse(body: &[u8]) -> Self {
        Self(
            url::form_urlencoded::parse(body)
                .map(|(k, v)| (k.into_owned(), v.into_owned()))
                .collect(),
        )
    }

    /// A field's value, trimmed; empty when absent.
    fn text(&self, name: &str) -> String {
        self.0
            .get(name)
            .map(|v| v.trim().to_string())
            .unwrap_or_default()
    }

    /// Whether a checkbox was ticked (browsers send only ticked ones).
    fn checked(&self, name: &str) -> bool {
        self.0.contains_key(name)
    }
}

/// Writes the audit row of `action` on `target`, whatever the outcome:
/// one item and `ok`, or none and why it failed.
async fn audited<T>(
    state: &ConsoleState,
    principal: &Principal,
    action: &str,
    target: serde_json::Value,
    result: &Result<T, ConsoleError>,
) -> Result<(), ConsoleError> {
    let outcome = match result {
        Ok(_) => "ok".to_string(),
        Err(e) => e.to_string(),
    };
    audit::record(
        state.db(),
        principal,
        action,
        &target,
        u64::from(result.is_ok()),
        &outcome,
    )
    .await?;
    Ok(())
}

/// The filters textarea: one `FIELD:OP:VALUE` per line (`orderpipe subs --filter`'s form).
fn parse_filters(text: &str) -> Result<Vec<FilterSpec>, ConsoleError> {
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .map(|line| {
            PropertyFilter::parse(line, "filters")
                .map(|f| FilterSpec::from(&f))
                .map_err(|e| SubsError::Invalid(e).into())
        })
        .collect()
}

fn filters_text(filters: &[PropertyFilter]) -> String {
    filters
        .iter()
        .map(PropertyFilter::to_cli)
        .collect::<Vec<_>>()
        .join("\n")
}

/// One subscription as listed.
struct SubscriptionRow {
    sub: Subscription,
    filters: String,
}

#[derive(Template)]
#[template(path = "subscriptions.html")]
struct ListPage {
    chrome: Chrome,
    subscriptions: Vec<SubscriptionRow>,
    consumers: Vec<Consumer>,
    events: Vec<EventDefinition>,
    latest: Option<ControlRequest>,
    applied: Option<i64>,
    state: StateView,
}

/// Desired vs actual, or why it could not be compared.
struct StateView {
    error: Option<String>,
    desired: Vec<String>,
    missing: Vec<String>,
    orphaned_groups: Vec<String>,
    orphaned_topics: Vec<String>,
}

#[derive(Debug, Default, Deserialize)]
struct ListQuery {
    #[serde(default)]
    applied: Option<i64>,
}

async fn list(
    State(state): State<ConsoleState>,
    principal: Principal,
    Query(q): Query<ListQuery>,
) -> Result<Html<String>, ConsoleError> {
    let store = store(&state);
    let subscriptions = store
        .list_subscriptions(&SubscriptionQuery::default())
        .await?
        .into_iter()
        .map(|sub| SubscriptionRow {
            filters: filters_text(&sub.filters),
            sub,
        })
        .collect();
    let view = match crate::router::reconcile::compare_with_broker(state.settings(), &store).await {
        Ok(r) => StateView {
            error: None,
            desired: r.desired,
            missing: r.missing,
            orphaned_groups: r.orphaned_groups,
            orphaned_topics: r.orphaned_topics,
        },
        // The rest of the page still helps while the broker is away.
        Err(e) => StateView {
            error: Some(e.to_string()),
            desired: Vec::new(),
            missing: Vec::new(),
            orphaned_groups: Vec::new(),
            orphaned_topics: Vec::new(),
        },
    };
    super::render(&ListPage {
        chrome: state.chrome(&principal, "Subscriptions", "/subscriptions"),
        subscriptions,
        consumers: store.list_consumers().await?,
        events: store.list_events().await?,
        latest: store.latest_request().await?,
        applied: q.applied,
        state: view,
    })
}

/// The create and edit form.
#[derive(Template)]
#[template(path = "subscription_form.html")]
struct FormPage {
    chrome: Chrome,
    /// None: a new subscription.
    id: Option<i64>,
    event: String,
    consumer: String,
    bind_key: String,
    filters: String,
    description: String,
    enabled: bool,
    consumers: Vec<Consumer>,
    events: Vec<EventDefinition>,
    error: Option<(String, String)>,
}

impl FormPage {
    async fn new(
        state: &ConsoleState,
        principal: &Principal,
        id: Option<i64>,
    ) -> Result<Self, ConsoleError> {
        let store = store(state);
        let title = match id {
            Some(id) => format!("Edit subscription {id}"),
            None => "New subscription".into(),
        };
        Ok(Self {
            chrome: state.chrome(principal, &title, "/subscriptions"),
            id,
            event: String::new(),
            consumer: String::new(),
            bind_key: String::new(),
            filters: String::new(),
            description: String::new(),
            enabled: true,
            consumers: store.list_consumers().await?,
            events: store.list_events().await?,
            error: None,
        })
    }

    /// The form again, with what was typed and what is wrong (400).
    fn refused(mut self, fields: &Fields, error: ConsoleError) -> Response {
        self.event = fields.text("event");
        self.consumer = fields.text("consumer");
        self.bind_key = fields.text("bind_key");
        self.filters = fields.text("filters");
        self.description = fields.text("description");
        self.enabled = fields.checked("enabled");
        let status = error.status();
        self.error = Some(match error {
            ConsoleError::BadInput { field, message } => (field, message),
            other => (String::new(), other.to_string()),
        });
        match super::render(&self) {
            Ok(html) => (status, html).into_response(),
            Err(e) => e.into_response(),
        }
    }
}

async fn new_form(
    State(state): State<ConsoleState>,
    principal: Principal,
) -> Result<Html<String>, ConsoleError> {
    super::render(&FormPage::new(&state, &principal, None).await?)
}

async fn edit_form(
    State(state): State<ConsoleState>,
    principal: Principal,
    Path(id): Path<String>,
) -> Result<Html<String>, ConsoleError> {
    let id = subscription_id(&id)?;
    let sub = store(&state).subscription(id).await?;
    let mut page = FormPage::new(&state, &principal, Some(id)).await?;
    page.event = sub.event;
    page.consumer = sub.consumer;
    page.bind_key = sub.bind_key;
    page.filters = filters_text(&sub.filters);
    page.description = sub.description;
    page.enabled = sub.enabled;
    super::render(&page)
}

async fn create(
    State(state): State<ConsoleState>,
    principal: Principal,
    body: Bytes,
) -> Result<Response, ConsoleError> {
    let fields = Fields::parse(&body);
    let result = async {
        let new = NewSubscription {
            event: fields.text("event"),
            consumer: fields.text("consumer"),
            bind_key: fields.text("bind_key"),
            filters: parse_filters(&fields.text("filters"))?,
            enabled: Some(fields.checked("enabled")),
            description: Some(fields.text("description")).filter(|d| !d.is_empty()),
        };
        Ok::<_, ConsoleError>(
            store(&state)
                .add_subscription(&new, &state.settings().topics.order_events.name)
                .await?,
        )
    }
    .await;
    let target = json!({"event": fields.text("event"), "consumer": fields.text("consumer"),
        "bind_key": fields.text("bind_key"), "filters": fields.text("filters"), "enabled": fields.checked("enabled"),
        "id": result.as_ref().ok().map(|s| s.id)});
    audited(&state, &principal, "subs.create", target, &result).await?;
    match result {
        Ok(sub) => Ok(Redirect::to(&format!("/subscriptions#sub-{}", sub.id)).into_response()),
        Err(e) => Ok(FormPage::new(&state, &principal, None)
            .await?
            .refused(&fields, e)),
    }
}

async fn update(
    State(state): State<ConsoleState>,
    principal: Principal,
    Path(id): Path<String>,
    body: Bytes,
) -> Result<Response, ConsoleError> {
    let id = subscription_id(&id)?;
    let fields = Fields::parse(&body);
    let result = async {
        let patch = SubscriptionPatch {
            bind_key: Some(fields.text("bind_key")),
            filters: Some(parse_filters(&fields.text("filters"))?),
            enabled: Some(fields.checked("enabled")),
            description: Some(fields.text("description")),
        };
        Ok::<_, ConsoleError>(store(&state).update_subscription(id, &patch).await?)
    }
    .await;
    let target = json!({"id": id, "bind_key": fields.text("bind_key"), "filters": fields.text("filters"),
        "enabled": fields.checked("enabled")});
    audited(&state, &principal, "subs.update", target, &result).await?;
    match result {
        Ok(_) => Ok(Redirect::to(&format!("/subscriptions#sub-{id}")).into_response()),
        Err(e @ ConsoleError::NotFound(_)) => Err(e),
        Err(e) => Ok(FormPage::new(&state, &principal, Some(id))
            .await?
            .refused(&fields, e)),
    }
}

async fn toggle(
    State(state): State<ConsoleState>,
    principal: Principal,
    Path((id, word)): Path<(String, String)>,
) -> Result<Response, ConsoleError> {
    let (enabled, action) = match word.as_str() {
        "enable" => (true, "subs.enable"),
        "disable" => (false, "subs.disable"),
        other => {
            return Err(ConsoleError::NotFound(format!(
                "`{other}` is not an action of a subscription (enable, disable)"
            )));
        }
    };
    let id = subscription_id(&id)?;
    let patch = SubscriptionPatch {
        enabled: Some(enabled),
        ..SubscriptionPatch::default()
    };
    let result = store(&state)
        .update_subscription(id, &patch)
        .await
        .map_err(ConsoleError::from);
    audited(&state, &principal, action, json!({"id": id}), &result).await?;
    result?;
    Ok(Redirect::to(&format!("/subscriptions#sub-{id}")).into_response())
}

async fn apply(
    State(state): State<ConsoleState>,
    principal: Principal,
    body: Bytes,
) -> Result<Response, ConsoleError> {
    let consumer = Some(Fields::parse(&body).text("consumer")).filter(|c| !c.is_empty());
    let result = store(&state)
        .request(RequestKind::Refresh, consumer.as_deref())
        .await
        .map_err(ConsoleError::from);
    let target = json!({"consumer": consumer, "request": result.as_ref().ok().map(|r| r.id)});
    audited(&state, &principal, "subs.apply", target, &result).await?;
    Ok(Redirect::to(&format!("/subscriptions?applied={}", result?.id)).into_response())
}
