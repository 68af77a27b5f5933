//! The incident, through the real binaries: a healthy run on the embedded default, a stop, a
//! real slowdown between runs (the restarted daemon pinned to one core that a busy process
//! shares), a restart. The throughput alert must fire against the healthy record the first run
//! left, `dflash-tui status --format json` must show it, and its explanation must name the
//! restart and what differs from the record. Then a new run dir of the same recipe, on the same
//! slowed machine, is judged against the recipe's record.
//!
//! And the live environment watch: a real `pip install` into the venv the daemon watches, while
//! it trains, raises the `environment` alert; the revert clears it; the recording the daemon
//! wrote replays both, at their times.
//!
//! Detector timings are shortened through the config (`[detectors]`), so the test runs in about
//! two minutes; the README's "What the console catches" gives the bounds at the defaults.
mod support;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use dflash_shared::config::{Config, TelemetrySection};
use dflash_shared::health::healthy_record::{HealthyRecord, HealthyRecordConfig};
use dflash_shared::health::ThroughputConfig;

const TUI: &str = env!("CARGO_BIN_EXE_dflash-tui");

/// Held by each scenario for its whole run: each trains a daemon, and the healthy record needs
/// a stretch of steady throughput that a second training daemon beside it breaks often enough
/// to fail the test now and then, even on a quiet machine (issue 36's session note).
static ONE_DAEMON_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn dflashd_bin() -> PathBuf {
    let bin = std::env::var_os("DFLASHD_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(TUI).with_file_name("dflashd"));
    assert!(
        bin.is_file(),
        "this test needs the dflashd binary at {} (cargo build --release -p dflashd, or set DFLASHD_BIN)",
        bin.display()
    );
    bin
}

/// The embedded default with detector timings short enough for a test, written to `root`:
/// its path, and the config as written.
fn config_and_path(root: &Path, edit: impl FnOnce(&mut Config)) -> (PathBuf, Config) {
    let mut cfg = Config::embedded_default();
    cfg.training.eval_every = 1_000_000;
    cfg.training.online_eval_every = Some(0);
    cfg.training.checkpoint_every = 1_000_000;
    // Short timings for a machine whose pace is not its own (CI runners, a build beside the
    // test): the embedded default's steps vary by a third from one to the next there, and
    // another process can halve them for seconds at a time. So the baseline rests on enough
    // steps to be the run's pace, not its first fast moments; a drop must hold a few steps to
    // become an alert; and an alert clears after a few steps back near the pace. With the
    // defaults' 80/90 % thresholds and two-minute clear, a noise alert against a baseline a
    // tenth above the run's steady pace never cleared, and no healthy record was written (seen
    // in CI). The slowdowns this test makes (a core shared with three busy loops) run at
    // a quarter to a third of the pace, below `warn_below` here.
    let t = &mut cfg.detectors.throughput;
    t.warmup_s = 2.0;
    t.min_baseline_samples = 10;
    t.smoothing_samples = 3;
    t.warn_below = 0.6;
    t.warn_clear_above = 0.7;
    t.crit_below = 0.4;
    t.crit_clear_above = 0.5;
    t.warn_after_s = 4.0;
    t.crit_after_s = 2.0;
    t.clear_after_s = 4.0;
    cfg.detectors.healthy.after_ok_s = 4.0;
    cfg.detectors.healthy.refresh_s = 2.0;
    cfg.telemetry.sample_interval_ms = 250;
    edit(&mut cfg);
    let path = root.join("config.toml");
    std::fs::write(&path, cfg.to_toml_string()).unwrap();
    (path, cfg)
}

struct Daemon {
    child: Child,
    socket: PathBuf,
    stderr: PathBuf,
}

impl Daemon {
    /// `dflashd start`, optionally pinned to `cpus` (`taskset -c`).
    fn start(root: &Path, config: &Path, run_dir: &Path, cpus: Option<&str>, tag: &str) -> Daemon {
        let socket = root.join(format!("s-{tag}/d.sock"));
        let stderr = root.join(format!("dflashd-{tag}.err"));
        let mut cmd = match cpus {
            Some(c) => {
                let mut cmd = Command::new("taskset");
                cmd.args(["-c", c]).arg(dflashd_bin());
                cmd
            }
            None => Command::new(dflashd_bin()),
        };
        for (var, sub) in [
            ("XDG_RUNTIME_DIR", "rt"),
            ("XDG_STATE_HOME", "state"),
            ("XDG_DATA_HOME", "data"),
        ] {
            cmd.env(var, root.join(sub));
        }
        let child = cmd
            .env_remove("NOTIFY_SOCKET")
            .env("DFLASH_CPU_PEAK_FLOPS", "5e10")
            // One compute thread: on a machine whose cores are shared (CI, a build beside the
            // test), two libtorch threads stall each other whenever one is descheduled and the
            // run's pace swings between its own and a third of it for tens of seconds; one
            // thread keeps its fair share, so the healthy run is healthy.
            .args(["start", "--threads", "1", "--log-every", "0", "--config"])
            .arg(config)
            .arg("--socket")
            .arg(&socket)
            .arg("--run-dir")
            .arg(run_dir)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&stderr).unwrap())
            .spawn()
            .expect("spawn dflashd");
        Daemon {
            child,
            socket,
            stderr,
        }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.stderr).unwrap_or_default()
    }

    /// `dflash-tui status --format json` against this daemon.
    fn status(&self, root: &Path) -> Option<serde_json::Value> {
        let out = Command::new(TUI)
            .env("XDG_RUNTIME_DIR", root.join("rt"))
            .env("XDG_STATE_HOME", root.join("state"))
            .args(["status", "--format", "json", "--socket"])
            .arg(&self.socket)
            .output()
            .ok()?;
        serde_json::from_slice(&out.stdout).ok()
    }

    /// Waits until `pred` holds of the status report; returns it and how long it took.
    fn wait_for(
        &mut self,
        root: &Path,
        limit: Duration,
        what: &str,
        pred: impl Fn(&serde_json::Value) -> bool,
    ) -> (serde_json::Value, Duration) {
        let start = Instant::now();
        let mut last = None;
        while start.elapsed() < limit {
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!(
                    "dflashd exited ({status}) waiting for {what}:\n{}",
                    self.log()
                );
            }
            if let Some(s) = self.status(root) {
                if pred(&s) {
                    return (s, start.elapsed());
                }
                last = Some(s);
            }
            std::thread::sleep(Duration::from_millis(500));
        }
        panic!(
            "{what} not seen in {limit:?}; last status: {}\n{}",
            last.map(|s| s.to_string()).unwrap_or_default(),
            self.log()
        );
    }

    fn stop(mut self) {
        let sent = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .expect("kill");
        assert!(sent.success());
        let deadline = Instant::now() + Duration::from_secs(60);
        while Instant::now() < deadline {
            if self.child.try_wait().unwrap().is_some() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        panic!("dflashd did not stop:\n{}", self.log());
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Three busy loops on CPU 0: whatever else the machine runs (a build beside the test), a
/// daemon moved onto that core gets at most a quarter of it, well under its healthy rate.
struct Busy(Vec<Child>);

impl Busy {
    fn on_cpu0() -> Busy {
        Busy(
            (0..3)
                .map(|_| {
                    Command::new("taskset")
                        .args(["-c", "0", "sh", "-c", "while :; do :; done"])
                        .spawn()
                        .expect("taskset (util-linux) runs a busy loop")
                })
                .collect(),
        )
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        for child in &mut self.0 {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// The throughput alert of a report from a daemon that answered (an unreachable one's report
/// rests on an older run's journal).
fn throughput_alert(status: &serde_json::Value) -> Option<&serde_json::Value> {
    if status["daemon"]["reachable"] != true {
        return None;
    }
    status["alerts"]
        .as_array()?
        .iter()
        .find(|a| a["detector"] == "throughput")
}

fn lines(v: &serde_json::Value) -> Vec<String> {
    v.as_array()
        .map(|a| {
            a.iter()
                .filter_map(|s| s.as_str().map(String::from))
                .collect()
        })
        .unwrap_or_default()
}

/// How late `wait_for` can see what already happened: its 0.5 s poll and one
/// `dflash-tui status` round trip on a loaded machine.
const POLL_SLACK_S: f64 = 2.0;

/// The detection bound of `t`, from the detector's documented rule: warmup + (⌊k/2⌋ + 2)·Δ
/// + crit_after (Warn: warn_after), with Δ the slow run's step interval.
fn detection_bound(t: &ThroughputConfig, step_interval_s: f64, warn: bool) -> f64 {
    let after = if warn { t.warn_after_s } else { t.crit_after_s };
    t.warmup_s + (t.smoothing_samples / 2 + 2) as f64 * step_interval_s + after
}

#[test]
fn a_collapse_after_a_restart_and_a_new_run_of_the_recipe_are_caught_against_the_healthy_record() {
    across_restarts(Timings::Short);
}

/// The same at the default throughput detector, healthy record and telemetry timings
/// (`warmup_s` 120, `smoothing_samples` 5, `warn_after_s` 60, `after_ok_s` 300, 1 s sampling):
/// the record is written within warmup + `after_ok_s` + [`RECORD_SLACK_S`] of the first step
/// however noisy the steps, and the README's bounds hold. About 13 minutes; `make soak` runs it.
#[test]
#[ignore = "soak: about 13 minutes at the default detector timings (make soak)"]
fn at_the_default_detector_timings_the_collapses_are_caught_within_their_bounds() {
    across_restarts(Timings::Defaults);
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Timings {
    /// The test's shortened timings (`config`).
    Short,
    /// The defaults of `[detectors.throughput]` and `telemetry.sample_interval_ms`.
    Defaults,
}

fn across_restarts(timings: Timings) {
    let _alone = ONE_DAEMON_AT_A_TIME
        .lock()
        .unwrap_or_else(|p| p.into_inner());
    let root = tempfile::tempdir().unwrap();
    let root = root.path();
    let (cfg, parsed) = config_and_path(root, |c| {
        // The run must outlive every phase, however slow the machine: the embedded default's
        // 6 epochs end before the warmup, the healthy stretch and a collapse are through, so
        // more epochs of the same data (each daemon is stopped by the test, never by its end).
        c.training.epochs = 200;
        if timings == Timings::Defaults {
            c.detectors.throughput = ThroughputConfig::default();
            c.detectors.healthy = HealthyRecordConfig::default();
            c.telemetry.sample_interval_ms = TelemetrySection::default().sample_interval_ms;
        }
    });
    let throughput = parsed.detectors.throughput;
    let bound =
        |step_interval_s: f64, warn: bool| detection_bound(&throughput, step_interval_s, warn);
    // How long to wait for what must happen within a bound: the bound and a margin.
    let patience = |bound_s: f64| Duration::from_secs_f64(bound_s + 90.0);
    let run_a = root.join("run-a");

    // 1. A healthy run, until it has written its healthy record: within warmup + after_ok_s
    // + RECORD_SLACK_S of its first step, the README's bound.
    let mut healthy = Daemon::start(root, &cfg, &run_a, None, "healthy");
    let record_path = run_a.join("healthy.json");
    let record_bound_s = throughput.warmup_s + parsed.detectors.healthy.after_ok_s + RECORD_SLACK_S;
    let deadline = Instant::now() + patience(record_bound_s + 40.0);
    while !record_path.is_file() {
        assert!(
            Instant::now() < deadline,
            "no healthy record:\n{}\n{}",
            healthy.log(),
            run_story(&run_a)
        );
        if let Ok(Some(s)) = healthy.child.try_wait() {
            panic!("dflashd exited ({s}):\n{}", healthy.log());
        }
        std::thread::sleep(Duration::from_millis(250));
    }
    let first_step_ms = first_step_ms(&run_a).expect("a step before the record");
    let written = HealthyRecord::parse(&std::fs::read_to_string(&record_path).unwrap()).unwrap();
    let record_after_s = (written.recorded_ms - first_step_ms) as f64 / 1000.0;
    eprintln!("healthy record written {record_after_s:.1} s after the first step");
    assert!(
        record_after_s <= record_bound_s,
        "record written {record_after_s:.1} s after the first step, bound {record_bound_s:.1} s"
    );
    // A collapse inside the run: the machine's CPU 0 gets busy and the running daemon, all its
    // threads, is moved onto it (`taskset -a -p`).
    let busy = Busy::on_cpu0();
    let step_at_pin = healthy
        .status(root)
        .and_then(|s| s["run"]["step"].as_u64())
        .unwrap_or(0);
    let pinned = Command::new("taskset")
        .args(["-a", "-p", "-c", "0", &healthy.child.id().to_string()])
        .stdout(Stdio::null())
        .status()
        .unwrap();
    assert!(pinned.success());
    // Inside a run there is no warmup left: the bound is from the pin, with Δ the slowed
    // run's step interval as measured over the wait (at least the 6 s assumed elsewhere: on a
    // loaded machine the pinned daemon's steps can take longer), plus the console's polling.
    let (status, took) = healthy.wait_for(
        root,
        patience(bound(6.0, true) - throughput.warmup_s),
        "an in-run alert",
        |s| throughput_alert(s).is_some(),
    );
    let steps_slowed = status["run"]["step"]
        .as_u64()
        .unwrap_or(0)
        .saturating_sub(step_at_pin)
        .max(1);
    let slowed_step_s = took.as_secs_f64() / steps_slowed as f64;
    let in_run_bound = bound(slowed_step_s.max(6.0), true) - throughput.warmup_s + POLL_SLACK_S;
    eprintln!(
        "in-run collapse: {} after {:.1} s ({steps_slowed} steps, {slowed_step_s:.2} s a step)",
        throughput_alert(&status).unwrap()["level"],
        took.as_secs_f64()
    );
    assert!(
        took.as_secs_f64() <= in_run_bound,
        "{took:?}, bound {in_run_bound:.1} s"
    );
    // 2. A stop.
    healthy.stop();
    // The record as the run left it (refreshed while it was healthy, never during the alert).
    let record = HealthyRecord::parse(&std::fs::read_to_string(&record_path).unwrap()).unwrap();
    let recorded = record.throughput.tokens_per_s;
    assert!(recorded > 0.0);
    assert!(
        record.throughput.basis.is_some(),
        "the cost of a token is recorded"
    );

    // 3. A real slowdown: the machine's CPU 0 stays busy, and the restart is pinned to it.
    let _busy = busy;
    // 4. The restart.
    let mut slow = Daemon::start(root, &cfg, &run_a, Some("0"), "restart");
    let restart_bound = 40.0 + bound(6.0, true);
    let (status, took) = slow.wait_for(root, patience(restart_bound), "a throughput alert", |s| {
        throughput_alert(s).is_some()
    });
    let alert = throughput_alert(&status).unwrap();
    let now = status["throughput"]["tokens_per_s"].as_f64().unwrap();
    let share = now / recorded;
    eprintln!(
        "restart: healthy {recorded:.0} tok/s, slowed {now:.0} tok/s ({:.0} %), {} after {:.1} s",
        share * 100.0,
        alert["level"],
        took.as_secs_f64()
    );
    // The latest step alone is noisy; the alert is the detector's judgement of the smoothed rate
    // (below warn_below of the record), which is what this test holds it to.
    assert!(
        ["warn", "crit"].contains(&alert["level"].as_str().unwrap_or_default()),
        "{alert}"
    );
    let source = status["throughput"]["baseline_source"]
        .as_str()
        .unwrap_or_default();
    assert!(source.starts_with("this run ran at"), "{status}");
    assert_eq!(
        status["throughput"]["baseline_tokens_per_s"].as_f64(),
        Some(recorded),
        "judged against the record, never the slow rate"
    );
    let message = alert["message"].as_str().unwrap();
    assert!(message.contains("this run ran at"), "{message}");
    let explained = format!(
        "{} {}",
        alert["explanation"].as_str().unwrap(),
        lines(&alert["since_healthy"]).join("; ")
    );
    assert!(
        explained.contains("daemon restarted, resumed at step")
            || explained.contains("daemon start since the record"),
        "the explanation names the restart: {explained}"
    );
    assert!(
        lines(&alert["since_healthy"])
            .iter()
            .any(|l| l.contains("daemon start")),
        "what differs from the record: {alert}"
    );
    // The bound: a generous Δ of the slowed run's step time (the embedded default's step is
    // about a second healthy; slowed, a few), plus up to 40 s of start before the first step.
    let warn = alert["level"] == "warn";
    let restart_bound = 40.0 + bound(6.0, warn);
    assert!(
        took.as_secs_f64() <= restart_bound,
        "fired after {:.1} s, bound {restart_bound:.1} s",
        took.as_secs_f64()
    );
    slow.stop();

    // A new run dir of the same recipe on the same slowed machine.
    let run_b = root.join("run-b");
    let mut fresh = Daemon::start(root, &cfg, &run_b, Some("0"), "new-run");
    let (status, took) = fresh.wait_for(root, patience(restart_bound), "a throughput alert", |s| {
        throughput_alert(s).is_some()
    });
    let source = status["throughput"]["baseline_source"]
        .as_str()
        .unwrap_or_default();
    eprintln!(
        "new run dir: {} after {:.1} s ({source})",
        throughput_alert(&status).unwrap()["level"],
        took.as_secs_f64()
    );
    assert!(source.starts_with("this recipe ran at"), "{status}");
    assert!(source.contains(&run_a.display().to_string()), "{source}");

    // The slowdown is on purpose (this is the machine now): forget the record through a
    // confirmed action. The recipe's record goes, the alert ends, and the rate is learned anew.
    let recipe = HealthyRecord::parse(&std::fs::read_to_string(&record_path).unwrap())
        .unwrap()
        .recipe;
    let recipe_record = find_file(&root.join("state"), &format!("{recipe}.json"))
        .expect("the recipe's record in the state dir");
    let outcome = forget_healthy_record(&fresh.socket);
    eprintln!("forget: {outcome}");
    assert!(outcome.contains("healthy record forgotten"), "{outcome}");
    assert!(!recipe_record.exists(), "the recipe's record is deleted");
    assert!(record_path.is_file(), "run-a's own record is run-a's");
    let (status, took) = fresh.wait_for(root, Duration::from_secs(60), "the alert to end", |s| {
        throughput_alert(s).is_none()
    });
    eprintln!(
        "forget: alert ended {:.1} s after the confirmation",
        took.as_secs_f64()
    );
    assert!(
        status["throughput"]["baseline_source"].is_null(),
        "{status}"
    );
    assert!(status["healthy_record"].is_null(), "{status}");
    fresh.stop();
    let journal = std::fs::read_to_string(run_b.join("journal.jsonl")).unwrap();
    assert!(journal.contains("healthy record forgotten"), "{journal}");
}

/// How late past warmup + `after_ok_s` the first healthy record may be written: the baseline's
/// `min_baseline_samples` (a few seconds of steps), and a timed dip that holds the record back
/// at the moment it falls due.
const RECORD_SLACK_S: f64 = 60.0;

/// What a failed wait needs to be read: the run's journal (every alert and note) and its
/// tok/s per step, from the run dir.
fn run_story(run_dir: &Path) -> String {
    let journal = std::fs::read_to_string(run_dir.join("journal.jsonl")).unwrap_or_default();
    let rates: Vec<String> = std::fs::read_to_string(run_dir.join("metrics.jsonl"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .map(|v| {
            format!(
                "{}:{:.0}",
                v["step"],
                v["tokens_per_s"].as_f64().unwrap_or(0.0)
            )
        })
        .collect();
    format!("journal:\n{journal}\nstep:tok/s: {}", rates.join(" "))
}

/// The time of the run's first optimizer step, from its `metrics.jsonl`.
fn first_step_ms(run_dir: &Path) -> Option<i64> {
    let text = std::fs::read_to_string(run_dir.join("metrics.jsonl")).ok()?;
    text.lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .find(|v| v["step"].as_u64().is_some_and(|s| s >= 1))
        .and_then(|v| v["ts_ms"].as_i64())
}

/// The first file called `name` under `dir`.
fn find_file(dir: &Path, name: &str) -> Option<PathBuf> {
    for entry in std::fs::read_dir(dir).ok()?.flatten() {
        let path = entry.path();
        if path.is_dir() {
            if let Some(found) = find_file(&path, name) {
                return Some(found);
            }
        } else if path.file_name().is_some_and(|n| n == name) {
            return Some(path);
        }
    }
    None
}

/// Files `ForgetHealthyRecord` and confirms it with the run name, as the console's modal does;
/// returns the daemon's outcome sentence.
fn forget_healthy_record(socket: &Path) -> String {
    use dflash_shared::actions::Action;
    use dflash_shared::protocol::{Request, Response};
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let (session, welcome, _pushes) =
            dflash_tui::client::Session::connect(socket).await.unwrap();
        let pending = match session
            .request(&Request::RequestAction {
                action: Action::ForgetHealthyRecord,
            })
            .await
            .unwrap()
        {
            Response::Pending { action } => action,
            other => panic!("expected a pending action, got {other:?}"),
        };
        assert!(
            pending
                .consequences
                .iter()
                .any(|c| c.contains("learned as normal")),
            "{:?}",
            pending.consequences
        );
        match session
            .request(&Request::Confirm {
                action_id: pending.id,
                run_name: welcome.run_name,
                via: "test".into(),
            })
            .await
            .unwrap()
        {
            Response::Executed { outcome, .. } => outcome,
            other => panic!("expected the forget to run, got {other:?}"),
        }
    })
}

fn pip_install(venv: &Path, wheel: &Path) {
    let out = Command::new("python3")
        .args(["-m", "pip", "--python"])
        .arg(venv.join("bin/python"))
        .args([
            "install",
            "--no-index",
            "--quiet",
            "--disable-pip-version-check",
        ])
        .arg(wheel)
        .output()
        .expect("python3 -m pip");
    assert!(
        out.status.success(),
        "pip install {}: {}",
        wheel.display(),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A pure-Python wheel of `demo-pkg` at `version`, built with zipfile (no build backend, no
/// network): what an installer of any package lays down.
fn wheel(dir: &Path, version: &str) -> PathBuf {
    let path = dir.join(format!("demo_pkg-{version}-py3-none-any.whl"));
    let script = format!(
        "import zipfile\n\
         with zipfile.ZipFile({path:?}, 'w') as z:\n\
         \x20   z.writestr('demo_pkg/__init__.py', '__version__ = \"{version}\"\\n')\n\
         \x20   d = 'demo_pkg-{version}.dist-info/'\n\
         \x20   z.writestr(d + 'METADATA', 'Metadata-Version: 2.1\\nName: demo-pkg\\nVersion: {version}\\n\\n')\n\
         \x20   z.writestr(d + 'WHEEL', 'Wheel-Version: 1.0\\nGenerator: dflash-test\\nRoot-Is-Purelib: true\\nTag: py3-none-any\\n')\n\
         \x20   z.writestr(d + 'RECORD', '')\n",
        path = path.display().to_string()
    );
    let ok = Command::new("python3")
        .args(["-c", &script])
        .status()
        .unwrap();
    assert!(ok.success());
    path
}

#[test]
fn a_package_installed_while_training_is_alerted_and_the_recording_replays_it() {
    environment_watch(Timings::Short);
}

/// The same at the default telemetry sampling (1 s, so a 15 s environment scan): the README's
/// mid-run bound, measured. About 2 minutes; `make soak` runs it.
#[test]
#[ignore = "soak: the environment watch at the default sampling (make soak)"]
fn at_the_default_sampling_an_install_is_caught_within_one_scan() {
    environment_watch(Timings::Defaults);
}

/// How often the daemon scans the environment and caches at a sample interval: fifteen samples,
/// at least 5 s (`runtime/launch.rs`, where the sampler is configured).
fn scan_interval_s(sample_interval_ms: u64) -> f64 {
    (sample_interval_ms as f64 * 15.0 / 1000.0).max(5.0)
}

fn environment_watch(timings: Timings) {
    let _alone = ONE_DAEMON_AT_A_TIME
        .lock()
        .unwrap_or_else(|p| p.into_inner());
    let root = tempfile::tempdir().unwrap();
    let root = root.path();
    let venv = root.join("venv");
    let made = Command::new("python3")
        .args(["-m", "venv", "--without-pip"])
        .arg(&venv)
        .status()
        .unwrap();
    assert!(made.success());
    pip_install(&venv, &wheel(root, "1.0"));
    let (cfg, parsed) = config_and_path(root, |c| {
        c.telemetry.python = Some(venv.join("bin/python").display().to_string());
        if timings == Timings::Defaults {
            c.telemetry.sample_interval_ms = TelemetrySection::default().sample_interval_ms;
        }
    });
    let sample_ms = parsed.telemetry.sample_interval_ms;
    // Seen by the first scan after the install: one scan interval, the sampler's own tick, and
    // the console's polling.
    let bound_s = scan_interval_s(sample_ms) + sample_ms as f64 / 1000.0 + POLL_SLACK_S;
    let run = root.join("run");
    let mut d = Daemon::start(root, &cfg, &run, None, "env");
    d.wait_for(root, Duration::from_secs(60), "training", |s| {
        s["run"]["step"].as_u64().unwrap_or(0) > 0
    });

    // An install swaps demo-pkg 1.0 for 2.0 in the watched venv while the daemon trains.
    pip_install(&venv, &wheel(root, "2.0"));
    let env_alert = |s: &serde_json::Value| {
        s["alerts"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|a| a["detector"] == "environment")
            .cloned()
    };
    let (status, took) = d.wait_for(
        root,
        Duration::from_secs(60),
        "the environment alert",
        |s| env_alert(s).is_some(),
    );
    let alert = env_alert(&status).unwrap();
    eprintln!(
        "environment alert {:.1} s after the install (bound {bound_s:.1} s)",
        took.as_secs_f64()
    );
    assert!(
        took.as_secs_f64() <= bound_s,
        "{took:?}, bound {bound_s:.1} s"
    );
    let message = alert["message"].as_str().unwrap();
    assert!(
        message.contains("demo-pkg 1.0 → 2.0"),
        "names the package and both versions: {message}"
    );

    // Reverted: the alert clears; the journal keeps both changes.
    pip_install(&venv, &wheel(root, "1.0"));
    d.wait_for(root, Duration::from_secs(60), "the alert to clear", |s| {
        env_alert(s).is_none()
    });
    d.stop();
    let journal = std::fs::read_to_string(run.join("journal.jsonl")).unwrap();
    assert!(journal.contains("\"python.demo-pkg\""), "{journal}");

    // The recording the daemon wrote replays the alert when it fired, and its clearing.
    let recording = dflash_tui::replay::load(&run.join("recording.jsonl")).unwrap();
    let frames = recording.frames;
    let alerted: Vec<(i64, bool)> = frames
        .iter()
        .filter_map(|f| match &f.frame {
            dflash_shared::protocol::Response::Status(s) => Some((
                f.ts_ms,
                s.alerts.iter().any(|a| a.detector == "environment"),
            )),
            _ => None,
        })
        .collect();
    let fired = alerted
        .iter()
        .find(|(_, on)| *on)
        .expect("a frame with the alert")
        .0;
    let cleared = alerted
        .iter()
        .find(|(t, on)| *t > fired && !*on)
        .expect("a later frame without it")
        .0;
    let replay_at = |until: i64| {
        let upto: Vec<_> = frames
            .iter()
            .filter(|f| f.ts_ms <= until)
            .cloned()
            .collect();
        support::screen::replayed(&upto)
    };
    let during = replay_at(fired);
    assert!(
        during
            .explained_alerts()
            .iter()
            .any(|a| a.sentence().contains("demo-pkg 1.0 → 2.0")),
        "the replay shows the alert at {fired}"
    );
    // The environment alert is gone from the replay. Only that detector's line counts: on a
    // busy machine a throughput alert can stand at the same moment, and its "Before it" rightly
    // names the environment change among what preceded it.
    let after = replay_at(cleared);
    let shown: Vec<String> = after
        .explained_alerts()
        .iter()
        .filter(|a| a.detectors.iter().any(|d| d == "environment"))
        .map(|a| a.sentence())
        .collect();
    // What the recording holds around the clearing, for a failure to be read from the log.
    let around: Vec<String> = frames
        .iter()
        .filter(|f| (f.ts_ms - cleared).abs() <= 5_000)
        .map(|f| {
            format!(
                "{} {}",
                f.ts_ms,
                serde_json::to_string(&f.frame).unwrap_or_default()
            )
        })
        .map(|line| line.chars().take(300).collect())
        .collect();
    assert!(
        shown.is_empty(),
        "and its clearing at {cleared}: shown {shown:#?}\nframes around it:\n{}",
        around.join("\n")
    );
}
