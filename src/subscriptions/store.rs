//! The control plane's tables (`sql/*/0012_subscriptions.sql`): create,
//! read, change and remove sources, event definitions, consumers and
//! subscriptions with their filters; the desired bindings; the control
//! requests routers poll.
//!
//! Every write runs in one transaction with a [`ControlRequest`] row
//! (`kind = "change"`), so a router polling [`Store::latest_request`] sees
//! that something changed without reading every table. Inputs are checked
//! before anything is written ([`super::model`]); errors name the field.
//!
//! For the router (`orderpipe deliver` without `--subscription`):
//!
//! ```ignore
//! let store = Store::new(db, Origin::Router);
//! let bindings = store.desired(None).await?;          // one Binding per consumer group
//! let seen = store.latest_request().await?;           // poll this; re-read when its id moves
//! match binding.decide(event_name, &data, &old) { Decision::Deliver { .. } => post(), _ => commit() }
//! ```

use std::collections::BTreeMap;

use serde::Serialize;
use sqlx::Row;
use sqlx::any::AnyRow;

use super::bindings::{Binding, Route};
use super::filter::{FilterSpec, PropertyFilter};
use super::model::*;
use super::{Invalid, SubsError};
use crate::clock::now_ms;
use crate::db::{Db, Tx};
use crate::delivery::SuccessRule;
use crate::retry::RetryLayer;

/// Who asked for a change, kept with its [`ControlRequest`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    /// `orderpipe subs ...`.
    Cli,
    /// The admin HTTP API.
    Api,
    /// A router (it only reads; a request it writes is a reload of its own).
    Router,
    /// The operator console (`orderpipe console`).
    Console,
}

impl Origin {
    fn as_str(self) -> &'static str {
        match self {
            Self::Cli => "cli",
            Self::Api => "api",
            Self::Router => "router",
            Self::Console => "console",
        }
    }
}

/// What a [`ControlRequest`] asks of routers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum RequestKind {
    /// A record changed (written by every store write).
    Change,
    /// `POST /refresh`: recompute the bindings and reconcile the groups now
    /// (seed 003's `refresh_bindings`), for every consumer or one.
    Refresh,
    /// `POST /reload`: re-read the tables now (seed 003's `reload_config`).
    Reload,
}

impl RequestKind {
    fn as_str(self) -> &'static str {
        match self {
            Self::Change => "change",
            Self::Refresh => "refresh",
            Self::Reload => "reload",
        }
    }

    fn parse(text: &str) -> Self {
        match text {
            "refresh" => Self::Refresh,
            "reload" => Self::Reload,
            _ => Self::Change,
        }
    }
}

/// A request to routers (`control_requests`). Ids only grow: a router keeps
/// the last id it acted on and acts again when [`Store::latest_request`] is newer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ControlRequest {
    /// Row id.
    pub id: i64,
    /// What it asks.
    pub kind: RequestKind,
    /// The consumer it concerns; None: every consumer.
    pub consumer: Option<String>,
    /// `cli`, `api` or `router`.
    pub origin: String,
    /// When (ms since the epoch).
    pub requested_ms: i64,
}

/// Which subscriptions [`Store::list_subscriptions`] returns.
#[derive(Debug, Clone, Default)]
pub struct SubscriptionQuery {
    /// Only this consumer's.
    pub consumer: Option<String>,
    /// Only this event's (routing key).
    pub event: Option<String>,
    /// Only enabled subscriptions of enabled consumers (what routers serve).
    pub served_only: bool,
}

/// The control plane's tables on a database.
#[derive(Debug, Clone)]
pub struct Store {
    db: Db,
    origin: Origin,
}

const SOURCE_COLUMNS: &str = "id, name, db_host, db_port, db_user, enabled, description, created_ms, updated_ms, redact_json";
const EVENT_SELECT: &str = "SELECT e.id, e.routing_key, e.topic, s.name, e.description, e.created_ms, e.updated_ms, e.redact_json \
     FROM event_definitions e LEFT JOIN cdc_sources s ON s.id = e.source_id";
const CONSUMER_COLUMNS: &str = "id, name, http_method, http_url, timeout_ms, retry_json, channel_id, enabled, description, created_ms, updated_ms, success";
const SUBSCRIPTION_FROM: &str = "FROM subscriptions s JOIN event_definitions e ON e.id = s.event_id \
     JOIN downstream_consumers c ON c.id = s.consumer_id \
     WHERE (? IS NULL OR c.name = ?) AND (? IS NULL OR e.routing_key = ?) AND (? IS NULL OR s.id = ?) \
     AND (? = 0 OR (s.enabled = 1 AND c.enabled = 1))";

/// How a record of a kind is removed, and what refuses it: the rows that
/// still refer to it.
struct Removal {
    /// The kind, for [`SubsError::InUse`].
    kind: &'static str,
    /// The rows that refer to it (one `?`: its id), by their key or id.
    users: &'static str,
    /// What `users` lists, in the error (`events`, `subscriptions`).
    users_are: &'static str,
    /// The delete (one `?`: its id).
    delete: &'static str,
}

/// A source, while event definitions name it.
const SOURCE_REMOVAL: Removal = Removal {
    kind: "source",
    users: "SELECT routing_key FROM event_definitions WHERE source_id = ? ORDER BY routing_key",
    users_are: "events",
    delete: "DELETE FROM cdc_sources WHERE id = ?",
};

/// An event definition, while subscriptions name it.
const EVENT_REMOVAL: Removal = Removal {
    kind: "event",
    users: "SELECT id FROM subscriptions WHERE event_id = ? ORDER BY id",
    users_are: "subscriptions",
    delete: "DELETE FROM event_definitions WHERE id = ?",
};

/// A consumer, while subscriptions name it.
const CONSUMER_REMOVAL: Removal = Removal {
    kind: "consumer",
    users: "SELECT id FROM subscriptions WHERE consumer_id = ? ORDER BY id",
    users_are: "subscriptions",
    delete: "DELETE FROM downstream_consumers WHERE id = ?",
};

/// Row of `SOURCE_COLUMNS`.
fn source(r: &AnyRow) -> Result<Source, sqlx::Error> {
    Ok(Source {
        id: r.try_get(0)?,
        name: r.try_get(1)?,
        db_host: r.try_get(2)?,
        db_port: r.try_get(3)?,
        db_user: r.try_get(4)?,
        enabled: r.try_get::<i32, _>(5)? != 0,
        description: r.try_get(6)?,
        redact: stored_json(r.try_get(9)?)?,
        created_ms: r.try_get(7)?,
        updated_ms: r.try_get(8)?,
    })
}

/// Row of `EVENT_SELECT`.
fn event(r: &AnyRow) -> Result<EventDefinition, sqlx::Error> {
    Ok(EventDefinition {
        id: r.try_get(0)?,
        routing_key: r.try_get(1)?,
        topic: r.try_get(2)?,
        source: r.try_get(3)?,
        description: r.try_get(4)?,
        redact: stored_json(r.try_get(7)?)?,
        created_ms: r.try_get(5)?,
        updated_ms: r.try_get(6)?,
    })
}

/// A `*_json` column's value; NULL: the default.
fn stored_json<T: serde::de::DeserializeOwned + Default>(
    json: Option<String>,
) -> Result<T, sqlx::Error> {
    match json {
        Some(json) => serde_json::from_str(&json).map_err(|e| sqlx::Error::Decode(Box::new(e))),
        None => Ok(T::default()),
    }
}

/// Row of `CONSUMER_COLUMNS` (with `prefix` columns before them).
fn consumer_at(r: &AnyRow, at: usize) -> Result<Consumer, sqlx::Error> {
    let retry: Option<String> = r.try_get(at + 5)?;
    let retry = retry
        .map(|json| serde_json::from_str::<RetryLayer>(&json))
        .transpose()
        .map_err(|e| sqlx::Error::Decode(format!("downstream_consumers.retry_json: {e}").into()))?;
    Ok(Consumer {
        id: r.try_get(at)?,
        name: r.try_get(at + 1)?,
        method: r.try_get(at + 2)?,
        url: r.try_get(at + 3)?,
        timeout_ms: r.try_get(at + 4)?,
        retry,
        channel_id: r.try_get(at + 6)?,
        enabled: r.try_get::<i32, _>(at + 7)? != 0,
        description: r.try_get(at + 8)?,
        created_ms: r.try_get(at + 9)?,
        updated_ms: r.try_get(at + 10)?,
        success: SuccessRule::parse(
            "downstream_consumers.success",
            &r.try_get::<String, _>(at + 11)?,
        )
        .map_err(|e| sqlx::Error::Decode(e.into()))?,
    })
}

/// A stored filter back to its domain type.
fn stored_filter(r: &AnyRow) -> Result<(i64, PropertyFilter), sqlx::Error> {
    let json = |i: usize| -> Result<Option<serde_json::Value>, sqlx::Error> {
        let text: Option<String> = r.try_get(i)?;
        text.map(|t| serde_json::from_str(&t))
            .transpose()
            .map_err(|e| sqlx::Error::Decode(format!("property_filters: {e}").into()))
    };
    let values = json(3)?;
    let op: String = r.try_get(2)?;
    let spec = FilterSpec {
        field: r.try_get(1)?,
        values: if op == "in" {
            values.clone().and_then(|v| v.as_array().cloned())
        } else {
            None
        },
        value: if op == "in" { None } else { values },
        op,
        from: json(4)?,
        to: json(5)?,
    };
    let filter = spec
        .check("property_filters")
        .map_err(|e| sqlx::Error::Decode(e.to_string().into()))?;
    Ok((r.try_get(0)?, filter))
}

impl Store {
    /// The tables of `db`, changed on behalf of `origin`.
    pub fn new(db: Db, origin: Origin) -> Self {
        Self { db, origin }
    }

    /// The database.
    pub fn db(&self) -> &Db {
        &self.db
    }

    // ----- control requests -----

    /// Writes a request in `tx`.
    async fn request_in(
        &self,
        tx: &mut Tx,
        kind: RequestKind,
        consumer: Option<&str>,
    ) -> Result<i64, sqlx::Error> {
        let row = sqlx::query("INSERT INTO control_requests (kind, consumer_name, origin, requested_ms) VALUES (?, ?, ?, ?) RETURNING id")
            .bind(kind.as_str())
            .bind(consumer)
            .bind(self.origin.as_str())
            .bind(now_ms())
            .fetch_one(&mut **tx)
            .await?;
        row.try_get(0)
    }

    /// Ends a write: its change request for routers (about `consumer`, or
    /// all), then the commit, so a router never sees one without the other.
    async fn commit_change(&self, mut tx: Tx, consumer: Option<&str>) -> Result<(), SubsError> {
        self.request_in(&mut tx, RequestKind::Change, consumer)
            .await?;
        tx.commit().await?;
        Ok(())
    }

    /// Ends an update: runs `update` (its last two `?`, left unbound, are
    /// `updated_ms` and the row id) for row `id`, then [`Store::commit_change`].
    async fn commit_update(
        &self,
        mut tx: Tx,
        update: sqlx::query::Query<'_, sqlx::Any, sqlx::any::AnyArguments>,
        id: i64,
        consumer: Option<&str>,
    ) -> Result<(), SubsError> {
        update.bind(now_ms()).bind(id).execute(&mut *tx).await?;
        self.commit_change(tx, consumer).await
    }

    /// Asks routers to refresh (recompute and reconcile their groups) or
    /// reload (re-read the tables), for every consumer or `consumer` (which
    /// must exist). Returns the request.
    pub async fn request(
        &self,
        kind: RequestKind,
        consumer: Option<&str>,
    ) -> Result<ControlRequest, SubsError> {
        let mut tx = self.db.begin().await?;
        if let Some(name) = consumer {
            self.consumer_id(&mut tx, name).await?;
        }
        let id = self.request_in(&mut tx, kind, consumer).await?;
        tx.commit().await?;
        Ok(self
            .latest_request()
            .await?
            .filter(|r| r.id == id)
            .unwrap_or(ControlRequest {
                id,
                kind,
                consumer: consumer.map(str::to_string),
                origin: self.origin.as_str().into(),
                requested_ms: now_ms(),
            }))
    }

    /// The newest request, if any: a router polls it (cheap, by primary key).
    pub async fn latest_request(&self) -> Result<Option<ControlRequest>, SubsError> {
        Ok(self.requests_after(-1, 1, true).await?.pop())
    }

    /// Requests with an id above `after`, oldest first, at most `limit`.
    pub async fn requests_since(
        &self,
        after: i64,
        limit: i64,
    ) -> Result<Vec<ControlRequest>, SubsError> {
        self.requests_after(after, limit, false).await
    }

    async fn requests_after(
        &self,
        after: i64,
        limit: i64,
        newest: bool,
    ) -> Result<Vec<ControlRequest>, SubsError> {
        let order = if newest { "DESC" } else { "ASC" };
        let sql = format!(
            "SELECT id, kind, consumer_name, origin, requested_ms FROM control_requests WHERE id > ? ORDER BY id {order} LIMIT ?"
        );
        let rows = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(after)
            .bind(limit)
            .fetch_all(&self.db.pool)
            .await?;
        rows.iter()
            .map(|r| {
                Ok(ControlRequest {
                    id: r.try_get(0)?,
                    kind: RequestKind::parse(&r.try_get::<String, _>(1)?),
                    consumer: r.try_get(2)?,
                    origin: r.try_get(3)?,
                    requested_ms: r.try_get(4)?,
                })
            })
            .collect::<Result<_, sqlx::Error>>()
            .map_err(SubsError::from)
    }

    // ----- sources -----

    /// Every source, by name.
    pub async fn list_sources(&self) -> Result<Vec<Source>, SubsError> {
        let sql = format!("SELECT {SOURCE_COLUMNS} FROM cdc_sources ORDER BY name");
        self.select_all(sql, source).await
    }

    /// The source `name`.
    pub async fn source(&self, name: &str) -> Result<Source, SubsError> {
        let sql = format!("SELECT {SOURCE_COLUMNS} FROM cdc_sources WHERE name = ?");
        let names = "SELECT name FROM cdc_sources ORDER BY name";
        self.select_found(sql, ("source", name), source, Some(names))
            .await
    }

    /// Adds a source.
    pub async fn add_source(&self, new: &NewSource) -> Result<Source, SubsError> {
        check_name("name", &new.name)?;
        check_source_fields(
            Some(&new.db_host),
            new.db_port,
            Some(&new.db_user),
            new.description.as_deref(),
        )?;
        let redact = redact_json(new.redact.as_ref())?;
        let existing = "SELECT id FROM cdc_sources WHERE name = ?";
        let mut tx = self.begin_add("source", existing, &new.name).await?;
        let now = now_ms();
        sqlx::query(
            "INSERT INTO cdc_sources (name, db_host, db_port, db_user, enabled, description, created_ms, updated_ms, redact_json) \
             VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
        )
        .bind(&new.name)
        .bind(&new.db_host)
        .bind(new.db_port.unwrap_or(3306))
        .bind(&new.db_user)
        .bind(i32::from(new.enabled.unwrap_or(true)))
        .bind(new.description.clone().unwrap_or_default())
        .bind(now)
        .bind(now)
        .bind(redact)
        .execute(&mut *tx)
        .await
        .map_err(|e| duplicate(e, "source", &new.name))?;
        self.commit_change(tx, None).await?;
        self.source(&new.name).await
    }

    /// Changes a source.
    pub async fn update_source(
        &self,
        name: &str,
        patch: &SourcePatch,
    ) -> Result<Source, SubsError> {
        check_source_fields(
            patch.db_host.as_deref(),
            patch.db_port,
            patch.db_user.as_deref(),
            patch.description.as_deref(),
        )?;
        let redact = redact_json(patch.redact.as_ref())?;
        let current = self.source(name).await?;
        let tx = self.db.begin().await?;
        // Only the fields the patch names change, in the statement itself
        // (COALESCE): a concurrent patch of other fields is not undone.
        let update = sqlx::query(
            "UPDATE cdc_sources SET db_host = COALESCE(?, db_host), db_port = COALESCE(?, db_port), \
             db_user = COALESCE(?, db_user), enabled = COALESCE(?, enabled), description = COALESCE(?, description), \
             redact_json = COALESCE(?, redact_json), updated_ms = ? WHERE id = ?",
        )
        .bind(patch.db_host.clone())
        .bind(patch.db_port)
        .bind(patch.db_user.clone())
        .bind(patch.enabled.map(i32::from))
        .bind(patch.description.clone())
        .bind(redact);
        self.commit_update(tx, update, current.id, None).await?;
        self.source(name).await
    }

    /// Removes a source no event definition refers to.
    pub async fn remove_source(&self, name: &str) -> Result<Source, SubsError> {
        let current = self.source(name).await?;
        self.remove_unused::<String>(&SOURCE_REMOVAL, name, current.id, None)
            .await?;
        Ok(current)
    }

    // ----- event definitions -----

    /// Every event definition, by routing key.
    pub async fn list_events(&self) -> Result<Vec<EventDefinition>, SubsError> {
        let sql = format!("{EVENT_SELECT} ORDER BY e.routing_key");
        self.select_all(sql, event).await
    }

    /// The event definition of `routing_key`.
    pub async fn event(&self, routing_key: &str) -> Result<EventDefinition, SubsError> {
        let sql = format!("{EVENT_SELECT} WHERE e.routing_key = ?");
        self.select_found(sql, ("event", routing_key), event, None)
            .await
    }

    /// Adds an event definition; `order_topic` is the topic of event names
    /// that are no CDC routing key ([`default_topic`]).
    pub async fn add_event(
        &self,
        new: &NewEvent,
        order_topic: &str,
    ) -> Result<EventDefinition, SubsError> {
        let existing = "SELECT id FROM event_definitions WHERE routing_key = ?";
        let mut tx = self.begin_add("event", existing, &new.routing_key).await?;
        self.insert_event(&mut tx, new, order_topic).await?;
        self.commit_change(tx, None).await?;
        self.event(&new.routing_key).await
    }

    /// Inserts an event definition in `tx`; returns its id.
    async fn insert_event(
        &self,
        tx: &mut Tx,
        new: &NewEvent,
        order_topic: &str,
    ) -> Result<i64, SubsError> {
        check_routing_key("event", &new.routing_key)?;
        let topic = new
            .topic
            .clone()
            .unwrap_or_else(|| default_topic(&new.routing_key, order_topic));
        check_topic(&topic)?;
        check_text("description", new.description.as_deref(), 255)?;
        let redact = event_redact_json(&new.routing_key, new.redact.as_ref())?;
        let source_id = match new.source.as_deref() {
            Some(name) if !name.is_empty() => Some(self.source_id(tx, name).await?),
            _ => None,
        };
        let now = now_ms();
        let row = sqlx::query(
            "INSERT INTO event_definitions (routing_key, topic, source_id, description, created_ms, updated_ms, redact_json) \
             VALUES (?, ?, ?, ?, ?, ?, ?) RETURNING id",
        )
        .bind(&new.routing_key)
        .bind(&topic)
        .bind(source_id)
        .bind(new.description.clone().unwrap_or_default())
        .bind(now)
        .bind(now)
        .bind(redact)
        .fetch_one(&mut **tx)
        .await
        .map_err(|e| duplicate(e, "event", &new.routing_key))?;
        Ok(row.try_get(0)?)
    }

    /// Changes an event definition.
    pub async fn update_event(
        &self,
        routing_key: &str,
        patch: &EventPatch,
    ) -> Result<EventDefinition, SubsError> {
        if let Some(topic) = &patch.topic {
            check_topic(topic)?;
        }
        check_text("description", patch.description.as_deref(), 255)?;
        let redact = event_redact_json(routing_key, patch.redact.as_ref())?;
        let current = self.event(routing_key).await?;
        let mut tx = self.db.begin().await?;
        let source_id = match patch.source.as_deref() {
            None | Some("") => None,
            Some(name) => Some(self.source_id(&mut tx, name).await?),
        };
        // Only what the patch names changes (see update_source).
        let update = sqlx::query(
            "UPDATE event_definitions SET topic = COALESCE(?, topic), \
             source_id = CASE ? WHEN 1 THEN ? ELSE source_id END, description = COALESCE(?, description), \
             redact_json = COALESCE(?, redact_json), updated_ms = ? WHERE id = ?",
        )
        .bind(patch.topic.clone())
        .bind(i32::from(patch.source.is_some()))
        .bind(source_id)
        .bind(patch.description.clone())
        .bind(redact);
        self.commit_update(tx, update, current.id, None).await?;
        self.event(routing_key).await
    }

    /// Removes an event definition no subscription names.
    pub async fn remove_event(&self, routing_key: &str) -> Result<EventDefinition, SubsError> {
        let current = self.event(routing_key).await?;
        self.remove_unused::<i64>(&EVENT_REMOVAL, routing_key, current.id, None)
            .await?;
        Ok(current)
    }

    // ----- consumers -----

    /// Every consumer, by name.
    pub async fn list_consumers(&self) -> Result<Vec<Consumer>, SubsError> {
        let sql = format!("SELECT {CONSUMER_COLUMNS} FROM downstream_consumers ORDER BY name");
        self.select_all(sql, |r| consumer_at(r, 0)).await
    }

    /// The consumer `name`.
    pub async fn consumer(&self, name: &str) -> Result<Consumer, SubsError> {
        let sql = format!("SELECT {CONSUMER_COLUMNS} FROM downstream_consumers WHERE name = ?");
        let names = "SELECT name FROM downstream_consumers ORDER BY name";
        self.select_found(sql, ("consumer", name), |r| consumer_at(r, 0), Some(names))
            .await
    }

    /// Adds a consumer.
    pub async fn add_consumer(&self, new: &NewConsumer) -> Result<Consumer, SubsError> {
        check_name("name", &new.name)?;
        check_endpoint(Some(&new.url), new.method.as_deref())?;
        check_timeout(new.timeout_ms)?;
        check_retry(new.retry.as_ref())?;
        check_text("channel_id", new.channel_id.as_deref(), 64)?;
        check_text("description", new.description.as_deref(), 255)?;
        let existing = "SELECT id FROM downstream_consumers WHERE name = ?";
        let mut tx = self.begin_add("consumer", existing, &new.name).await?;
        let now = now_ms();
        sqlx::query(
            "INSERT INTO downstream_consumers (name, http_method, http_url, timeout_ms, retry_json, channel_id, enabled, \
             description, created_ms, updated_ms, success) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        )
        .bind(&new.name)
        .bind(new.method.clone().unwrap_or_else(|| "POST".into()))
        .bind(&new.url)
        .bind(new.timeout_ms.unwrap_or(5_000))
        .bind(retry_json(new.retry.as_ref()))
        .bind(new.channel_id.clone().unwrap_or_else(|| "orderpipe".into()))
        .bind(i32::from(new.enabled.unwrap_or(true)))
        .bind(new.description.clone().unwrap_or_default())
        .bind(now)
        .bind(now)
        .bind(new.success.unwrap_or_default().as_str())
        .execute(&mut *tx)
        .await
        .map_err(|e| duplicate(e, "consumer", &new.name))?;
        self.commit_change(tx, Some(&new.name)).await?;
        self.consumer(&new.name).await
    }

    /// Changes a consumer (its name never changes: it names its groups).
    pub async fn update_consumer(
        &self,
        name: &str,
        patch: &ConsumerPatch,
    ) -> Result<Consumer, SubsError> {
        check_endpoint(patch.url.as_deref(), patch.method.as_deref())?;
        check_timeout(patch.timeout_ms)?;
        check_retry(patch.retry.as_ref())?;
        if patch.clear_retry && patch.retry.is_some() {
            return Err(Invalid::new(
                "retry",
                "both a new retry schedule and clear_retry given; keep one",
            )
            .into());
        }
        check_text("channel_id", patch.channel_id.as_deref(), 64)?;
        check_text("description", patch.description.as_deref(), 255)?;
        let current = self.consumer(name).await?;
        let tx = self.db.begin().await?;
        // Only what the patch names changes (see update_source).
        let update = sqlx::query(
            "UPDATE downstream_consumers SET http_method = COALESCE(?, http_method), http_url = COALESCE(?, http_url), \
             timeout_ms = COALESCE(?, timeout_ms), retry_json = CASE ? WHEN 1 THEN ? ELSE retry_json END, \
             channel_id = COALESCE(?, channel_id), enabled = COALESCE(?, enabled), \
             description = COALESCE(?, description), success = COALESCE(?, success), updated_ms = ? WHERE id = ?",
        )
        .bind(patch.method.clone())
        .bind(patch.url.clone())
        .bind(patch.timeout_ms)
        .bind(i32::from(patch.retry.is_some() || patch.clear_retry))
        .bind(retry_json(patch.retry.as_ref()))
        .bind(patch.channel_id.clone())
        .bind(patch.enabled.map(i32::from))
        .bind(patch.description.clone())
        .bind(patch.success.map(SuccessRule::as_str));
        self.commit_update(tx, update, current.id, Some(name))
            .await?;
        self.consumer(name).await
    }

    /// Removes a consumer no subscription names.
    pub async fn remove_consumer(&self, name: &str) -> Result<Consumer, SubsError> {
        let current = self.consumer(name).await?;
        self.remove_unused::<i64>(&CONSUMER_REMOVAL, name, current.id, Some(name))
            .await?;
        Ok(current)
    }

    // ----- subscriptions -----

    /// Subscriptions matching `query`, by id, with their filters.
    pub async fn list_subscriptions(
        &self,
        query: &SubscriptionQuery,
    ) -> Result<Vec<Subscription>, SubsError> {
        self.subscriptions_where(query, None).await
    }

    /// The subscription `id`.
    pub async fn subscription(&self, id: i64) -> Result<Subscription, SubsError> {
        self.subscriptions_where(&SubscriptionQuery::default(), Some(id))
            .await?
            .pop()
            .ok_or_else(|| SubsError::NotFound {
                kind: "subscription",
                key: id.to_string(),
                known: String::new(),
            })
    }

    async fn subscriptions_where(
        &self,
        q: &SubscriptionQuery,
        id: Option<i64>,
    ) -> Result<Vec<Subscription>, SubsError> {
        let bind = |sql: String| {
            sqlx::query(sqlx::AssertSqlSafe(sql))
                .bind(q.consumer.clone())
                .bind(q.consumer.clone())
                .bind(q.event.clone())
                .bind(q.event.clone())
                .bind(id)
                .bind(id)
                .bind(i32::from(q.served_only))
        };
        let rows = bind(format!(
            "SELECT s.id, e.routing_key, e.topic, c.name, s.bind_key, s.enabled, s.description, s.created_ms, s.updated_ms \
             {SUBSCRIPTION_FROM} ORDER BY s.id"
        ))
        .fetch_all(&self.db.pool)
        .await?;
        let filter_rows = bind(format!(
            "SELECT f.subscription_id, f.field, f.op, f.value_json, f.from_json, f.to_json \
             FROM property_filters f JOIN ({}) m ON m.id = f.subscription_id ORDER BY f.subscription_id, f.position",
            format_args!("SELECT s.id {SUBSCRIPTION_FROM}")
        ))
        .fetch_all(&self.db.pool)
        .await?;
        let mut filters: BTreeMap<i64, Vec<PropertyFilter>> = BTreeMap::new();
        for r in &filter_rows {
            let (id, f) = stored_filter(r)?;
            filters.entry(id).or_default().push(f);
        }
        rows.iter()
            .map(|r| {
                let id: i64 = r.try_get(0)?;
                let consumer: String = r.try_get(3)?;
                let bind_key: String = r.try_get(4)?;
                Ok(Subscription {
                    id,
                    event: r.try_get(1)?,
                    topic: r.try_get(2)?,
                    group: group_name(&consumer, &bind_key),
                    consumer,
                    bind_key,
                    enabled: r.try_get::<i32, _>(5)? != 0,
                    filters: filters.remove(&id).unwrap_or_default(),
                    description: r.try_get(6)?,
                    created_ms: r.try_get(7)?,
                    updated_ms: r.try_get(8)?,
                })
            })
            .collect::<Result<_, sqlx::Error>>()
            .map_err(SubsError::from)
    }

    /// Adds a subscription (and its event definition, with its default
    /// topic, when none has its routing key); `order_topic` as in [`Store::add_event`].
    pub async fn add_subscription(
        &self,
        new: &NewSubscription,
        order_topic: &str,
    ) -> Result<Subscription, SubsError> {
        check_routing_key("event", &new.event)?;
        check_name("bind_key", &new.bind_key)?;
        let filters = check_filters(&new.filters)?;
        check_text("description", new.description.as_deref(), 255)?;
        let mut tx = self.db.begin().await?;
        let consumer_id = self.consumer_id(&mut tx, &new.consumer).await?;
        let event_id = match self
            .id_of(
                &mut tx,
                "SELECT id FROM event_definitions WHERE routing_key = ?",
                &new.event,
            )
            .await?
        {
            Some(id) => id,
            None => {
                let event = NewEvent {
                    routing_key: new.event.clone(),
                    ..NewEvent::default()
                };
                self.insert_event(&mut tx, &event, order_topic).await?
            }
        };
        let existing: Option<(i64,)> =
            sqlx::query_as("SELECT id FROM subscriptions WHERE event_id = ? AND consumer_id = ?")
                .bind(event_id)
                .bind(consumer_id)
                .fetch_optional(&mut *tx)
                .await?;
        if let Some((id,)) = existing {
            return Err(SubsError::Exists {
                kind: "subscription",
                key: format!("{} -> {}", new.event, new.consumer),
                detail: format!(" (subscription {id}; change it with update)"),
            });
        }
        let now = now_ms();
        let row = sqlx::query(
            "INSERT INTO subscriptions (event_id, consumer_id, bind_key, enabled, description, created_ms, updated_ms) \
             VALUES (?, ?, ?, ?, ?, ?, ?) RETURNING id",
        )
        .bind(event_id)
        .bind(consumer_id)
        .bind(&new.bind_key)
        .bind(i32::from(new.enabled.unwrap_or(true)))
        .bind(new.description.clone().unwrap_or_default())
        .bind(now)
        .bind(now)
        .fetch_one(&mut *tx)
        .await
        .map_err(|e| duplicate(e, "subscription", &format!("{} -> {}", new.event, new.consumer)))?;
        let id: i64 = row.try_get(0)?;
        insert_filters(&mut tx, id, &filters).await?;
        self.commit_change(tx, Some(&new.consumer)).await?;
        self.subscription(id).await
    }

    /// Changes a subscription; `filters`, when given, replace all of them.
    pub async fn update_subscription(
        &self,
        id: i64,
        patch: &SubscriptionPatch,
    ) -> Result<Subscription, SubsError> {
        if let Some(key) = &patch.bind_key {
            check_name("bind_key", key)?;
        }
        let filters = patch.filters.as_deref().map(check_filters).transpose()?;
        check_text("description", patch.description.as_deref(), 255)?;
        let current = self.subscription(id).await?;
        let mut tx = self.db.begin().await?;
        if let Some(filters) = filters {
            sqlx::query("DELETE FROM property_filters WHERE subscription_id = ?")
                .bind(id)
                .execute(&mut *tx)
                .await?;
            insert_filters(&mut tx, id, &filters).await?;
        }
        // Only what the patch names changes (see update_source).
        let update = sqlx::query(
            "UPDATE subscriptions SET bind_key = COALESCE(?, bind_key), enabled = COALESCE(?, enabled), \
             description = COALESCE(?, description), updated_ms = ? WHERE id = ?",
        )
        .bind(patch.bind_key.clone())
        .bind(patch.enabled.map(i32::from))
        .bind(patch.description.clone());
        self.commit_update(tx, update, id, Some(&current.consumer))
            .await?;
        self.subscription(id).await
    }

    /// Removes a subscription and its filters.
    pub async fn remove_subscription(&self, id: i64) -> Result<Subscription, SubsError> {
        let current = self.subscription(id).await?;
        let mut tx = self.db.begin().await?;
        sqlx::query("DELETE FROM property_filters WHERE subscription_id = ?")
            .bind(id)
            .execute(&mut *tx)
            .await?;
        sqlx::query("DELETE FROM subscriptions WHERE id = ?")
            .bind(id)
            .execute(&mut *tx)
            .await?;
        self.commit_change(tx, Some(&current.consumer)).await?;
        Ok(current)
    }

    // ----- desired state -----

    /// The desired bindings (of `consumer` only, when given): the enabled
    /// subscriptions of enabled consumers, one [`Binding`] per (consumer,
    /// bind_key), sorted by group.
    pub async fn desired(&self, consumer: Option<&str>) -> Result<Vec<Binding>, SubsError> {
        let query = SubscriptionQuery {
            consumer: consumer.map(str::to_string),
            served_only: true,
            ..SubscriptionQuery::default()
        };
        let subscriptions = self.list_subscriptions(&query).await?;
        let consumers: BTreeMap<String, Consumer> = self
            .list_consumers()
            .await?
            .into_iter()
            .map(|c| (c.name.clone(), c))
            .collect();
        let mut bindings: BTreeMap<String, Binding> = BTreeMap::new();
        for s in subscriptions {
            let Some(consumer) = consumers.get(&s.consumer) else {
                continue;
            };
            let binding = bindings.entry(s.group.clone()).or_insert_with(|| Binding {
                group: s.group.clone(),
                consumer: consumer.clone(),
                bind_key: s.bind_key.clone(),
                topics: Vec::new(),
                routes: Vec::new(),
            });
            if !binding.topics.contains(&s.topic) {
                binding.topics.push(s.topic.clone());
                binding.topics.sort();
            }
            binding.routes.push(Route {
                subscription_id: s.id,
                routing_key: s.event,
                topic: s.topic,
                filters: s.filters,
            });
        }
        Ok(bindings.into_values().collect())
    }

    // ----- helpers -----

    /// Every row `sql` (no `?`) returns, as `row` reads it.
    async fn select_all<T>(
        &self,
        sql: String,
        row: impl Fn(&AnyRow) -> Result<T, sqlx::Error>,
    ) -> Result<Vec<T>, SubsError> {
        let rows = sqlx::query(sqlx::AssertSqlSafe(sql))
            .fetch_all(&self.db.pool)
            .await?;
        Ok(rows.iter().map(row).collect::<Result<_, _>>()?)
    }

    /// The row `sql` (one `?`: the key) finds for `what` (kind, key), as
    /// `row` reads it; [`SubsError::NotFound`] without one, with the known
    /// names when `names` lists them.
    async fn select_found<T>(
        &self,
        sql: String,
        what: (&'static str, &str),
        row: impl Fn(&AnyRow) -> Result<T, sqlx::Error>,
        names: Option<&'static str>,
    ) -> Result<T, SubsError> {
        let (kind, key) = what;
        let found = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(key)
            .fetch_optional(&self.db.pool)
            .await?;
        match (found, names) {
            (Some(found), _) => Ok(row(&found)?),
            (None, Some(names)) => Err(self.not_found(kind, key, names).await),
            (None, None) => Err(SubsError::NotFound {
                kind,
                key: key.into(),
                known: String::new(),
            }),
        }
    }

    /// Deletes row `id` (`key`) as `removal` says, unless rows refer to it
    /// ([`SubsError::InUse`] lists them, as `T`); writes a change request
    /// for `consumer` in the same transaction.
    async fn remove_unused<T>(
        &self,
        removal: &Removal,
        key: &str,
        id: i64,
        consumer: Option<&str>,
    ) -> Result<(), SubsError>
    where
        T: ToString + Send + Unpin + for<'r> sqlx::Decode<'r, sqlx::Any> + sqlx::Type<sqlx::Any>,
    {
        let mut tx = self.db.begin().await?;
        let found: Vec<(T,)> = sqlx::query_as(removal.users)
            .bind(id)
            .fetch_all(&mut *tx)
            .await?;
        if !found.is_empty() {
            let list = found
                .iter()
                .map(|(u,)| u.to_string())
                .collect::<Vec<_>>()
                .join(", ");
            return Err(SubsError::InUse {
                kind: removal.kind,
                key: key.into(),
                by: format!("{} {list}", removal.users_are),
            });
        }
        sqlx::query(removal.delete)
            .bind(id)
            .execute(&mut *tx)
            .await?;
        self.commit_change(tx, consumer).await?;
        Ok(())
    }

    async fn id_of(
        &self,
        tx: &mut Tx,
        sql: &'static str,
        key: &str,
    ) -> Result<Option<i64>, sqlx::Error> {
        Ok(sqlx::query_as::<_, (i64,)>(sql)
            .bind(key)
            .fetch_optional(&mut **tx)
            .await?
            .map(|(id,)| id))
    }

    /// Begins the transaction of an add: [`SubsError::Exists`] when `sql`
    /// (one `?`: the key) finds a row of `kind` with `key`. The unique key
    /// still guards a concurrent insert ([`duplicate`]); this check gives the
    /// common case a clear error first.
    async fn begin_add(
        &self,
        kind: &'static str,
        sql: &'static str,
        key: &str,
    ) -> Result<Tx, SubsError> {
        let mut tx = self.db.begin().await?;
        match self.id_of(&mut tx, sql, key).await? {
            Some(_) => Err(SubsError::Exists {
                kind,
                key: key.into(),
                detail: String::new(),
            }),
            None => Ok(tx),
        }
    }

    /// The id of `kind` `name` that `sql` (one `?`: the name) finds, or
    /// [`SubsError::NotFound`] listing the known names (`names`).
    async fn id_or_not_found(
        &self,
        tx: &mut Tx,
        kind: &'static str,
        name: &str,
        sql: &'static str,
        names: &'static str,
    ) -> Result<i64, SubsError> {
        match self.id_of(tx, sql, name).await? {
            Some(id) => Ok(id),
            None => Err(not_found_in(tx, kind, name, names).await),
        }
    }

    async fn consumer_id(&self, tx: &mut Tx, name: &str) -> Result<i64, SubsError> {
        let sql = "SELECT id FROM downstream_consumers WHERE name = ?";
        let names = "SELECT name FROM downstream_consumers ORDER BY name";
        self.id_or_not_found(tx, "consumer", name, sql, names).await
    }

    async fn source_id(&self, tx: &mut Tx, name: &str) -> Result<i64, SubsError> {
        let sql = "SELECT id FROM cdc_sources WHERE name = ?";
        let names = "SELECT name FROM cdc_sources ORDER BY name";
        self.id_or_not_found(tx, "source", name, sql, names).await
    }

    /// Not found, with the known names (up to 20) when the kind has names.
    async fn not_found(&self, kind: &'static str, key: &str, names: &'static str) -> SubsError {
        let known = match self.db.pool.acquire().await {
            Ok(mut conn) => known_names(&mut conn, names).await,
            Err(_) => String::new(),
        };
        SubsError::NotFound {
            kind,
            key: key.into(),
            known,
        }
    }
}

/// `; known: a, b` (up to 20), `; none exists yet`, or nothing when the query fails.
async fn known_names(conn: &mut sqlx::AnyConnection, names: &'static str) -> String {
    match sqlx::query_as::<_, (String,)>(names)
        .fetch_all(&mut *conn)
        .await
    {
        Ok(rows) if rows.is_empty() => "; none exists yet".to_string(),
        Ok(rows) => {
            let more = if rows.len() > 20 { ", ..." } else { "" };
            format!(
                "; known: {}{more}",
                rows.iter()
                    .take(20)
                    .map(|(n,)| n.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        }
        Err(_) => String::new(),
    }
}

/// Not found in `tx` (a pool of one connection has none to spare for the names).
async fn not_found_in(
    tx: &mut Tx,
    kind: &'static str,
    key: &str,
    names: &'static str,
) -> SubsError {
    SubsError::NotFound {
        kind,
        key: key.into(),
        known: known_names(tx, names).await,
    }
}

/// Inserts `filters` of subscription `id` in order.
async fn insert_filters(
    tx: &mut Tx,
    id: i64,
    filters: &[PropertyFilter],
) -> Result<(), sqlx::Error> {
    for (position, filter) in filters.iter().enumerate() {
        let spec = FilterSpec::from(filter);
        let value = match (&spec.value, &spec.values) {
            (Some(v), _) => Some(v.to_string()),
            (None, Some(values)) => Some(serde_json::Value::from(values.clone()).to_string()),
            (None, None) => None,
        };
        sqlx::query(
            "INSERT INTO property_filters (subscription_id, position, field, op, value_json, from_json, to_json) \
             VALUES (?, ?, ?, ?, ?, ?, ?)",
        )
        .bind(id)
        .bind(position as i32)
        .bind(&spec.field)
        .bind(&spec.op)
        .bind(value)
        .bind(spec.from.as_ref().map(|v| v.to_string()))
        .bind(spec.to.as_ref().map(|v| v.to_string()))
        .execute(&mut **tx)
        .await?;
    }
    Ok(())
}

/// A unique key violated by a concurrent insert (its check passed before the
/// other committed) is [`SubsError::Exists`], like one the check caught.
fn duplicate(e: sqlx::Error, kind: &'static str, key: &str) -> SubsError {
    match &e {
        sqlx::Error::Database(db) if db.is_unique_violation() => SubsError::Exists {
            kind,
            key: key.into(),
            detail: String::new(),
        },
        _ => e.into(),
    }
}

/// A retry layer as stored (None: no layer).
fn retry_json(retry: Option<&RetryLayer>) -> Option<String> {
    retry.map(|l| serde_json::to_string(l).expect("a retry layer serializes"))
}

/// Checks a Kafka topic name.
fn check_topic(topic: &str) -> Result<(), Invalid> {
    let ok = !topic.is_empty()
        && topic.len() <= 249
        && topic
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
    if ok {
        Ok(())
    } else {
        Err(Invalid::new(
            "topic",
            format!("`{topic}` is not a topic name: 1 to 249 of a-z, A-Z, 0-9, . _ -"),
        ))
    }
}

/// A source's column rules as stored (JSON text), checked as cdc checks
/// `[cdc.redact]`; None when not given.
fn redact_json(
    rules: Option<&std::collections::BTreeMap<String, crate::masking::ColumnRules>>,
) -> Result<Option<String>, Invalid> {
    let Some(rules) = rules else {
        return Ok(None);
    };
    crate::masking::check_rules("redact", rules).map_err(|e| {
        Invalid::new(
            "redact",
            format!("{e} (a JSON object: table -> {{drop, hash, mask}} column lists)"),
        )
    })?;
    Ok(Some(
        serde_json::to_string(rules).expect("column rules serialize"),
    ))
}

/// An event definition's column rules as stored, checked as cdc checks a
/// `[cdc.redact]` table's; None when not given. Only a CDC routing key
/// names a table whose columns there are.
fn event_redact_json(
    routing_key: &str,
    rules: Option<&crate::masking::ColumnRules>,
) -> Result<Option<String>, Invalid> {
    let Some(rules) = rules else {
        return Ok(None);
    };
    if *rules == crate::masking::ColumnRules::default() {
        return Ok(Some("{}".into()));
    }
    let Some(table) = cdc_table(routing_key) else {
        return Err(Invalid::new(
            "redact",
            format!(
                "`{routing_key}` is an order event, not <db>.<table>.<operation>: only a table's columns can be masked"
            ),
        ));
    };
    let one = BTreeMap::from([(table.to_string(), rules.clone())]);
    crate::masking::check_rules("redact", &one).map_err(|e| Invalid::new("redact", e))?;
    Ok(Some(
        serde_json::to_string(rules).expect("column rules serialize"),
    ))
}

/// Checks a source's fields.
fn check_source_fields(
    host: Option<&str>,
    port: Option<i32>,
    user: Option<&str>,
    description: Option<&str>,
) -> Result<(), Invalid> {
    if host.is_some_and(|h| h.is_empty() || h.len() > 128 || h.contains(char::is_whitespace)) {
        return Err(Invalid::new(
            "db_host",
            "a host name or address of 1 to 128 characters",
        ));
    }
    if let Some(p) = port.filter(|p| !(1..=65_535).contains(p)) {
        return Err(Invalid::new(
            "db_port",
            format!("{p} is outside 1 to 65535"),
        ));
    }
    if user.is_some_and(|u| u.is_empty() || u.len() > 32) {
        return Err(Invalid::new("db_user", "a user name of 1 to 32 characters"));
    }
    check_text("description", description, 255)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::subscriptions::Decision;
    use serde_json::json;

    fn consumer(name: &str) -> NewConsumer {
        NewConsumer {
            name: name.into(),
            url: format!("http://{name}.internal/hook"),
            ..NewConsumer::default()
        }
    }

    fn subscription(
        event: &str,
        consumer: &str,
        bind_key: &str,
        filters: &[&str],
    ) -> NewSubscription {
        NewSubscription {
            event: event.into(),
            consumer: consumer.into(),
            bind_key: bind_key.into(),
            filters: filters
                .iter()
                .map(|f| FilterSpec::from(&PropertyFilter::parse(f, "--filter").unwrap()))
                .collect(),
            ..NewSubscription::default()
        }
    }

    /// A source's column rules (migration 0025): checked as cdc checks
    /// `[cdc.redact]`, stored and read back, replaced whole, cleared by `{}`.
    #[tokio::test]
    async fn a_sources_column_rules_are_checked_kept_replaced_and_cleared() {
        let (_dir, db) = crate::db::sqlite_for_test().await;
        let store = Store::new(db, Origin::Cli);
        let rules = |json: serde_json::Value| Some(serde_json::from_value(json).unwrap());
        let new = |redact| NewSource {
            name: "shop".into(),
            db_host: "db".into(),
            db_user: "repl".into(),
            redact,
            ..NewSource::default()
        };
        let e = store
            .add_source(&new(rules(json!({"users": {"drop": ["a"]}}))))
            .await
            .unwrap_err();
        assert!(
            matches!(&e, SubsError::Invalid(i) if i.field == "redact" && i.reason.contains("<database>.<table>")),
            "{e}"
        );
        let added = store
            .add_source(&new(rules(
                json!({"shop.users": {"hash": ["mobile"], "drop": ["id_card"]}}),
            )))
            .await
            .unwrap();
        assert_eq!(added.redact["shop.users"].hash, ["mobile"]);
        assert_eq!(added.redact["shop.users"].drop, ["id_card"]);
        let patch = |redact| SourcePatch {
            redact,
            ..SourcePatch::default()
        };
        // Another field's patch keeps them; a new set replaces them; {} clears them.
        let kept = store
            .update_source(
                "shop",
                &SourcePatch {
                    description: Some("x".into()),
                    ..SourcePatch::default()
                },
            )
            .await
            .unwrap();
        assert_eq!(kept.redact, added.redact);
        let replaced = store
            .update_source(
                "shop",
                &patch(rules(json!({"shop.users": {"mask": ["email"]}}))),
            )
            .await
            .unwrap();
        assert_eq!(replaced.redact["shop.users"].mask, ["email"]);
        assert!(replaced.redact["shop.users"].hash.is_empty());
        let cleared = store
            .update_source("shop", &patch(rules(json!({}))))
            .await
            .unwrap();
        assert!(cleared.redact.is_empty());
    }

    /// The SQLite twin of 0012: CRUD, bindings by (consumer, bind_key), control requests.
    #[tokio::test]
    async fn sqlite_crud_bindings_and_requests() {
        let (_dir, db) = crate::db::sqlite_for_test().await;
        let store = Store::new(db, Origin::Cli);
        assert_eq!(store.latest_request().await.unwrap(), None);
        store.add_consumer(&consumer("sms")).await.unwrap();
        store.add_consumer(&consumer("log")).await.unwrap();
        let insert = store
            .add_subscription(
                &subscription("db.table_user.insert", "sms", "user", &[]),
                "order.events.v1",
            )
            .await
            .unwrap();
        assert_eq!(
            (insert.topic.as_str(), insert.group.as_str()),
            ("cdc.db.table_user", "sms.user.consumer")
        );
        let update = store
            .add_subscription(
                &subscription(
                    "db.table_user.update",
                    "sms",
                    "user",
                    &["status:changed:1->2"],
                ),
                "order.events.v1",
            )
            .await
            .unwrap();
        assert_eq!(
            update.filters,
            [PropertyFilter::parse("status:changed:1->2", "f").unwrap()]
        );
        store
            .add_subscription(
                &subscription("order.created", "log", "orders", &["amount:ne:0"]),
                "o.v1",
            )
            .await
            .unwrap();
        let events: Vec<String> = store
            .list_events()
            .await
            .unwrap()
            .into_iter()
            .map(|e| format!("{} {}", e.routing_key, e.topic))
            .collect();
        assert_eq!(
            events,
            [
                "db.table_user.insert cdc.db.table_user",
                "db.table_user.update cdc.db.table_user",
                "order.created o.v1"
            ]
        );

        // Two subscriptions, one bind key: one group.
        let desired = store.desired(None).await.unwrap();
        let groups: Vec<(&str, usize)> = desired
            .iter()
            .map(|b| (b.group.as_str(), b.routes.len()))
            .collect();
        assert_eq!(
            groups,
            [("log.orders.consumer", 1), ("sms.user.consumer", 2)]
        );
        let sms = &desired[1];
        assert_eq!(
            sms.decide(
                "db.table_user.update",
                &json!({"status": 3}),
                &json!({"status": 1})
            ),
            Decision::Filtered
        );
        assert_eq!(
            sms.decide(
                "db.table_user.update",
                &json!({"status": 2}),
                &json!({"status": 1})
            ),
            Decision::Deliver {
                subscriptions: vec![update.id]
            }
        );

        // Disable one subscription, then the consumer: the group loses it, then goes.
        let before = store.latest_request().await.unwrap().unwrap();
        store
            .update_subscription(
                update.id,
                &SubscriptionPatch {
                    enabled: Some(false),
                    ..Default::default()
                },
            )
            .await
            .unwrap();
        let after = store.latest_request().await.unwrap().unwrap();
        assert!(
            after.id > before.id
                && after.kind == RequestKind::Change
                && after.consumer.as_deref() == Some("sms")
        );
        assert_eq!(store.desired(Some("sms")).await.unwrap()[0].routes.len(), 1);
        store
            .update_consumer(
                "sms",
                &ConsumerPatch {
                    enabled: Some(false),
                    ..Default::default()
                },
            )
            .await
            .unwrap();
        assert!(store.desired(Some("sms")).await.unwrap().is_empty());

        // Replacing filters; update of the URL and retry; refusals name things.
        let replaced = store
            .update_subscription(
                update.id,
                &SubscriptionPatch {
                    filters: Some(vec![]),
                    ..Default::default()
                },
            )
            .await
            .unwrap();
        assert!(replaced.filters.is_empty());
        let retry: RetryLayer = serde_json::from_value(json!({"delays": ["5s", "30s"]})).unwrap();
        let changed = store
            .update_consumer(
                "sms",
                &ConsumerPatch {
                    url: Some("https://sms2/send".into()),
                    retry: Some(retry.clone()),
                    ..Default::default()
                },
            )
            .await
            .unwrap();
        assert_eq!(
            (changed.url.as_str(), changed.retry),
            ("https://sms2/send", Some(retry))
        );
        let err = store
            .add_subscription(
                &subscription("db.table_user.insert", "sms", "user", &[]),
                "o",
            )
            .await
            .unwrap_err();
        assert!(
            err.to_string()
                .contains(&format!("subscription {}", insert.id)),
            "{err}"
        );
        let err = store
            .add_subscription(&subscription("db.t.insert", "smss", "user", &[]), "o")
            .await
            .unwrap_err();
        assert_eq!(
            err.to_string(),
            "consumer `smss` not found; known: log, sms"
        );
        let err = store.remove_consumer("sms").await.unwrap_err();
        assert_eq!(
            err.to_string(),
            format!(
                "consumer `sms` is used by subscriptions {}, {}: remove those first",
                insert.id, update.id
            )
        );
        store.remove_subscription(update.id).await.unwrap();
        assert!(matches!(
            store.subscription(update.id).await,
            Err(SubsError::NotFound { .. })
        ));

        let refresh = store
            .request(RequestKind::Refresh, Some("log"))
            .await
            .unwrap();
        assert_eq!(
            (
                refresh.kind,
                refresh.consumer.as_deref(),
                refresh.origin.as_str()
            ),
            (RequestKind::Refresh, Some("log"), "cli")
        );
        assert_eq!(
            store.requests_since(refresh.id - 1, 10).await.unwrap(),
            [refresh]
        );
    }
}
