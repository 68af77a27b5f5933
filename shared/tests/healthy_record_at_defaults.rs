//! The healthy record at the defaults a user runs with, on a real step series: the embedded
//! default's own `metrics.jsonl` (`tests/fixtures/embedded_default_steps.tsv`, how it was taken
//! is in its header), fed step by step to the daemon's pure parts: the [`HealthMonitor`] it
//! runs, [`standing`] and the [`HealthyStretch`] that decides when the record is written.
//!
//! A noisy run's 5-step median dips below the Warn line for a moment many times in five
//! minutes; none of those dips is an alert, and none may restart the record's clock. A real
//! collapse must still never be recorded.
use dflash_shared::config::DetectorsSection;
use dflash_shared::health::healthy_record::HealthyRecordConfig;
use dflash_shared::health::healthy_stretch::{standing, HealthyStretch, Standing};
use dflash_shared::health::{HealthMonitor, Level};
use dflash_shared::metrics::{StepMetrics, StepTimes, TimestampMs};

const FIXTURE: &str = include_str!("fixtures/embedded_default_steps.tsv");
/// Any epoch: the series' times are relative to its first step.
const T0_MS: TimestampMs = 1_780_000_000_000;
/// How late past warmup + `after_ok_s` the first record may come: the baseline's
/// `min_baseline_samples` and a dip that holds the record at the moment it falls due. The
/// README states the same bound, and the soak test holds the real daemon to it.
const RECORD_SLACK_S: f64 = 60.0;

/// `(ms since the first step, tok/s)` per optimizer step.
fn recorded_steps() -> Vec<(TimestampMs, f64)> {
    FIXTURE
        .lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .map(|l| {
            let (ms, rate) = l.split_once('\t').expect("two tab-separated columns");
            (ms.parse().expect("ms"), rate.parse().expect("tok/s"))
        })
        .collect()
}

fn step(ts_ms: TimestampMs, step: u64, tokens_per_s: f64) -> StepMetrics {
    StepMetrics {
        ts_ms,
        step,
        epoch: 1,
        loss: 1.0,
        accuracy: 0.5,
        tau: None,
        tau_tree: None,
        lr: 1e-4,
        grad_norm: 1.0,
        tokens_per_s,
        draft_positions_per_s: tokens_per_s,
        mfu: None,
        workers: Vec::new(),
        times: StepTimes::default(),
        online: None,
        domino: None,
        dspark: None,
        dflash2: None,
        job: None,
    }
}

/// What the daemon's health feed and record keeper did over a series.
#[derive(Debug, Default)]
struct Replay {
    /// Times the record was written (first, then refreshes), ms since the first step.
    written_ms: Vec<TimestampMs>,
    /// Each written record's median tok/s.
    written_rates: Vec<f64>,
    /// Timed drops that began inside a healthy stretch.
    dips: usize,
    /// The longest stretch between two dips (or a dip and the series' ends), ms.
    longest_undipped_ms: TimestampMs,
    /// Throughput levels entered, with their times (ms since the first step).
    levels: Vec<(TimestampMs, Level)>,
}

/// Feeds `steps` through the monitor and the stretch at the default detector settings, as
/// `daemon/src/runtime/health_feed.rs::observe_step` does, writing the record whenever due.
fn replay(steps: &[(TimestampMs, f64)]) -> Replay {
    let cfg = DetectorsSection::default();
    let mut monitor = HealthMonitor::new(&cfg, 1, 1);
    let mut stretch = HealthyStretch::new(cfg.healthy.clone());
    let mut out = Replay::default();
    let (mut was_timed, mut last_dip_ms) = (false, 0);
    for (i, &(ms, rate)) in steps.iter().enumerate() {
        let ts = T0_MS + ms;
        for t in monitor.observe_step(&step(ts, i as u64 + 1, rate)) {
            if t.detector == "throughput" {
                out.levels.push((ms, t.to));
            }
        }
        let judged = monitor.throughput();
        let now = standing(&judged, monitor.any_active());
        stretch.observe(ts, now);
        stretch.observe_step(&step(ts, i as u64 + 1, rate));
        if stretch.drop_timed() && !was_timed {
            out.dips += 1;
            out.longest_undipped_ms = out.longest_undipped_ms.max(ms - last_dip_ms);
            last_dip_ms = ms;
        }
        was_timed = stretch.drop_timed();
        if stretch.due(ts) {
            stretch.attempted(ts);
            stretch.written(ts);
            out.written_ms.push(ms);
            let figures = stretch
                .window()
                .figures(None)
                .expect("a due record has samples");
            out.written_rates.push(figures.throughput.tokens_per_s);
        }
    }
    let end = steps.last().map_or(0, |s| s.0);
    out.longest_undipped_ms = out.longest_undipped_ms.max(end - last_dip_ms);
    out
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn record_bound_ms() -> TimestampMs {
    let d = DetectorsSection::default();
    ((d.throughput.warmup_s + d.healthy.after_ok_s + RECORD_SLACK_S) * 1000.0) as TimestampMs
}

#[test]
fn the_recorded_default_run_writes_its_record_within_warmup_after_ok_and_the_slack() {
    let steps = recorded_steps();
    let end_ms = steps.last().unwrap().0;
    assert!(
        end_ms > record_bound_ms(),
        "the fixture must outlast the bound"
    );
    let r = replay(&steps);
    // The series is as noisy as the issue describes: dips are timed again and again, and no
    // stretch between two of them lasts `after_ok_s`. A clock that a dip restarts would never
    // write a record here.
    let after_ok_ms = (HealthyRecordConfig::default().after_ok_s * 1000.0) as TimestampMs;
    assert!(r.dips >= 3, "{} dips", r.dips);
    assert!(
        r.longest_undipped_ms < after_ok_ms,
        "longest stretch without a dip {} ms",
        r.longest_undipped_ms
    );
    assert!(r.levels.is_empty(), "no throughput alert: {:?}", r.levels);
    let first = *r.written_ms.first().expect("a record is written");
    eprintln!(
        "record written {:.1} s after the first step ({} dips timed, bound {:.0} s)",
        first as f64 / 1000.0,
        r.dips,
        record_bound_ms() as f64 / 1000.0
    );
    assert!(first <= record_bound_ms(), "first record at {first} ms");
    // The record holds the run's rate: the median of the steps it was written over, dips left
    // out, within a few percent of the whole series' median.
    let series = median(steps.iter().map(|s| s.1).collect());
    let recorded = r.written_rates[0];
    assert!(
        (recorded / series - 1.0).abs() < 0.05,
        "recorded {recorded:.0} tok/s, series median {series:.0}"
    );
}

/// The same steps, collapsed to `share` of their rate from `from_ms` on.
fn collapsed(
    steps: &[(TimestampMs, f64)],
    from_ms: TimestampMs,
    share: f64,
) -> Vec<(TimestampMs, f64)> {
    steps
        .iter()
        .map(|&(ms, rate)| (ms, if ms >= from_ms { rate * share } else { rate }))
        .collect()
}

#[test]
fn a_collapse_before_the_record_is_due_is_never_recorded() {
    let steps = recorded_steps();
    // 200 s after the first step: past warmup, well before the record falls due.
    let r = replay(&collapsed(&steps, 200_000, 0.2));
    assert_eq!(
        r.levels.iter().map(|l| l.1).collect::<Vec<_>>(),
        [Level::Crit],
        "{:?}",
        r.levels
    );
    assert!(r.written_ms.is_empty(), "written at {:?}", r.written_ms);
}

#[test]
fn a_drop_that_becomes_an_alert_lends_the_record_none_of_its_slow_rate() {
    let steps = recorded_steps();
    let healthy = median(steps.iter().map(|s| s.1).collect());
    // Half the rate for 120 s from 300 s (below the Warn line, above Crit's): Warn after
    // warn_after_s, then a recovery.
    let slowed: Vec<_> = steps
        .iter()
        .map(|&(ms, rate)| {
            let slow = (300_000..420_000).contains(&ms);
            (ms, if slow { rate * 0.5 } else { rate })
        })
        .collect();
    let r = replay(&slowed);
    assert_eq!(
        r.levels.first().map(|l| l.1),
        Some(Level::Warn),
        "{:?}",
        r.levels
    );
    let warned_ms = r.levels[0].0;
    assert!(
        r.written_ms.iter().all(|&w| w < 300_000 || w > warned_ms),
        "nothing written while the drop was timed: {:?}",
        r.written_ms
    );
    for rate in &r.written_rates {
        assert!(
            *rate > 0.95 * healthy,
            "a record at {rate:.0} tok/s, healthy {healthy:.0}"
        );
    }
}

/// The incident's timeline (21.5K tok/s for half an hour, then 4.3K) with the step-to-step
/// spread of the embedded default instead of the smooth seeded noise of `health_traces.rs`: the
/// record is written before the collapse, holds the healthy rate, and the collapse is Crit
/// within the detector's stated bound.
#[test]
fn the_incident_with_the_embedded_defaults_step_noise_is_recorded_then_caught() {
    let steps = recorded_steps();
    let series = median(steps.iter().map(|s| s.1).collect());
    let span = steps.last().unwrap().0;
    let collapse_ms = 30 * 60_000;
    // The recorded relative spread, repeated to cover 40 minutes.
    let mut incident = Vec::new();
    let mut offset = 0;
    while offset < 40 * 60_000 {
        for &(ms, rate) in &steps {
            let t = offset + ms;
            let level = if t >= collapse_ms { 4_300.0 } else { 21_500.0 };
            incident.push((t, level * rate / series));
        }
        offset += span + 150;
    }
    let r = replay(&incident);
    let first = *r.written_ms.first().expect("a record before the collapse");
    assert!(first <= record_bound_ms(), "first record at {first} ms");
    assert!(r.written_ms.iter().all(|&w| w < collapse_ms));
    let last = *r.written_rates.last().unwrap();
    assert!((last / 21_500.0 - 1.0).abs() < 0.05, "recorded {last:.0}");
    let crit = r
        .levels
        .iter()
        .find(|l| l.1 == Level::Crit)
        .expect("the collapse is Crit");
    let t = DetectorsSection::default().throughput;
    // The detector's stated bound: ⌊k/2⌋ + 2 sample intervals, then crit_after_s (the longest
    // interval between two recorded steps stands for the interval).
    let interval_ms = steps.windows(2).map(|w| w[1].0 - w[0].0).max().unwrap();
    let bound_ms = (t.smoothing_samples as TimestampMs / 2 + 2) * interval_ms
        + (t.crit_after_s * 1000.0) as TimestampMs;
    assert!(
        crit.0 - collapse_ms <= bound_ms,
        "Crit {} ms after the collapse, bound {bound_ms} ms",
        crit.0 - collapse_ms
    );
    assert!(
        r.levels.iter().all(|l| l.0 >= collapse_ms),
        "no alert before the collapse: {:?}",
        r.levels
    );
}

#[test]
fn standing_is_healthy_only_past_learning() {
    // The monitor's first judgement is learning: no stretch may start before the baseline.
    let cfg = DetectorsSection::default();
    let monitor = HealthMonitor::new(&cfg, 1, 1);
    assert_eq!(standing(&monitor.throughput(), false), Standing::Sick);
}
