//! Issue 23's done-when tests: two real `dflashd` processes on this machine, one per node,
//! meeting at a loopback rendezvous (libtorch's TCPStore) and summing gradients through
//! libtorch's Gloo, each on the embedded default with one drafter worker, or on a threaded
//! topology of two drafter workers per node.
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use dflash_engine::train::checkpoint::read_tensors;
use dflash_engine::train::resume::DRAFTER_FILE;
use dflash_shared::metrics::DeviceRole;
use tch::Tensor;

use dflash_shared::events::{EventKind, Severity};

use crate::support::binary::{checkpoint_steps, journal, write_config, Daemon};

/// The collective timeout the failure test runs under: a lost node pauses the other within it.
const TIMEOUT_S: u64 = 5;

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Node `rank` of two, in its own root (its own socket, run dir and XDG directories).
fn node(root: &Path, rank: u32, port: u16, extra: &[&str]) -> Daemon {
    node_timing_out(root, rank, port, TIMEOUT_S, extra)
}

/// [`node`] under a collective timeout of `timeout_s`.
fn node_timing_out(root: &Path, rank: u32, port: u16, timeout_s: u64, extra: &[&str]) -> Daemon {
    let rendezvous = format!("127.0.0.1:{port}");
    let timeout = timeout_s.to_string();
    let rank = rank.to_string();
    let mut args = vec![
        "--nnodes",
        "2",
        "--node-rank",
        &rank,
        "--rendezvous",
        &rendezvous,
        "--collective-timeout-s",
        &timeout,
    ];
    args.extend_from_slice(extra);
    Daemon::spawn(root, &args)
}

fn roots(n: usize) -> Vec<tempfile::TempDir> {
    (0..n).map(|_| tempfile::tempdir().unwrap()).collect()
}

fn drafter_at(run_dir: &Path, step: u64) -> Vec<(String, Tensor)> {
    let dir: PathBuf = run_dir.join(format!("checkpoints/step-{step:010}"));
    read_tensors(&dir, DRAFTER_FILE).unwrap()
}

fn max_abs_diff(a: &[(String, Tensor)], b: &[(String, Tensor)]) -> f64 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .map(|(name, ta)| {
            let tb = &b.iter().find(|(n, _)| n == name).unwrap().1;
            (ta - tb).abs().max().double_value(&[])
        })
        .fold(0.0, f64::max)
}

fn exit_ok(d: &mut Daemon) {
    let status = d.wait_exit();
    assert!(status.success(), "{status}:\n{}", d.stderr());
}

/// The steps the banner announces ("… 321 steps in total").
fn total_steps(d: &Daemon) -> String {
    let out = d.stdout();
    let at = out.find(" steps in total").expect("a banner");
    out[..at].rsplit(' ').next().unwrap().to_string()
}

/// Tolerance 0: each gradient element is summed over two ranks, one fp32 addition, which is
/// commutative, so Gloo's ring and the in-process group give the same bits (and the f64 Σw
/// likewise); everything else is the same arithmetic on the same micro-batches, which
/// `NodeShard` hands out exactly as the single process's round-robin does. More than two
/// ranks would reassociate the sum (≤ (n−1)·2⁻²⁴ relative per element per step).
#[test]
fn two_nodes_of_one_worker_equal_one_daemon_of_two_drafter_workers() {
    let started = Instant::now();
    let r = roots(3);
    let port = free_port();
    let steps = "4";
    let mut n0 = node(r[0].path(), 0, port, &["--max-steps", steps]);
    let mut n1 = node(r[1].path(), 1, port, &["--max-steps", steps]);
    let config = r[2].path().join("two-workers.toml");
    write_config(&config, |c| {
        c.topology.drafter_devices = vec![dflash_shared::config::Device::Cpu; 2];
    });
    exit_ok(&mut n0);
    exit_ok(&mut n1);
    let single_args = ["--config", config.to_str().unwrap(), "--max-steps", steps];
    let mut single = Daemon::spawn(r[2].path(), &single_args);
    exit_ok(&mut single);
    assert_eq!(total_steps(&n0), total_steps(&single), "global steps");
    assert_eq!(total_steps(&n1), total_steps(&single));
    let w0 = drafter_at(&n0.run_dir, 4);
    assert_eq!(max_abs_diff(&w0, &drafter_at(&n1.run_dir, 4)), 0.0);
    let diff = max_abs_diff(&w0, &drafter_at(&single.run_dir, 4));
    assert!(diff == 0.0, "max |Δparam| after 4 steps: {diff:e}");
    // Every step line of each node carries the job's view from the per-step all-reduce: both
    // nodes' figures, the same on both nodes, and the job's rate their sum.
    let (jobs0, jobs1) = (step_jobs(&n0.run_dir), step_jobs(&n1.run_dir));
    assert_eq!(jobs0.len(), 4, "one view per step");
    for (j0, j1) in jobs0.iter().zip(&jobs1) {
        assert_eq!((j0.this_node, j1.this_node), (0, 1));
        assert_eq!(j0.nodes, j1.nodes, "both nodes read the same sum");
        assert_eq!(j0.nodes.iter().map(|n| n.node).collect::<Vec<_>>(), [0, 1]);
        let sum: f64 = j0.nodes.iter().map(|n| n.tokens_per_s).sum();
        assert_eq!(j0.tokens_per_s, sum);
        assert!(j0.nodes.iter().all(|n| n.tokens_per_s > 0.0
            && n.busy_ms > 0.0
            && n.busy_ms <= n.step_ms
            && n.queue_wait_share.is_none()));
    }
    // Each node compared its state with the other's through the store at the checkpoint, and
    // journaled the agreement.
    for d in [&n0, &n1] {
        assert!(
            journal_text(&d.run_dir).contains("checkpoint step 4: the state of all 2 nodes agrees"),
            "{}",
            journal_text(&d.run_dir)
        );
    }
    eprintln!(
        "two dflashd nodes vs one: max |Δ| {diff:e} in {:?}",
        started.elapsed()
    );
}

/// Two nodes of two drafter workers each (`[topology]` one target and two drafter workers on
/// the CPU, so each node runs its threaded topology, every drafter worker its own rank of one
/// Gloo group of four) against one daemon of four drafter workers. Tolerance 1e-5, the
/// in-process equivalence tests' (`engine/tests/engine/topology_equivalence.rs`): each
/// gradient element is now a sum of four fp32 values, which Gloo's ring associates otherwise
/// than the in-process group's rank order (≤ 3·2⁻²⁴ relative per element per step). The two
/// nodes agree to the bit: every rank of the ring reads the same reduced bytes.
#[test]
fn two_nodes_of_two_workers_equal_one_daemon_of_four_drafter_workers() {
    let started = Instant::now();
    let r = roots(3);
    let with_drafters = |root: &Path, n: usize| {
        let config = root.join(format!("{n}-drafter-workers.toml"));
        write_config(&config, |c| {
            c.topology.target_devices = vec![dflash_shared::config::Device::Cpu];
            c.topology.drafter_devices = vec![dflash_shared::config::Device::Cpu; n];
        });
        config.to_str().unwrap().to_string()
    };
    let steps = 2;
    let port = free_port();
    let (c0, c1) = (with_drafters(r[0].path(), 2), with_drafters(r[1].path(), 2));
    let mut n0 = node(r[0].path(), 0, port, &["--config", &c0, "--max-steps", "2"]);
    let mut n1 = node(r[1].path(), 1, port, &["--config", &c1, "--max-steps", "2"]);
    exit_ok(&mut n0);
    exit_ok(&mut n1);
    let c4 = with_drafters(r[2].path(), 4);
    let mut single = Daemon::spawn(r[2].path(), &["--config", &c4, "--max-steps", "2"]);
    exit_ok(&mut single);
    assert_eq!(total_steps(&n0), total_steps(&single), "global steps");
    let w0 = drafter_at(&n0.run_dir, steps);
    assert_eq!(max_abs_diff(&w0, &drafter_at(&n1.run_dir, steps)), 0.0);
    let diff = max_abs_diff(&w0, &drafter_at(&single.run_dir, steps));
    assert!(diff <= 1e-5, "max |Δparam| after {steps} steps: {diff:e}");
    // Each node's slot of the job view holds that node's own step: its two drafter workers'
    // tokens, so the nodes' tokens add up to the one daemon's step, not to twice it.
    let tokens = |rate: f64, ms: f64| (rate * ms / 1e3).round() as u64;
    let single_steps = step_lines(&single.run_dir);
    let (lines0, lines1) = (step_lines(&n0.run_dir), step_lines(&n1.run_dir));
    assert_eq!(lines0.len() as u64, steps, "one line per step");
    for ((m0, m1), one) in lines0.iter().zip(&lines1).zip(&single_steps) {
        let (j0, j1) = (m0.job.as_ref().unwrap(), m1.job.as_ref().unwrap());
        assert_eq!(j0.nodes, j1.nodes, "both nodes read the same sum");
        for (m, own) in [(m0, &j0.nodes[0]), (m1, &j1.nodes[1])] {
            assert_eq!(
                own.tokens_per_s, m.tokens_per_s,
                "a node's slot is its own step"
            );
            assert!(
                own.queue_wait_share.is_some(),
                "a threaded node has a queue"
            );
            let drafters = m.workers.iter().filter(|w| w.role == DeviceRole::Drafter);
            assert_eq!(drafters.count(), 2, "{:?}", m.workers);
        }
        let per_node: Vec<u64> = j0
            .nodes
            .iter()
            .map(|n| tokens(n.tokens_per_s, n.step_ms))
            .collect();
        let whole = tokens(one.tokens_per_s, one.times.total_ms);
        assert!(per_node.iter().all(|&t| t > 0 && t < whole), "{per_node:?}");
        assert_eq!(
            per_node.iter().sum::<u64>(),
            whole,
            "{per_node:?} vs {whole}"
        );
    }
    eprintln!(
        "two dflashd nodes of two workers vs one of four: max |Δ| {diff:e} in {:?}",
        started.elapsed()
    );
}

/// The step lines of a run dir's `metrics.jsonl`.
fn step_lines(run_dir: &Path) -> Vec<dflash_shared::metrics::StepMetrics> {
    std::fs::read_to_string(run_dir.join("metrics.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str::<dflash_shared::metrics::StepMetrics>(l).unwrap())
        .filter(|m| m.step > 0)
        .collect()
}

/// The job view of every step line of a run dir's `metrics.jsonl`.
fn step_jobs(run_dir: &Path) -> Vec<dflash_shared::job::JobView> {
    step_lines(run_dir)
        .into_iter()
        .map(|m| m.job.expect("a node's step line carries the job's view"))
        .collect()
}

/// The journal of a run dir as text, for lines that name things.
fn journal_text(run_dir: &Path) -> String {
    std::fs::read_to_string(run_dir.join("journal.jsonl")).unwrap_or_default()
}

/// The survivor journals "lost node {lost}" within the collective timeout of the kill and
/// stays up, paused; how long the pause took.
fn paused_naming(survivor: &mut Daemon, lost: u32) -> Duration {
    let paused = wait_for(
        &format!("a pause naming node {lost}"),
        Duration::from_secs(TIMEOUT_S + 5),
        || journal_text(&survivor.run_dir).contains(&format!("lost node {lost}")),
    );
    assert!(
        paused < Duration::from_secs(TIMEOUT_S),
        "paused {paused:?} after the kill"
    );
    assert!(
        survivor.child.try_wait().unwrap().is_none(),
        "the survivor waits paused"
    );
    paused
}

fn wait_for(what: &str, limit: Duration, mut ok: impl FnMut() -> bool) -> Duration {
    let started = Instant::now();
    while !ok() {
        assert!(started.elapsed() < limit, "no {what} within {limit:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
    started.elapsed()
}

/// A restart of both nodes after a loss, 2 more steps each: each resumes from the newest
/// checkpoint both hold (returned) and both end on the same weights.
fn restart_both_and_resume(r: &[tempfile::TempDir], cfg: &dyn Fn(usize) -> String) -> u64 {
    let common = {
        let a = checkpoint_steps(&r[0].path().join("run"));
        let b = checkpoint_steps(&r[1].path().join("run"));
        *a.iter().filter(|s| b.contains(s)).max().unwrap()
    };
    let port = free_port();
    let more = ["--max-steps", "2"];
    let mut nodes: Vec<Daemon> = (0..2)
        .map(|i| {
            node(
                r[i].path(),
                i as u32,
                port,
                &[&["--config", &cfg(i)][..], &more].concat(),
            )
        })
        .collect();
    for d in &mut nodes {
        exit_ok(d);
    }
    for d in &nodes {
        assert!(
            d.stdout().contains(&format!("resumed at step {common} ")),
            "{}",
            d.stdout()
        );
    }
    let end = common + 2;
    assert_eq!(
        max_abs_diff(
            &drafter_at(&nodes[0].run_dir, end),
            &drafter_at(&nodes[1].run_dir, end)
        ),
        0.0
    );
    common
}

#[test]
fn kill_9_of_one_node_pauses_the_other_naming_it_and_both_resume_from_the_common_checkpoint() {
    let started = Instant::now();
    let r = roots(2);
    let configs: Vec<PathBuf> = r.iter().map(|d| d.path().join("every-2.toml")).collect();
    for c in &configs {
        write_config(c, |c| {
            c.training.checkpoint_every = 2;
            c.training.keep_checkpoints = 50;
        });
    }
    let cfg = |i: usize| configs[i].to_str().unwrap().to_string();
    let port = free_port();
    let mut n0 = node(r[0].path(), 0, port, &["--config", &cfg(0)]);
    let mut n1 = node(r[1].path(), 1, port, &["--config", &cfg(1)]);
    n0.wait_step_above(2);
    // Node 0's status: its place in the job, the job's view, and the job's rate as the
    // throughput figure the detector judges.
    let status = n0.status();
    let job = status.job.expect("a node's status carries the job");
    assert_eq!((job.node, job.nnodes), (0, 2));
    let view = job.view.expect("a view after the first step");
    assert_eq!(view.nodes.len(), 2);
    assert!(view.tokens_per_s > view.nodes[0].tokens_per_s);
    wait_for("a checkpoint on both", Duration::from_secs(30), || {
        !checkpoint_steps(&n0.run_dir).is_empty() && !checkpoint_steps(&n1.run_dir).is_empty()
    });
    n1.child.kill().unwrap(); // SIGKILL
    let _ = n1.child.wait();
    let paused = paused_naming(&mut n0, 1);
    n0.signal(libc::SIGTERM);
    n0.wait_exit();
    drop((n0, n1));

    let common = restart_both_and_resume(&r, &cfg);
    eprintln!(
        "kill -9: paused {paused:?} after; resumed both at {common}; {:?}",
        started.elapsed()
    );
}

/// Node 0 also serves the rendezvous store: killing it takes the store with it. Node 1 must
/// still pause naming node 0 within the timeout, not hang on the store or the group.
#[test]
fn kill_9_of_node_0_the_store_host_pauses_node_1_naming_it() {
    let r = roots(2);
    let port = free_port();
    let mut n0 = node(r[0].path(), 0, port, &[]);
    let mut n1 = node(r[1].path(), 1, port, &[]);
    n1.wait_step_above(2);
    n0.child.kill().unwrap(); // SIGKILL
    let _ = n0.child.wait();
    paused_naming(&mut n1, 0);
    // And it stops when asked: nothing of it waits on the dead store.
    n1.signal(libc::SIGTERM);
    n1.wait_exit();
}

#[test]
fn two_nodes_whose_configs_differ_in_a_locked_key_both_refuse_naming_it() {
    let r = roots(2);
    let configs: Vec<PathBuf> = r.iter().map(|d| d.path().join("c.toml")).collect();
    write_config(&configs[0], |_| {});
    write_config(&configs[1], |c| c.training.epochs += 1);
    let port = free_port();
    let mut nodes: Vec<Daemon> = (0..2)
        .map(|i| {
            let path = configs[i].to_str().unwrap();
            node(r[i].path(), i as u32, port, &["--config", path])
        })
        .collect();
    for d in &mut nodes {
        let status = d.wait_exit();
        assert_eq!(status.code(), Some(1), "{}", d.stderr());
        let err = d.stderr();
        assert!(
            err.contains("node 1's training.epochs = ") && err.contains("(a locked key)"),
            "{err}"
        );
        assert!(
            journal_text(&d.run_dir).contains("training.epochs"),
            "the refusal is journaled"
        );
        assert!(checkpoint_steps(&d.run_dir).is_empty(), "nothing trained");
    }
}

/// The heartbeat timeout (`nodes.heartbeat_timeout_s`) the test of nodes of two drafter
/// workers runs under: short, so the kill is named quickly, and far above a live heartbeat
/// thread's lateness on two loaded cores.
const HEARTBEAT_S: f64 = 2.0;

/// The survivor's `run_paused` reason, once it names node `lost` as a node: never by the
/// address Gloo gives in a group of more than two ranks. How long after the call it came.
fn paused_reason_naming(survivor: &mut Daemon, lost: u32, limit: Duration) -> (Duration, String) {
    let mut reason = String::new();
    let waited = wait_for(&format!("a pause naming node {lost}"), limit, || {
        let paused = journal(&survivor.run_dir)
            .into_iter()
            .find_map(|e| match e.kind {
                EventKind::RunPaused { reason } => Some(reason),
                _ => None,
            });
        reason = paused.unwrap_or_default();
        !reason.is_empty()
    });
    assert!(
        reason.contains(&format!("node {lost}")) && !reason.contains("the peer at"),
        "{reason}"
    );
    assert!(
        survivor.child.try_wait().unwrap().is_none(),
        "the survivor waits paused"
    );
    (waited, reason)
}

/// Two nodes of two drafter workers each, one Gloo group of four: Gloo names the lost peer of
/// such a group by its address, so the node is named by its heartbeat. Node 0 pauses within
/// the heartbeat's bound (`nodes.heartbeat_timeout_s` and a fifth of it; the test allows a
/// second more for the run loop to journal it on two loaded cores) with a reason naming node
/// 1, the heartbeat judge's line journaled beside it; then both resume from the newest
/// checkpoint they both hold and end on the same weights.
#[test]
#[ignore = "soak: two daemons of three workers each, a kill and a restart take about 13 s; `make soak` runs it"]
fn kill_9_of_a_node_of_two_drafter_workers_pauses_the_other_naming_it_and_both_resume() {
    let started = Instant::now();
    let r = roots(2);
    let configs: Vec<PathBuf> = r
        .iter()
        .map(|d| d.path().join("two-workers.toml"))
        .collect();
    for (c, root) in configs.iter().zip(&r) {
        // Each node warm-starts from its own copy of one drafter: the start's comparison of
        // the copies' digests lets equal ones through.
        write_drafter(&root.path().join("drafter"), 7);
        write_config(c, |c| {
            c.topology.target_devices = vec![dflash_shared::config::Device::Cpu];
            c.topology.drafter_devices = vec![dflash_shared::config::Device::Cpu; 2];
            c.training.checkpoint_every = 2;
            c.training.keep_checkpoints = 50;
            c.nodes.heartbeat_timeout_s = HEARTBEAT_S;
            c.drafter.init_from = Some("drafter".into());
        });
    }
    let cfg = |i: usize| configs[i].to_str().unwrap().to_string();
    let port = free_port();
    let mut n0 = node(r[0].path(), 0, port, &["--config", &cfg(0)]);
    let mut n1 = node(r[1].path(), 1, port, &["--config", &cfg(1)]);
    n0.wait_step_above(2);
    wait_for("a checkpoint on both", Duration::from_secs(30), || {
        !checkpoint_steps(&n0.run_dir).is_empty() && !checkpoint_steps(&n1.run_dir).is_empty()
    });
    n1.child.kill().unwrap(); // SIGKILL
    let _ = n1.child.wait();
    let bound = Duration::from_secs_f64(HEARTBEAT_S * 1.2);
    let (paused, reason) = paused_reason_naming(&mut n0, 1, Duration::from_secs(TIMEOUT_S + 5));
    assert!(
        paused < bound + Duration::from_secs(1),
        "paused {paused:?} after the kill, the heartbeat's bound is {bound:?}: {reason}"
    );
    let judged = journal(&n0.run_dir).into_iter().find(|e| {
        matches!(&e.kind, EventKind::Note { message }
            if message.contains("node 1's heartbeat has not advanced for "))
    });
    assert_eq!(
        judged.map(|e| e.severity),
        Some(Severity::Warn),
        "the judge's line, a warning: {}",
        journal_text(&n0.run_dir)
    );
    n0.signal(libc::SIGTERM);
    n0.wait_exit();
    drop((n0, n1));

    let common = restart_both_and_resume(&r, &cfg);
    eprintln!(
        "kill -9 of a node of two workers: paused {paused:?} after ({reason}); resumed both at \
         {common}; {:?}",
        started.elapsed()
    );
}

/// A drafter of the embedded default's shape with the weights of `seed`, in `dflashd export`'s
/// layout (`config.json`, an f32 `model.safetensors`), for `drafter.init_from`.
fn write_drafter(dir: &Path, seed: i64) {
    use dflash_engine::embedded;
    use dflash_engine::model::drafter::Drafter;
    use dflash_engine::train::drafter_io::{named_parameters, write_hf};
    let cfg = embedded::tiny_drafter_config(&embedded::tiny_target_config());
    let _rng = dflash_engine::device::global_rng::seeded(seed);
    let vs = tch::nn::VarStore::new(tch::Device::Cpu);
    let _drafter = Drafter::new(&vs.root(), &cfg);
    write_hf(dir, &cfg, &named_parameters(&vs), tch::Kind::Float).unwrap();
}

/// Each node reads `drafter.init_from` from its own copy, and the config compares only the
/// path: two nodes whose copies hold other weights both refuse the start after loading,
/// naming node 1, `drafter.init_from`, the file and what to do, and train nothing.
#[test]
fn two_nodes_whose_init_from_weights_differ_both_refuse_naming_node_and_key() {
    let started = Instant::now();
    let r = roots(2);
    let mut nodes: Vec<Daemon> = Vec::new();
    let port = free_port();
    for (i, root) in r.iter().enumerate() {
        write_drafter(&root.path().join("drafter"), 7 + i as i64);
        let config = root.path().join("warm.toml");
        // The same value on both nodes (relative to each config), other bytes behind it.
        write_config(&config, |c| c.drafter.init_from = Some("drafter".into()));
        nodes.push(node(
            root.path(),
            i as u32,
            port,
            &["--config", config.to_str().unwrap()],
        ));
    }
    for d in &mut nodes {
        let status = d.wait_exit();
        assert_eq!(status.code(), Some(1), "{}", d.stderr());
        let err = d.stderr();
        assert!(
            err.contains(
                "node 1's drafter.init_from holds other weights than node 0's: \
                 model.safetensors has SHA-256 "
            ) && err.contains("copy node 0's drafter directory to every node"),
            "{err}"
        );
        assert!(
            journal_text(&d.run_dir).contains("drafter.init_from holds other weights"),
            "the refusal is journaled"
        );
        assert!(checkpoint_steps(&d.run_dir).is_empty(), "nothing trained");
    }
    eprintln!("init_from digests refused in {:?}", started.elapsed());
}

/// A node that hangs with its sockets open (SIGSTOP: the process is alive, its connections
/// stay up, nothing answers) is noticed by its heartbeat, not at the collective timeout (30 s
/// here): node 0 pauses within the heartbeat's bound naming node 1. Continued, node 1 reads
/// why node 0 left the group and pauses too, naming node 0; both stop when asked.
#[test]
#[ignore = "soak: two daemons, a stop and a continue take about 6 s (the engine's dist tests stop a node in the regular suite); `make soak` runs it"]
fn a_node_that_hangs_is_named_within_the_heartbeat_bound_not_the_collective_timeout() {
    let started = Instant::now();
    let r = roots(2);
    let configs: Vec<PathBuf> = r.iter().map(|d| d.path().join("heartbeat.toml")).collect();
    for c in &configs {
        write_config(c, |c| c.nodes.heartbeat_timeout_s = HEARTBEAT_S);
    }
    let collective_timeout_s = 30;
    let port = free_port();
    let mut nodes: Vec<Daemon> = (0..2)
        .map(|i| {
            let config = ["--config", configs[i].to_str().unwrap()];
            node_timing_out(r[i].path(), i as u32, port, collective_timeout_s, &config)
        })
        .collect();
    nodes[0].wait_step_above(2);
    nodes[1].signal(libc::SIGSTOP);
    let bound = Duration::from_secs_f64(HEARTBEAT_S * 1.2);
    let limit = Duration::from_secs(collective_timeout_s / 2);
    let (paused, reason) = paused_reason_naming(&mut nodes[0], 1, limit);
    assert!(
        paused < bound + Duration::from_secs(1),
        "paused {paused:?} after the stop, the heartbeat's bound is {bound:?}: {reason}"
    );
    assert!(reason.contains("heartbeat has not advanced"), "{reason}");
    nodes[1].signal(libc::SIGCONT);
    let (_, woke) = paused_reason_naming(&mut nodes[1], 0, limit);
    assert!(woke.contains("node 0 left the gradient group"), "{woke}");
    for d in &mut nodes {
        d.signal(libc::SIGTERM);
        d.wait_exit();
    }
    eprintln!(
        "SIGSTOP of node 1: node 0 paused {paused:?} after; node 1 on continuing: {woke}; {:?}",
        started.elapsed()
    );
}
