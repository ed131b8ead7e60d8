//! CSRF protection and the one gate every state change passes.
//!
//! Every form carries a hidden `csrf_token` (the layout's `chrome.csrf`);
//! [`guard`] runs before every handler, and for each `POST` (but the login
//! form's) it:
//!
//! 1. identifies the user ([`super::auth`]); unknown → 401;
//! 2. reads the form's `csrf_token` (or an `X-CSRF-Token` header) and
//!    compares it with the user's: missing or wrong → 403;
//! 3. unless the route is in [`ANY_ROLE_POSTS`] (sign out, start or cancel a
//!    record search), requires an
//!    operator on a console that is not read-only → 403.
//!
//! A page (GET) asked for without a login is sent to the login form (303)
//! when tokens are configured, and back to the page after it.
//!
//! So no action route can forget a check: a new page's actions are covered
//! by registering them, nothing else. The token is an HMAC-SHA256 of the
//! user and role under a key drawn at start: stateless (proxy users have no
//! session), bound to the user, void after a restart.

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Redirect, Response};
use rand::RngCore;
use sha2::{Digest, Sha256};

use super::auth::Principal;
use super::{ConsoleError, ConsoleState};

/// The form field holding the token.
pub const FIELD: &str = "csrf_token";

/// The header that may hold it instead (scripts).
pub const HEADER: &str = "x-csrf-token";

/// POST routes any signed-in user may send (with a CSRF token): they
/// change nothing (a record search reads, and its cancel ends a read).
pub const ANY_ROLE_POSTS: [&str; 3] = ["/logout", "/search", "/search/cancel"];

/// POST routes that need no sign-in and no token (they sign in).
pub const OPEN_POSTS: [&str; 1] = ["/login"];

/// Largest form body read (bulk filters are a few fields).
const MAX_FORM_BYTES: usize = 1024 * 1024;

/// HMAC-SHA256 (RFC 2104) of `message` under `key` (a key of at most 64 bytes).
fn hmac_sha256(key: &[u8], message: &[u8]) -> [u8; 32] {
    let mut block = [0u8; 64];
    block[..key.len()].copy_from_slice(key);
    let pad = |byte: u8| block.map(|b| b ^ byte);
    let inner = Sha256::new()
        .chain_update(pad(0x36))
        .chain_update(message)
        .finalize();
    Sha256::new()
        .chain_update(pad(0x5c))
        .chain_update(inner)
        .finalize()
        .into()
}

/// The CSRF key of this process.
pub struct CsrfKey([u8; 32]);

impl CsrfKey {
    /// A fresh random key.
    pub fn random() -> Self {
        let mut key = [0u8; 32];
        rand::rng().fill_bytes(&mut key);
        Self(key)
    }

    /// The token of `principal`'s forms.
    pub fn token(&self, principal: &Principal) -> String {
        let message = format!("{}\u{0}{}", principal.who, principal.role.as_str());
        crate::hex::lower(&hmac_sha256(&self.0, message.as_bytes()))
    }

    /// Whether `given` is `principal`'s token (compared in constant time).
    pub fn is_valid(&self, principal: &Principal, given: &str) -> bool {
        let expected = self.token(principal);
        expected.len() == given.len()
            && expected
                .bytes()
                .zip(given.bytes())
                .fold(0u8, |acc, (a, b)| acc | (a ^ b))
                == 0
    }
}

/// The value of `field` in an `application/x-www-form-urlencoded` body.
pub fn form_value(body: &[u8], field: &str) -> Option<String> {
    url::form_urlencoded::parse(body)
        .find(|(name, _)| name == field)
        .map(|(_, value)| value.into_owned())
}

/// The gate (see the module docs); passes the identified [`Principal`] on
/// to the handler as a request extension.
pub async fn guard(State(state): State<ConsoleState>, request: Request, next: Next) -> Response {
    if request.method() != Method::POST || OPEN_POSTS.contains(&request.uri().path()) {
        let wanted = request
            .uri()
            .path_and_query()
            .map_or_else(|| "/".to_string(), ToString::to_string);
        let response = next.run(request).await;
        // A page asked for without a login goes to the login form, and back after it.
        if response.status() == StatusCode::UNAUTHORIZED
            && state.auth().has_tokens()
            && !wanted.starts_with("/login")
        {
            let next: String = url::form_urlencoded::byte_serialize(wanted.as_bytes()).collect();
            return Redirect::to(&format!("/login?next={next}")).into_response();
        }
        return response;
    }
    match check(&state, request).await {
        Ok(request) => next.run(request).await,
        Err(e) => {
            if let ConsoleError::Forbidden(why) = &e {
                tracing::warn!(why = %why, "console: state change refused");
            }
            e.into_response()
        }
    }
}

async fn check(state: &ConsoleState, request: Request) -> Result<Request, ConsoleError> {
    let (mut parts, body) = request.into_parts();
    let principal = state.auth().identify(&parts.headers)?;
    let bytes = axum::body::to_bytes(body, MAX_FORM_BYTES)
        .await
        .map_err(|e| ConsoleError::BadInput {
            field: "body".into(),
            message: format!("unreadable form: {e}"),
        })?;
    let given = parts
        .headers
        .get(HEADER)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string)
        .or_else(|| form_value(&bytes, FIELD));
    match given {
        None => {
            return Err(ConsoleError::Forbidden(
                "the form has no CSRF token (csrf_token): reload the page and submit it again"
                    .into(),
            ));
        }
        Some(token) if !state.csrf().is_valid(&principal, &token) => {
            return Err(ConsoleError::Forbidden("the form's CSRF token is not yours or has expired: reload the page and submit it again".into()));
        }
        Some(_) => {}
    }
    if !ANY_ROLE_POSTS.contains(&parts.uri.path()) {
        if state.read_only() {
            return Err(ConsoleError::Forbidden(
                "this console is read-only (--read-only): it changes nothing".into(),
            ));
        }
        if !principal.can_act(false) {
            return Err(ConsoleError::Forbidden(format!(
                "{} is a {}: only an operator may change state",
                principal.who,
                principal.role.as_str()
            )));
        }
    }
    parts.extensions.insert(principal);
    Ok(Request::from_parts(parts, Body::from(bytes)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::console::auth::Role;

    #[test]
    fn hmac_matches_rfc_4231_case_2() {
        let mac = hmac_sha256(b"Jefe", b"what do ya want for nothing?");
        assert_eq!(
            crate::hex::lower(&mac),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
    }

    #[test]
    fn a_token_is_bound_to_its_user_and_role() {
        let key = CsrfKey::random();
        let alice = Principal {
            who: "alice".into(),
            role: Role::Operator,
        };
        let token = key.token(&alice);
        assert!(key.is_valid(&alice, &token));
        assert!(!key.is_valid(
            &Principal {
                role: Role::Viewer,
                ..alice.clone()
            },
            &token
        ));
        assert!(!key.is_valid(
            &Principal {
                who: "bob".into(),
                ..alice.clone()
            },
            &token
        ));
        assert!(!CsrfKey::random().is_valid(&alice, &token));
        assert!(!key.is_valid(&alice, ""));
        assert_eq!(
            form_value(b"a=1&csrf_token=x%2By&b=2", FIELD).as_deref(),
            Some("x+y")
        );
    }
}
