//! An in-process, in-memory schema registry speaking the subset of the
//! Confluent REST API that orderpipe uses.
//!
//! `orderpipe demo` runs with no servers at all, yet its records go through
//! the same codec as production: the codec talks HTTP to this registry on a
//! loopback port exactly as it talks to Apicurio's `/apis/ccompat/v7`.
//! Compatibility is BACKWARD (the Confluent default): a new version must be
//! able to read data written with the latest one.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use apache_avro::Schema;
use apache_avro::schema_compatibility::SchemaCompatibility;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::Deserialize;
use serde_json::json;

#[derive(Default)]
struct Registry {
    /// Schema text by id (id = index + 1).
    schemas: Vec<String>,
    /// Registered ids per subject, oldest first.
    subjects: BTreeMap<String, Vec<u32>>,
}

type Shared = Arc<Mutex<Registry>>;

/// A running embedded registry; dropping it stops the server.
pub struct EmbeddedRegistry {
    url: String,
    task: tokio::task::JoinHandle<()>,
}

impl EmbeddedRegistry {
    /// Starts the registry on a free loopback port.
    pub async fn start() -> std::io::Result<Self> {
        let listener = tokio::net::TcpListener::bind(SocketAddr::from(([127, 0, 0, 1], 0))).await?;
        let url = format!("http://{}", listener.local_addr()?);
        let state: Shared = Arc::default();
        let app = Router::new()
            .route("/subjects", get(list_subjects))
            .route("/subjects/{subject}/versions", post(register))
            .route("/subjects/{subject}/versions/{version}", get(get_version))
            .route("/schemas/ids/{id}", get(get_by_id))
            .route(
                "/compatibility/subjects/{subject}/versions",
                post(compatibility),
            )
            .route(
                "/compatibility/subjects/{subject}/versions/{version}",
                post(compatibility_with_version),
            )
            .with_state(state);
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Ok(Self { url, task })
    }

    /// Base URL to put in the registry settings.
    pub fn url(&self) -> &str {
        &self.url
    }
}

impl Drop for EmbeddedRegistry {
    fn drop(&mut self) {
        self.task.abort();
    }
}

#[derive(Deserialize)]
struct SchemaBody {
    schema: String,
}

fn error(status: StatusCode, code: u32, message: String) -> Response {
    (
        status,
        Json(json!({"error_code": code, "message": message})),
    )
        .into_response()
}

fn parse(text: &str) -> Result<Schema, Box<Response>> {
    Schema::parse_str(text).map_err(|e| {
        Box::new(error(
            StatusCode::UNPROCESSABLE_ENTITY,
            42201,
            format!("invalid schema: {e}"),
        ))
    })
}

/// BACKWARD: the new schema (reader) can read data of the latest (writer).
fn backward_compatible(registry: &Registry, subject: &str, new: &Schema) -> Result<(), String> {
    let Some(&latest) = registry.subjects.get(subject).and_then(|ids| ids.last()) else {
        return Ok(());
    };
    let old =
        Schema::parse_str(&registry.schemas[latest as usize - 1]).map_err(|e| e.to_string())?;
    SchemaCompatibility::can_read(&old, new)
        .map(|_| ())
        .map_err(|e| e.to_string())
}

async fn list_subjects(State(state): State<Shared>) -> Response {
    let registry = state.lock().expect("registry lock");
    Json(registry.subjects.keys().cloned().collect::<Vec<_>>()).into_response()
}

async fn register(
    State(state): State<Shared>,
    Path(subject): Path<String>,
    Json(body): Json<SchemaBody>,
) -> Response {
    let parsed = match parse(&body.schema) {
        Ok(p) => p,
        Err(e) => return *e,
    };
    let canonical = parsed.canonical_form();
    let mut registry = state.lock().expect("registry lock");
    let existing = registry.subjects.get(&subject).and_then(|ids| {
        ids.iter().copied().find(|id| {
            Schema::parse_str(&registry.schemas[*id as usize - 1])
                .is_ok_and(|s| s.canonical_form() == canonical)
        })
    });
    if let Some(id) = existing {
        return Json(json!({"id": id})).into_response();
    }
    if let Err(reason) = backward_compatible(&registry, &subject, &parsed) {
        return error(
            StatusCode::CONFLICT,
            409,
            format!("schema being registered is incompatible with an earlier schema: {reason}"),
        );
    }
    registry.schemas.push(body.schema);
    let id = registry.schemas.len() as u32;
    registry.subjects.entry(subject).or_default().push(id);
    Json(json!({"id": id})).into_response()
}

async fn get_version(
    State(state): State<Shared>,
    Path((subject, version)): Path<(String, String)>,
) -> Response {
    let registry = state.lock().expect("registry lock");
    let Some(ids) = registry.subjects.get(&subject) else {
        return error(
            StatusCode::NOT_FOUND,
            40401,
            format!("Subject '{subject}' not found."),
        );
    };
    let index = match version.as_str() {
        "latest" => Some(ids.len() - 1),
        v => v.parse::<usize>().ok().and_then(|v| v.checked_sub(1)),
    };
    let Some(id) = index.and_then(|i| ids.get(i)).copied() else {
        return error(
            StatusCode::NOT_FOUND,
            40402,
            format!("Version {version} not found."),
        );
    };
    let version = ids.iter().position(|i| *i == id).unwrap_or(0) + 1;
    Json(json!({
        "subject": subject,
        "version": version,
        "id": id,
        "schema": registry.schemas[id as usize - 1],
    }))
    .into_response()
}

async fn get_by_id(State(state): State<Shared>, Path(id): Path<u32>) -> Response {
    let registry = state.lock().expect("registry lock");
    match id
        .checked_sub(1)
        .and_then(|i| registry.schemas.get(i as usize))
    {
        Some(schema) => Json(json!({"schema": schema})).into_response(),
        None => error(
            StatusCode::NOT_FOUND,
            40403,
            format!("Schema {id} not found"),
        ),
    }
}

async fn compatibility(
    State(state): State<Shared>,
    Path(subject): Path<String>,
    Json(body): Json<SchemaBody>,
) -> Response {
    let parsed = match parse(&body.schema) {
        Ok(p) => p,
        Err(e) => return *e,
    };
    let registry = state.lock().expect("registry lock");
    let verdict = backward_compatible(&registry, &subject, &parsed);
    Json(json!({
        "is_compatible": verdict.is_ok(),
        "messages": verdict.err().into_iter().collect::<Vec<_>>(),
    }))
    .into_response()
}

async fn compatibility_with_version(
    state: State<Shared>,
    Path((subject, _version)): Path<(String, String)>,
    body: Json<SchemaBody>,
) -> Response {
    compatibility(state, Path(subject), body).await
}
