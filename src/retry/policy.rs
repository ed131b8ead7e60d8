//! The retry schedule: how many immediate local retries, then which delays
//! in the group's retry topic before a record goes to the dead-letter topic.
//!
//! A schedule has one of two forms:
//!
//! * geometric: a named profile (`retry.profile`), optionally reshaped by
//!   `attempts`, `initial_delay_ms`, `multiplier` and `max_delay_ms`;
//! * explicit: `delays = ["5s", "30s", "5m"]` (each `<n>ms|s|m|h`).
//!
//! Profiles are data ([`PROFILES`]), named by their delays: `default`
//! (1 s to 16 s) and `10s-1m-5m` are geometric, `10s-30s-1m-5m` and
//! `5s-30s-5m` fixed lists; the older names `seed000`, `seed001` and
//! `seed003` are aliases ([`PROFILE_ALIASES`]). `jitter` (0 to 1) draws
//! each delay in `[d*(1-j), d*(1+j)]`.
//!
//! Settings come in layers, later wins: `[retry]`, then the group's
//! `[retry.groups."<group>"]`, then (for `deliver`) the subscription's
//! `retry` table. Fields layer one by one, except the form: a layer that
//! sets `delays` replaces the geometric fields below it, and a layer that
//! sets `profile` or a geometric override replaces the `delays` below it.
//! One layer setting both forms is refused, naming both fields.

use std::collections::BTreeMap;
use std::time::Duration;

use rand::Rng;
use serde::{Deserialize, Serialize};

/// A named schedule.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Profile {
    /// `attempts` delays: `initial_ms`, times `multiplier` each time, capped at `max_ms`.
    Geometric {
        /// Delayed attempts.
        attempts: u32,
        /// First delay.
        initial_ms: u64,
        /// Factor between delays.
        multiplier: f64,
        /// Cap of a delay.
        max_ms: u64,
    },
    /// A fixed list of delays (ms), one per delayed attempt.
    Fixed(&'static [u64]),
}

/// The named schedules, selectable with `retry.profile`. Each is named by
/// its delays, so a reader needs no other document to know what it does.
pub const PROFILES: [(&str, Profile); 4] = [
    // 1 s, 2 s, 4 s, 8 s, 16 s.
    (
        "default",
        Profile::Geometric {
            attempts: 5,
            initial_ms: 1_000,
            multiplier: 2.0,
            max_ms: 60_000,
        },
    ),
    // 10 s, then x6 capped at 5 min: 10 s, 1 min, 5 min.
    (
        "10s-1m-5m",
        Profile::Geometric {
            attempts: 3,
            initial_ms: 10_000,
            multiplier: 6.0,
            max_ms: 300_000,
        },
    ),
    (
        "10s-30s-1m-5m",
        Profile::Fixed(&[10_000, 30_000, 60_000, 300_000]),
    ),
    ("5s-30s-5m", Profile::Fixed(&[5_000, 30_000, 300_000])),
];

/// Older names of [`PROFILES`], still accepted: `seed000` is the house
/// message spec's schedule, `seed001` the field notes', `seed003` the CDC
/// platform's (source documents of the design, not in this repository).
pub const PROFILE_ALIASES: [(&str, &str); 3] = [
    ("seed000", "10s-1m-5m"),
    ("seed001", "10s-30s-1m-5m"),
    ("seed003", "5s-30s-5m"),
];

/// The schedule called `name`, by its name or an alias of it.
pub fn profile(name: &str) -> Option<Profile> {
    let name = PROFILE_ALIASES
        .iter()
        .find(|(alias, _)| *alias == name)
        .map_or(name, |(_, canonical)| canonical);
    PROFILES
        .iter()
        .find(|(known, _)| *known == name)
        .map(|(_, p)| *p)
}

/// The profile `retry.profile` falls back to.
pub const DEFAULT_PROFILE: &str = "default";

/// Accepted forms of one delay, for error messages.
pub const DELAY_FORMS: &str =
    "<n>ms, <n>s, <n>m or <n>h (e.g. \"500ms\", \"30s\", \"5m\", \"1h\"), from 1ms to 24h";

/// Longest delay of an explicit list: a record waiting longer blocks its
/// retry partition that long; park it in the DLQ and replay it instead.
const MAX_DELAY: Duration = Duration::from_secs(24 * 3600);

/// Most delayed attempts: retries must end in the DLQ.
const MAX_ATTEMPTS: usize = 100;

/// The accepted profile names, comma-separated, the aliases after them.
pub fn profile_names() -> String {
    let names = |list: &mut dyn Iterator<Item = &str>| list.collect::<Vec<_>>().join(", ");
    format!(
        "{} (older names: {})",
        names(&mut PROFILES.iter().map(|(name, _)| *name)),
        names(&mut PROFILE_ALIASES.iter().map(|(alias, _)| *alias)),
    )
}

/// One layer of retry settings: a group's `[retry.groups."<group>"]` or a
/// subscription's `retry` table. Unset fields leave the layer below as is.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RetryLayer {
    /// Immediate retries in the consumer before a record leaves its partition.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub local_retries: Option<u32>,
    /// A name of [`PROFILES`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub profile: Option<String>,
    /// Explicit delays, e.g. `["5s", "30s", "5m"]`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delays: Option<Vec<String>>,
    /// Each delay drawn in `[d*(1-jitter), d*(1+jitter)]`; 0 to 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub jitter: Option<f64>,
    /// Delayed attempts of a geometric profile.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attempts: Option<u32>,
    /// First delay of a geometric profile.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub initial_delay_ms: Option<u64>,
    /// Factor between delays of a geometric profile.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub multiplier: Option<f64>,
    /// Cap of a delay of a geometric profile.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_delay_ms: Option<u64>,
}

impl RetryLayer {
    /// The geometric fields this layer sets (`profile` included).
    fn geometric_fields(&self) -> Vec<&'static str> {
        [
            ("profile", self.profile.is_some()),
            ("attempts", self.attempts.is_some()),
            ("initial_delay_ms", self.initial_delay_ms.is_some()),
            ("multiplier", self.multiplier.is_some()),
            ("max_delay_ms", self.max_delay_ms.is_some()),
        ]
        .into_iter()
        .filter_map(|(name, set)| set.then_some(name))
        .collect()
    }

    /// Checks this layer on its own (delay syntax, ranges, one form);
    /// `prefix` names it in errors, e.g. `http.subscriptions[crm].retry`.
    pub fn check(&self, prefix: &str) -> Result<(), PolicyError> {
        Effective::default().apply(prefix, self)
    }
}

/// Retry settings as configured: `[retry]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RetrySettings {
    /// Immediate retries in the consumer before a record leaves its partition.
    pub local_retries: u32,
    /// A name of [`PROFILES`] (unset: `default`).
    #[serde(default)]
    pub profile: Option<String>,
    /// Explicit delays instead of a profile, e.g. `["5s", "30s", "5m"]`.
    #[serde(default)]
    pub delays: Option<Vec<String>>,
    /// Each delay drawn in `[d*(1-jitter), d*(1+jitter)]`; 0 to 1, default 0.
    #[serde(default)]
    pub jitter: Option<f64>,
    /// Overrides of the profile.
    #[serde(default)]
    pub attempts: Option<u32>,
    /// First delay.
    #[serde(default)]
    pub initial_delay_ms: Option<u64>,
    /// Factor between delays.
    #[serde(default)]
    pub multiplier: Option<f64>,
    /// Cap of a delay.
    #[serde(default)]
    pub max_delay_ms: Option<u64>,
    /// Longest error message carried in headers and the table.
    pub max_error_len: usize,
    /// Per consumer group, layered over the fields above.
    #[serde(default)]
    pub groups: BTreeMap<String, RetryLayer>,
    /// Test only (a `harness` build): every delay multiplied by this
    /// factor (0 < f <= 1), so a test observes a minutes-long schedule in seconds.
    #[serde(default)]
    pub time_scale: Option<f64>,
    /// Not read from the config: the layer `deliver` puts on top of the
    /// group's (its subscription's `retry`), with the path naming it in errors.
    #[serde(skip)]
    pub top: Option<(String, RetryLayer)>,
}

/// The resolved schedule.
#[derive(Debug, Clone, PartialEq)]
pub struct RetryPolicy {
    /// Immediate retries in place.
    pub local_retries: u32,
    /// One delay per delayed attempt; after the last one, the DLQ.
    pub delays: Vec<Duration>,
    /// Each delay is drawn in `[d*(1-jitter), d*(1+jitter)]`.
    pub jitter: f64,
    /// Longest error message kept.
    pub max_error_len: usize,
}

/// A retry setting that cannot be used; `field` is its full path.
#[derive(Debug, thiserror::Error)]
#[error("{field}: {reason}")]
pub struct PolicyError {
    field: String,
    reason: String,
}

impl PolicyError {
    fn new(field: impl Into<String>, reason: impl Into<String>) -> Self {
        Self {
            field: field.into(),
            reason: reason.into(),
        }
    }
}

/// Parses one delay: `<n>ms`, `<n>s`, `<n>m` or `<n>h`, 1 ms to 24 h.
pub fn parse_delay(text: &str) -> Result<Duration, String> {
    let refuse = || format!("`{text}` is not a delay; accepted forms: {DELAY_FORMS}");
    let digits = text.bytes().take_while(u8::is_ascii_digit).count();
    let (number, unit) = text.split_at(digits);
    let n: u64 = number.parse().map_err(|_| refuse())?;
    let ms = match unit {
        "ms" => Some(n),
        "s" => n.checked_mul(1_000),
        "m" => n.checked_mul(60_000),
        "h" => n.checked_mul(3_600_000),
        _ => None,
    }
    .ok_or_else(refuse)?;
    let delay = Duration::from_millis(ms);
    if delay.is_zero() || delay > MAX_DELAY {
        return Err(refuse());
    }
    Ok(delay)
}

/// A value with the path of the field that set it.
#[derive(Debug, Clone)]
struct Sourced<T> {
    value: T,
    field: String,
}

/// The layers folded so far.
#[derive(Debug, Default)]
struct Effective {
    local_retries: Option<u32>,
    jitter: Option<f64>,
    delays: Option<Vec<Duration>>,
    profile: Option<Sourced<String>>,
    attempts: Option<Sourced<u32>>,
    initial_delay_ms: Option<Sourced<u64>>,
    multiplier: Option<Sourced<f64>>,
    max_delay_ms: Option<Sourced<u64>>,
}

impl Effective {
    /// Lays `layer` (named `prefix` in errors) over what is there.
    fn apply(&mut self, prefix: &str, layer: &RetryLayer) -> Result<(), PolicyError> {
        let field = |name: &str| format!("{prefix}.{name}");
        if let Some(delays) = &layer.delays {
            if let Some(other) = layer.geometric_fields().first() {
                return Err(PolicyError::new(
                    format!("{} and {}", field("delays"), field(other)),
                    "both set: an explicit list of delays or a profile with its geometric overrides, not both",
                ));
            }
            if delays.len() > MAX_ATTEMPTS {
                return Err(PolicyError::new(
                    field("delays"),
                    format!(
                        "{} delays; at most {MAX_ATTEMPTS}: retries must end in the DLQ",
                        delays.len()
                    ),
                ));
            }
            let parsed = delays
                .iter()
                .enumerate()
                .map(|(i, text)| {
                    parse_delay(text).map_err(|reason| {
                        PolicyError::new(format!("{}[{i}]", field("delays")), reason)
                    })
                })
                .collect::<Result<Vec<_>, _>>()?;
            *self = Self {
                local_retries: self.local_retries,
                jitter: self.jitter,
                delays: Some(parsed),
                ..Self::default()
            };
        } else if !layer.geometric_fields().is_empty() {
            self.delays = None;
            if let Some(name) = &layer.profile {
                if profile(name).is_none() {
                    return Err(PolicyError::new(
                        field("profile"),
                        format!("`{name}` is not a profile; accepted: {}", profile_names()),
                    ));
                }
                self.profile = Some(Sourced {
                    value: name.clone(),
                    field: field("profile"),
                });
            }
            if let Some(attempts) = layer.attempts {
                if attempts as usize > MAX_ATTEMPTS {
                    return Err(PolicyError::new(
                        field("attempts"),
                        format!(
                            "{attempts} is more than {MAX_ATTEMPTS}; retries must end in the DLQ"
                        ),
                    ));
                }
                self.attempts = Some(Sourced {
                    value: attempts,
                    field: field("attempts"),
                });
            }
            if let Some(multiplier) = layer.multiplier {
                if !(1.0..=100.0).contains(&multiplier) {
                    return Err(PolicyError::new(
                        field("multiplier"),
                        format!("{multiplier} is outside 1.0 to 100.0"),
                    ));
                }
                self.multiplier = Some(Sourced {
                    value: multiplier,
                    field: field("multiplier"),
                });
            }
            if let Some(ms) = layer.initial_delay_ms {
                self.initial_delay_ms = Some(Sourced {
                    value: ms,
                    field: field("initial_delay_ms"),
                });
            }
            if let Some(ms) = layer.max_delay_ms {
                self.max_delay_ms = Some(Sourced {
                    value: ms,
                    field: field("max_delay_ms"),
                });
            }
        }
        if let Some(jitter) = layer.jitter {
            if !(0.0..=1.0).contains(&jitter) {
                return Err(PolicyError::new(
                    field("jitter"),
                    format!("{jitter} is outside 0 to 1 (a fraction of each delay, e.g. 0.1)"),
                ));
            }
            self.jitter = Some(jitter);
        }
        if let Some(n) = layer.local_retries {
            self.local_retries = Some(n);
        }
        Ok(())
    }

    /// The delays of the folded layers.
    fn delays(&self) -> Result<Vec<Duration>, PolicyError> {
        if let Some(delays) = &self.delays {
            return Ok(delays.clone());
        }
        let name = self
            .profile
            .as_ref()
            .map_or(DEFAULT_PROFILE, |p| p.value.as_str());
        match profile(name).expect("profile names are checked") {
            Profile::Geometric {
                attempts,
                initial_ms,
                multiplier,
                max_ms,
            } => {
                let attempts = self.attempts.as_ref().map_or(attempts, |a| a.value);
                let initial = self
                    .initial_delay_ms
                    .as_ref()
                    .map_or(initial_ms, |a| a.value);
                let multiplier = self.multiplier.as_ref().map_or(multiplier, |a| a.value);
                let max = self.max_delay_ms.as_ref().map_or(max_ms, |a| a.value);
                let mut delay = initial as f64;
                let mut delays = Vec::with_capacity(attempts as usize);
                for _ in 0..attempts {
                    delays.push(Duration::from_millis((delay as u64).min(max)));
                    delay *= multiplier;
                }
                Ok(delays)
            }
            Profile::Fixed(ms) => {
                let overrides = [
                    self.attempts.as_ref().map(|s| &s.field),
                    self.initial_delay_ms.as_ref().map(|s| &s.field),
                    self.multiplier.as_ref().map(|s| &s.field),
                    self.max_delay_ms.as_ref().map(|s| &s.field),
                ];
                if let Some(field) = overrides.into_iter().flatten().next() {
                    let geometric: Vec<&str> = PROFILES
                        .iter()
                        .filter(|(_, p)| matches!(p, Profile::Geometric { .. }))
                        .map(|(n, _)| *n)
                        .collect();
                    return Err(PolicyError::new(
                        field.clone(),
                        format!(
                            "profile {name} is a fixed list of delays; attempts, initial_delay_ms, multiplier and \
                             max_delay_ms reshape only the geometric profiles ({}): set delays instead",
                            geometric.join(", ")
                        ),
                    ));
                }
                Ok(ms.iter().map(|&ms| Duration::from_millis(ms)).collect())
            }
        }
    }
}

impl RetrySettings {
    /// `[retry]` itself as a layer.
    fn base(&self) -> RetryLayer {
        RetryLayer {
            local_retries: Some(self.local_retries),
            profile: self.profile.clone(),
            delays: self.delays.clone(),
            jitter: self.jitter,
            attempts: self.attempts,
            initial_delay_ms: self.initial_delay_ms,
            multiplier: self.multiplier,
            max_delay_ms: self.max_delay_ms,
        }
    }

    /// The schedule of `group`: `[retry]`, then `[retry.groups."<group>"]`,
    /// then [`RetrySettings::top`].
    pub fn policy_for(&self, group: &str) -> Result<RetryPolicy, PolicyError> {
        self.policy_with(
            group,
            self.top
                .as_ref()
                .map(|(prefix, layer)| (prefix.as_str(), layer)),
        )
    }

    /// [`RetrySettings::policy_for`] with one more layer on top (a
    /// subscription's `retry`), named `top.0` in errors.
    pub fn policy_with(
        &self,
        group: &str,
        top: Option<(&str, &RetryLayer)>,
    ) -> Result<RetryPolicy, PolicyError> {
        let mut effective = Effective::default();
        effective.apply("retry", &self.base())?;
        if let Some(layer) = self.groups.get(group) {
            effective.apply(&format!("retry.groups.\"{group}\""), layer)?;
        }
        if let Some((prefix, layer)) = top {
            effective.apply(prefix, layer)?;
        }
        let mut delays = effective.delays()?;
        if let Some(scale) = self.time_scale()? {
            delays.iter_mut().for_each(|d| *d = d.mul_f64(scale));
        }
        Ok(RetryPolicy {
            local_retries: effective
                .local_retries
                .unwrap_or(self.local_retries)
                .min(20),
            delays,
            jitter: effective.jitter.unwrap_or(0.0),
            max_error_len: self.max_error_len.max(64),
        })
    }

    /// Resolves `[retry]` and every `[retry.groups."<group>"]`: the first
    /// unusable value, by its field.
    pub fn validate(&self) -> Result<(), PolicyError> {
        self.policy_for("")?;
        self.groups
            .keys()
            .try_for_each(|group| self.policy_for(group).map(drop))
    }

    /// `time_scale`, refused outside a `harness` build and out of (0, 1].
    fn time_scale(&self) -> Result<Option<f64>, PolicyError> {
        let Some(scale) = self.time_scale else {
            return Ok(None);
        };
        if !cfg!(feature = "harness") {
            return Err(PolicyError::new(
                "retry.time_scale",
                "a test setting of a build with the cargo feature `harness` (make test); remove it from the config",
            ));
        }
        if !(scale > 0.0 && scale <= 1.0) {
            return Err(PolicyError::new(
                "retry.time_scale",
                format!("{scale} is outside (0, 1]"),
            ));
        }
        Ok(Some(scale))
    }
}

impl RetryPolicy {
    /// Resolves `[retry]` alone (no group layer).
    pub fn from_settings(s: &RetrySettings) -> Result<Self, PolicyError> {
        s.policy_for("")
    }

    /// The configured delay before the delayed attempt after `attempt`
    /// (0 = the main topic), or None for the DLQ.
    pub fn next_delay(&self, attempt: u32) -> Option<Duration> {
        self.delays.get(attempt as usize).copied()
    }

    /// The delay of delayed attempt `attempt` when the downstream asked to
    /// wait `hint` (an HTTP `Retry-After`): the hint in place of the
    /// schedule's delay (no jitter: the downstream named the moment), never
    /// longer than the schedule's longest delay (a downstream cannot stall
    /// a record past what the group allows) and never shorter than its
    /// shortest (a `Retry-After: 0` does not spend every attempt at once).
    /// None past the last attempt, like [`RetryPolicy::next_delay`].
    pub fn hinted_delay(&self, attempt: u32, hint: Duration) -> Option<Duration> {
        self.next_delay(attempt)?;
        let shortest = self.delays.iter().min().copied().unwrap_or_default();
        let longest = self.delays.iter().max().copied().unwrap_or_default();
        Some(hint.clamp(shortest, longest))
    }

    /// [`RetryPolicy::next_delay`] with the jitter drawn from `rng`:
    /// uniformly in `[d*(1-jitter), d*(1+jitter)]`.
    pub fn draw_delay(&self, attempt: u32, rng: &mut impl Rng) -> Option<Duration> {
        let delay = self.next_delay(attempt)?;
        if self.jitter <= 0.0 {
            return Some(delay);
        }
        Some(delay.mul_f64(rng.random_range((1.0 - self.jitter)..=(1.0 + self.jitter))))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(profile: &str) -> RetrySettings {
        RetrySettings {
            local_retries: 3,
            profile: Some(profile.into()),
            delays: None,
            jitter: None,
            attempts: None,
            initial_delay_ms: None,
            multiplier: None,
            max_delay_ms: None,
            max_error_len: 1024,
            groups: BTreeMap::new(),
            time_scale: None,
            top: None,
        }
    }

    fn secs(p: &RetryPolicy) -> Vec<u64> {
        p.delays.iter().map(|d| d.as_secs()).collect()
    }

    fn layer(toml: &str) -> RetryLayer {
        toml::from_str(toml).unwrap()
    }

    #[test]
    fn a_retry_after_hint_replaces_the_delay_within_the_schedules_bounds() {
        // seed000: 10 s, 60 s, 300 s.
        let p = RetryPolicy::from_settings(&settings("seed000")).unwrap();
        let s = Duration::from_secs;
        assert_eq!(p.hinted_delay(0, s(20)), Some(s(20)), "the hint as is");
        assert_eq!(
            p.hinted_delay(2, s(20)),
            Some(s(20)),
            "shorter than attempt 3's"
        );
        assert_eq!(
            p.hinted_delay(0, s(3600)),
            Some(s(300)),
            "at most the longest"
        );
        assert_eq!(
            p.hinted_delay(1, s(0)),
            Some(s(10)),
            "at least the shortest"
        );
        assert_eq!(
            p.hinted_delay(3, s(20)),
            None,
            "after the last delay: the DLQ"
        );
    }

    #[test]
    fn profiles_resolve_to_the_documented_schedules() {
        let p = RetryPolicy::from_settings(&settings("default")).unwrap();
        assert_eq!(secs(&p), [1, 2, 4, 8, 16]);
        let p = RetryPolicy::from_settings(&settings("10s-1m-5m")).unwrap();
        assert_eq!(secs(&p), [10, 60, 300]);
        assert_eq!(p.next_delay(3), None, "after the last delay: the DLQ");
        assert_eq!(
            secs(&RetryPolicy::from_settings(&settings("10s-30s-1m-5m")).unwrap()),
            [10, 30, 60, 300]
        );
        assert_eq!(
            secs(&RetryPolicy::from_settings(&settings("5s-30s-5m")).unwrap()),
            [5, 30, 300]
        );
        let mut unset = settings("default");
        unset.profile = None;
        assert_eq!(
            secs(&RetryPolicy::from_settings(&unset).unwrap()),
            [1, 2, 4, 8, 16]
        );
    }

    #[test]
    fn the_older_profile_names_resolve_to_the_same_schedules() {
        for (alias, canonical) in PROFILE_ALIASES {
            assert_eq!(profile(alias), profile(canonical), "{alias}");
            assert!(profile(canonical).is_some(), "{canonical} is a profile");
            let by_alias = RetryPolicy::from_settings(&settings(alias)).unwrap();
            let by_name = RetryPolicy::from_settings(&settings(canonical)).unwrap();
            assert_eq!(by_alias.delays, by_name.delays, "{alias}");
        }
        // Reshaping works through an alias as through the name.
        let mut by_alias = settings("seed000");
        by_alias.attempts = Some(4);
        assert_eq!(
            secs(&RetryPolicy::from_settings(&by_alias).unwrap()),
            [10, 60, 300, 300]
        );
    }

    #[test]
    fn delays_are_capped_and_bad_values_named() {
        let mut s = settings("default");
        s.attempts = Some(10);
        let p = RetryPolicy::from_settings(&s).unwrap();
        assert_eq!(p.delays.last().unwrap().as_secs(), 60);
        let err = RetryPolicy::from_settings(&settings("fast"))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("retry.profile") && err.contains("accepted: default, 10s-1m-5m, 10s-30s-1m-5m, 5s-30s-5m (older names: seed000, seed001, seed003)"),
            "{err}"
        );
        s.attempts = Some(1000);
        assert!(
            RetryPolicy::from_settings(&s)
                .unwrap_err()
                .to_string()
                .contains("retry.attempts")
        );
    }

    #[test]
    fn explicit_delays_parse_in_every_accepted_form() {
        for (text, ms) in [
            ("500ms", 500),
            ("5s", 5_000),
            ("30s", 30_000),
            ("5m", 300_000),
            ("1h", 3_600_000),
            ("24h", 86_400_000),
        ] {
            assert_eq!(parse_delay(text), Ok(Duration::from_millis(ms)), "{text}");
        }
        for bad in [
            "",
            "5",
            "s",
            "5 s",
            "5sec",
            "1.5s",
            "-5s",
            "0s",
            "25h",
            "5S",
            "99999999999999999999h",
        ] {
            let err = parse_delay(bad).unwrap_err();
            assert!(err.contains(DELAY_FORMS), "{bad}: {err}");
        }
        let mut s = settings("default");
        s.profile = None;
        s.delays = Some(vec!["5s".into(), "30s".into(), "5m".into()]);
        assert_eq!(secs(&RetryPolicy::from_settings(&s).unwrap()), [5, 30, 300]);
        s.delays = Some(vec!["5s".into(), "30 seconds".into()]);
        let err = RetryPolicy::from_settings(&s).unwrap_err().to_string();
        assert!(
            err.starts_with(
                "retry.delays[1]: `30 seconds` is not a delay; accepted forms: <n>ms, <n>s"
            ),
            "{err}"
        );
        s.delays = Some(vec!["1s".into(); 101]);
        assert!(
            RetryPolicy::from_settings(&s)
                .unwrap_err()
                .to_string()
                .contains("at most 100")
        );
        s.delays = Some(vec![]);
        assert!(
            RetryPolicy::from_settings(&s).unwrap().delays.is_empty(),
            "an explicit empty list: straight to the DLQ"
        );
    }

    #[test]
    fn both_forms_in_one_layer_are_refused_naming_both_fields() {
        let mut s = settings("10s-1m-5m");
        s.delays = Some(vec!["5s".into()]);
        let err = RetryPolicy::from_settings(&s).unwrap_err().to_string();
        assert!(
            err.starts_with("retry.delays and retry.profile: both set"),
            "{err}"
        );
        s.profile = None;
        s.multiplier = Some(3.0);
        let err = RetryPolicy::from_settings(&s).unwrap_err().to_string();
        assert!(
            err.starts_with("retry.delays and retry.multiplier: both set"),
            "{err}"
        );
        let err = layer("delays = [\"1s\"]\nattempts = 2")
            .check("http.subscriptions[crm].retry")
            .unwrap_err()
            .to_string();
        assert!(
            err.starts_with(
                "http.subscriptions[crm].retry.delays and http.subscriptions[crm].retry.attempts"
            ),
            "{err}"
        );
    }

    #[test]
    fn group_layers_replace_the_form_below_and_layer_the_rest() {
        let mut s = settings("10s-1m-5m");
        s.jitter = Some(0.2);
        s.groups.insert(
            "a.order.consumer".into(),
            layer("delays = [\"5s\", \"30s\", \"5m\"]\nlocal_retries = 0"),
        );
        s.groups
            .insert("b.order.consumer".into(), layer("attempts = 4"));
        s.groups.insert(
            "c.order.consumer".into(),
            layer("profile = \"10s-30s-1m-5m\"\njitter = 0.0"),
        );
        let a = s.policy_for("a.order.consumer").unwrap();
        assert_eq!(
            (secs(&a), a.local_retries, a.jitter),
            (vec![5, 30, 300], 0, 0.2)
        );
        assert_eq!(
            secs(&s.policy_for("b.order.consumer").unwrap()),
            [10, 60, 300, 300],
            "10s-1m-5m from [retry], 4 attempts"
        );
        let c = s.policy_for("c.order.consumer").unwrap();
        assert_eq!((secs(&c), c.jitter), (vec![10, 30, 60, 300], 0.0));
        assert_eq!(
            secs(&s.policy_for("other").unwrap()),
            [10, 60, 300],
            "no layer: [retry]"
        );
        s.validate().unwrap();

        // A profile over [retry]'s delays replaces them.
        let mut s = settings("default");
        s.profile = None;
        s.delays = Some(vec!["1s".into()]);
        s.groups
            .insert("g".into(), layer("profile = \"5s-30s-5m\""));
        assert_eq!(secs(&s.policy_for("g").unwrap()), [5, 30, 300]);
        // A subscription's layer goes on top of the group's.
        s.top = Some((
            "http.subscriptions[crm].retry".into(),
            layer("delays = [\"2s\"]"),
        ));
        assert_eq!(secs(&s.policy_for("g").unwrap()), [2]);
    }

    #[test]
    fn overrides_of_a_fixed_profile_and_bad_group_values_are_named() {
        let mut s = settings("seed001");
        s.groups.insert("g".into(), layer("attempts = 6"));
        let err = s.validate().unwrap_err().to_string();
        assert!(
            err.starts_with("retry.groups.\"g\".attempts: profile seed001 is a fixed list"),
            "{err}"
        );
        assert!(
            err.contains("(default, 10s-1m-5m): set delays instead"),
            "{err}"
        );
        let mut s = settings("default");
        s.groups.insert("g".into(), layer("jitter = 1.5"));
        let err = s.validate().unwrap_err().to_string();
        assert!(
            err.starts_with("retry.groups.\"g\".jitter: 1.5 is outside 0 to 1"),
            "{err}"
        );
        let mut s = settings("default");
        s.groups.insert("g".into(), layer("delays = [\"10\"]"));
        let err = s.validate().unwrap_err().to_string();
        assert!(
            err.starts_with("retry.groups.\"g\".delays[0]: `10` is not a delay; accepted forms"),
            "{err}"
        );
        assert!(
            toml::from_str::<RetryLayer>("delay = [\"1s\"]")
                .unwrap_err()
                .to_string()
                .contains("unknown field `delay`")
        );
    }

    #[test]
    fn jitter_draws_within_its_bounds_and_spreads() {
        let mut s = settings("5s-30s-5m");
        s.jitter = Some(0.25);
        let p = RetryPolicy::from_settings(&s).unwrap();
        let mut rng = rand::rng();
        for (attempt, base) in [(0, 5_000.0), (1, 30_000.0), (2, 300_000.0)] {
            let drawn: Vec<f64> = (0..2_000)
                .map(|_| p.draw_delay(attempt, &mut rng).unwrap().as_secs_f64() * 1e3)
                .collect();
            let (low, high) = drawn
                .iter()
                .fold((f64::MAX, f64::MIN), |(l, h), &d| (l.min(d), h.max(d)));
            assert!(
                low >= base * 0.75 - 1.0 && high <= base * 1.25 + 1.0,
                "attempt {attempt}: {low}..{high}"
            );
            // Spread over the range, not stuck at one value.
            assert!(
                low < base * 0.8 && high > base * 1.2,
                "attempt {attempt}: {low}..{high}"
            );
        }
        assert_eq!(p.draw_delay(3, &mut rng), None);
        s.jitter = None;
        let p = RetryPolicy::from_settings(&s).unwrap();
        assert_eq!(
            p.draw_delay(0, &mut rng),
            Some(Duration::from_secs(5)),
            "no jitter: exactly the delay"
        );
    }

    #[test]
    fn time_scale_is_a_harness_setting() {
        let mut s = settings("10s-1m-5m");
        s.time_scale = Some(0.01);
        match cfg!(feature = "harness") {
            true => {
                let p = RetryPolicy::from_settings(&s).unwrap();
                assert_eq!(
                    p.delays,
                    [
                        Duration::from_millis(100),
                        Duration::from_millis(600),
                        Duration::from_secs(3)
                    ]
                );
                s.time_scale = Some(2.0);
                assert!(
                    RetryPolicy::from_settings(&s)
                        .unwrap_err()
                        .to_string()
                        .contains("retry.time_scale: 2 is outside")
                );
            }
            false => {
                let err = RetryPolicy::from_settings(&s).unwrap_err().to_string();
                assert!(
                    err.contains("retry.time_scale") && err.contains("harness"),
                    "{err}"
                );
            }
        }
    }
}
