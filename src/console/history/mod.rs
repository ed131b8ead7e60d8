//! `/history`: the last hour or 24 hours of each group's lag, applied/s,
//! failure rate, dead-letter inflow and parked keys, as charts drawn on the
//! server. `/history?group=G` is one group's page (the overview's cards
//! link to it); `&window=24h` the day; `&format=json` the points with the
//! query and range they came from.
//!
//! | module | what it is |
//! |---|---|
//! | [`source`] | the figures, their units and PromQL, the window, and Prometheus's `query_range` |
//! | [`sampler`] | the console's own samples (`console_samples`), one per group per `console.sample_interval_secs`, kept a day |
//! | [`chart`] | one chart as SVG |
//!
//! The points come from Prometheus when `console.prometheus_url` is set
//! (the Prometheus that scrapes the pods, so the history outlives the
//! console), else from the console's own samples ([`read`]).

pub mod chart;
pub mod sampler;
pub mod source;

use askama::Template;
use axum::Router;
use axum::extract::{Query, State};
use axum::response::{IntoResponse, Json, Response};
use axum::routing::get;
use serde::Deserialize;
use serde_json::json;

use super::auth::Principal;
use super::{Chrome, ConsoleError, ConsoleState, Page};
use source::{History, Metric, Range, Window};

/// The history page.
pub const PAGE: Page = Page {
    routes,
    nav: Some(("History", "/history")),
    actions: &[],
};

fn routes() -> Router<ConsoleState> {
    Router::new().route("/history", get(show))
}

/// `?group=&window=1h|24h&format=html|json`.
#[derive(Debug, Default, Deserialize)]
struct HistoryQuery {
    group: Option<String>,
    window: Option<String>,
    format: Option<String>,
}

/// A chart as the page shows it.
struct ChartView {
    title: &'static str,
    unit: &'static str,
    svg: String,
    /// Each group's colour and its last value.
    legend: Vec<(String, &'static str, String)>,
}

#[derive(Template)]
#[template(path = "history.html")]
struct HistoryPage {
    chrome: Chrome,
    group: Option<String>,
    window: &'static str,
    source: String,
    charts: Vec<ChartView>,
}

/// Reads every chart of `range`, for `group` only when given: the five
/// queries at once, so the page waits for the slowest, not their sum.
pub async fn read(
    state: &ConsoleState,
    range: Range,
    group: Option<&str>,
) -> Result<Vec<History>, ConsoleError> {
    let chart = |metric: Metric| async move {
        let (query, mut series) = match &state.settings().console.prometheus_url {
            Some(url) => (
                metric.promql().to_string(),
                source::query_range(url, metric.promql(), range).await?,
            ),
            None => (
                format!("console_samples.{}", metric.column()),
                sampler::read(state.db(), metric, range, group).await?,
            ),
        };
        series.retain(|s| group.is_none_or(|g| s.group == g));
        Ok::<_, ConsoleError>(History {
            metric,
            query,
            series,
        })
    };
    futures::future::try_join_all(Metric::ALL.into_iter().map(chart)).await
}

async fn show(
    State(state): State<ConsoleState>,
    principal: Principal,
    Query(q): Query<HistoryQuery>,
) -> Result<Response, ConsoleError> {
    let window = Window::parse(q.window.as_deref())?;
    let range = window.range(crate::clock::now_ms());
    let group = q.group.filter(|g| !g.is_empty());
    let charts = read(&state, range, group.as_deref()).await?;
    let source = match &state.settings().console.prometheus_url {
        Some(url) => format!(
            "Prometheus at {url} (query_range, a point every {} s)",
            range.step_secs
        ),
        None => format!(
            "the console's own samples (console_samples), one every {} s",
            state.settings().console.sample_interval_secs
        ),
    };
    match q.format.as_deref().unwrap_or("html") {
        "json" => {
            Ok(Json(json!({"source": source, "range": range, "charts": charts})).into_response())
        }
        "html" => {
            let views = charts
                .iter()
                .map(|h| ChartView {
                    title: h.metric.title(),
                    unit: h.metric.unit(),
                    svg: chart::svg(h, range),
                    legend: h
                        .series
                        .iter()
                        .enumerate()
                        .map(|(i, s)| {
                            let last = s
                                .points
                                .last()
                                .map_or_else(|| "-".to_string(), |(_, v)| chart::short(*v));
                            (s.group.clone(), chart::color(i), last)
                        })
                        .collect(),
                })
                .collect();
            let title = group.as_deref().map_or_else(
                || "History of every group".to_string(),
                |g| format!("History of {g}"),
            );
            Ok(super::render(&HistoryPage {
                chrome: state.chrome(&principal, &title, "/history"),
                group,
                window: window.as_str(),
                source,
                charts: views,
            })?
            .into_response())
        }
        other => Err(ConsoleError::bad_input(
            "format",
            format!("`{other}` is not a format; accepted: html, json"),
        )),
    }
}
