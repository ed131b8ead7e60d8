//! `orderpipe cdc --source NAME`: the source and its tables from the
//! control plane's tables (seed 003: the control plane names the data
//! sources and the events, Maxwell captures what they name).
//!
//! The `cdc_sources` row `NAME` gives the host, port and replication user;
//! the password stays in the cdc process's own secret configuration (the
//! password of `cdc.source`, or of `database.url` when that is unset),
//! never in the table. The tables captured are those of the event
//! definitions linked to the source (`event_definitions.source_id`):
//! routing key `<db>.<table>.<insert|update|delete>` -> table
//! `<db>.<table>`. A table is captured whole (its inserts, updates and
//! deletes), so one definition of it is enough; routers deliver only the
//! routing keys subscribed to.
//!
//! Changes apply without a restart, the way routers pick them up: every
//! write to the control plane adds a `control_requests` row; [`Watch`]
//! polls the latest id every second ([`ChangeWatch`]) and, when it moved,
//! reads the capture again. A different one (a table more or less, another
//! host, port or user) stops the running stream cleanly (its last batch and checkpoint
//! committed) and starts it again with the new tables from that
//! checkpoint, in the same process: nothing lost, nothing twice.
//! A change that would be refused at start (source disabled or removed,
//! no event definition left) is logged and the current capture kept; it
//! applies (is refused) at the next start.
//!
//! Column rules come from the source row's `redact` (`[cdc.redact]`'s
//! shape) and from its event definitions' (each one its table's; every
//! definition of a table carries the same rules or none: one table, one
//! record shape, one typed schema), and join the process's own
//! `cdc.redact`. A table given rules in two of these places is refused,
//! naming both. A change of the rules restarts the stream like a change of
//! tables.

use std::collections::BTreeMap;

use secrecy::{ExposeSecret, SecretString};

use super::{CdcError, CdcSettings};
use crate::masking::ColumnRules;
use crate::subscriptions::model::cdc_table;
use crate::subscriptions::watch::{ChangeWatch, POLL_INTERVAL};
use crate::subscriptions::{Source, Store, SubsError};

/// What the control plane says a source captures.
#[derive(Debug, Clone)]
pub struct Capture {
    /// The `cdc_sources` row.
    pub source: Source,
    /// Its tables, `db.table`, sorted, each once.
    pub tables: Vec<String>,
    /// The column rules of its tables: the row's and its event definitions'.
    pub redact: BTreeMap<String, ColumnRules>,
}

/// Reads source `name` and its event definitions from `store`; refuses an
/// unknown or disabled source, a source without CDC event definitions, a
/// definition whose topic is not the one `cdc` writes for its table, and
/// column rules for a table `cdc.redact` (the process's own) has rules for.
pub async fn capture(store: &Store, name: &str, cdc: &CdcSettings) -> Result<Capture, CdcError> {
    let setup = |what: String| CdcError::Setup(what);
    // A database that fails is worth retrying ([`Watch`]); a missing row is not.
    let read = |e: SubsError, what: &str| match e {
        SubsError::Db(e) => CdcError::Unreachable(format!("--source {name}: reading {what}: {e}")),
        e => setup(format!("--source {name}: {e} ({what})")),
    };
    let source = store
        .source(name)
        .await
        .map_err(|e| read(e, "cdc_sources"))?;
    if !source.enabled {
        return Err(setup(format!(
            "--source {name}: source `{name}` is disabled (cdc_sources.enabled = 0); \
             enable it with `orderpipe subs enable source {name}`"
        )));
    }
    let events = store
        .list_events()
        .await
        .map_err(|e| read(e, "event_definitions"))?;
    let mut tables = Vec::new();
    // Per table, its event definitions' rules and the definition they came from.
    let mut events_rules: BTreeMap<String, (ColumnRules, String)> = BTreeMap::new();
    for event in events.iter().filter(|e| e.source.as_deref() == Some(name)) {
        let Some(table) = cdc_table(&event.routing_key) else {
            tracing::warn!(
                source = name,
                event = %event.routing_key,
                "cdc: event definition of this source is not <db>.<table>.<insert|update|delete>; nothing to capture for it"
            );
            continue;
        };
        let writes = cdc.topic_of(table);
        if event.topic != writes {
            return Err(setup(format!(
                "event definition `{}` of source `{name}` reads topic `{}`, but cdc writes {table} to `{writes}` \
                 (cdc.topic_prefix = {:?}): change the event's topic (orderpipe subs update event {} --topic {writes}) \
                 or cdc.topic_prefix",
                event.routing_key, event.topic, cdc.topic_prefix, event.routing_key
            )));
        }
        tables.push(table.to_string());
        if event.redact != ColumnRules::default() {
            if let Some((rules, other)) = events_rules.get(table)
                && *rules != event.redact
            {
                return Err(setup(format!(
                    "--source {name}: event definitions `{other}` and `{}` give {table} different column rules: \
                     one table has one record shape; give them the same rules, or keep them on one \
                     (orderpipe subs update event {} --redact ...)",
                    event.routing_key, event.routing_key
                )));
            }
            events_rules
                .entry(table.to_string())
                .or_insert_with(|| (event.redact.clone(), event.routing_key.clone()));
        }
    }
    tables.sort();
    tables.dedup();
    if let Some(table) = source.redact.keys().find(|t| cdc.redact.contains_key(*t)) {
        return Err(setup(format!(
            "--source {name}: cdc.redact and the redact of cdc_sources `{name}` both name {table}: \
             keep its rules in one (orderpipe subs update source {name} --redact ...)"
        )));
    }
    let mut redact = source.redact.clone();
    for (table, (rules, event)) in events_rules {
        let elsewhere = if cdc.redact.contains_key(&table) {
            Some("cdc.redact".to_string())
        } else if source.redact.contains_key(&table) {
            Some(format!("the redact of cdc_sources `{name}`"))
        } else {
            None
        };
        if let Some(elsewhere) = elsewhere {
            return Err(setup(format!(
                "--source {name}: {elsewhere} and event definition `{event}` both give {table} column rules: \
                 keep them in one"
            )));
        }
        redact.insert(table, rules);
    }
    if tables.is_empty() {
        return Err(setup(format!(
            "--source {name}: no event definition <db>.<table>.<insert|update|delete> names source `{name}`, \
             so there is nothing to capture; add one (orderpipe subs add event DB.TABLE.insert --source {name})"
        )));
    }
    Ok(Capture {
        source,
        tables,
        redact,
    })
}

/// Follows the control plane for one source (see the module docs).
pub struct Watch {
    changes: ChangeWatch,
    name: String,
}

impl Watch {
    /// The capture of source `name` now, and a watch of what changes after it.
    pub async fn start(
        store: Store,
        name: &str,
        cdc: &CdcSettings,
    ) -> Result<(Self, Capture), CdcError> {
        // The request id first: a change made while the capture is read is seen again.
        let changes = ChangeWatch::from_now(store).await.map_err(|e| {
            CdcError::Unreachable(format!("--source {name}: reading control_requests: {e}"))
        })?;
        let capture = capture(changes.store(), name, cdc).await?;
        let watch = Self {
            changes,
            name: name.to_string(),
        };
        Ok((watch, capture))
    }

    /// Resolves with the new capture once the control plane changes what
    /// `current` captures; until then polls every [`POLL_INTERVAL`] (as
    /// routers do). A database that cannot be read, or a capture now
    /// refused, is logged and waited out.
    pub async fn changed(&mut self, cdc: &CdcSettings, current: &Capture) -> Capture {
        loop {
            tokio::time::sleep(POLL_INTERVAL).await;
            let latest = match self.changes.check().await {
                Ok(latest) => latest,
                Err(e) => {
                    tracing::warn!(source = %self.name, error = %e, "cdc: cannot read control_requests; keeps its capture");
                    continue;
                }
            };
            if !latest.is_new() {
                continue;
            }
            match capture(self.changes.store(), &self.name, cdc).await {
                Ok(next) => {
                    self.changes.acted(latest);
                    if !next.same_as(current) {
                        return next;
                    }
                }
                // Refused: acted on (it applies, is refused, at the next start).
                Err(CdcError::Setup(e)) => {
                    self.changes.acted(latest);
                    tracing::warn!(source = %self.name, error = %e, tables = %current.tables.join(","),
                        "cdc: the control plane's change is refused; keeps capturing its tables");
                }
                // Not read: tried again at the next poll.
                Err(e) => {
                    tracing::warn!(source = %self.name, error = %e, "cdc: cannot read the control plane; keeps its capture")
                }
            }
        }
    }
}

impl Capture {
    /// Whether `other` reads the same server as the same user and the
    /// same tables, with the same column rules.
    pub fn same_as(&self, other: &Capture) -> bool {
        let s = (
            &self.source.db_host,
            self.source.db_port,
            &self.source.db_user,
        );
        let o = (
            &other.source.db_host,
            other.source.db_port,
            &other.source.db_user,
        );
        s == o && self.tables == other.tables && self.redact == other.redact
    }
}

/// The URL of `source`'s row: host, port and user from the row, the
/// password (and options) from `secret`, the process's own source URL
/// (`field` names where it came from, for errors).
pub fn source_url(
    source: &Source,
    secret: &SecretString,
    field: &str,
) -> Result<SecretString, CdcError> {
    let mut url = url::Url::parse(secret.expose_secret())
        .map_err(|e| CdcError::Setup(format!("{field}: not a mysql:// URL: {e}")))?;
    let port = u16::try_from(source.db_port).map_err(|_| {
        CdcError::Setup(format!(
            "cdc_sources `{}`: db_port = {} is not a port (1-65535)",
            source.name, source.db_port
        ))
    })?;
    url.set_host(Some(&source.db_host)).map_err(|e| {
        CdcError::Setup(format!(
            "cdc_sources `{}`: db_host = {:?}: {e}",
            source.name, source.db_host
        ))
    })?;
    // Cannot fail for a URL with a host (set just above).
    let _ = url.set_port(Some(port));
    let _ = url.set_username(&source.db_user);
    Ok(SecretString::from(url.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Rules for a table in both the row and `cdc.redact` are refused,
    /// naming both: at start, and (through [`Watch::changed`], which logs it
    /// and keeps the current capture) when a row changes while cdc runs.
    #[tokio::test]
    async fn a_rows_rules_for_a_table_cdc_redact_names_too_are_refused() {
        let (_dir, db) = crate::db::sqlite_for_test().await;
        let store = Store::new(db, crate::subscriptions::store::Origin::Cli);
        let mut cdc = crate::config::Settings::default().cdc;
        let rules: std::collections::BTreeMap<String, crate::masking::ColumnRules> =
            serde_json::from_value(serde_json::json!({"shop.t": {"hash": ["mobile"]}})).unwrap();
        store
            .add_source(&crate::subscriptions::model::NewSource {
                name: "shop".into(),
                db_host: "db".into(),
                db_user: "repl".into(),
                redact: Some(rules.clone()),
                ..Default::default()
            })
            .await
            .unwrap();
        store
            .add_event(
                &crate::subscriptions::model::NewEvent {
                    routing_key: "shop.t.insert".into(),
                    topic: Some(cdc.topic_of("shop.t")),
                    source: Some("shop".into()),
                    ..Default::default()
                },
                "order.events.v1",
            )
            .await
            .unwrap();
        let captured = capture(&store, "shop", &cdc).await.unwrap();
        assert_eq!(captured.source.redact, rules);
        cdc.redact = rules;
        let e = capture(&store, "shop", &cdc).await.unwrap_err().to_string();
        assert!(
            e.contains("cdc.redact and the redact of cdc_sources `shop` both name shop.t"),
            "{e}"
        );
    }

    /// An event definition's rules are its table's; definitions of one
    /// table must agree, and a table with rules on the row or in
    /// `cdc.redact` takes none from a definition.
    #[tokio::test]
    async fn event_definitions_rules_join_the_capture_and_disagreements_are_refused() {
        use crate::subscriptions::model::{EventPatch, NewEvent, NewSource, SourcePatch};
        let (_dir, db) = crate::db::sqlite_for_test().await;
        let store = Store::new(db, crate::subscriptions::store::Origin::Cli);
        let cdc = crate::config::Settings::default().cdc;
        let rules =
            |json: serde_json::Value| -> ColumnRules { serde_json::from_value(json).unwrap() };
        let new_source = NewSource {
            name: "shop".into(),
            db_host: "db".into(),
            db_user: "repl".into(),
            ..Default::default()
        };
        store.add_source(&new_source).await.unwrap();
        for (change, redact) in [
            (
                "insert",
                Some(rules(serde_json::json!({"hash": ["mobile"]}))),
            ),
            ("update", None),
        ] {
            let event = NewEvent {
                routing_key: format!("shop.t.{change}"),
                topic: Some(cdc.topic_of("shop.t")),
                source: Some("shop".into()),
                redact,
                ..Default::default()
            };
            store.add_event(&event, "order.events.v1").await.unwrap();
        }
        let captured = capture(&store, "shop", &cdc).await.unwrap();
        assert_eq!(captured.redact["shop.t"].hash, ["mobile"]);
        assert!(captured.source.redact.is_empty());
        let patch = |redact| EventPatch {
            redact: Some(redact),
            ..Default::default()
        };
        store
            .update_event(
                "shop.t.update",
                &patch(rules(serde_json::json!({"mask": ["mobile"]}))),
            )
            .await
            .unwrap();
        let e = capture(&store, "shop", &cdc).await.unwrap_err().to_string();
        assert!(
            e.contains("`shop.t.insert` and `shop.t.update` give shop.t different column rules"),
            "{e}"
        );
        store
            .update_event("shop.t.update", &patch(ColumnRules::default()))
            .await
            .unwrap();
        assert_eq!(
            capture(&store, "shop", &cdc).await.unwrap().redact,
            captured.redact
        );
        let on_row = SourcePatch {
            redact: Some(
                serde_json::from_value(serde_json::json!({"shop.t": {"drop": ["note"]}})).unwrap(),
            ),
            ..Default::default()
        };
        store.update_source("shop", &on_row).await.unwrap();
        let e = capture(&store, "shop", &cdc).await.unwrap_err().to_string();
        assert!(
            e.contains("the redact of cdc_sources `shop` and event definition `shop.t.insert` both give shop.t column rules"),
            "{e}"
        );
        // The store refuses rules an event cannot have, naming the field.
        for (key, redact) in [
            ("order.created", serde_json::json!({"hash": ["mobile"]})),
            (
                "shop.u.insert",
                serde_json::json!({"hash": ["a"], "drop": ["a"]}),
            ),
        ] {
            let event = NewEvent {
                routing_key: key.into(),
                redact: Some(rules(redact)),
                ..Default::default()
            };
            let e = store
                .add_event(&event, "order.events.v1")
                .await
                .unwrap_err();
            assert!(
                matches!(&e, SubsError::Invalid(i) if i.field == "redact"),
                "{key}: {e}"
            );
        }
    }

    fn row(host: &str, port: i32, user: &str) -> Source {
        Source {
            id: 1,
            name: "order_db".into(),
            db_host: host.into(),
            db_port: port,
            db_user: user.into(),
            enabled: true,
            description: String::new(),
            redact: Default::default(),
            created_ms: 0,
            updated_ms: 0,
        }
    }

    #[test]
    fn the_row_gives_host_port_user_and_the_secret_the_password() {
        let secret = SecretString::from("mysql://other:s3cret@127.0.0.1:3306/orderpipe");
        let url = source_url(&row("db-1.internal", 3307, "repl"), &secret, "cdc.source").unwrap();
        assert_eq!(
            url.expose_secret(),
            "mysql://repl:s3cret@db-1.internal:3307/orderpipe"
        );
        let err = source_url(&row("h", 70000, "repl"), &secret, "cdc.source").unwrap_err();
        assert!(err.to_string().contains("db_port = 70000"), "{err}");
        let err = source_url(
            &row("h", 1, "u"),
            &SecretString::from("nope"),
            "database.url",
        )
        .unwrap_err();
        assert!(
            err.to_string()
                .starts_with("database.url: not a mysql:// URL"),
            "{err}"
        );
    }
}
