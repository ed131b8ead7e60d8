//! The schemas pages (read-only): `/schemas` lists the registry's subjects
//! with their versions and compatibility level; `/schemas/{subject}` shows
//! one version's schema (`?version=`) and the field-by-field difference of
//! two versions (`?old=&new=`) with both compatibility verdicts
//! ([`crate::explore::registry`]).

use askama::Template;
use axum::Router;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Path, Query, State};
use axum::response::Html;
use axum::routing::get;
use serde::Deserialize;

use super::{Chrome, ConsoleError, ConsoleState, Page, Principal};
use crate::codec::CodecError;
use crate::explore::registry::{RegistryReader, SchemaDiff, SchemaVersion, SubjectSummary};

/// The schemas pages; no actions.
pub const PAGE: Page = Page {
    routes,
    nav: Some(("Schemas", "/schemas")),
    actions: &[],
};

fn routes() -> Router<ConsoleState> {
    Router::new()
        .route("/schemas", get(list))
        .route("/schemas/{subject}", get(show))
}

/// A registry error as a console error: a subject or version the registry
/// does not have is 404, an unreachable registry 503.
fn registry_error(e: CodecError) -> ConsoleError {
    let text = e.to_string();
    match e {
        CodecError::Registry(_) if text.contains("404") => ConsoleError::NotFound(text),
        _ => ConsoleError::Unavailable(text),
    }
}

fn reader(state: &ConsoleState) -> Result<RegistryReader, ConsoleError> {
    RegistryReader::new(&state.settings().registry).map_err(registry_error)
}

#[derive(Template)]
#[template(path = "schemas.html")]
struct SchemasPage {
    chrome: Chrome,
    subjects: Vec<SubjectSummary>,
}

async fn list(
    State(state): State<ConsoleState>,
    principal: Principal,
) -> Result<Html<String>, ConsoleError> {
    let subjects = reader(&state)?.subjects().await.map_err(registry_error)?;
    super::render(&SchemasPage {
        chrome: state.chrome(&principal, "Schemas", "/schemas"),
        subjects,
    })
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct SubjectQuery {
    #[serde(default)]
    version: Option<String>,
    #[serde(default)]
    old: Option<String>,
    #[serde(default)]
    new: Option<String>,
}

#[derive(Template)]
#[template(path = "schema.html")]
struct SchemaPage {
    chrome: Chrome,
    summary: SubjectSummary,
    shown: Option<SchemaVersion>,
    old: u32,
    new: u32,
    diff: Option<SchemaDiff>,
}

/// A version number of `field` among `versions`.
fn version(field: &str, text: Option<&str>, versions: &[u32]) -> Result<Option<u32>, ConsoleError> {
    let Some(text) = text.map(str::trim).filter(|t| !t.is_empty()) else {
        return Ok(None);
    };
    let known = versions
        .iter()
        .map(u32::to_string)
        .collect::<Vec<_>>()
        .join(", ");
    match text.parse::<u32>() {
        Ok(v) if versions.contains(&v) => Ok(Some(v)),
        _ => Err(ConsoleError::bad_input(
            field,
            format!("`{text}` is not a version of this subject; its versions: {known}"),
        )),
    }
}

async fn show(
    State(state): State<ConsoleState>,
    principal: Principal,
    Path(subject): Path<String>,
    q: Result<Query<SubjectQuery>, QueryRejection>,
) -> Result<Html<String>, ConsoleError> {
    let Query(q) = q.map_err(|e| {
        ConsoleError::bad_input(
            "query",
            format!("{}; accepted fields: version, old, new", e.body_text()),
        )
    })?;
    let reader = reader(&state)?;
    let summary = reader.subject(&subject).await.map_err(registry_error)?;
    let latest = summary.versions.last().copied().unwrap_or(1);
    let shown_version =
        version("version", q.version.as_deref(), &summary.versions)?.unwrap_or(latest);
    let old = version("old", q.old.as_deref(), &summary.versions)?;
    let new = version("new", q.new.as_deref(), &summary.versions)?;
    let diff = match (old, new) {
        (Some(old), Some(new)) => Some(
            reader
                .diff(&subject, old, new)
                .await
                .map_err(registry_error)?,
        ),
        (None, None) => None,
        (None, Some(_)) => {
            return Err(ConsoleError::bad_input(
                "old",
                "pick the version to compare with",
            ));
        }
        (Some(_), None) => {
            return Err(ConsoleError::bad_input(
                "new",
                "pick the version to compare with",
            ));
        }
    };
    let shown = if diff.is_none() {
        Some(
            reader
                .version(&subject, shown_version)
                .await
                .map_err(registry_error)?,
        )
    } else {
        None
    };
    let before_latest = summary
        .versions
        .iter()
        .rev()
        .nth(1)
        .copied()
        .unwrap_or(latest);
    super::render(&SchemaPage {
        chrome: state.chrome(&principal, &format!("Schema {subject}"), "/schemas"),
        old: old.unwrap_or(before_latest),
        new: new.unwrap_or(latest),
        summary,
        shown,
        diff,
    })
}
