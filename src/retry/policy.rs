//! The retry schedule: how many immediate local retries, then which delays
//! in the group's retry topic before a record goes to the dead-letter topic.

use std::time::Duration;

use serde::Deserialize;

/// Named schedules, selectable with `retry.profile`.
pub const PROFILES: [&str; 2] = ["default", "seed000"];

/// Retry settings as configured.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RetrySettings {
    /// Immediate retries in the consumer before a record leaves its partition.
    pub local_retries: u32,
    /// `default` (1 s, 2 s, 4 s, 8 s, 16 s) or `seed000` (10 s, 1 min, 5 min).
    pub profile: String,
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
}

/// The resolved schedule.
#[derive(Debug, Clone, PartialEq)]
pub struct RetryPolicy {
    /// Immediate retries in place.
    pub local_retries: u32,
    /// One delay per delayed attempt; after the last one, the DLQ.
    pub delays: Vec<Duration>,
    /// Longest error message kept.
    pub max_error_len: usize,
}

/// A retry setting that cannot be used.
#[derive(Debug, thiserror::Error)]
#[error("retry.{field}: {reason}")]
pub struct PolicyError {
    field: &'static str,
    reason: String,
}

impl RetryPolicy {
    /// Resolves the profile and overrides; refuses what would retry forever
    /// or not at all by accident.
    pub fn from_settings(s: &RetrySettings) -> Result<Self, PolicyError> {
        let (attempts, initial, multiplier, max) = match s.profile.as_str() {
            "default" => (5, 1_000, 2.0, 60_000),
            // Seed 000: 3 retries, 10 s -> 1 min -> 5 min.
            "seed000" => (3, 10_000, 6.0, 300_000),
            other => {
                return Err(PolicyError {
                    field: "profile",
                    reason: format!("`{other}` is not a profile; accepted: {}", PROFILES.join(", ")),
                });
            }
        };
        let attempts = s.attempts.unwrap_or(attempts);
        let initial = s.initial_delay_ms.unwrap_or(initial);
        let multiplier = s.multiplier.unwrap_or(multiplier);
        let max = s.max_delay_ms.unwrap_or(max);
        if attempts > 100 {
            return Err(PolicyError {
                field: "attempts",
                reason: format!("{attempts} is more than 100; retries must end in the DLQ"),
            });
        }
        if !(1.0..=100.0).contains(&multiplier) {
            return Err(PolicyError {
                field: "multiplier",
                reason: format!("{multiplier} is outside 1.0 to 100.0"),
            });
        }
        let mut delays = Vec::with_capacity(attempts as usize);
        let mut delay = initial as f64;
        for _ in 0..attempts {
            delays.push(Duration::from_millis((delay as u64).min(max)));
            delay *= multiplier;
        }
        Ok(Self {
            local_retries: s.local_retries.min(20),
            delays,
            max_error_len: s.max_error_len.max(64),
        })
    }

    /// Where a record goes after failing delayed attempt `attempt` (0 = the
    /// main topic): the delay before the next attempt, or None for the DLQ.
    pub fn next_delay(&self, attempt: u32) -> Option<Duration> {
        self.delays.get(attempt as usize).copied()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(profile: &str) -> RetrySettings {
        RetrySettings {
            local_retries: 3,
            profile: profile.into(),
            attempts: None,
            initial_delay_ms: None,
            multiplier: None,
            max_delay_ms: None,
            max_error_len: 1024,
        }
    }

    #[test]
    fn profiles_resolve_to_the_documented_schedules() {
        let p = RetryPolicy::from_settings(&settings("default")).unwrap();
        let secs: Vec<u64> = p.delays.iter().map(|d| d.as_secs()).collect();
        assert_eq!(secs, [1, 2, 4, 8, 16]);
        let p = RetryPolicy::from_settings(&settings("seed000")).unwrap();
        let secs: Vec<u64> = p.delays.iter().map(|d| d.as_secs()).collect();
        assert_eq!(secs, [10, 60, 300]);
        assert_eq!(p.next_delay(3), None, "after the last delay: the DLQ");
    }

    #[test]
    fn delays_are_capped_and_bad_values_named() {
        let mut s = settings("default");
        s.attempts = Some(10);
        let p = RetryPolicy::from_settings(&s).unwrap();
        assert_eq!(p.delays.last().unwrap().as_secs(), 60);
        let err = RetryPolicy::from_settings(&settings("fast")).unwrap_err().to_string();
        assert!(err.contains("retry.profile") && err.contains("default, seed000"), "{err}");
        s.attempts = Some(1000);
        assert!(RetryPolicy::from_settings(&s).unwrap_err().to_string().contains("retry.attempts"));
    }
}
