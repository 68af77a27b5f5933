//! What the reliability campaign's tests share (`campaign_*.rs`, issue 15): how large a
//! campaign runs, its seeded random source, and the readers of what a run leaves behind.
//!
//! Three sizes, by `DFLASH_CAMPAIGN`: unset, the short campaign `make test` runs (2 kill
//! rounds, 1,000 fuzzed frames; the crowd test, one crowded phase, runs only under `make soak`
//! or by hand, as it needs a quiet machine), each check at the least length that still
//! catches its defect; `soak`, what `make soak` runs (6 rounds, 10,000 frames, two crowded
//! phases); `full`, the (20 rounds, 10,000 frames, two crowded phases):
//! `DFLASH_CAMPAIGN=full cargo test --release -p dflashd --test daemon campaign_`.
//! Each size can also be set on its own (`DFLASH_CAMPAIGN_ROUNDS`, `DFLASH_CAMPAIGN_FRAMES`,
//! `DFLASH_CAMPAIGN_CROWDS`), and `DFLASH_CAMPAIGN_SEED` replays a failing fuzz run.
use std::path::Path;

use dflash_shared::metrics::StepMetrics;
use rand::rngs::StdRng;
use rand::SeedableRng;

/// Held by each campaign test for its whole run: they are the heaviest tests of the binary
/// (kill rounds restart the daemon again and again; the crowd test measures throughput), and
/// one running beside another would turn the other's load into the crowd test's noise.
pub fn one_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

/// `DFLASH_CAMPAIGN`: 0 short (unset), 1 `soak`, 2 `full`.
fn level() -> usize {
    match std::env::var("DFLASH_CAMPAIGN").as_deref() {
        Err(_) | Ok("") | Ok("short") => 0,
        Ok("soak") => 1,
        Ok("full") => 2,
        Ok(other) => panic!("DFLASH_CAMPAIGN={other:?}: expected soak or full (or unset)"),
    }
}

/// `var` when set, else the size of the campaign's level: `[short, soak, full]`.
fn size(var: &str, sizes: [u64; 3]) -> u64 {
    match std::env::var(var) {
        Ok(v) => v
            .parse()
            .unwrap_or_else(|_| panic!("{var}={v:?} is not a whole number")),
        Err(_) => sizes[level()],
    }
}

/// kill -9 rounds (the campaign: 20).
pub fn kill_rounds() -> u64 {
    size("DFLASH_CAMPAIGN_ROUNDS", [2, 6, 20])
}

/// Fuzzed frames on the socket (the issue asks for 10k).
pub fn fuzz_frames() -> u64 {
    size("DFLASH_CAMPAIGN_FRAMES", [1_000, 10_000, 10_000])
}

/// Crowded phases of the many-clients test, each between two quiet ones.
pub fn crowd_phases() -> u64 {
    size("DFLASH_CAMPAIGN_CROWDS", [1, 2, 2])
}

/// The seeded random source of a campaign test; the seed is printed so a failure replays.
pub fn rng(test: &str) -> StdRng {
    let seed = size("DFLASH_CAMPAIGN_SEED", [15; 3]);
    eprintln!("{test}: DFLASH_CAMPAIGN_SEED={seed}");
    StdRng::seed_from_u64(seed)
}

/// Every line of a `metrics.jsonl`; a line that does not parse fails the test, naming it.
pub fn metrics_lines(path: &Path) -> Vec<StepMetrics> {
    std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .lines()
        .enumerate()
        .map(|(i, l)| {
            serde_json::from_str(l)
                .unwrap_or_else(|e| panic!("{} line {}: {e}: {l:?}", path.display(), i + 1))
        })
        .collect()
}

/// A process's resident memory in KiB (`VmRSS` of `/proc/<pid>/status`).
pub fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS in /proc/<pid>/status")
}

/// The median of `values` (sorted in place); NaN for none.
pub fn median(values: &mut [f64]) -> f64 {
    if values.is_empty() {
        return f64::NAN;
    }
    values.sort_by(|a, b| a.total_cmp(b));
    let n = values.len();
    if n % 2 == 1 {
        values[n / 2]
    } else {
        (values[n / 2 - 1] + values[n / 2]) / 2.0
    }
}
