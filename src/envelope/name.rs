//! Event names: `{domain}.{resource}.{action}` (seed 000).
//!
//! Lower case, dot-separated, two to four segments. The last segment says
//! what kind of message it is: past tense for an event that happened
//! (`order.payment.succeeded`), a verb for a command (`notification.email.send`).
//! Names that describe the technology instead of the business
//! (`kafka.send`, `db.insert`) are refused.

use std::fmt;

use serde::{Serialize, Serializer};

/// Segments that name a technology, not a business concept.
const TECHNICAL_SEGMENTS: &[&str] = &[
    "kafka", "db", "database", "mysql", "mariadb", "sql", "redis", "mq", "rabbitmq", "queue",
    "topic", "http", "rpc", "insert", "select", "message", "msg",
];

/// Past-tense actions that do not end in `-ed`.
const IRREGULAR_PAST: &[&str] = &[
    "paid", "sent", "held", "built", "made", "done", "lost", "won", "set", "reset", "put", "read",
    "sold", "bought", "found", "given", "taken", "written", "begun", "run", "split",
];

/// Command verbs accepted as the action of a command message.
const COMMAND_VERBS: &[&str] = &[
    "send", "cancel", "ship", "refund", "reserve", "release", "notify", "create", "update",
    "delete", "pay", "capture", "retry", "sync", "close", "open", "confirm", "approve", "reject",
];

/// Whether a name describes something that happened or something to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum EventKind {
    /// Past tense: `order.created`.
    Event,
    /// Verb: `notification.email.send`.
    Command,
}

/// Why an event name was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("`{name}` is not a valid event name: {reason}")]
pub struct EventNameError {
    name: String,
    reason: String,
}

/// A validated event name.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct EventName {
    name: String,
    kind: EventKind,
}

impl Serialize for EventName {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.name)
    }
}

impl EventName {
    /// Parses and validates a name.
    pub fn parse(name: &str) -> Result<Self, EventNameError> {
        let fail = |reason: &str| EventNameError {
            name: name.to_string(),
            reason: reason.to_string(),
        };
        let segments: Vec<&str> = name.split('.').collect();
        if !(2..=4).contains(&segments.len()) {
            return Err(fail(
                "expected {domain}.{resource}.{action}: 2 to 4 lower-case segments separated by dots",
            ));
        }
        for segment in &segments {
            let valid = segment
                .chars()
                .next()
                .is_some_and(|c| c.is_ascii_lowercase())
                && segment
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
            if !valid {
                return Err(fail(
                    "each segment must start with a-z and hold only a-z, 0-9 and _ (lower case)",
                ));
            }
            if TECHNICAL_SEGMENTS.contains(segment) {
                return Err(fail(&format!(
                    "`{segment}` names a technology; event names express business meaning (e.g. order.created)"
                )));
            }
        }
        let action = segments[segments.len() - 1];
        let kind = if action.ends_with("ed") || IRREGULAR_PAST.contains(&action) {
            EventKind::Event
        } else if COMMAND_VERBS.contains(&action) {
            EventKind::Command
        } else {
            return Err(fail(&format!(
                "action `{action}` is neither past tense (an event, e.g. created) nor a known command verb (e.g. send)"
            )));
        };
        Ok(Self {
            name: name.to_string(),
            kind,
        })
    }

    /// Seed 003's routing key of a row change, `<db>.<table>.<insert|update|delete>`:
    /// database and table names are the source's, not house event names, so
    /// only the shape is checked (three non-empty segments, the last one of
    /// insert, update, delete). It counts as an event (a change that happened).
    pub fn routing_key(name: &str) -> Result<Self, EventNameError> {
        let segments: Vec<&str> = name.split('.').collect();
        let valid = segments.len() == 3
            && segments.iter().all(|s| !s.is_empty())
            && matches!(segments[2], "insert" | "update" | "delete");
        if !valid {
            return Err(EventNameError {
                name: name.to_string(),
                reason: "a routing key is <db>.<table>.<insert|update|delete>".into(),
            });
        }
        Ok(Self {
            name: name.to_string(),
            kind: EventKind::Event,
        })
    }

    /// The name as written.
    pub fn as_str(&self) -> &str {
        &self.name
    }

    /// Event (past tense) or command (verb).
    pub fn kind(&self) -> EventKind {
        self.kind
    }
}

impl fmt::Display for EventName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_spec_examples() {
        for name in [
            "user.created",
            "user.profile.updated",
            "order.created",
            "order.payment.succeeded",
            "order.payment.failed",
            "inventory.stock.decreased",
        ] {
            assert_eq!(
                EventName::parse(name).unwrap().kind(),
                EventKind::Event,
                "{name}"
            );
        }
        for name in ["notification.email.send", "order.cancel"] {
            assert_eq!(
                EventName::parse(name).unwrap().kind(),
                EventKind::Command,
                "{name}"
            );
        }
    }

    #[test]
    fn refuses_technical_and_malformed_names() {
        for (name, needle) in [
            ("kafka.send", "technology"),
            ("db.insert", "technology"),
            ("Order.Created", "lower case"),
            ("order", "2 to 4"),
            ("order..created", "segment"),
            ("order.creating", "past tense"),
            ("a.b.c.d.created", "2 to 4"),
        ] {
            let err = EventName::parse(name).unwrap_err().to_string();
            assert!(err.contains(needle), "{name}: {err}");
        }
    }
}
