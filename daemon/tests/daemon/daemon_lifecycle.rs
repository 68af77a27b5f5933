//! The real `dflashd start` on the CPU default: status over the socket while it trains, the
//! run-dir lock, SIGTERM (checkpoint, exit 0, and the restart continues from it), and
//! `--detach` with `--reuse-running`.

use std::time::{Duration, Instant};

use crate::support::binary::{checkpoint_steps, journal, run, Daemon};
use dflash_shared::events::EventKind;
use dflash_shared::status::RunState;

#[test]
fn status_advances_a_second_start_is_refused_and_sigterm_checkpoints_then_resume_continues() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();
    // This start times the CPU's matmul peak (every other test daemon is given one).
    let mut d = Daemon::spawn_measuring(root, &[]);
    let first = d.wait_step_above(0);
    let later = d.wait_step_above(first);
    assert!(later > first);
    let s = d.status();
    assert_eq!(s.run.name, "tiny-cpu");
    assert_eq!(s.run.state, RunState::Training);
    assert_eq!((s.run.epochs, s.run.total_steps), (6, 642));
    assert!(s.throughput.tokens_per_s > 0.0, "{:?}", s.throughput);
    assert!(
        s.last_loss.is_some() && s.last_tau.is_some(),
        "step-0 evaluation reported"
    );

    // Same run dir, another socket: refused by the lock, naming the live daemon.
    let (code, _, stderr) = run(
        root,
        &[
            "start",
            "--run-dir",
            &d.run_dir.display().to_string(),
            "--socket",
            &root.join("s2/d.sock").display().to_string(),
        ],
    );
    assert_ne!(code, 0);
    assert!(
        stderr.contains(&format!("pid {}", d.child.id())),
        "the refusal names the live pid: {stderr}"
    );

    d.signal(libc::SIGTERM);
    assert!(d.wait_exit().success(), "{}", d.stderr());
    let saved = *checkpoint_steps(&d.run_dir)
        .last()
        .expect("a checkpoint on SIGTERM");
    assert!(
        saved >= later,
        "checkpoint at step {saved}, status said {later}"
    );
    let events = journal(&d.run_dir);
    let stopped = events.iter().rev().find_map(|e| match &e.kind {
        EventKind::RunStopped { reason, checkpoint } => Some((reason.clone(), checkpoint.clone())),
        _ => None,
    });
    let (reason, checkpoint) = stopped.expect("RunStopped journaled");
    assert!(reason.contains("SIGTERM"), "{reason}");
    assert!(checkpoint.unwrap().ends_with(&format!("step-{saved:010}")));
    assert!(!d.socket.exists(), "the socket is removed on exit");

    // The restart resumes from that checkpoint and goes on from its step.
    let mut again = Daemon::spawn(root, &["--max-steps", "2"]);
    assert!(again.wait_exit().success(), "{}", again.stderr());
    assert!(
        again.stdout().contains(&format!("resumed at step {saved}")),
        "{}",
        again.stdout()
    );
    assert_eq!(checkpoint_steps(&d.run_dir).last(), Some(&(saved + 2)));
    let metrics = std::fs::read_to_string(d.run_dir.join("metrics.jsonl")).unwrap();
    let steps: Vec<u64> = metrics
        .lines()
        .map(|l| {
            serde_json::from_str::<serde_json::Value>(l).unwrap()["step"]
                .as_u64()
                .unwrap()
        })
        .collect();
    assert_eq!(&steps[steps.len() - 2..], &[saved + 1, saved + 2]);
    let resumed = journal(&d.run_dir).into_iter().any(|e| {
        matches!(e.kind, EventKind::RunStarted { resumed_from_step: Some(s), .. } if s == saved)
    });
    assert!(resumed, "RunStarted names the step it resumed from");
    // The first start measured its CPU peak; the restart was given one.
    let peaks: Vec<String> = journal(&d.run_dir)
        .into_iter()
        .filter_map(|e| match e.kind {
            EventKind::Note { message } if message.starts_with("MFU peak of cpu: ") => {
                Some(message)
            }
            _ => None,
        })
        .collect();
    assert_eq!(peaks.len(), 2, "{peaks:?}");
    assert!(peaks[0].contains("GFLOP/s, measured now ("), "{}", peaks[0]);
    assert!(
        peaks[1].starts_with("MFU peak of cpu: 50.0 GFLOP/s, given, not measured"),
        "{}",
        peaks[1]
    );
}

/// Running, and not a zombie waiting for whoever adopted it to reap it.
fn alive(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| {
            s.rsplit(')')
                .next()
                .map(|r| !r.trim_start().starts_with(['Z', 'X']))
        })
        .unwrap_or(false)
}

#[test]
fn detach_returns_once_serving_and_reuse_running_finds_it() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();
    let run_dir = root.join("run").display().to_string();
    let socket = root.join("s/d.sock").display().to_string();
    let start = [
        "start",
        "--detach",
        "--threads",
        "1",
        "--run-dir",
        &run_dir,
        "--socket",
        &socket,
    ];
    let t0 = Instant::now();
    let (code, stdout, stderr) = run(root, &start);
    assert_eq!(code, 0, "{stdout}\n{stderr}");
    assert!(t0.elapsed() < Duration::from_secs(30));
    let pid: i32 = stdout
        .split("(pid ")
        .nth(1)
        .and_then(|r| r.split(')').next())
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("no pid in: {stdout}"));
    for needle in [
        socket.as_str(),
        "dflash-tui attach --socket",
        "dflash-tui stop --socket",
        "dflash-tui confirm-stop",
    ] {
        assert!(
            stdout.contains(needle),
            "{needle:?} missing from:\n{stdout}"
        );
    }
    // The socket answers right away: `--detach` returned only once it did.
    assert!(std::os::unix::net::UnixStream::connect(&socket).is_ok());

    let mut reuse = start.to_vec();
    reuse.push("--reuse-running");
    let (code, stdout, _) = run(root, &reuse);
    assert_eq!(code, 0);
    assert!(
        stdout.contains(&format!("already running on {socket} (pid {pid}")),
        "{stdout}"
    );

    // SAFETY: the detached daemon is ours (started above).
    assert_eq!(unsafe { libc::kill(pid, libc::SIGTERM) }, 0);
    let deadline = Instant::now() + crate::support::binary::WAIT;
    while alive(pid) {
        assert!(Instant::now() < deadline, "detached daemon did not exit");
        std::thread::sleep(Duration::from_millis(50));
    }
    let out =
        std::fs::read_to_string(root.join("xdg-state/dflash/logs/dflashd-stdio.out")).unwrap();
    assert!(out.contains("stopped (SIGTERM)"), "{out}");
}

#[test]
fn a_multi_worker_start_names_every_worker_by_role_and_publishes_its_queue() {
    use dflash_shared::config::Device;
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();
    let config = root.join("two-by-two.toml");
    crate::support::binary::write_config(&config, |c| {
        c.topology.target_devices = vec![Device::Cpu, Device::Cpu];
        c.topology.drafter_devices = vec![Device::Cpu, Device::Cpu];
    });
    let mut d = Daemon::spawn(root, &["--config", &config.display().to_string()]);
    d.wait_step_above(1);
    let queue = d.status().queue;
    assert!(
        queue.capacity > 0 && queue.byte_cap > 0,
        "the queue is published: {queue:?}"
    );
    d.signal(libc::SIGTERM);
    assert!(d.wait_exit().success(), "{}", d.stderr());
    let out = d.stdout();
    assert!(
        out.contains("on 2 target workers (cpu, cpu) + 2 drafter workers (cpu, cpu)"),
        "the banner names the topology, not drafter rank 0's device:\n{out}"
    );
    // The daemon, the one writer of the warmup record, lists every worker's serialized
    // warmup under the environment it ran in.
    let warmup: serde_json::Value =
        serde_json::from_slice(&std::fs::read(d.run_dir.join("warmup.json")).unwrap()).unwrap();
    let roles: Vec<&str> = warmup["devices"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| w["role"].as_str().unwrap())
        .collect();
    assert_eq!(
        roles,
        ["target", "target", "drafter", "drafter"],
        "{warmup}"
    );
    assert!(warmup["fingerprint_digest"].is_string(), "{warmup}");
    // Once at warmup, every worker's attention call sites and the SDPA kernel each gets on
    // its device (issue 12, defect 7).
    let journal =
        std::fs::read_to_string(dflash_shared::run_dir::journal_path(&d.run_dir)).unwrap();
    let kernels: Vec<(String, String, String)> = journal
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .filter(|e| e["kind"] == "attention_kernel")
        .map(|e| {
            let field = |k: &str| e[k].as_str().unwrap().to_string();
            (field("role"), field("call_site"), field("backend"))
        })
        .collect();
    let sites: Vec<(&str, &str)> = kernels
        .iter()
        .map(|(role, site, _)| (role.as_str(), site.as_str()))
        .collect();
    assert_eq!(
        sites,
        [
            ("target", "target causal GQA"),
            ("target", "target causal GQA"),
            ("drafter", "drafter block-sparse (bias)"),
            ("drafter", "drafter block-sparse (bias)"),
        ],
        "{journal}"
    );
    assert!(
        kernels
            .iter()
            .all(|(_, _, backend)| backend == "math" || backend == "flash"),
        "a CPU kernel on every CPU worker: {kernels:?}"
    );
}

/// The production loop's checkpoint cadence, through the real daemon: every
/// `checkpoint_every` steps and at the end, each journaled once; a restart resumes from the
/// last one, does not rewrite it, and keeps the cadence on the global step count.
#[test]
fn the_daemon_checkpoints_on_its_cadence_and_a_restart_continues_it() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();
    let config = root.join("cadence.toml");
    crate::support::binary::write_config(&config, |c| {
        c.training.checkpoint_every = 3;
        c.training.keep_checkpoints = 10;
    });
    let config = config.display().to_string();
    let mut first = Daemon::spawn(root, &["--config", &config, "--max-steps", "7"]);
    assert!(first.wait_exit().success(), "{}", first.stderr());
    assert_eq!(checkpoint_steps(&first.run_dir), [3, 6, 7]);

    let mut again = Daemon::spawn(root, &["--config", &config, "--max-steps", "3"]);
    assert!(again.wait_exit().success(), "{}", again.stderr());
    assert!(
        again.stdout().contains("resumed at step 7"),
        "{}",
        again.stdout()
    );
    assert_eq!(checkpoint_steps(&again.run_dir), [3, 6, 7, 9, 10]);
    let written: Vec<u64> = journal(&again.run_dir)
        .into_iter()
        .filter_map(|e| match e.kind {
            EventKind::CheckpointWritten { step, .. } => Some(step),
            _ => None,
        })
        .collect();
    assert_eq!(written, [3, 6, 7, 9, 10], "each checkpoint journaled once");
}
