//! What a chart shows ([`Metric`], its PromQL and its unit), over which
//! [`Window`], and the points Prometheus's `query_range` answers for it
//! ([`query_range`]), for a console with `console.prometheus_url`.

use serde::Serialize;
use serde_json::Value;

use crate::console::ConsoleError;

/// One charted figure of a group.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Metric {
    /// Records behind, summed over the group's partitions.
    Lag,
    /// Events applied per second.
    Applied,
    /// Dead-lettered share of the outcomes.
    FailureRate,
    /// Records dead-lettered per minute.
    DeadLetterInflow,
    /// Keys parked behind a failed record.
    ParkedKeys,
}

impl Metric {
    /// Every chart, in page order.
    pub const ALL: [Metric; 5] = [
        Metric::Lag,
        Metric::Applied,
        Metric::FailureRate,
        Metric::DeadLetterInflow,
        Metric::ParkedKeys,
    ];

    /// The chart's title.
    pub fn title(self) -> &'static str {
        match self {
            Metric::Lag => "Lag",
            Metric::Applied => "Applied",
            Metric::FailureRate => "Failure rate",
            Metric::DeadLetterInflow => "Dead-letter inflow",
            Metric::ParkedKeys => "Parked keys",
        }
    }

    /// The unit of its values.
    pub fn unit(self) -> &'static str {
        match self {
            Metric::Lag => "records",
            Metric::Applied => "events/s",
            Metric::FailureRate => "%",
            Metric::DeadLetterInflow => "dead letters/min",
            Metric::ParkedKeys => "keys",
        }
    }

    /// The PromQL of the series, one per `group`, over the metrics the
    /// members and the DLQ persister export (docs/operations.md). The lag
    /// is the members' own export, else the persister's broker-side one
    /// (a group with no member left).
    pub fn promql(self) -> &'static str {
        match self {
            Metric::Lag => {
                "sum by (group) (orderpipe_consumer_lag_records) or sum by (group) (orderpipe_group_lag_records)"
            }
            Metric::Applied => "sum by (group) (rate(orderpipe_applied_records_total[1m]))",
            // `or 0 * applied`: a group that applied and never failed has
            // no dead-letter series, and its rate is 0, not "no data".
            Metric::FailureRate => {
                "100 * (sum by (group) (rate(orderpipe_dead_lettered_records_total[5m])) \
                 or 0 * sum by (group) (rate(orderpipe_applied_records_total[5m]))) / \
                 (sum by (group) (rate(orderpipe_applied_records_total[5m])) + \
                 (sum by (group) (rate(orderpipe_dead_lettered_records_total[5m])) \
                 or 0 * sum by (group) (rate(orderpipe_applied_records_total[5m]))))"
            }
            Metric::DeadLetterInflow => {
                "60 * (sum by (group) (rate(orderpipe_dead_lettered_records_total[5m])) \
                 or 0 * sum by (group) (rate(orderpipe_applied_records_total[5m])))"
            }
            Metric::ParkedKeys => "max by (group) (orderpipe_parked_keys)",
        }
    }

    /// Its column of `console_samples`.
    pub(crate) fn column(self) -> &'static str {
        match self {
            Metric::Lag => "lag_records",
            Metric::Applied => "applied_per_sec",
            Metric::FailureRate => "failure_rate_pct",
            Metric::DeadLetterInflow => "dead_letters_per_min",
            Metric::ParkedKeys => "parked_keys",
        }
    }
}

/// The time span a page shows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Window {
    /// The last hour.
    Hour,
    /// The last 24 hours.
    Day,
}

impl Window {
    /// `1h` or `24h`, naming the field and the accepted values otherwise.
    pub fn parse(text: Option<&str>) -> Result<Self, ConsoleError> {
        match text.unwrap_or("1h") {
            "1h" => Ok(Self::Hour),
            "24h" => Ok(Self::Day),
            other => Err(ConsoleError::bad_input(
                "window",
                format!("`{other}` is not a window; accepted: 1h, 24h"),
            )),
        }
    }

    /// As in the query string.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Hour => "1h",
            Self::Day => "24h",
        }
    }

    /// The range ending now: 120 steps of 30 s, or 288 of 5 minutes.
    pub fn range(self, now_ms: i64) -> Range {
        let (span_secs, step_secs) = match self {
            Self::Hour => (3_600, 30),
            Self::Day => (86_400, 300),
        };
        // Ends on a step, so two pages a moment apart draw the same points.
        let end_secs = now_ms / 1000 / step_secs * step_secs;
        Range {
            start_secs: end_secs - span_secs,
            end_secs,
            step_secs,
        }
    }
}

/// The time range of a chart, in seconds since the epoch (Prometheus's units).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Range {
    /// First instant.
    pub start_secs: i64,
    /// Last instant.
    pub end_secs: i64,
    /// Between two points.
    pub step_secs: i64,
}

/// One group's points: (ms since the epoch, value), oldest first.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Series {
    /// The consumer group.
    pub group: String,
    /// Its points.
    pub points: Vec<(i64, f64)>,
}

/// One chart's data.
#[derive(Debug, Clone, Serialize)]
pub struct History {
    /// What it shows.
    pub metric: Metric,
    /// The PromQL, or the `console_samples` column it was read from.
    pub query: String,
    /// One series per group.
    pub series: Vec<Series>,
}

/// Prometheus's `GET /api/v1/query_range` of `promql` over `range`, one
/// series per `group` label (NaN and infinite points left out).
#[tracing::instrument(skip(base))]
pub async fn query_range(
    base: &str,
    promql: &str,
    range: Range,
) -> Result<Vec<Series>, ConsoleError> {
    let params = url::form_urlencoded::Serializer::new(String::new())
        .append_pair("query", promql)
        .append_pair("start", &range.start_secs.to_string())
        .append_pair("end", &range.end_secs.to_string())
        .append_pair("step", &range.step_secs.to_string())
        .finish();
    let url = format!("{}/api/v1/query_range?{params}", base.trim_end_matches('/'));
    let unavailable =
        |why: String| ConsoleError::Unavailable(format!("Prometheus at {base}: {why}"));
    let response = crate::delivery::http_client()
        .get(&url)
        .timeout(std::time::Duration::from_secs(10))
        .send()
        .await
        .map_err(|e| unavailable(e.to_string()))?;
    let status = response.status();
    let body: Value = response
        .json()
        .await
        .map_err(|e| unavailable(format!("{status}, not JSON: {e}")))?;
    if body["status"] != "success" {
        return Err(unavailable(format!("{status}: {}", body["error"])));
    }
    Ok(parse_matrix(&body))
}

/// The series of a `query_range` answer.
fn parse_matrix(body: &Value) -> Vec<Series> {
    let results = body["data"]["result"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let mut series: Vec<Series> = results
        .iter()
        .map(|r| Series {
            group: r["metric"]["group"].as_str().unwrap_or("").to_string(),
            points: r["values"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|p| {
                    let at = p[0].as_f64()?;
                    let value: f64 = p[1].as_str()?.parse().ok()?;
                    value.is_finite().then_some(((at * 1000.0) as i64, value))
                })
                .collect(),
        })
        .collect();
    series.sort_by(|a, b| a.group.cmp(&b.group));
    series
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_matrix_gives_one_series_per_group_without_nan() {
        let body = json!({"status": "success", "data": {"resultType": "matrix", "result": [
            {"metric": {"group": "b"}, "values": [[1700000000, "1.5"], [1700000030, "NaN"]]},
            {"metric": {"group": "a"}, "values": [[1700000000.5, "2"]]},
        ]}});
        assert_eq!(
            parse_matrix(&body),
            vec![
                Series {
                    group: "a".into(),
                    points: vec![(1_700_000_000_500, 2.0)]
                },
                Series {
                    group: "b".into(),
                    points: vec![(1_700_000_000_000, 1.5)]
                },
            ]
        );
    }

    #[test]
    fn a_window_ends_on_a_step_and_a_bad_one_is_named() {
        let r = Window::Hour.range(1_700_000_017_000);
        assert_eq!(
            (r.end_secs % 30, r.end_secs - r.start_secs, r.step_secs),
            (0, 3_600, 30)
        );
        let e = Window::parse(Some("2h")).unwrap_err().to_string();
        assert!(e.contains("window") && e.contains("1h, 24h"), "{e}");
    }
}
