//! Two rank processes on loopback: exact sums, a `kill -9` mid-collective, a stalled peer; and
//! an abort from another thread, in one process.
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{channel, Receiver};
use std::time::{Duration, Instant};

use dflash_engine::collective::allreduce::{AllReduce, AllReduceError};
use dflash_engine::dist::{
    CollectiveBackend, GlooTransport, GroupSpec, ProcessGroupAllReduce, TcpStore,
};
use tch::{Device, Kind, Tensor};

use crate::rank::{PORT_VAR, RANK_VAR, SCENARIO_VAR, TIMEOUT_VAR};

/// Held by the tests whose timing a CPU-heavy neighbour would break: the stalled-peer test
/// (its 1.5 s timeout also bounds the store connect of a process still loading libtorch) and
/// the two-node training test (two processes training on the 2 cores).
pub(crate) static TIMING: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// The collective timeout the kill test runs under: the survivor must report within it. The
/// lost connection names the peer at once; the timeout is long enough that, on a machine
/// busy with other work, it never fires first and reports a timeout instead of the peer (a
/// few seconds did, under load: issue 36).
const TIMEOUT: Duration = Duration::from_secs(20);

/// A rank process and the `DIST ` lines it printed, each with when the parent read it.
pub(crate) struct RankProcess {
    child: Child,
    lines: Receiver<(Instant, String)>,
    rank: usize,
}

impl RankProcess {
    fn start(rank: usize, port: u16, scenario: &str, timeout: Duration) -> RankProcess {
        Self::start_with(rank, port, scenario, timeout, &[])
    }

    /// [`Self::start`] with further environment variables.
    pub(crate) fn start_with(
        rank: usize,
        port: u16,
        scenario: &str,
        timeout: Duration,
        extra: &[(&str, String)],
    ) -> RankProcess {
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args(["--exact", "rank_process", "--nocapture"])
            .envs(extra.iter().map(|(k, v)| (*k, v.as_str())))
            .env(RANK_VAR, rank.to_string())
            .env(PORT_VAR, port.to_string())
            .env(SCENARIO_VAR, scenario)
            .env(TIMEOUT_VAR, timeout.as_millis().to_string())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let (tx, lines) = channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if let Some(rest) = line.strip_prefix("DIST ") {
                    let _ = tx.send((Instant::now(), rest.to_string()));
                }
            }
        });
        RankProcess { child, lines, rank }
    }

    /// The next line starting with `prefix` (and when it came), failing the test on a
    /// `FAILED` line, on the process's end, or after 20 s.
    pub(crate) fn expect(&self, prefix: &str) -> (Instant, String) {
        loop {
            match self.lines.recv_timeout(Duration::from_secs(20)) {
                Ok((at, line)) if line.starts_with(prefix) => return (at, line),
                Ok((_, line)) if line.starts_with("FAILED") => {
                    panic!("rank {}: {line}", self.rank)
                }
                Ok(_) => continue,
                Err(e) => panic!("rank {}: no {prefix:?} line ({e})", self.rank),
            }
        }
    }

    /// The next `count` lines that start with any of `prefixes`, in the order they came,
    /// under [`Self::expect`]'s rules (for lines whose order between them is not fixed).
    pub(crate) fn expect_lines(&self, prefixes: &[&str], count: usize) -> Vec<(Instant, String)> {
        let mut out = Vec::new();
        while out.len() < count {
            match self.lines.recv_timeout(Duration::from_secs(20)) {
                Ok((_, line)) if line.starts_with("FAILED") => {
                    panic!("rank {}: {line}", self.rank)
                }
                Ok((at, line)) if prefixes.iter().any(|p| line.starts_with(p)) => {
                    out.push((at, line))
                }
                Ok(_) => continue,
                Err(e) => panic!(
                    "rank {}: no {prefixes:?} line after {out:?} ({e})",
                    self.rank
                ),
            }
        }
        out
    }

    /// `kill -9`.
    pub(crate) fn kill(&mut self) {
        self.child.kill().unwrap();
    }

    /// Sends `signal` (`STOP`, `CONT`) to the process, through kill(1): the engine's tests
    /// have no libc binding of their own.
    pub(crate) fn signal(&self, signal: &str) {
        let pid = self.child.id().to_string();
        let status = Command::new("kill")
            .args([&format!("-{signal}"), &pid])
            .status()
            .unwrap();
        assert!(status.success(), "kill -{signal} {pid}: {status}");
    }

    pub(crate) fn wait_success(mut self) {
        let status = self.child.wait().unwrap();
        assert!(status.success(), "rank {} exited with {status}", self.rank);
    }
}

impl Drop for RankProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Rank 0 on a free port, then rank 1 on the port rank 0 bound.
fn start_pair(scenario: &str, timeout: Duration) -> (RankProcess, RankProcess) {
    let rank0 = RankProcess::start(0, 0, scenario, timeout);
    let (_, line) = rank0.expect("PORT ");
    let port: u16 = line["PORT ".len()..].parse().unwrap();
    let rank1 = RankProcess::start(1, port, scenario, timeout);
    (rank0, rank1)
}

#[test]
fn two_processes_sum_fp32_tensors_f64_values_and_bucketed_gradients_exactly() {
    let started = Instant::now();
    let (rank0, rank1) = start_pair("sum", Duration::from_secs(20));
    assert_eq!(rank0.expect("OK").1, "OK rank 0");
    assert_eq!(rank1.expect("OK").1, "OK rank 1");
    rank0.wait_success();
    rank1.wait_success();
    eprintln!("two-process exact sums: {:?}", started.elapsed());
}

/// The survivor's `ERROR <ms> <text>` line: how long it waited in the collective and why.
fn error_line(line: &str) -> (u128, String) {
    let rest = &line["ERROR ".len()..];
    let (ms, text) = rest.split_once(' ').unwrap();
    (ms.parse().unwrap(), text.to_string())
}

#[test]
fn kill_9_of_one_peer_mid_collective_is_an_error_naming_it_on_the_survivor_within_the_timeout() {
    let _serial = TIMING.lock().unwrap_or_else(|p| p.into_inner());
    let (rank0, mut rank1) = start_pair("loop", TIMEOUT);
    rank0.expect("LOOPING");
    rank1.expect("LOOPING");
    // Both are inside back-to-back all-reduces of 4 MiB now.
    std::thread::sleep(Duration::from_millis(100));
    let killed = Instant::now();
    rank1.child.kill().unwrap(); // SIGKILL
    let (at, line) = rank0.expect("ERROR");
    let (_, text) = error_line(&line);
    let after_kill = at.duration_since(killed);
    assert!(after_kill < TIMEOUT, "{after_kill:?}: {text}");
    assert!(
        text.starts_with("rank 0 of 2: lost rank 1 during an all-reduce"),
        "{text}"
    );
    eprintln!("survivor's error {after_kill:?} after kill -9: {text}");
    rank0.wait_success();
}

#[test]
fn a_peer_that_never_calls_the_collective_is_a_timeout_error_not_a_hang() {
    let _serial = TIMING.lock().unwrap_or_else(|p| p.into_inner());
    let timeout = Duration::from_millis(1500);
    let (rank0, rank1) = start_pair("stall", timeout);
    rank1.expect("JOINED");
    let (_, line) = rank0.expect("ERROR");
    let (waited_ms, text) = error_line(&line);
    // Gloo's own timeout, or ours a second after it.
    assert!(
        (1400..=timeout.as_millis() + 2000).contains(&waited_ms),
        "{waited_ms} ms: {text}"
    );
    assert!(
        text.starts_with("rank 0 of 2: no all-reduce result within 1500 ms"),
        "{text}"
    );
    rank0.wait_success();
    drop(rank1);
}

#[test]
fn an_abort_from_another_thread_releases_a_rank_waiting_for_its_peer() {
    let timeout = Duration::from_secs(20);
    let server = TcpStore::serve("127.0.0.1", 0, 2, timeout).unwrap();
    let port = server.port();
    let spec = move |rank| GroupSpec {
        name: "abort".into(),
        rank,
        world_size: 2,
        timeout,
        backend: CollectiveBackend::Gloo(GlooTransport::Hostname("127.0.0.1".into())),
    };
    let peer = std::thread::spawn(move || {
        let store = TcpStore::connect("127.0.0.1", port, 2, timeout).unwrap();
        let group = ProcessGroupAllReduce::join(&store, &spec(1)).unwrap();
        // Joined, then never calls: rank 0 waits for it until the abort.
        std::thread::sleep(Duration::from_secs(2));
        drop(group);
    });
    let mut group = ProcessGroupAllReduce::join(&server, &spec(0)).unwrap();
    let abort = group.abort_handle();
    let aborter = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(300));
        abort.abort();
    });
    let started = Instant::now();
    let mut t = Tensor::ones([16], (Kind::Float, Device::Cpu));
    assert_eq!(group.sum_tensor(&mut t), Err(AllReduceError::Aborted));
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
    let mut again = [1.0];
    assert_eq!(group.sum_f64(&mut again), Err(AllReduceError::Aborted));
    aborter.join().unwrap();
    peer.join().unwrap();
}
