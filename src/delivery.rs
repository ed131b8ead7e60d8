//! Config-driven HTTP delivery to downstream services (seed 003).
//!
//! Subscriptions are data, not code: each names an event-name pattern, a
//! URL, method, timeout, retry schedule and an enabled flag:
//!
//! ```toml
//! [[http.subscriptions]]
//! name = "crm"
//! events = ["order.*"]            # or exact names, e.g. "order.payment.succeeded"
//! url = "http://crm.internal/hooks/orders"
//! method = "POST"
//! timeout_ms = 2000
//! retry = {delays = ["5s", "30s", "5m"], jitter = 0.1}   # or retry_profile = "5s-30s-5m"
//! enabled = true
//! ```
//!
//! The group's schedule layers `[retry]`, then `[retry.groups."<group>"]`,
//! then the subscription's `retry` (see [`crate::retry::policy`]); it is
//! read at start, so a change of it takes a restart.
//!
//! `orderpipe deliver --subscription crm` runs a consumer group
//! (`http.crm`) whose [`HttpDelivery`] handler POSTs each matching event as
//! `{request_id, channel_id, event_type, data, old, timestamp}` with the
//! event id as `Idempotency-Key` (and as `request_id`, so a redelivery
//! carries the same key) and the trace context in `traceparent`. Whether an
//! answer is a delivery is the subscription's [`SuccessRule`] (default
//! `2xx`: any 2xx, and when the body is JSON with a `code`, that code is 0,
//! which fits plain webhooks answering `204` or `200 {}` and seed 003's
//! `{"code": 0}` alike). A 4xx other than 408 and 429 is the downstream
//! refusing the record for good: dead-lettered at once as
//! `downstream_rejected`, with the status and up to 1 KB of the body.
//! Anything else, or a timeout, is a retryable failure that goes through
//! the error tier; a 429 or 503 with `Retry-After` carries the hint
//! ([`HandlerError::RetryAfter`]) so the retry topic waits that long,
//! bounded by the schedule ([`crate::retry::RetryPolicy::hinted_delay`]).
//!
//! The POST is made with no database transaction open: the handler acts
//! outside the database ([`Handler::acts_outside`]), so the worker POSTs a
//! batch's records first (skipping those whose dedup row exists, read
//! without a transaction), then one short transaction claims the dedup rows
//! of the deliveries and commits, then the offset moves. Safe because the
//! offset never passes an uncommitted dedup row: a crash between the POST
//! and the commit redelivers the record, POSTed again with the same
//! `Idempotency-Key`, which a downstream honouring the key does once
//! (committing first and POSTing after would lose the delivery on such a
//! crash). Up to `in_flight` records of a partition are POSTed at once
//! ([`post_all`]); the worker hands them over in waves of distinct keys, so
//! one key's records are never in flight together and go in offset order.
//!
//! Subscriptions reload on SIGHUP and when the config file changes; a
//! delivery in flight finishes with the settings it started with.

use std::path::PathBuf;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use async_trait::async_trait;
use serde::Deserialize;
use serde_json::json;

use crate::consumer::handler::{Effect, EventResult, Handler, HandlerError, MAJOR_1};
use crate::db::Tx;
use crate::envelope::{Envelope, EventName};
use crate::retry::{RetryLayer, RetryPolicy, RetrySettings};

/// One downstream subscription.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Subscription {
    /// Name; the consumer group is `http.<name>` unless `deliver --group` says otherwise.
    pub name: String,
    /// Event-name patterns; `*` matches any run of characters.
    pub events: Vec<String>,
    /// Where to deliver.
    pub url: String,
    /// HTTP method.
    #[serde(default = "default_method")]
    pub method: String,
    /// Per-request timeout.
    #[serde(default = "default_timeout")]
    pub timeout_ms: u64,
    /// Retry profile of the group (a name of [`crate::retry::policy::PROFILES`]),
    /// the same as `retry.profile`; unset: the group's `[retry]` layers decide.
    #[serde(default)]
    pub retry_profile: Option<String>,
    /// The group's schedule over `[retry]` and `[retry.groups."<group>"]`:
    /// `delays`, `jitter`, `profile`, ... ([`RetryLayer`]).
    #[serde(default)]
    pub retry: Option<RetryLayer>,
    /// `channel_id` in the body (who is calling).
    #[serde(default = "default_channel")]
    pub channel_id: String,
    /// Off: matching events are consumed and not delivered.
    #[serde(default = "default_enabled")]
    pub enabled: bool,
    /// Which answers are deliveries ([`SuccessRule`]).
    #[serde(default)]
    pub success: SuccessRule,
    /// Records of one partition delivered at once, at most (1: one at a
    /// time); records of one key are never in flight together.
    #[serde(default = "default_in_flight")]
    pub in_flight: usize,
}

/// `in_flight` of a subscription or downstream consumer that sets none.
pub const DEFAULT_IN_FLIGHT: usize = 16;
/// The accepted `in_flight` values.
pub const IN_FLIGHT_RANGE: std::ops::RangeInclusive<usize> = 1..=256;

/// Which HTTP answers count as a delivery (`success` of a subscription or
/// a downstream consumer).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, serde::Serialize)]
pub enum SuccessRule {
    /// Any 2xx; when the body is JSON with a `code` field, it must also be
    /// 0. Plain webhooks (`204`, `200 {}`, `200 OK`) and seed 003's
    /// `{"code": 0}` are both deliveries.
    #[default]
    #[serde(rename = "2xx")]
    TwoXx,
    /// 2xx and a JSON body whose `code` is 0: seed 003's contract, strictly
    /// (an answer without `code` is a failure).
    #[serde(rename = "2xx-and-code")]
    TwoXxAndCode,
    /// The body's `code` alone: 0 is a delivery whatever the status (for
    /// downstreams that answer every request with one status).
    #[serde(rename = "code")]
    Code,
}

impl SuccessRule {
    /// The accepted spellings, in order.
    pub const NAMES: [&'static str; 3] = ["2xx", "2xx-and-code", "code"];

    /// The rule's name (what config, tables and flags say).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::TwoXx => Self::NAMES[0],
            Self::TwoXxAndCode => Self::NAMES[1],
            Self::Code => Self::NAMES[2],
        }
    }

    /// `text` as a rule; the error names `field` and the accepted values.
    pub fn parse(field: &str, text: &str) -> Result<Self, String> {
        match text {
            "2xx" => Ok(Self::TwoXx),
            "2xx-and-code" => Ok(Self::TwoXxAndCode),
            "code" => Ok(Self::Code),
            other => Err(format!(
                "{field}: `{other}` is not a success rule; accepted values: {}",
                Self::NAMES.join(", ")
            )),
        }
    }

    /// Whether an answer of `status` with `body` is a delivery; when it is
    /// not, why (the body's `code`, or its absence).
    fn judge(self, status: reqwest::StatusCode, body: &str) -> Result<(), String> {
        let code = serde_json::from_str::<serde_json::Value>(body)
            .ok()
            .and_then(|v| v.get("code").cloned());
        let code_is_zero = || match &code {
            Some(c) if c.as_i64() == Some(0) || c.as_str() == Some("0") => Ok(()),
            Some(c) => Err(format!("HTTP {status}, answered code {c}")),
            None => Err(format!(
                "HTTP {status} without a JSON `code` (success rule {})",
                self.as_str()
            )),
        };
        match self {
            Self::TwoXx if !status.is_success() => Err(format!("HTTP {status}")),
            Self::TwoXx if code.is_none() => Ok(()),
            Self::TwoXx => code_is_zero(),
            Self::TwoXxAndCode if !status.is_success() => Err(format!("HTTP {status}")),
            Self::TwoXxAndCode | Self::Code => code_is_zero(),
        }
    }
}

/// A 4xx the downstream will answer again, whatever the retry: the record
/// is refused for good (408 Request Timeout and 429 Too Many Requests are
/// about the moment, not the record, and retry).
fn is_rejection(status: reqwest::StatusCode) -> bool {
    status.is_client_error() && !matches!(status.as_u16(), 408 | 429)
}

/// At most `max` bytes of `text`, cut at a character boundary.
fn prefix(text: &str, max: usize) -> &str {
    let mut end = text.len().min(max);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

fn default_method() -> String {
    "POST".into()
}
fn default_timeout() -> u64 {
    5_000
}
fn default_channel() -> String {
    "orderpipe".into()
}
fn default_enabled() -> bool {
    true
}
fn default_in_flight() -> usize {
    DEFAULT_IN_FLIGHT
}

/// The `[http]` settings.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HttpSettings {
    /// Declared subscriptions.
    #[serde(default)]
    pub subscriptions: Vec<Subscription>,
}

impl HttpSettings {
    /// Checks every subscription ([`Subscription::validate`]).
    pub fn validate(&self) -> Result<(), String> {
        self.subscriptions
            .iter()
            .try_for_each(Subscription::validate)
    }

    /// Every subscription's schedule for its default group resolves over `retry`.
    pub fn validate_retry(&self, retry: &RetrySettings) -> Result<(), String> {
        self.subscriptions
            .iter()
            .try_for_each(|s| s.retry_policy(retry, &default_group(&s.name)).map(drop))
    }
}

impl Subscription {
    /// Whether `event_name` matches one of the patterns.
    pub fn matches(&self, event_name: &str) -> bool {
        self.events.iter().any(|p| glob(p, event_name))
    }

    /// Checks the values; the message names the field.
    pub fn validate(&self) -> Result<(), String> {
        let field = |f: &str| format!("http.subscriptions[{}].{f}", self.name);
        if !self.url.starts_with("http://") && !self.url.starts_with("https://") {
            return Err(format!(
                "{}: `{}` is not an http(s) URL",
                field("url"),
                self.url
            ));
        }
        if !matches!(self.method.as_str(), "POST" | "PUT") {
            return Err(format!(
                "{}: `{}` is not one of POST, PUT",
                field("method"),
                self.method
            ));
        }
        if self.events.is_empty() {
            return Err(format!(
                "{}: name at least one event pattern, e.g. \"order.*\"",
                field("events")
            ));
        }
        if !IN_FLIGHT_RANGE.contains(&self.in_flight) {
            return Err(format!(
                "{}: {} is out of range: accepted {} to {}",
                field("in_flight"),
                self.in_flight,
                IN_FLIGHT_RANGE.start(),
                IN_FLIGHT_RANGE.end()
            ));
        }
        self.retry_layer()?
            .check(&field("retry"))
            .map_err(|e| e.to_string())
    }

    /// The subscription's retry layer: `retry`, with `retry_profile` as its
    /// profile (setting both is refused, naming both).
    pub fn retry_layer(&self) -> Result<RetryLayer, String> {
        let mut layer = self.retry.clone().unwrap_or_default();
        if let Some(profile) = &self.retry_profile {
            if layer.profile.is_some() || layer.delays.is_some() {
                let other = if layer.profile.is_some() {
                    "retry.profile"
                } else {
                    "retry.delays"
                };
                return Err(format!(
                    "http.subscriptions[{0}].retry_profile and http.subscriptions[{0}].{other}: both set; \
                     keep one (retry_profile is the older spelling of retry.profile)",
                    self.name
                ));
            }
            layer.profile = Some(profile.clone());
        }
        Ok(layer)
    }

    /// The layer `deliver` puts on top of its group's
    /// ([`RetrySettings::top`]): the path naming it in errors, and [`Subscription::retry_layer`].
    pub fn retry_top(&self) -> Result<(String, RetryLayer), String> {
        Ok((
            format!("http.subscriptions[{}].retry", self.name),
            self.retry_layer()?,
        ))
    }

    /// The schedule of this subscription's `group`: `[retry]`, the
    /// group's layer, then the subscription's.
    pub fn retry_policy(&self, retry: &RetrySettings, group: &str) -> Result<RetryPolicy, String> {
        let (prefix, layer) = self.retry_top()?;
        retry
            .policy_with(group, Some((&prefix, &layer)))
            .map_err(|e| e.to_string())
    }
}

/// `*` matches any run of characters (dots included).
fn glob(pattern: &str, text: &str) -> bool {
    let parts: Vec<&str> = pattern.split('*').collect();
    if parts.len() == 1 {
        return pattern == text;
    }
    let (first, last) = (parts[0], parts[parts.len() - 1]);
    if !text.starts_with(first) || !text[first.len()..].ends_with(last) {
        return false;
    }
    let mut rest = &text[first.len()..text.len() - last.len()];
    for middle in &parts[1..parts.len() - 1] {
        match rest.find(middle) {
            Some(i) => rest = &rest[i + middle.len()..],
            None => return false,
        }
    }
    true
}

/// The consumer group `orderpipe deliver --subscription NAME` runs as
/// unless `--group` says otherwise.
pub fn default_group(subscription: &str) -> String {
    format!("http.{subscription}")
}

/// The subscription `name` of the `[http]` settings.
pub fn find(http: &HttpSettings, name: &str) -> Result<Subscription, String> {
    let found = http.subscriptions.iter().find(|s| s.name == name).cloned();
    let known: Vec<&str> = http.subscriptions.iter().map(|s| s.name.as_str()).collect();
    let subscription = found.ok_or_else(|| {
        format!(
            "--subscription: no subscription `{name}` in [[http.subscriptions]]; declared: {}",
            if known.is_empty() {
                "none".to_string()
            } else {
                known.join(", ")
            }
        )
    })?;
    subscription.validate()?;
    Ok(subscription)
}

/// The HTTP delivery handler of one subscription.
pub struct HttpDelivery {
    subscription: Arc<RwLock<Subscription>>,
    client: reqwest::Client,
}

impl HttpDelivery {
    /// A handler delivering to `subscription`; keep the returned handle to reload it.
    pub fn new(subscription: Subscription) -> (Self, Arc<RwLock<Subscription>>) {
        let shared = Arc::new(RwLock::new(subscription));
        (
            Self {
                subscription: shared.clone(),
                client: http_client(),
            },
            shared,
        )
    }
}

/// The HTTP client of the deliveries (no proxy from the environment).
pub fn http_client() -> reqwest::Client {
    reqwest::Client::builder()
        .no_proxy()
        .build()
        .expect("HTTP client builds")
}

/// Where and how one change is delivered.
#[derive(Debug, Clone, Copy)]
pub struct Endpoint<'a> {
    /// URL.
    pub url: &'a str,
    /// `POST` or `PUT` (anything else is sent as POST).
    pub method: &'a str,
    /// Per-request timeout.
    pub timeout_ms: u64,
    /// `channel_id` in the body.
    pub channel_id: &'a str,
    /// Which answers are deliveries.
    pub success: SuccessRule,
}

/// Delivers `envelope` to `endpoint` as `{request_id, channel_id,
/// event_type, data, old, timestamp}` (`data`/`old`: a row change's row and
/// previous values, an order event's payload and null), with the event id as
/// `Idempotency-Key` and the trace context in `traceparent`. An answer the
/// endpoint's [`SuccessRule`] accepts is [`Effect::Applied`]; a 4xx other
/// than 408 and 429 is [`HandlerError::Rejected`] (the status and up to
/// 1 KB of the body); anything else, or a timeout, a retryable failure.
/// Every error names the endpoint.
pub async fn post(
    client: &reqwest::Client,
    endpoint: Endpoint<'_>,
    envelope: &Envelope,
) -> Result<Effect, HandlerError> {
    let event_id = envelope.event_id.to_string();
    let (data, old) = envelope.data.data_and_old();
    let body = json!({
        "request_id": event_id,
        "channel_id": endpoint.channel_id,
        "event_type": envelope.event_name.as_str(),
        "data": data,
        "old": old,
        "timestamp": envelope.event_time.timestamp(),
    });
    let method =
        reqwest::Method::from_bytes(endpoint.method.as_bytes()).unwrap_or(reqwest::Method::POST);
    let fail = |what: String| {
        HandlerError::Retryable(format!("{} {}: {what}", endpoint.method, endpoint.url))
    };
    let response = client
        .request(method, endpoint.url)
        .timeout(Duration::from_millis(endpoint.timeout_ms))
        .header("Idempotency-Key", &event_id)
        .header("X-Request-Id", &event_id)
        .header("traceparent", envelope.traceparent())
        .json(&body)
        .send()
        .await
        .map_err(|e| {
            if e.is_timeout() {
                fail(format!("no answer within {} ms", endpoint.timeout_ms))
            } else if e.is_connect() {
                fail("connection refused or unreachable".into())
            } else {
                fail(e.to_string())
            }
        })?;
    let status = response.status();
    let retry_after = matches!(status.as_u16(), 429 | 503)
        .then(|| response.headers().get(reqwest::header::RETRY_AFTER))
        .flatten()
        .and_then(|v| v.to_str().ok())
        .and_then(|v| parse_retry_after(v, chrono::Utc::now()));
    let text = response.text().await.unwrap_or_default();
    match endpoint.success.judge(status, &text) {
        Ok(()) => Ok(Effect::Applied),
        Err(why) if is_rejection(status) && endpoint.success != SuccessRule::Code => {
            Err(HandlerError::Rejected(format!(
                "{} {}: {why}: {}",
                endpoint.method,
                endpoint.url,
                prefix(&text, 1024)
            )))
        }
        Err(why) => {
            let reason = format!(
                "{} {}: {why}: {}",
                endpoint.method,
                endpoint.url,
                prefix(&text, 200)
            );
            Err(match retry_after {
                Some(after) => HandlerError::RetryAfter { reason, after },
                None => HandlerError::Retryable(reason),
            })
        }
    }
}

/// A `Retry-After` value: delta-seconds (`120`) or an HTTP-date (`Wed, 21
/// Oct 2015 07:28:00 GMT`, how long from `now`; a date past is zero). None
/// when it is neither (the schedule's delay applies then).
fn parse_retry_after(value: &str, now: chrono::DateTime<chrono::Utc>) -> Option<Duration> {
    let value = value.trim();
    if let Ok(secs) = value.parse::<u64>() {
        return Some(Duration::from_secs(secs));
    }
    let at = chrono::DateTime::parse_from_rfc2822(value).ok()?;
    Some(
        (at.with_timezone(&chrono::Utc) - now)
            .to_std()
            .unwrap_or_default(),
    )
}

#[async_trait]
impl Handler for HttpDelivery {
    fn name(&self) -> &'static str {
        "http"
    }

    /// Major 1 of the events it delivers; a new major of an event outside
    /// the subscription does not stop it.
    fn supported_majors(&self, event_name: &EventName) -> &[u32] {
        let sub = self.subscription.read().expect("subscription lock");
        if sub.enabled && sub.matches(event_name.as_str()) {
            MAJOR_1
        } else {
            &[]
        }
    }

    fn acts_outside(&self) -> bool {
        true
    }

    /// Never called by the worker (the POST runs in `apply_outside`, with no
    /// transaction open).
    async fn apply(&self, _: &mut Tx, _: &Envelope) -> Result<Effect, HandlerError> {
        Err(HandlerError::Fatal(OUTSIDE_ONLY.into()))
    }

    async fn apply_outside(&self, events: &[&Envelope]) -> Vec<EventResult> {
        // A snapshot: a reload during these deliveries does not change them.
        let sub = self.subscription.read().expect("subscription lock").clone();
        let endpoint = Endpoint {
            url: &sub.url,
            method: &sub.method,
            timeout_ms: sub.timeout_ms,
            channel_id: &sub.channel_id,
            success: sub.success,
        };
        let deliver =
            |envelope: &Envelope| sub.enabled && sub.matches(envelope.event_name.as_str());
        post_all(&self.client, endpoint, events, sub.in_flight, deliver).await
    }
}

/// What an HTTP handler's in-transaction `apply` answers: it acts outside
/// the database only.
pub(crate) const OUTSIDE_ONLY: &str =
    "an HTTP delivery runs outside the database transaction (Handler::apply_outside)";

/// [`post`]s the `events` (of distinct keys) that `deliver` accepts, up to
/// `in_flight` at once; the others are [`Effect::Ignored`]. One result per
/// event, in order.
pub async fn post_all(
    client: &reqwest::Client,
    endpoint: Endpoint<'_>,
    events: &[&Envelope],
    in_flight: usize,
    deliver: impl Fn(&Envelope) -> bool,
) -> Vec<EventResult> {
    use futures::stream::{self, StreamExt};
    let mut calls = Vec::with_capacity(events.len());
    for &envelope in events {
        let wanted = deliver(envelope);
        calls.push(async move {
            if wanted {
                post(client, endpoint, envelope).await
            } else {
                Ok(Effect::Ignored)
            }
        });
    }
    stream::iter(calls)
        .buffered(in_flight.max(1))
        .collect()
        .await
}

/// Reloads `subscription` with `reload` (which reads the config file
/// `path`) on SIGHUP and whenever that file changes (checked every 2 s).
/// Runs until the process ends.
pub fn watch(
    path: PathBuf,
    subscription: Arc<RwLock<Subscription>>,
    reload: impl Fn() -> Result<Subscription, String> + Send + 'static,
) {
    let name = subscription.read().expect("subscription lock").name.clone();
    tokio::spawn(async move {
        let modified = |p: &PathBuf| std::fs::metadata(p).and_then(|m| m.modified()).ok();
        let mut seen = modified(&path);
        #[cfg(unix)]
        let mut hup = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()).ok();
        loop {
            #[cfg(unix)]
            let signalled = async {
                match hup.as_mut() {
                    Some(h) => {
                        h.recv().await;
                    }
                    None => std::future::pending::<()>().await,
                }
            };
            #[cfg(not(unix))]
            let signalled = std::future::pending::<()>();
            tokio::select! {
                _ = signalled => {}
                _ = tokio::time::sleep(Duration::from_secs(2)) => {
                    let now = modified(&path);
                    if now == seen {
                        continue;
                    }
                    seen = now;
                }
            }
            match reload() {
                Ok(fresh) => {
                    let mut current = subscription.write().expect("subscription lock");
                    if *current != fresh {
                        tracing::info!(subscription = %name, url = %fresh.url, enabled = fresh.enabled, "subscription reloaded");
                        *current = fresh;
                    }
                }
                Err(e) => {
                    tracing::error!(subscription = %name, error = %e, "subscription not reloaded; keeping the previous one")
                }
            }
        }
    });
}

#[cfg(test)]
// figment::Jail's closures return figment::Error, whose size is figment's choice.
#[allow(clippy::result_large_err)]
mod tests {
    use super::*;

    #[test]
    fn success_rules_judge_status_and_code() {
        use SuccessRule::*;
        let ok = |rule: SuccessRule, status: u16, body: &str| {
            rule.judge(reqwest::StatusCode::from_u16(status).unwrap(), body)
                .is_ok()
        };
        for (status, body) in [
            (200, ""),
            (204, ""),
            (200, "{}"),
            (202, "accepted"),
            (201, r#"{"code": 0}"#),
            (200, r#"{"code": "0"}"#),
        ] {
            assert!(ok(TwoXx, status, body), "2xx: {status} {body:?}");
        }
        for (status, body) in [
            (200, r#"{"code": 1}"#),
            (500, r#"{"code": 0}"#),
            (301, ""),
            (429, ""),
        ] {
            assert!(!ok(TwoXx, status, body), "2xx: {status} {body:?}");
        }
        assert!(
            ok(TwoXxAndCode, 200, r#"{"code": 0}"#)
                && !ok(TwoXxAndCode, 204, "")
                && !ok(TwoXxAndCode, 200, "{}")
        );
        assert!(
            ok(Code, 500, r#"{"code": 0}"#)
                && !ok(Code, 200, "{}")
                && !ok(Code, 200, r#"{"code": 3}"#)
        );
        assert!(
            is_rejection(reqwest::StatusCode::BAD_REQUEST)
                && is_rejection(reqwest::StatusCode::GONE)
        );
        assert!(
            !is_rejection(reqwest::StatusCode::REQUEST_TIMEOUT)
                && !is_rejection(reqwest::StatusCode::TOO_MANY_REQUESTS)
        );
        assert!(!is_rejection(reqwest::StatusCode::SERVICE_UNAVAILABLE));
        for name in SuccessRule::NAMES {
            assert_eq!(SuccessRule::parse("f", name).unwrap().as_str(), name);
        }
        let e = SuccessRule::parse("http.subscriptions[crm].success", "200").unwrap_err();
        assert!(
            e.contains("http.subscriptions[crm].success") && e.contains("2xx, 2xx-and-code, code"),
            "{e}"
        );
        assert_eq!(prefix("añb", 2), "a", "cut at a character boundary");
    }

    #[test]
    fn retry_after_reads_seconds_and_http_dates() {
        let now = chrono::DateTime::parse_from_rfc3339("2015-10-21T07:27:30Z")
            .unwrap()
            .with_timezone(&chrono::Utc);
        assert_eq!(parse_retry_after(" 2 ", now), Some(Duration::from_secs(2)));
        assert_eq!(
            parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT", now),
            Some(Duration::from_secs(30))
        );
        assert_eq!(
            parse_retry_after("Wed, 21 Oct 2015 07:00:00 GMT", now),
            Some(Duration::ZERO),
            "a date past: at once (the schedule's floor applies)"
        );
        assert_eq!(parse_retry_after("soon", now), None);
        assert_eq!(parse_retry_after("-3", now), None);
    }

    #[test]
    fn patterns_match_event_names() {
        assert!(glob("order.*", "order.payment.succeeded"));
        assert!(glob("order.payment.succeeded", "order.payment.succeeded"));
        assert!(!glob("order.payment.succeeded", "order.payment.failed"));
        assert!(glob("*.refunded", "order.refunded"));
        assert!(glob("order.*.succeeded", "order.payment.succeeded"));
        assert!(!glob("inventory.*", "order.created"));
    }

    #[test]
    fn a_subscriptions_retry_layers_over_its_group_and_names_its_fields() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.toml");
        let write = |subscription_retry: &str| {
            std::fs::write(
                &path,
                format!(
                    "[retry]\nprofile = \"10s-1m-5m\"\n[retry.groups.\"crm.order.consumer\"]\njitter = 0.1\n\
                     [[http.subscriptions]]\nname = \"crm\"\nevents = [\"order.*\"]\nurl = \"http://crm/hooks\"\n{subscription_retry}\n"
                ),
            )
            .unwrap();
        };
        figment::Jail::expect_with(|_| {
            write("retry = {delays = [\"5s\", \"30s\", \"5m\"]}");
            let settings = crate::config::Settings::load(Some(&path)).unwrap();
            let crm = find(&settings.http, "crm").unwrap();
            let policy = crm
                .retry_policy(&settings.retry, "crm.order.consumer")
                .unwrap();
            assert_eq!(
                policy.delays,
                [5, 30, 300].map(Duration::from_secs),
                "the subscription's list over 10s-1m-5m"
            );
            assert_eq!(policy.jitter, 0.1, "the group's jitter stays");
            // Without a retry table: the [retry] layers decide (10s-1m-5m here).
            write("");
            let settings = crate::config::Settings::load(Some(&path)).unwrap();
            let crm = find(&settings.http, "crm").unwrap();
            assert_eq!(
                crm.retry_policy(&settings.retry, "http.crm")
                    .unwrap()
                    .delays,
                [10, 60, 300].map(Duration::from_secs)
            );
            write("retry_profile = \"seed003\""); // an older name still works
            let settings = crate::config::Settings::load(Some(&path)).unwrap();
            let crm = find(&settings.http, "crm").unwrap();
            assert_eq!(
                crm.retry_policy(&settings.retry, "http.crm")
                    .unwrap()
                    .delays,
                [5, 30, 300].map(Duration::from_secs)
            );
            for (retry, want) in [
                (
                    "retry_profile = \"5s-30s-5m\"\nretry = {delays = [\"1s\"]}",
                    "http.subscriptions[crm].retry_profile and http.subscriptions[crm].retry.delays: both set",
                ),
                (
                    "retry = {delays = [\"1 minute\"]}",
                    "http.subscriptions[crm].retry.delays[0]: `1 minute` is not a delay; accepted forms: <n>ms, <n>s, <n>m or <n>h",
                ),
                (
                    "retry = {jitter = 2}",
                    "http.subscriptions[crm].retry.jitter: 2 is outside 0 to 1",
                ),
                (
                    "retry = {attempts = 5, profile = \"10s-30s-1m-5m\"}",
                    "http.subscriptions[crm].retry.attempts: profile 10s-30s-1m-5m is a fixed list",
                ),
            ] {
                write(retry);
                let err = crate::config::Settings::load(Some(&path))
                    .unwrap_err()
                    .to_string();
                assert!(err.contains(want), "{retry}: {err}");
            }
            Ok(())
        });
    }

    #[test]
    fn group_keys_with_dots_load_from_toml_and_json() {
        let dir = tempfile::tempdir().unwrap();
        let json = dir.path().join("c.json");
        std::fs::write(&json, r#"{"retry": {"groups": {"inventory-service.order.consumer": {"delays": ["10s", "1m"]}}}}"#).unwrap();
        figment::Jail::expect_with(|_| {
            let settings = crate::config::Settings::load(Some(&json)).unwrap();
            let policy = settings
                .retry
                .policy_for("inventory-service.order.consumer")
                .unwrap();
            assert_eq!(
                policy.delays,
                [Duration::from_secs(10), Duration::from_secs(60)]
            );
            assert_eq!(
                settings
                    .retry
                    .policy_for("other.order.consumer")
                    .unwrap()
                    .delays
                    .len(),
                5,
                "other groups: default"
            );
            Ok(())
        });
    }

    #[test]
    fn declares_major_1_of_the_events_it_delivers_only() {
        let subscription: Subscription = serde_json::from_str(
            r#"{"name": "crm", "events": ["order.payment.*"], "url": "http://127.0.0.1:1/"}"#,
        )
        .unwrap();
        let (handler, _) = HttpDelivery::new(subscription);
        let name = |n: &str| EventName::parse(n).unwrap();
        assert_eq!(
            handler.supported_majors(&name("order.payment.succeeded")),
            MAJOR_1
        );
        assert!(handler.supported_majors(&name("order.created")).is_empty());
    }
}
