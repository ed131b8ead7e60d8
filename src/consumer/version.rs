//! `event_version` at the consumer: which major versions a group understands.
//!
//! Seed 000: an incompatible change is a new version. A version reads
//! `MAJOR.MINOR` (a bare `MAJOR` or a `MAJOR.MINOR.PATCH` is read too).
//! Minor versions are backward compatible by rule (fields only added, with
//! defaults), so only the major decides. Each handler declares, per event
//! name, the majors it understands ([`Handler::supported_majors`]); a record
//! whose major one of the group's handlers does not declare goes to the
//! dead-letter topic as [`UNSUPPORTED_VERSION`] before any effect runs, so an
//! incompatible producer is caught, never half-applied. An unreadable
//! version gets the same class: both mean "this group cannot tell what the
//! producer meant", and both are fixed the same way (fix or upgrade a side,
//! then replay).

use std::fmt;
use std::sync::Arc;

use super::handler::Handler;
use crate::envelope::Envelope;

/// Error class of a record whose `event_version` the group does not understand or cannot read.
pub const UNSUPPORTED_VERSION: &str = "unsupported_version";

/// Majors understood by handlers that keep the default (it lives with the
/// [`Handler`] trait, whose default it is; also reachable here).
pub use super::handler::MAJOR_1;

/// A parsed `event_version`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct EventVersion {
    /// Incompatible changes bump it.
    pub major: u32,
    /// Compatible changes (optional fields added) bump it; 0 when absent.
    pub minor: u32,
}

impl EventVersion {
    /// Reads `MAJOR`, `MAJOR.MINOR` or `MAJOR.MINOR.PATCH` (decimal digits only).
    pub fn parse(text: &str) -> Result<Self, String> {
        let refuse =
            |why: &str| format!("event_version `{text}` is not MAJOR.MINOR (e.g. 1.0): {why}");
        let parts: Vec<&str> = text.split('.').collect();
        if parts.len() > 3 {
            return Err(refuse("more than three parts"));
        }
        let mut numbers = [0u32; 3];
        for (slot, part) in numbers.iter_mut().zip(&parts) {
            if part.is_empty() || !part.bytes().all(|b| b.is_ascii_digit()) {
                return Err(refuse(&format!("`{part}` is not a decimal number")));
            }
            *slot = part
                .parse()
                .map_err(|_| refuse(&format!("`{part}` is too large")))?;
        }
        Ok(Self {
            major: numbers[0],
            minor: numbers[1],
        })
    }
}

impl fmt::Display for EventVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.major, self.minor)
    }
}

/// Whether the group's `handlers` understand the envelope's version: Ok, or
/// the reason to dead-letter it as [`UNSUPPORTED_VERSION`]. Handlers that
/// declare no major for the event name do not act on it and do not vote;
/// when none acts on it, its version does not matter.
pub fn check(envelope: &Envelope, handlers: &[Arc<dyn Handler>]) -> Result<(), String> {
    let name = &envelope.event_name;
    let mut acting = handlers
        .iter()
        .map(|h| (h.name(), h.supported_majors(name)))
        .filter(|(_, m)| !m.is_empty())
        .peekable();
    if acting.peek().is_none() {
        return Ok(());
    }
    let version = EventVersion::parse(&envelope.event_version)?;
    for (handler, majors) in acting {
        if !majors.contains(&version.major) {
            let known: Vec<String> = majors.iter().map(u32::to_string).collect();
            return Err(format!(
                "`{name}` event_version `{}` has major {}; handler `{handler}` of this group understands major {} of it. \
                 An incompatible producer: deploy a consumer that declares major {} (then replay), or fix the producer",
                envelope.event_version,
                version.major,
                known.join(", "),
                version.major
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use async_trait::async_trait;

    use super::*;
    use crate::consumer::handler::{Effect, HandlerError};
    use crate::consumer::handlers::{Inventory, Logistics, Notification};
    use crate::db::Tx;
    use crate::envelope::{EventData, EventName};

    #[test]
    fn parses_major_minor_and_the_short_and_long_forms() {
        assert_eq!(
            EventVersion::parse("1.0"),
            Ok(EventVersion { major: 1, minor: 0 })
        );
        assert_eq!(
            EventVersion::parse("1.7"),
            Ok(EventVersion { major: 1, minor: 7 })
        );
        assert_eq!(
            EventVersion::parse("99.0"),
            Ok(EventVersion {
                major: 99,
                minor: 0
            })
        );
        assert_eq!(
            EventVersion::parse("2"),
            Ok(EventVersion { major: 2, minor: 0 })
        );
        assert_eq!(
            EventVersion::parse("1.2.3"),
            Ok(EventVersion { major: 1, minor: 2 })
        );
        assert_eq!(EventVersion::parse("10.20").unwrap().to_string(), "10.20");
    }

    #[test]
    fn unreadable_versions_are_refused_with_the_expected_form() {
        for bad in [
            "",
            "v1",
            "1.",
            ".1",
            "1.x",
            "1.0.0.0",
            "1 .0",
            "-1.0",
            "1.0-beta",
            "99999999999.0",
        ] {
            let err = EventVersion::parse(bad).unwrap_err();
            assert!(
                err.contains("MAJOR.MINOR") && err.contains(&format!("`{bad}`")),
                "{bad}: {err}"
            );
        }
    }

    fn envelope(version: &str, data: EventData) -> Envelope {
        let mut e = Envelope::new("test", data);
        e.event_version = version.to_string();
        e
    }

    fn shipped() -> EventData {
        EventData::sample_lifecycle(5)
            .into_iter()
            .find(|d| matches!(d, EventData::Shipped(_)))
            .unwrap()
    }

    #[test]
    fn built_in_handlers_take_major_1_of_what_they_handle() {
        let all: Vec<Arc<dyn Handler>> = vec![Arc::new(Inventory), Arc::new(Notification)];
        assert!(check(&envelope("1.0", EventData::sample_created(1)), &all).is_ok());
        assert!(check(&envelope("1.7", EventData::sample_created(1)), &all).is_ok());
        let err = check(&envelope("99.0", EventData::sample_created(1)), &all).unwrap_err();
        assert!(
            err.contains("major 99")
                && err.contains("`inventory`")
                && err.contains("major 1 of it"),
            "{err}"
        );
        assert!(
            check(&envelope("one", EventData::sample_created(1)), &all)
                .unwrap_err()
                .contains("MAJOR.MINOR")
        );
        // Logistics does not act on order.created: its version is not its business.
        let logistics: Vec<Arc<dyn Handler>> = vec![Arc::new(Logistics)];
        assert!(check(&envelope("99.0", EventData::sample_created(1)), &logistics).is_ok());
        assert!(check(&envelope("junk", EventData::sample_created(1)), &logistics).is_ok());
        assert!(
            check(&envelope("2.0", shipped()), &logistics)
                .unwrap_err()
                .contains("`logistics`")
        );
    }

    /// A user handler that has learnt major 2 of `order.created`.
    struct V2Aware;

    #[async_trait]
    impl Handler for V2Aware {
        fn name(&self) -> &'static str {
            "v2-aware"
        }
        fn supported_majors(&self, event_name: &EventName) -> &[u32] {
            match event_name.as_str() {
                "order.created" => &[1, 2],
                _ => MAJOR_1,
            }
        }
        async fn apply(&self, _: &mut Tx, _: &Envelope) -> Result<Effect, HandlerError> {
            Ok(Effect::Ignored)
        }
    }

    #[test]
    fn every_acting_handler_must_understand_the_major() {
        let alone: Vec<Arc<dyn Handler>> = vec![Arc::new(V2Aware)];
        assert!(check(&envelope("2.3", EventData::sample_created(1)), &alone).is_ok());
        assert!(check(&envelope("2.0", shipped()), &alone).is_err());
        // Beside a handler that knows only major 1, a v2 record is refused whole.
        let mixed: Vec<Arc<dyn Handler>> = vec![Arc::new(V2Aware), Arc::new(Notification)];
        assert!(
            check(&envelope("2.0", EventData::sample_created(1)), &mixed)
                .unwrap_err()
                .contains("`notification`")
        );
    }
}
