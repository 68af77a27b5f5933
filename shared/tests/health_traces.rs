//! Detectors on deterministic synthetic traces (seeded noise), including the incident the
//! daemon exists for: stable 21.5K tok/s with flat memory, a torch swap at 20:52, a compile
//! cache deleted at 21:00, then a collapse to 4.3K tok/s with volatile memory.
use chrono::FixedOffset;
use dflash_shared::events::{Event, EventKind, Severity};
use dflash_shared::health::{
    diff_fingerprints, explain_alert, render_precursors, throughput_headline, CacheWatcher,
    Fingerprint, Level, MemoryConfig, MemoryFlatness, MemoryVerdict, QueueBound, QueueDiagnoser,
    QueueThresholds, ThroughputConfig, ThroughputDetector, Transition,
};
use dflash_shared::metrics::{AllocatorStats, CacheState, DeviceRole, GpuSample, QueueStats};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// 2026-01-01T00:00:00Z.
const DAY_MS: i64 = 1_767_225_600_000;
const UTC: i32 = 0;

fn at(h: i64, m: i64, s: i64) -> i64 {
    DAY_MS + ((h * 60 + m) * 60 + s) * 1000
}

fn utc() -> FixedOffset {
    FixedOffset::east_opt(UTC).unwrap()
}

/// Standard normal by Box–Muller.
fn gaussian(rng: &mut StdRng) -> f64 {
    let u1: f64 = rng.random_range(f64::EPSILON..1.0);
    let u2: f64 = rng.random();
    (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
}

/// A throughput sample: `mean` with ±`uniform_pct` uniform noise, and a one-sample hiccup
/// (a GC pause, a slow batch) at half speed 2% of the time.
fn noisy_tokens(rng: &mut StdRng, mean: f64, uniform_pct: f64) -> f64 {
    let noise = rng.random_range(-uniform_pct..=uniform_pct) / 100.0;
    let hiccup = if rng.random::<f64>() < 0.02 { 0.5 } else { 1.0 };
    mean * (1.0 + noise) * hiccup
}

/// Sample timestamps one second apart with ±50 ms jitter.
fn ticks(rng: &mut StdRng, from_ms: i64, to_ms: i64) -> Vec<i64> {
    let mut out = Vec::new();
    let mut t = from_ms;
    while t < to_ms {
        out.push(t);
        t += 1000 + rng.random_range(-50..=50);
    }
    out
}

/// Worst-case sample spacing of `ticks`, for the detection bound.
const MAX_TICK_S: f64 = 1.05;

fn throughput_trace(seed: u64, phases: &[(i64, f64)], end_ms: i64) -> Vec<(i64, f64)> {
    let mut rng = StdRng::seed_from_u64(seed);
    ticks(&mut rng, phases[0].0, end_ms)
        .into_iter()
        .map(|t| {
            let mean = phases
                .iter()
                .rev()
                .find(|(start, _)| *start <= t)
                .unwrap()
                .1;
            (t, noisy_tokens(&mut rng, mean, 8.0))
        })
        .collect()
}

fn run(detector: &mut ThroughputDetector, trace: &[(i64, f64)]) -> Vec<Transition> {
    trace
        .iter()
        .filter_map(|&(t, v)| detector.observe(t, v))
        .collect()
}

/// The documented bound: the rolling median crosses within ⌊k/2⌋+1 samples, then the level
/// needs `after_s` more, checked at the next sample.
fn detection_bound_ms(cfg: &ThroughputConfig, after_s: f64) -> i64 {
    (((cfg.smoothing_samples / 2 + 2) as f64 * MAX_TICK_S + after_s) * 1000.0).ceil() as i64
}

#[test]
fn a_noisy_but_stable_run_is_never_flagged() {
    for seed in 0..8 {
        let trace = throughput_trace(seed, &[(at(12, 0, 0), 21_500.0)], at(18, 0, 0));
        let mut d = ThroughputDetector::new(ThroughputConfig::default());
        let transitions = run(&mut d, &trace);
        assert!(transitions.is_empty(), "seed {seed}: {transitions:?}");
        let baseline = d.baseline().unwrap();
        assert!(
            (baseline / 21_500.0 - 1.0).abs() < 0.02,
            "baseline {baseline}"
        );
    }
    // Gaussian noise with σ = 6% and no hiccups: also never flagged.
    let mut rng = StdRng::seed_from_u64(99);
    let mut d = ThroughputDetector::new(ThroughputConfig::default());
    for t in ticks(&mut rng, at(0, 0, 0), at(6, 0, 0)) {
        let v = 21_500.0 * (1.0 + 0.06 * gaussian(&mut rng));
        assert_eq!(d.observe(t, v), None);
    }
}

#[test]
fn a_collapse_to_4_3k_is_crit_within_the_stated_bound() {
    let cfg = ThroughputConfig::default();
    let bound = detection_bound_ms(&cfg, cfg.crit_after_s);
    assert_eq!(bound, 24_200, "with the defaults the bound is 24.2 s");
    for seed in 0..8 {
        let collapse = at(21, 1, 0) + seed as i64 * 137;
        let trace = throughput_trace(
            seed,
            &[(at(19, 0, 0), 21_500.0), (collapse, 4_300.0)],
            at(22, 0, 0),
        );
        let mut d = ThroughputDetector::new(cfg.clone());
        let transitions = run(&mut d, &trace);
        assert_eq!(transitions.len(), 1, "seed {seed}: {transitions:?}");
        let crit = &transitions[0];
        assert_eq!((crit.from, crit.to), (Level::Ok, Level::Crit));
        let delay = crit.at_ms - collapse;
        assert!(
            delay > 0 && delay <= bound,
            "seed {seed}: Crit after {delay} ms, bound {bound} ms"
        );
        assert!(
            crit.message.starts_with("throughput 4."),
            "{}",
            crit.message
        );
        assert!(crit.message.ends_with("(Crit)"), "{}", crit.message);
        assert!(matches!(
            crit.to_event_kind(),
            EventKind::RegressionStarted {
                level: Severity::Crit,
                ..
            }
        ));
    }
}

#[test]
fn a_drop_to_12_8k_is_warn_and_never_crit() {
    let cfg = ThroughputConfig::default();
    let bound = detection_bound_ms(&cfg, cfg.warn_after_s);
    for seed in 0..8 {
        let drop = at(21, 0, 0);
        let trace = throughput_trace(
            seed,
            &[(at(19, 0, 0), 21_500.0), (drop, 12_800.0)],
            at(23, 0, 0),
        );
        let mut d = ThroughputDetector::new(cfg.clone());
        let transitions = run(&mut d, &trace);
        assert_eq!(transitions.len(), 1, "seed {seed}: {transitions:?}");
        assert_eq!(transitions[0].to, Level::Warn);
        let delay = transitions[0].at_ms - drop;
        assert!(
            delay > 0 && delay <= bound,
            "seed {seed}: Warn after {delay} ms, bound {bound} ms"
        );
        // The baseline did not follow the regression down.
        assert!((d.baseline().unwrap() / 21_500.0 - 1.0).abs() < 0.02);
    }
}

#[test]
fn recovery_returns_to_ok_with_hysteresis() {
    let cfg = ThroughputConfig::default();
    let trace = throughput_trace(
        7,
        &[
            (at(19, 0, 0), 21_500.0),
            (at(21, 0, 0), 4_300.0),
            // Partial recovery to 60%: above crit_clear_above, below warn_clear_above.
            (at(21, 10, 0), 12_900.0),
            (at(21, 30, 0), 21_500.0),
        ],
        at(22, 30, 0),
    );
    let mut d = ThroughputDetector::new(cfg.clone());
    let transitions = run(&mut d, &trace);
    let levels: Vec<_> = transitions.iter().map(|t| (t.from, t.to)).collect();
    assert_eq!(
        levels,
        [
            (Level::Ok, Level::Crit),
            (Level::Crit, Level::Warn),
            (Level::Warn, Level::Ok)
        ]
    );
    // Leaving a level takes clear_after_s of clear readings, never less.
    let eased = transitions[1].at_ms - at(21, 10, 0);
    let recovered = transitions[2].at_ms - at(21, 30, 0);
    for delay in [eased, recovered] {
        assert!(delay >= (cfg.clear_after_s * 1000.0) as i64, "{delay}");
        assert!(
            delay <= detection_bound_ms(&cfg, cfg.clear_after_s),
            "{delay}"
        );
    }
    assert!(matches!(
        transitions[2].to_event_kind(),
        EventKind::RegressionEnded { .. }
    ));
}

#[test]
fn a_stable_slow_run_after_a_restart_needs_the_pinned_baseline() {
    // Rolling baseline only: a run that restarts at 12.8K learns 12.8K as normal.
    let trace = throughput_trace(3, &[(at(0, 0, 0), 12_800.0)], at(3, 0, 0));
    let mut rolling = ThroughputDetector::new(ThroughputConfig::default());
    assert!(run(&mut rolling, &trace).is_empty());
    // Pinned from the earlier run, the same trace is a Warn (and it is not a Crit: the stable
    // 12.8K run should not be killed to "fix" throughput).
    let pinned = ThroughputConfig {
        pinned_baseline_tokens_per_s: Some(21_500.0),
        ..Default::default()
    };
    let mut d = ThroughputDetector::new(pinned);
    let t = run(&mut d, &trace);
    assert_eq!(t.iter().map(|t| t.to).collect::<Vec<_>>(), [Level::Warn]);
    assert!(d.status().baseline_pinned);
}

fn gpu(ts_ms: i64, used: u64, retries: u64) -> GpuSample {
    GpuSample {
        ts_ms,
        index: 0,
        name: "NVIDIA H200".into(),
        uuid: None,
        role: DeviceRole::Drafter,
        memory_used_bytes: Some(used),
        memory_total_bytes: Some(150_754_820_096),
        utilization_pct: Some(98),
        power_w: Some(650.0),
        temperature_c: Some(63),
        allocator: Some(AllocatorStats {
            alloc_retries: retries,
            ..Default::default()
        }),
    }
}

/// Flat: 120 GB ± 30 MB. Volatile: a 90→135 GB sawtooth every 20 s, one allocator retry each.
fn memory_sample(rng: &mut StdRng, t: i64, volatile_from: i64) -> GpuSample {
    if t < volatile_from {
        gpu(t, 120_000_000_000 + rng.random_range(0..60_000_000), 0)
    } else {
        let phase = ((t - volatile_from) / 1000) % 20;
        let retries = ((t - volatile_from) / 20_000) as u64 + 1;
        gpu(t, 90_000_000_000 + phase as u64 * 2_250_000_000, retries)
    }
}

#[test]
fn memory_flat_for_hours_then_volatile() {
    let mut rng = StdRng::seed_from_u64(5);
    let mut m = MemoryFlatness::new(MemoryConfig::default());
    let volatile_from = at(21, 1, 0);
    let mut transitions = Vec::new();
    for t in ticks(&mut rng, at(18, 30, 0), at(21, 30, 0)) {
        if t < volatile_from {
            assert!(m
                .observe(&memory_sample(&mut rng, t, volatile_from))
                .is_none());
            continue;
        }
        transitions.extend(m.observe(&memory_sample(&mut rng, t, volatile_from)));
    }
    assert_eq!(transitions.len(), 1, "{transitions:?}");
    assert!(
        transitions[0].at_ms - volatile_from <= 2_100,
        "flagged within two samples"
    );
    let MemoryVerdict::Volatile { stats, reasons } = m.verdict(0) else {
        panic!("{:?}", m.verdict(0))
    };
    assert!(stats.range_frac > 0.25, "{stats:?}");
    assert!(stats.alloc_retries_delta.unwrap() > 0);
    assert_eq!(reasons.len(), 3, "{reasons:?}");
}

fn queue(ts_ms: i64, depth: usize, blocked_ms: f64, starved_ms: f64) -> QueueStats {
    QueueStats {
        ts_ms,
        depth,
        capacity: 16,
        high_watermark: 12,
        low_watermark: 4,
        bytes_resident: depth as u64 * 210_000_000,
        byte_cap: 8 << 30,
        producer_rate: 1.0,
        consumer_rate: 1.0,
        producer_blocked_ms: blocked_ms,
        consumer_starved_ms: starved_ms,
    }
}

/// 5 producers and 3 consumers; per second each consumer starves `starved` s and each producer
/// blocks `blocked` s, with noise; depth around `depth`.
fn queue_trace(seed: u64, secs: i64, depth: f64, starved: f64, blocked: f64) -> Vec<QueueStats> {
    let mut rng = StdRng::seed_from_u64(seed);
    let (mut s, mut b) = (0.0, 0.0);
    (0..secs)
        .map(|i| {
            s += 3.0 * 1000.0 * (starved * rng.random_range(0.8..1.2)).min(1.0);
            b += 5.0 * 1000.0 * (blocked * rng.random_range(0.8..1.2)).min(1.0);
            let d = (depth + rng.random_range(-1.0..1.0))
                .clamp(0.0, 16.0)
                .round() as usize;
            queue(at(12, 0, 0) + i * 1000, d, b, s)
        })
        .collect()
}

#[test]
fn queue_diagnosis_tells_which_side_bounds_the_run() {
    let cases = [
        (queue_trace(1, 300, 0.5, 0.40, 0.0), QueueBound::TargetBound),
        (
            queue_trace(2, 300, 12.0, 0.0, 0.30),
            QueueBound::DrafterBound,
        ),
        (queue_trace(3, 300, 8.0, 0.02, 0.02), QueueBound::Balanced),
    ];
    for (trace, expected) in cases {
        let mut q = QueueDiagnoser::new(QueueThresholds::default(), 5, 3);
        let transitions: Vec<_> = trace.iter().filter_map(|s| q.observe(s)).collect();
        let diagnosis = q.diagnosis().unwrap();
        assert_eq!(diagnosis.bound, expected, "{}", diagnosis.explanation);
        assert!(
            transitions.is_empty(),
            "below waste_warn_frac: {transitions:?}"
        );
    }
    let d = {
        let mut q = QueueDiagnoser::new(QueueThresholds::default(), 5, 3);
        queue_trace(1, 300, 0.5, 0.40, 0.0).iter().for_each(|s| {
            q.observe(s);
        });
        q.diagnosis().unwrap()
    };
    assert!(
        (d.consumer_starved_frac - 0.40).abs() < 0.03,
        "{}",
        d.consumer_starved_frac
    );
    assert!(
        d.explanation
            .starts_with("drafter workers waited for hidden states 4"),
        "{}",
        d.explanation
    );
    assert!(
        d.explanation.ends_with("(watermarks 4/12): target-bound"),
        "{}",
        d.explanation
    );
}

#[test]
fn starved_drafters_most_of_the_time_is_a_warning_that_clears() {
    let mut q = QueueDiagnoser::new(QueueThresholds::default(), 5, 3);
    let mut trace = queue_trace(4, 600, 0.2, 0.7, 0.0);
    // Then the target side catches up: balanced from t = 600 s on.
    let last = trace.last().unwrap().clone();
    for i in 1..=600 {
        trace.push(queue(
            last.ts_ms + i * 1000,
            8,
            last.producer_blocked_ms,
            last.consumer_starved_ms,
        ));
    }
    let transitions: Vec<_> = trace.iter().filter_map(|s| q.observe(s)).collect();
    let levels: Vec<_> = transitions.iter().map(|t| t.to).collect();
    assert_eq!(levels, [Level::Warn, Level::Ok], "{transitions:?}");
    assert!(
        transitions[0]
            .message
            .starts_with("queue imbalance: drafter workers waited"),
        "{}",
        transitions[0].message
    );
}

fn journal_event(seq: u64, ts_ms: i64, severity: Severity, kind: EventKind) -> Event {
    Event {
        seq,
        ts_ms,
        severity,
        kind,
    }
}

fn cache(present: bool, warm: bool) -> CacheState {
    CacheState {
        name: "torchinductor".into(),
        path: "/tmp/torchinductor_op".into(),
        present,
        size_bytes: if present { 2_100_000_000 } else { 0 },
        entries: if present { 418 } else { 0 },
        last_change_ms: None,
        warm,
    }
}

/// The whole incident, through every detector, ending in the console's alert line.
#[test]
fn the_incident_is_flagged_and_explained() {
    let mut journal: Vec<Event> = Vec::new();
    let push = |journal: &mut Vec<Event>, ts: i64, severity: Severity, kind: EventKind| {
        let seq = journal.len() as u64 + 1;
        journal.push(journal_event(seq, ts, severity, kind));
    };

    // 20:52: the environment changed under the run.
    let before = Fingerprint {
        python_packages: [("torch".to_string(), "2.11.0+cu128".to_string())].into(),
        gpu_models: vec!["NVIDIA H200".into(); 8],
        ..Default::default()
    };
    let mut after = before.clone();
    after
        .python_packages
        .insert("torch".into(), "2.9.1+cu130".into());
    for drift in diff_fingerprints(&before, &after) {
        assert!(drift.blocks_resume);
        push(
            &mut journal,
            at(20, 52, 0),
            Severity::Warn,
            drift.to_event_kind(),
        );
    }

    // Caches are sampled every 10 s; the compile cache is deleted at 21:00.
    let mut caches = CacheWatcher::new();
    let mut t = at(18, 30, 0);
    while t <= at(21, 30, 0) {
        let present = t < at(21, 0, 0);
        let (changes, transitions) = caches.observe(t, &[cache(present, present)]);
        for c in changes {
            push(&mut journal, t, Severity::Warn, c.to_event_kind());
        }
        for tr in transitions {
            push(&mut journal, t, tr.severity(), tr.to_event_kind());
        }
        t += 10_000;
    }

    // Throughput and memory, one sample per second; the collapse starts at 21:01.
    let collapse = at(21, 1, 0);
    let mut rng = StdRng::seed_from_u64(2026);
    let mut throughput = ThroughputDetector::new(ThroughputConfig::default());
    let mut memory = MemoryFlatness::new(MemoryConfig::default());
    for t in ticks(&mut rng, at(18, 30, 0), at(21, 30, 0)) {
        let mean = if t < collapse { 21_500.0 } else { 4_300.0 };
        let sample = memory_sample(&mut rng, t, collapse);
        let mut transitions: Vec<Transition> = memory.observe(&sample).into_iter().collect();
        transitions.extend(throughput.observe(t, noisy_tokens(&mut rng, mean, 6.0)));
        for tr in transitions {
            push(&mut journal, t, tr.severity(), tr.to_event_kind());
        }
    }

    assert_eq!(throughput.level(), Level::Crit);
    let status = throughput.status();
    let since = status.since_ms.unwrap();
    assert!(since > collapse && since - collapse <= 24_200);
    // The rolling median of the noisy stable phase (with its 2% hiccups) sits just under 21.5K.
    let baseline = status.baseline_tokens_per_s.unwrap();
    assert!((baseline / 21_500.0 - 1.0).abs() < 0.01, "{baseline}");
    let headline = throughput_headline(4_300.0, status.level, Some(since), Some(21_500.0), utc());
    assert_eq!(headline, "4.3K tok/s, Crit since 21:01 (baseline 21.5K)");

    let precursors = explain_alert(since, &journal, 3_600_000);
    assert_eq!(
        render_precursors(&precursors, utc()).unwrap(),
        "Before it: torch 2.11.0+cu128 → 2.9.1+cu130 at 20:52; TorchInductor compile cache deleted at 21:00; \
         GPU 0 memory volatile at 21:01."
    );
    // Outside the lookback window nothing explains it.
    assert!(explain_alert(since, &journal, 30_000)
        .iter()
        .all(|p| p.text == "GPU 0 memory volatile"));
}
