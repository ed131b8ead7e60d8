//! Where a pipeline's time goes, stage by stage. Each timing is a sample of
//! a histogram metric (`<metric>{stage="..."}`) for the dashboards, and is
//! counted (in bounded memory) so that a run's summary can say p50 / p99 per stage: the
//! polling relay's claim, encode, produce, commit and mark, and `cdc`'s
//! gather, encode, produce and commit.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::Instant;

use serde::Serialize;

/// Batch times a run's summary keeps per stage: its percentiles come from
/// a uniform sample of this many batches (every batch while there are
/// fewer); count, mean and max are exact. Bounded, as `cdc` runs for months.
const MAX_SAMPLES: usize = 16_384;

/// Milliseconds one pipeline stage took per batch, over a run.
#[derive(Debug, Default, Clone, Serialize)]
pub struct StageTimes {
    /// Batches timed.
    pub count: u64,
    /// Mean.
    pub mean: f64,
    /// Median.
    pub p50: f64,
    /// 99th percentile.
    pub p99: f64,
    /// Longest.
    pub max: f64,
}

impl StageTimes {
    /// The figures of `samples` (milliseconds, any order).
    pub fn of(samples: &mut [f64]) -> Self {
        if samples.is_empty() {
            return Self::default();
        }
        samples.sort_unstable_by(f64::total_cmp);
        // Nearest rank: the smallest sample with at least p of them at or below it.
        let rank = |p: f64| {
            samples[((p * samples.len() as f64).ceil() as usize).clamp(1, samples.len()) - 1]
        };
        Self {
            count: samples.len() as u64,
            mean: samples.iter().sum::<f64>() / samples.len() as f64,
            p50: rank(0.50),
            p99: rank(0.99),
            max: samples[samples.len() - 1],
        }
    }
}

/// The times of one stage over a run, for its summary.
#[derive(Debug, Default)]
struct StageSamples {
    count: u64,
    sum: f64,
    max: f64,
    /// A uniform sample of at most [`MAX_SAMPLES`] of the times.
    kept: Vec<f64>,
}

impl StageSamples {
    fn add(&mut self, ms: f64) {
        self.count += 1;
        self.sum += ms;
        self.max = self.max.max(ms);
        if self.kept.len() < MAX_SAMPLES {
            self.kept.push(ms);
        } else {
            // Reservoir sampling (algorithm R): every batch so far is kept
            // with the same chance.
            let slot = rand::random_range(0..self.count) as usize;
            if slot < MAX_SAMPLES {
                self.kept[slot] = ms;
            }
        }
    }

    fn times(mut self) -> StageTimes {
        StageTimes {
            count: self.count,
            mean: self.sum / self.count.max(1) as f64,
            max: self.max,
            ..StageTimes::of(&mut self.kept)
        }
    }
}

/// The stage times of one run: a histogram metric per stage and the
/// samples behind the run's summary.
#[derive(Debug)]
pub(crate) struct StageClock {
    metric: &'static str,
    samples: Mutex<BTreeMap<&'static str, StageSamples>>,
}

impl StageClock {
    /// Stage times recorded as `metric{stage}`.
    pub(crate) fn new(metric: &'static str) -> Self {
        Self {
            metric,
            samples: Mutex::default(),
        }
    }

    /// `stage` took from `started` to now: the metric and the summary.
    pub(crate) fn record(&self, stage: &'static str, started: Instant) {
        metrics::histogram!(self.metric, "stage" => stage).record(started.elapsed().as_secs_f64());
        self.sample(stage, started);
    }

    /// `stage` took from `started` to now, for the summary only (its
    /// metric is another one).
    pub(crate) fn sample(&self, stage: &'static str, started: Instant) {
        let ms = started.elapsed().as_secs_f64() * 1000.0;
        let mut samples = self.samples.lock().expect("not poisoned");
        samples.entry(stage).or_default().add(ms);
    }

    /// The figures per stage so far; the samples start again.
    pub(crate) fn take(&self) -> BTreeMap<String, StageTimes> {
        let samples = std::mem::take(&mut *self.samples.lock().expect("not poisoned"));
        samples
            .into_iter()
            .map(|(stage, times)| (stage.to_string(), times.times()))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stage_times_use_nearest_rank_percentiles() {
        let mut ms: Vec<f64> = (1..=200).rev().map(f64::from).collect();
        let t = StageTimes::of(&mut ms);
        assert_eq!((t.count, t.p50, t.p99, t.max), (200, 100.0, 198.0, 200.0));
        assert!((t.mean - 100.5).abs() < 1e-9);
        assert_eq!(StageTimes::of(&mut []).count, 0);
    }

    #[test]
    fn a_clock_summarises_each_stage_and_starts_again() {
        let clock = StageClock::new("test_stage_seconds");
        let started = Instant::now();
        clock.record("encode", started);
        clock.sample("encode", started);
        clock.sample("commit", started);
        let taken = clock.take();
        assert_eq!(taken["encode"].count, 2);
        assert_eq!(taken["commit"].count, 1);
        assert!(clock.take().is_empty());
    }

    #[test]
    fn a_long_run_keeps_bounded_samples_and_exact_counts() {
        let mut stage = StageSamples::default();
        for ms in 1..=100_000 {
            stage.add(f64::from(ms));
        }
        assert_eq!(stage.kept.len(), MAX_SAMPLES);
        let t = stage.times();
        assert_eq!((t.count, t.max), (100_000, 100_000.0));
        assert!((t.mean - 50_000.5).abs() < 1e-6, "{}", t.mean);
        // The sample's median: its standard error is ~0.4 % here.
        assert!((t.p50 - 50_000.0).abs() < 2_500.0, "{}", t.p50);
        assert!((t.p99 - 99_000.0).abs() < 1_000.0, "{}", t.p99);
    }
}
