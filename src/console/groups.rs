//! Pausing and resuming a consumer group from the overview's cards, through
//! the code of `orderpipe group pause|resume` ([`crate::consumer::group_pause`]):
//!
//! | action | route | the CLI's |
//! |---|---|---|
//! | pause (a reason, optionally an end) | `POST /groups/pause` | `group pause G --reason ... [--for 1h]` |
//! | resume | `POST /groups/resume` | `group resume G` |
//!
//! Both are an operator's (the CSRF guard checks the role), confirmed by
//! typing the group's name (a pause stops a group's effects: a click on the
//! wrong card must not do it), and written to the audit log.

use axum::Router;
use axum::extract::{Form, State};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::post;
use serde::Deserialize;
use serde_json::json;

use super::auth::Principal;
use super::{ConsoleError, ConsoleState, Page, audit};
use crate::consumer::group_pause;
use crate::db::DbError;

/// The group actions (on the overview's cards; no page of their own).
pub const PAGE: Page = Page {
    routes,
    nav: None,
    actions: &["/groups/pause", "/groups/resume"],
};

fn routes() -> Router<ConsoleState> {
    Router::new()
        .route("/groups/pause", post(pause))
        .route("/groups/resume", post(resume))
}

/// The pause and resume forms.
#[derive(Debug, Default, Deserialize)]
struct GroupForm {
    #[serde(default)]
    group: String,
    /// The group's name typed again.
    #[serde(default)]
    confirm: String,
    #[serde(default)]
    reason: String,
    /// `""` (until resumed) or a duration: `15m`, `1h`, ...
    #[serde(default, rename = "for")]
    duration: String,
}

impl GroupForm {
    /// The group, once confirmed; else 400 naming the field.
    fn confirmed(&self) -> Result<&str, ConsoleError> {
        let group = self.group.trim();
        if group.is_empty() {
            return Err(ConsoleError::bad_input(
                "group",
                "required: the consumer group",
            ));
        }
        if self.confirm.trim() != group {
            return Err(ConsoleError::bad_input(
                "confirm",
                format!("type the group's name, `{group}`, to confirm"),
            ));
        }
        Ok(group)
    }
}

async fn pause(
    State(state): State<ConsoleState>,
    principal: Principal,
    Form(form): Form<GroupForm>,
) -> Result<Response, ConsoleError> {
    let group = form.confirmed()?;
    let reason = form.reason.trim();
    if reason.is_empty() {
        return Err(ConsoleError::bad_input(
            "reason",
            "required: why the group is paused (shown to whoever looks next)",
        ));
    }
    let until = match form.duration.trim() {
        "" => None,
        text => {
            let duration = humantime::parse_duration(text).map_err(|e| {
                ConsoleError::bad_input(
                    "for",
                    format!("`{text}` is not a duration like 30m or 2h: {e}"),
                )
            })?;
            Some(crate::clock::now_ms() + duration.as_millis() as i64)
        }
    };
    if !crate::db::fits_column(group, crate::db::CONSUMER_GROUP_CHARS) {
        return Err(ConsoleError::bad_input(
            "group",
            "longer than a group name can be",
        ));
    }
    group_pause::pause(state.db(), group, until, &principal.who, reason)
        .await
        .map_err(DbError::from)?;
    let target = json!({"group": group, "reason": reason, "until_ms": until});
    audit::record(state.db(), &principal, "group.pause", &target, 1, "paused").await?;
    Ok(Redirect::to("/").into_response())
}

async fn resume(
    State(state): State<ConsoleState>,
    principal: Principal,
    Form(form): Form<GroupForm>,
) -> Result<Response, ConsoleError> {
    let group = form.confirmed()?;
    let was = group_pause::resume(state.db(), group)
        .await
        .map_err(DbError::from)?;
    let outcome = if was { "resumed" } else { "was not paused" };
    audit::record(
        state.db(),
        &principal,
        "group.resume",
        &json!({"group": group}),
        1,
        outcome,
    )
    .await?;
    Ok(Redirect::to("/").into_response())
}
