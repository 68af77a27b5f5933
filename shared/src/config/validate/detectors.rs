//! `[detectors]`: thresholds with their hysteresis, and the windows in seconds.
use super::{in_range, positive};
use crate::config::error::ConfigIssue;
use crate::config::Config;

fn serve_gap(c: &Config, v: &mut Vec<ConfigIssue>) {
    let g = &c.detectors.serve_gap;
    let p = "detectors.serve_gap";
    in_range(
        v,
        &format!("{p}.gap_fraction"),
        g.gap_fraction,
        f64::MIN_POSITIVE,
        0.999_999,
        "a fraction of the offline τ in (0, 1)",
    );
    if !(g.clear_fraction.is_finite() && g.clear_fraction >= 0.0) {
        v.push(ConfigIssue::invalid(
            format!("{p}.clear_fraction"),
            "a fraction of the offline τ, 0 or more",
            g.clear_fraction,
        ));
    } else if g.clear_fraction >= g.gap_fraction {
        v.push(ConfigIssue::invalid(
            format!("{p}.clear_fraction"),
            format!(
                "less than {p}.gap_fraction ({}) for hysteresis",
                g.gap_fraction
            ),
            g.clear_fraction,
        ));
    }
    positive(v, &format!("{p}.fire_after"), g.fire_after);
    positive(v, &format!("{p}.clear_after"), g.clear_after);
}

/// The most `detectors.straggler.behind_frac` may be: a node taking 11 times the next slowest
/// node's time; a bar above that would never name anyone.
const STRAGGLER_BEHIND_FRAC_MAX: f64 = 10.0;

/// The most `detectors.straggler.steps` may be.
const STRAGGLER_STEPS_MAX: usize = 10_000;

fn straggler(c: &Config, v: &mut Vec<ConfigIssue>) {
    let s = &c.detectors.straggler;
    let p = "detectors.straggler";
    in_range(
        v,
        &format!("{p}.behind_frac"),
        s.behind_frac,
        f64::MIN_POSITIVE,
        STRAGGLER_BEHIND_FRAC_MAX,
        "a fraction of the next slowest node's own work in (0, 10], e.g. 0.2 for a fifth longer",
    );
    if !(1..=STRAGGLER_STEPS_MAX).contains(&s.steps) {
        v.push(ConfigIssue::invalid(
            format!("{p}.steps"),
            format!("a number of steps in a row from 1 to {STRAGGLER_STEPS_MAX}, e.g. 5"),
            s.steps,
        ));
    }
}

pub(super) fn detectors(c: &Config, v: &mut Vec<ConfigIssue>) {
    serve_gap(c, v);
    straggler(c, v);
    let t = &c.detectors.throughput;
    let p = "detectors.throughput";
    for (key, value) in [
        ("warn_below", t.warn_below),
        ("warn_clear_above", t.warn_clear_above),
        ("crit_below", t.crit_below),
        ("crit_clear_above", t.crit_clear_above),
    ] {
        in_range(
            v,
            &format!("{p}.{key}"),
            value,
            0.0,
            1.0,
            "a ratio of the baseline in [0, 1]",
        );
    }
    if t.crit_below >= t.warn_below {
        v.push(ConfigIssue::invalid(
            format!("{p}.crit_below"),
            format!("less than {p}.warn_below ({})", t.warn_below),
            t.crit_below,
        ));
    }
    if t.warn_clear_above <= t.warn_below {
        v.push(ConfigIssue::invalid(
            format!("{p}.warn_clear_above"),
            format!("more than {p}.warn_below ({}) for hysteresis", t.warn_below),
            t.warn_clear_above,
        ));
    }
    if t.crit_clear_above <= t.crit_below {
        v.push(ConfigIssue::invalid(
            format!("{p}.crit_clear_above"),
            format!("more than {p}.crit_below ({}) for hysteresis", t.crit_below),
            t.crit_clear_above,
        ));
    }
    positive(v, &format!("{p}.smoothing_samples"), t.smoothing_samples);
    if let Some(b) = t.pinned_baseline_tokens_per_s {
        if !(b.is_finite() && b > 0.0) {
            v.push(ConfigIssue::invalid(
                format!("{p}.pinned_baseline_tokens_per_s"),
                "a positive tok/s",
                b,
            ));
        }
    }
    let durations = [
        ("detectors.throughput.warmup_s", t.warmup_s),
        (
            "detectors.throughput.baseline_window_s",
            t.baseline_window_s,
        ),
        ("detectors.throughput.warn_after_s", t.warn_after_s),
        ("detectors.throughput.crit_after_s", t.crit_after_s),
        ("detectors.throughput.clear_after_s", t.clear_after_s),
        ("detectors.throughput.max_sample_gap_s", t.max_sample_gap_s),
        ("detectors.memory.warmup_s", c.detectors.memory.warmup_s),
        ("detectors.memory.window_s", c.detectors.memory.window_s),
        ("detectors.queue.window_s", c.detectors.queue.window_s),
        (
            "detectors.queue.min_duration_s",
            c.detectors.queue.min_duration_s,
        ),
        (
            "detectors.healthy.after_ok_s",
            c.detectors.healthy.after_ok_s,
        ),
        ("detectors.healthy.refresh_s", c.detectors.healthy.refresh_s),
    ];
    for (key, value) in durations {
        in_range(
            v,
            key,
            value,
            0.0,
            f64::MAX,
            "a non-negative number of seconds",
        );
    }
    let m = &c.detectors.memory;
    in_range(
        v,
        "detectors.memory.max_range_frac",
        m.max_range_frac,
        0.0,
        1.0,
        "a fraction of total memory in [0, 1]",
    );
    in_range(
        v,
        "detectors.memory.max_stddev_frac",
        m.max_stddev_frac,
        0.0,
        1.0,
        "a fraction of total memory in [0, 1]",
    );
    let q = &c.detectors.queue;
    for (key, value) in [
        ("starved_frac", q.starved_frac),
        ("blocked_frac", q.blocked_frac),
        ("waste_warn_frac", q.waste_warn_frac),
    ] {
        in_range(
            v,
            &format!("detectors.queue.{key}"),
            value,
            0.0,
            1.0,
            "a fraction in [0, 1]",
        );
    }
}
