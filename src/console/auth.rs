//! Who is asking, and with which role.
//!
//! Three ways in, tried in this order:
//!
//! 1. a trusted reverse-proxy header (`console.proxy_user_header`, role from
//!    `console.proxy_role_header`, viewer when absent) — only when configured;
//!    the proxy authenticates people, so audit rows name the person;
//! 2. `Authorization: Bearer <token>` (scripts, curl);
//! 3. the session cookie set by the login form (`POST /login` with a token).
//!
//! A token names a role, not a person: its audit rows say `viewer-token` or
//! `operator-token`. Tokens are [`SecretString`]s compared by SHA-256 digest;
//! the session cookie holds a random id (never the token), is `HttpOnly` and
//! `SameSite=Strict`, and lives [`SESSION_TTL`].

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use axum::extract::FromRequestParts;
use axum::http::{HeaderMap, header, request::Parts};
use rand::RngCore;
use secrecy::{ExposeSecret, SecretString};
use sha2::{Digest, Sha256};

use super::ConsoleError;
use crate::config::console::ConsoleSettings;

/// How long a login lasts.
pub const SESSION_TTL: Duration = Duration::from_secs(12 * 60 * 60);

/// The session cookie's name.
pub const SESSION_COOKIE: &str = "orderpipe_console";

/// What a signed-in user may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// Reads every page; changes nothing.
    Viewer,
    /// Also replays, ignores, releases and edits subscriptions.
    Operator,
}

impl Role {
    /// `viewer` or `operator`.
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Viewer => "viewer",
            Role::Operator => "operator",
        }
    }

    /// Parses `viewer` / `operator` (case-insensitive).
    pub fn parse(text: &str) -> Option<Self> {
        match text.trim().to_ascii_lowercase().as_str() {
            "viewer" => Some(Role::Viewer),
            "operator" => Some(Role::Operator),
            _ => None,
        }
    }
}

/// The signed-in user of a request; extract it in a handler to require a login.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Principal {
    /// Who: the proxy's user name, or `viewer-token` / `operator-token`.
    pub who: String,
    /// What they may do.
    pub role: Role,
}

impl Principal {
    /// Whether this user may change state on this console (operator, and
    /// the console is not `--read-only`).
    pub fn can_act(&self, read_only: bool) -> bool {
        self.role == Role::Operator && !read_only
    }
}

/// The configured ways in, and the live sessions.
pub struct Authenticator {
    viewer_digest: Option<[u8; 32]>,
    operator_digest: Option<[u8; 32]>,
    proxy_user_header: Option<String>,
    proxy_role_header: Option<String>,
    sessions: Mutex<HashMap<String, (Principal, Instant)>>,
}

fn digest(text: &str) -> [u8; 32] {
    Sha256::digest(text.as_bytes()).into()
}

impl Authenticator {
    /// From the `[console]` section.
    pub fn new(settings: &ConsoleSettings) -> Self {
        Self {
            viewer_digest: settings
                .viewer_token
                .as_ref()
                .map(|t| digest(t.expose_secret())),
            operator_digest: settings
                .operator_token
                .as_ref()
                .map(|t| digest(t.expose_secret())),
            proxy_user_header: settings.proxy_user_header.clone(),
            proxy_role_header: settings.proxy_role_header.clone(),
            sessions: Mutex::new(HashMap::new()),
        }
    }

    /// Whether the login form applies (a token is configured).
    pub fn has_tokens(&self) -> bool {
        self.viewer_digest.is_some() || self.operator_digest.is_some()
    }

    /// The role a token grants, if any.
    pub fn role_of_token(&self, token: &SecretString) -> Option<Role> {
        let given = digest(token.expose_secret());
        if self.operator_digest == Some(given) {
            Some(Role::Operator)
        } else if self.viewer_digest == Some(given) {
            Some(Role::Viewer)
        } else {
            None
        }
    }

    /// A principal for a token's role.
    fn token_principal(role: Role) -> Principal {
        Principal {
            who: format!("{}-token", role.as_str()),
            role,
        }
    }

    /// Signs in with `token`: a new session id for the cookie, or `None`
    /// when the token is no configured one.
    pub fn login(&self, token: &SecretString) -> Option<(String, Principal)> {
        let principal = Self::token_principal(self.role_of_token(token)?);
        let id = new_session_id();
        let mut sessions = self.sessions.lock().expect("sessions lock");
        let now = Instant::now();
        sessions.retain(|_, (_, at)| now.duration_since(*at) < SESSION_TTL);
        sessions.insert(id.clone(), (principal.clone(), now));
        Some((id, principal))
    }

    /// Ends the session of these headers' cookie.
    pub fn logout(&self, headers: &HeaderMap) {
        if let Some(id) = session_cookie(headers) {
            self.sessions.lock().expect("sessions lock").remove(&id);
        }
    }

    /// Who sent these headers, or why nobody: a configured proxy header
    /// first, then a bearer token, then the session cookie.
    pub fn identify(&self, headers: &HeaderMap) -> Result<Principal, ConsoleError> {
        if let Some(user_header) = &self.proxy_user_header
            && let Some(user) = headers.get(user_header.as_str())
        {
            let who = user
                .to_str()
                .ok()
                .map(str::trim)
                .filter(|u| !u.is_empty())
                .ok_or_else(|| {
                    ConsoleError::Unauthenticated(format!(
                        "the {user_header} header is empty or not text"
                    ))
                })?;
            let role = match self
                .proxy_role_header
                .as_deref()
                .and_then(|h| headers.get(h))
            {
                None => Role::Viewer,
                Some(value) => value.to_str().ok().and_then(Role::parse).ok_or_else(|| {
                    ConsoleError::Forbidden(format!(
                        "the {} header must be viewer or operator",
                        self.proxy_role_header.as_deref().unwrap_or_default()
                    ))
                })?,
            };
            return Ok(Principal {
                who: who.to_string(),
                role,
            });
        }
        if let Some(value) = headers.get(header::AUTHORIZATION) {
            let token = value
                .to_str()
                .ok()
                .and_then(|v| v.strip_prefix("Bearer "))
                .ok_or_else(|| {
                    ConsoleError::Unauthenticated("Authorization must be `Bearer <token>`".into())
                })?;
            let role = self
                .role_of_token(&SecretString::from(token.trim()))
                .ok_or_else(|| {
                    ConsoleError::Forbidden("the bearer token is no console token".into())
                })?;
            return Ok(Self::token_principal(role));
        }
        if let Some(id) = session_cookie(headers) {
            let sessions = self.sessions.lock().expect("sessions lock");
            if let Some((principal, at)) = sessions.get(&id)
                && at.elapsed() < SESSION_TTL
            {
                return Ok(principal.clone());
            }
        }
        Err(ConsoleError::Unauthenticated(
            match (&self.proxy_user_header, self.has_tokens()) {
                (Some(h), false) => format!("no {h} header: reach the console through its proxy"),
                _ => "not signed in".into(),
            },
        ))
    }
}

/// A new session id: 32 random bytes, hex.
fn new_session_id() -> String {
    let mut bytes = [0u8; 32];
    rand::rng().fill_bytes(&mut bytes);
    crate::hex::lower(&bytes)
}

/// The session id in the request's cookies.
fn session_cookie(headers: &HeaderMap) -> Option<String> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(name, _)| *name == SESSION_COOKIE)
        .map(|(_, value)| value.to_string())
}

/// The `Set-Cookie` value of a new session (or, with `None`, of its end).
pub fn session_set_cookie(id: Option<&str>) -> String {
    match id {
        Some(id) => format!(
            "{SESSION_COOKIE}={id}; Path=/; HttpOnly; SameSite=Strict; Max-Age={}",
            SESSION_TTL.as_secs()
        ),
        None => format!("{SESSION_COOKIE}=; Path=/; HttpOnly; SameSite=Strict; Max-Age=0"),
    }
}

impl FromRequestParts<super::ConsoleState> for Principal {
    type Rejection = ConsoleError;

    async fn from_request_parts(
        parts: &mut Parts,
        state: &super::ConsoleState,
    ) -> Result<Self, Self::Rejection> {
        if let Some(principal) = parts.extensions.get::<Principal>() {
            return Ok(principal.clone());
        }
        state.auth().identify(&parts.headers)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    fn settings() -> ConsoleSettings {
        ConsoleSettings {
            viewer_token: Some(SecretString::from("viewer-token-0123456789")),
            operator_token: Some(SecretString::from("operator-token-0123456789")),
            proxy_user_header: Some("X-Forwarded-User".into()),
            proxy_role_header: Some("X-Forwarded-Role".into()),
            ..ConsoleSettings::default()
        }
    }

    #[test]
    fn tokens_headers_and_sessions_name_the_role() {
        let auth = Authenticator::new(&settings());
        let mut headers = HeaderMap::new();
        assert!(matches!(
            auth.identify(&headers),
            Err(ConsoleError::Unauthenticated(_))
        ));
        headers.insert(
            header::AUTHORIZATION,
            HeaderValue::from_static("Bearer viewer-token-0123456789"),
        );
        assert_eq!(
            auth.identify(&headers).unwrap(),
            Principal {
                who: "viewer-token".into(),
                role: Role::Viewer
            }
        );
        headers.insert(
            header::AUTHORIZATION,
            HeaderValue::from_static("Bearer wrong-token-0123456789"),
        );
        assert!(matches!(
            auth.identify(&headers),
            Err(ConsoleError::Forbidden(_))
        ));

        let (id, principal) = auth
            .login(&SecretString::from("operator-token-0123456789"))
            .unwrap();
        assert_eq!(principal.role, Role::Operator);
        let mut cookie = HeaderMap::new();
        cookie.insert(
            header::COOKIE,
            HeaderValue::from_str(&format!("a=b; {SESSION_COOKIE}={id}")).unwrap(),
        );
        assert_eq!(auth.identify(&cookie).unwrap().role, Role::Operator);
        auth.logout(&cookie);
        assert!(auth.identify(&cookie).is_err());
        assert!(
            auth.login(&SecretString::from("nope-nope-nope-nope"))
                .is_none()
        );

        let mut proxied = HeaderMap::new();
        proxied.insert("x-forwarded-user", HeaderValue::from_static("alice"));
        assert_eq!(
            auth.identify(&proxied).unwrap(),
            Principal {
                who: "alice".into(),
                role: Role::Viewer
            }
        );
        proxied.insert("x-forwarded-role", HeaderValue::from_static("Operator"));
        assert_eq!(auth.identify(&proxied).unwrap().role, Role::Operator);
        proxied.insert("x-forwarded-role", HeaderValue::from_static("admin"));
        assert!(matches!(
            auth.identify(&proxied),
            Err(ConsoleError::Forbidden(_))
        ));
    }

    #[test]
    fn a_proxy_header_is_ignored_unless_configured() {
        let auth = Authenticator::new(&ConsoleSettings {
            proxy_user_header: None,
            proxy_role_header: None,
            ..settings()
        });
        let mut headers = HeaderMap::new();
        headers.insert("x-forwarded-user", HeaderValue::from_static("mallory"));
        headers.insert("x-forwarded-role", HeaderValue::from_static("operator"));
        assert!(matches!(
            auth.identify(&headers),
            Err(ConsoleError::Unauthenticated(_))
        ));
    }
}
