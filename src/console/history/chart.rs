//! One chart as SVG, drawn on the server (no script, no font files): a
//! line per group over the window, the unit above the value axis, the
//! times in UTC under the time axis. It scales to its container (a
//! `viewBox`, no fixed size), and its text is sized for a phone's width,
//! where a 400-unit chart shrinks to about four fifths (15-unit text reads
//! as 12 px), and grows to at most 480 px on a desktop. Group names are
//! not in the SVG: the page's legend names them beside [`color`].

use std::fmt::Write;

use super::source::{History, Range};

/// The drawing's size, in SVG units.
const WIDTH: f64 = 400.0;
const HEIGHT: f64 = 200.0;
/// The plot's margins: value labels on the left, the unit on top, times below.
const LEFT: f64 = 46.0;
const RIGHT: f64 = 14.0;
const TOP: f64 = 26.0;
const BOTTOM: f64 = 30.0;

/// Okabe and Ito's palette: told apart with every common colour-vision deficiency.
const PALETTE: [&str; 8] = [
    "#0072b2", "#d55e00", "#009e73", "#cc79a7", "#e69f00", "#56b4e9", "#000000", "#f0e442",
];

/// The colour of the `index`-th series (the legend uses it too).
pub fn color(index: usize) -> &'static str {
    PALETTE[index % PALETTE.len()]
}

/// The SVG of `history` over `range`.
pub fn svg(history: &History, range: Range) -> String {
    let (start_ms, end_ms) = (range.start_secs * 1000, range.end_secs * 1000);
    let max = history
        .series
        .iter()
        .flat_map(|s| s.points.iter().map(|p| p.1))
        .fold(0.0_f64, f64::max);
    let (top, step) = value_axis(max);
    let plot_w = WIDTH - LEFT - RIGHT;
    let plot_h = HEIGHT - TOP - BOTTOM;
    let x = |ms: i64| LEFT + plot_w * (ms - start_ms) as f64 / (end_ms - start_ms).max(1) as f64;
    let y = |v: f64| TOP + plot_h * (1.0 - v / top);
    let metric = history.metric;
    let mut out = String::new();
    let _ = write!(
        out,
        r#"<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {WIDTH} {HEIGHT}" role="img" aria-label="{} in {}, times in UTC" font-family="sans-serif" font-size="15">"#,
        metric.title(),
        metric.unit()
    );
    let _ = write!(
        out,
        r##"<text x="4" y="16" fill="#555">{}</text>"##,
        metric.unit()
    );
    // Value axis: gridlines and labels.
    let mut v = 0.0;
    while v <= top + step / 2.0 {
        let _ = write!(
            out,
            r##"<line x1="{LEFT}" x2="{}" y1="{y:.1}" y2="{y:.1}" stroke="#ddd"/><text x="{}" y="{:.1}" text-anchor="end" fill="#333">{}</text>"##,
            WIDTH - RIGHT,
            LEFT - 4.0,
            y(v) + 4.0,
            short(v),
            y = y(v),
        );
        v += step;
    }
    // Time axis: a tick every 10 minutes (an hour) or 4 hours (a day), in UTC.
    let tick_ms: i64 = if end_ms - start_ms <= 3_600_000 {
        600_000
    } else {
        4 * 3_600_000
    };
    let mut t = start_ms.div_euclid(tick_ms) * tick_ms + tick_ms;
    while t <= end_ms {
        let label = chrono::DateTime::from_timestamp_millis(t)
            .map(|d| d.format("%H:%M").to_string())
            .unwrap_or_default();
        let _ = write!(
            out,
            r##"<line x1="{x:.1}" x2="{x:.1}" y1="{TOP}" y2="{}" stroke="#eee"/><text x="{x:.1}" y="{}" text-anchor="middle" fill="#333">{label}</text>"##,
            HEIGHT - BOTTOM,
            HEIGHT - BOTTOM + 18.0,
            x = x(t),
        );
        t += tick_ms;
    }
    let _ = write!(
        out,
        r##"<text x="{}" y="{}" text-anchor="end" fill="#555">UTC</text>"##,
        WIDTH - RIGHT,
        HEIGHT - 1.0
    );
    let _ = write!(
        out,
        r##"<rect x="{LEFT}" y="{TOP}" width="{plot_w}" height="{plot_h}" fill="none" stroke="#999"/>"##
    );
    // A line per group, broken where samples are missing.
    let gap_ms = range.step_secs * 1000 * 5 / 2;
    for (i, series) in history.series.iter().enumerate() {
        for run in runs(&series.points, gap_ms) {
            let points: Vec<String> = run
                .iter()
                .map(|(ms, v)| format!("{:.1},{:.1}", x(*ms), y(*v)))
                .collect();
            let _ = match run.len() {
                1 => write!(
                    out,
                    r#"<circle cx="{:.1}" cy="{:.1}" r="2.5" fill="{}"/>"#,
                    x(run[0].0),
                    y(run[0].1),
                    color(i)
                ),
                _ => write!(
                    out,
                    r#"<polyline points="{}" fill="none" stroke="{}" stroke-width="2"/>"#,
                    points.join(" "),
                    color(i)
                ),
            };
        }
    }
    if history.series.iter().all(|s| s.points.is_empty()) {
        let _ = write!(
            out,
            r##"<text x="{}" y="{}" text-anchor="middle" fill="#555">no data in this window</text>"##,
            LEFT + plot_w / 2.0,
            TOP + plot_h / 2.0
        );
    }
    out.push_str("</svg>");
    out
}

/// The runs of `points` with no gap longer than `gap_ms`.
fn runs(points: &[(i64, f64)], gap_ms: i64) -> Vec<&[(i64, f64)]> {
    let mut runs = Vec::new();
    let mut from = 0;
    for i in 1..=points.len() {
        if i == points.len() || points[i].0 - points[i - 1].0 > gap_ms {
            if i > from {
                runs.push(&points[from..i]);
            }
            from = i;
        }
    }
    runs
}

/// The value axis's top and step: four steps of 1, 2 or 5 times a power of ten.
fn value_axis(max: f64) -> (f64, f64) {
    if max <= 0.0 {
        return (1.0, 0.25);
    }
    let rough = max / 4.0;
    let power = 10f64.powf(rough.log10().floor());
    let step = [1.0, 2.0, 5.0, 10.0]
        .into_iter()
        .map(|m| m * power)
        .find(|s| *s >= rough)
        .unwrap_or(10.0 * power);
    ((max / step).ceil() * step, step)
}

/// `1.5k`, `12M`, `0.25`, `40`.
pub(crate) fn short(v: f64) -> String {
    let trim = |s: String| {
        if s.contains('.') {
            s.trim_end_matches('0').trim_end_matches('.').to_string()
        } else {
            s
        }
    };
    match v.abs() {
        a if a >= 1e6 => format!("{}M", trim(format!("{:.1}", v / 1e6))),
        a if a >= 1e3 => format!("{}k", trim(format!("{:.1}", v / 1e3))),
        a if a >= 10.0 || a == 0.0 => format!("{v:.0}"),
        _ => trim(format!("{v:.2}")),
    }
}

#[cfg(test)]
mod tests {
    use super::super::source::{Metric, Series};
    use super::*;

    #[test]
    fn the_value_axis_covers_the_largest_value_in_round_steps() {
        assert_eq!(value_axis(0.0), (1.0, 0.25));
        assert_eq!(value_axis(7.0), (8.0, 2.0));
        assert_eq!(value_axis(1_234.0), (1_500.0, 500.0));
        let (top, step) = value_axis(0.3);
        assert!((top - 0.3).abs() < 1e-9 && (step - 0.1).abs() < 1e-9);
        assert_eq!(
            [short(1_500.0), short(2e6), short(0.25), short(40.0)],
            ["1.5k", "2M", "0.25", "40"]
        );
    }

    #[test]
    fn a_gap_breaks_the_line_and_an_empty_chart_says_so() {
        let points = [(0, 1.0), (30_000, 2.0), (300_000, 3.0)];
        assert_eq!(runs(&points, 75_000).len(), 2);
        let range = Range {
            start_secs: 0,
            end_secs: 3_600,
            step_secs: 30,
        };
        let mut history = History {
            metric: Metric::Lag,
            query: String::new(),
            series: vec![Series {
                group: "g".into(),
                points: points.to_vec(),
            }],
        };
        let svg = svg(&history, range);
        assert_eq!(svg.matches("<polyline").count(), 1, "{svg}");
        assert_eq!(svg.matches("<circle").count(), 1, "{svg}");
        assert!(svg.contains(">records<") && svg.contains(">UTC<") && svg.contains(">00:10<"));
        history.series.clear();
        assert!(super::svg(&history, range).contains("no data in this window"));
    }
}
