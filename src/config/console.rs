//! The `[console]` section: where `orderpipe console` listens, how it
//! authenticates (tokens or a trusted reverse-proxy header), whether it is
//! read-only, and how often the overview refreshes itself.

use std::net::SocketAddr;

use secrecy::{ExposeSecret, SecretString};
use serde::Deserialize;

use crate::subscriptions::admin::MIN_TOKEN_CHARS;

/// The `[console]` section of the configuration.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConsoleSettings {
    /// Listen address (port 0 = any free port).
    #[serde(default = "default_listen")]
    pub listen: String,
    /// No operator action at all: every state change is refused (403) and
    /// no action button is rendered, whatever the role.
    #[serde(default)]
    pub read_only: bool,
    /// Token of the viewer role (`ORDERPIPE_CONSOLE__VIEWER_TOKEN`), >= 16 characters.
    #[serde(default)]
    pub viewer_token: Option<SecretString>,
    /// Token of the operator role (`ORDERPIPE_CONSOLE__OPERATOR_TOKEN`), >= 16 characters.
    #[serde(default)]
    pub operator_token: Option<SecretString>,
    /// Header naming the user, set by an authenticating reverse proxy
    /// (e.g. `X-Forwarded-User`). Unset: no header is trusted.
    #[serde(default)]
    pub proxy_user_header: Option<String>,
    /// Header carrying the role (`viewer` or `operator`) set by that proxy;
    /// absent on a request: viewer. Needs `proxy_user_header`.
    #[serde(default)]
    pub proxy_role_header: Option<String>,
    /// Seconds between two automatic reloads of the pages that follow a
    /// live state (the overview, held orders; [`crate::console::Chrome::refreshing`]). 0: never.
    #[serde(default = "default_refresh_secs")]
    pub refresh_secs: u32,
    /// The Prometheus that scrapes the pods (`http://prometheus:9090`): the
    /// history charts come from its `query_range`. Unset: from the
    /// console's own samples (`console_samples`).
    #[serde(default)]
    pub prometheus_url: Option<String>,
    /// Seconds between two of the console's own samples (only without
    /// `prometheus_url`).
    #[serde(default = "default_sample_interval_secs")]
    pub sample_interval_secs: u32,
    /// Field paths of decoded records shown as `•••` (`data.mobile`,
    /// `data.*.email`): in the console unless an operator reveals them, and
    /// in `dlq show` / `search` without `--reveal` ([`crate::masking`]).
    #[serde(default)]
    pub masked_fields: Vec<String>,
}

impl Default for ConsoleSettings {
    fn default() -> Self {
        Self {
            listen: default_listen(),
            read_only: false,
            viewer_token: None,
            operator_token: None,
            proxy_user_header: None,
            proxy_role_header: None,
            refresh_secs: default_refresh_secs(),
            prometheus_url: None,
            sample_interval_secs: default_sample_interval_secs(),
            masked_fields: Vec::new(),
        }
    }
}

fn default_listen() -> String {
    "127.0.0.1:8095".into()
}

fn default_refresh_secs() -> u32 {
    10
}

fn default_sample_interval_secs() -> u32 {
    60
}

impl ConsoleSettings {
    /// Checks the address, token lengths (never their values) and headers.
    pub fn validate(&self) -> Result<(), String> {
        self.listen.parse::<SocketAddr>().map_err(|_| {
            format!(
                "console.listen: `{}` is not HOST:PORT with an IP address (e.g. 127.0.0.1:8095, 0.0.0.0:8095)",
                self.listen
            )
        })?;
        for (field, token) in [
            ("viewer_token", &self.viewer_token),
            ("operator_token", &self.operator_token),
        ] {
            if token
                .as_ref()
                .is_some_and(|t| t.expose_secret().chars().count() < MIN_TOKEN_CHARS)
            {
                return Err(format!(
                    "console.{field}: shorter than {MIN_TOKEN_CHARS} characters (its value is not shown)"
                ));
            }
        }
        if let (Some(viewer), Some(operator)) = (&self.viewer_token, &self.operator_token)
            && viewer.expose_secret() == operator.expose_secret()
        {
            return Err("console.viewer_token and console.operator_token are the same: a viewer would be an operator".into());
        }
        for (field, header) in [
            ("proxy_user_header", &self.proxy_user_header),
            ("proxy_role_header", &self.proxy_role_header),
        ] {
            if let Some(name) = header {
                axum::http::HeaderName::from_bytes(name.as_bytes())
                    .map_err(|_| format!("console.{field}: `{name}` is not an HTTP header name (e.g. X-Forwarded-User)"))?;
            }
        }
        if self.proxy_role_header.is_some() && self.proxy_user_header.is_none() {
            return Err("console.proxy_role_header needs console.proxy_user_header (the header naming the user)".into());
        }
        if let Some(url) = &self.prometheus_url
            && !(url.starts_with("http://") || url.starts_with("https://"))
        {
            return Err(format!(
                "console.prometheus_url: `{url}` is not an http:// or https:// URL (e.g. http://prometheus:9090)"
            ));
        }
        crate::masking::FieldMask::parse(&self.masked_fields)?;
        if self.sample_interval_secs == 0 {
            return Err("console.sample_interval_secs: 0; accepted: 1 or more seconds".into());
        }
        Ok(())
    }

    /// Whether any way to sign in is configured (the console refuses to
    /// start without one: it is never open to anyone by default).
    pub fn has_authentication(&self) -> bool {
        self.viewer_token.is_some()
            || self.operator_token.is_some()
            || self.proxy_user_header.is_some()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_values_are_named_and_secrets_never_shown() {
        let mut s = ConsoleSettings::default();
        s.validate().unwrap();
        assert!(!s.has_authentication());
        s.viewer_token = Some(SecretString::from("short-secret"));
        let err = s.validate().unwrap_err();
        assert!(
            err.contains("console.viewer_token") && !err.contains("short-secret"),
            "{err}"
        );
        s.viewer_token = Some(SecretString::from("viewer-token-0123456789"));
        s.operator_token = Some(SecretString::from("viewer-token-0123456789"));
        assert!(s.validate().unwrap_err().contains("the same"));
        s.operator_token = None;
        s.proxy_role_header = Some("X-Role".into());
        assert!(
            s.validate()
                .unwrap_err()
                .contains("needs console.proxy_user_header")
        );
        s.proxy_user_header = Some("bad header".into());
        assert!(
            s.validate()
                .unwrap_err()
                .contains("console.proxy_user_header: `bad header`")
        );
        s.proxy_user_header = Some("X-Forwarded-User".into());
        s.listen = "localhost".into();
        assert!(s.validate().unwrap_err().contains("console.listen"));
    }
}
