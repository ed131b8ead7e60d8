//! The `chaos` handler: fault injection for the demo, the tests and the
//! benchmarks, configured by the `[chaos]` section (or `ORDERPIPE_CHAOS__*`).
//!
//! Only a `harness` build has it: `--handler chaos` is unknown elsewhere,
//! and [`crate::config::Settings::validate`] refuses a `[chaos]` section.
//! Config keeps the section as raw data ([`Settings::chaos`]); this module
//! gives it its type, its defaults and its checks.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use serde::Deserialize;

use crate::config::Settings;
use crate::consumer::handler::{Effect, Handler, HandlerError};
use crate::consumer::handlers;
use crate::db::Tx;
use crate::envelope::Envelope;

/// The handler's name in `--handler`.
pub const NAME: &str = "chaos";

/// The `[chaos]` section. Every field is optional; the defaults inject nothing.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct ChaosSettings {
    /// Orders whose events fail transiently.
    pub transient_orders: Vec<i64>,
    /// How many executions of each such event fail before it succeeds (default 2).
    pub transient_failures: u32,
    /// Only these event names fail transiently (empty: every event).
    pub transient_events: Vec<String>,
    /// Orders whose events always fail (fatal).
    pub permanent_orders: Vec<i64>,
    /// Every event fails (fatal).
    pub permanent_all: bool,
    /// Fraction of all events (0.0 to 1.0, picked by event id) that fail
    /// transiently like `transient_orders`.
    pub transient_rate: f64,
    /// Not a handler rule: `consume` aborts the process once a batch is
    /// committed and its failed records are handed to the producer, before
    /// their acknowledgement (see `ConsumeOptions::crash_before_forward_ack`).
    pub crash_before_forward_ack: bool,
    /// Not a handler rule: `consume` appends each applied event's id and a
    /// stamp taken right after its batch's commit to this file
    /// (`harness::latency`, `dev/bench-latency.sh`).
    pub commit_stamps: Option<std::path::PathBuf>,
}

impl Default for ChaosSettings {
    fn default() -> Self {
        Self {
            transient_orders: Vec::new(),
            transient_failures: 2,
            transient_events: Vec::new(),
            permanent_orders: Vec::new(),
            permanent_all: false,
            transient_rate: 0.0,
            crash_before_forward_ack: false,
            commit_stamps: None,
        }
    }
}

impl ChaosSettings {
    /// The `[chaos]` section of `settings` (defaults when absent), checked.
    pub fn from_settings(settings: &Settings) -> Result<Self, String> {
        let chaos: Self = match &settings.chaos {
            Some(section) => section.deserialize().map_err(|e| format!("chaos: {e}"))?,
            None => Self::default(),
        };
        if !(0.0..=1.0).contains(&chaos.transient_rate) {
            return Err(format!(
                "chaos.transient_rate must be between 0.0 and 1.0, got {}",
                chaos.transient_rate
            ));
        }
        Ok(chaos)
    }
}

/// The handler called `name`: `chaos` (with the `[chaos]` section of
/// `settings`) or one of [`handlers::BUILT_IN`].
pub fn handler_by_name(name: &str, settings: &Settings) -> Result<Arc<dyn Handler>, String> {
    if name == NAME {
        return Ok(Arc::new(Chaos::new(ChaosSettings::from_settings(
            settings,
        )?)));
    }
    handlers::by_name(name).ok_or_else(|| handlers::unknown(name, &[NAME]))
}

/// Whether `event_id` falls in the first `rate` of the id space: a stable
/// pick (the same events in every process and every run of the same data).
fn picked(event_id: uuid::Uuid, rate: f64) -> bool {
    rate > 0.0 && (event_id.as_u128() % 1_000_000) < (rate * 1_000_000.0) as u128
}

/// Fails the configured orders' events (or a fraction of all events),
/// transiently (the first N executions of each event, counted in this
/// process) or permanently. Writes nothing.
pub struct Chaos {
    settings: ChaosSettings,
    executions: Mutex<HashMap<uuid::Uuid, u32>>,
}

impl Chaos {
    /// A chaos handler with these rules.
    pub fn new(settings: ChaosSettings) -> Self {
        Self {
            settings,
            executions: Mutex::new(HashMap::new()),
        }
    }
}

#[async_trait]
impl Handler for Chaos {
    fn name(&self) -> &'static str {
        NAME
    }

    async fn apply(&self, _: &mut Tx, envelope: &Envelope) -> Result<Effect, HandlerError> {
        let order = envelope.data.order_id();
        if self.settings.permanent_all || self.settings.permanent_orders.contains(&order) {
            return Err(HandlerError::Fatal(format!(
                "chaos: order {order} is configured to fail permanently"
            )));
        }
        let chosen = self.settings.transient_orders.contains(&order)
            || picked(envelope.event_id, self.settings.transient_rate);
        let events = &self.settings.transient_events;
        if chosen && (events.is_empty() || events.iter().any(|e| e == envelope.event_name.as_str()))
        {
            let mut executions = self.executions.lock().expect("chaos lock");
            let n = executions.entry(envelope.event_id).or_insert(0);
            *n += 1;
            if *n <= self.settings.transient_failures {
                return Err(HandlerError::Retryable(format!(
                    "chaos: transient failure {n} of {} for order {order}",
                    self.settings.transient_failures
                )));
            }
        }
        Ok(Effect::Ignored)
    }
}

#[cfg(test)]
// figment::Jail's closures return figment::Error, whose size is figment's choice.
#[allow(clippy::result_large_err)]
mod tests {
    use super::*;

    #[test]
    fn the_section_is_typed_checked_and_defaults_inject_nothing() {
        let mut settings = Settings::default();
        assert_eq!(
            ChaosSettings::from_settings(&settings).unwrap(),
            ChaosSettings::default()
        );
        let section = |json: serde_json::Value| {
            figment::Figment::from(figment::providers::Serialized::defaults(json))
                .extract::<figment::value::Value>()
                .unwrap()
        };
        settings.chaos = Some(section(serde_json::json!({"transient_rate": 1.5})));
        let err = ChaosSettings::from_settings(&settings).unwrap_err();
        assert!(
            err.contains("chaos.transient_rate must be between 0.0 and 1.0, got 1.5"),
            "{err}"
        );
        settings.chaos = Some(section(
            serde_json::json!({"transient_orders": [7], "permanent": true}),
        ));
        let err = ChaosSettings::from_settings(&settings).unwrap_err();
        assert!(
            err.starts_with("chaos: ") && err.contains("permanent"),
            "{err}"
        );
        settings.chaos = Some(section(serde_json::json!({"transient_orders": [7]})));
        let chaos = ChaosSettings::from_settings(&settings).unwrap();
        assert_eq!(
            (chaos.transient_orders, chaos.transient_failures),
            (vec![7], 2)
        );
    }

    #[test]
    fn a_file_and_the_environment_set_the_section() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.toml");
        std::fs::write(&path, "[chaos]\ntransient_orders = [3, 7]\n").unwrap();
        figment::Jail::expect_with(|jail| {
            jail.set_env("ORDERPIPE_CHAOS__TRANSIENT_FAILURES", "5");
            let chaos =
                ChaosSettings::from_settings(&Settings::load(Some(&path)).unwrap()).unwrap();
            assert_eq!(
                (chaos.transient_orders, chaos.transient_failures),
                (vec![3, 7], 5)
            );
            Ok(())
        });
    }

    #[test]
    fn handlers_resolve_with_chaos_named_among_the_built_in_ones() {
        let settings = Settings::default();
        assert_eq!(handler_by_name("chaos", &settings).unwrap().name(), "chaos");
        assert_eq!(
            handler_by_name("points", &settings).unwrap().name(),
            "points"
        );
        let err = handler_by_name("nope", &settings).err().unwrap();
        assert_eq!(
            err,
            "unknown handler `nope`; built-in handlers: inventory, payment, logistics, notification, points, chaos"
        );
    }
}
