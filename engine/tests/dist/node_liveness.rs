//! Two nodes of two ranks each (two OS processes, a Gloo group of four on loopback), each
//! with its heartbeat through the store (`dist::liveness`) and its endpoints naming peers as
//! nodes (`dist::NodeEndpoint`). Gloo names a lost peer of a group of four by its address; the
//! survivor must name the node instead: after a `kill -9`, after a `SIGSTOP` (alive, sockets
//! open, never answering: Gloo alone would wait for the collective timeout), and when the
//! killed node is node 0, which serves the store.
use std::sync::mpsc::channel;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use dflash_engine::collective::allreduce::AllReduce;
use dflash_engine::dist::{
    CollectiveBackend, GlooTransport, GroupSpec, Liveness, LivenessBounds, NodeEndpoint, OnSilence,
    ProcessGroupAllReduce, TcpStore,
};

use crate::rank::{contribution, env_var, WORLD as NODES};
use crate::two_process::RankProcess;

const WORKERS: usize = 2;
/// The heartbeat timeout these nodes run under, milliseconds.
pub const HEARTBEAT_VAR: &str = "DFLASH_DIST_HEARTBEAT_MS";
/// When set: the node aborts its endpoints this many milliseconds after joining, as a failure
/// of one of its workers does, and stays alive.
const QUIT_VAR: &str = "DFLASH_DIST_QUIT_AFTER_MS";
const HEARTBEAT: Duration = Duration::from_secs(2);
/// Far beyond the heartbeat's bound: a node named before it was named by its heartbeat.
const COLLECTIVE_TIMEOUT: Duration = Duration::from_secs(30);

/// The body of a node process: joins its two ranks, starts its heartbeat, then sums on both
/// ranks' threads until each fails, printing `DIST ERROR <worker> <ms> <text>` for each.
pub fn loop_as_node(store: TcpStore, node: usize, timeout: Duration) -> Result<()> {
    let store = std::sync::Arc::new(store);
    let heartbeat = Duration::from_millis(env_var(HEARTBEAT_VAR)?.parse()?);
    let specs: Vec<GroupSpec> = (0..WORKERS)
        .map(|worker| GroupSpec {
            name: "drafter".into(),
            rank: node * WORKERS + worker,
            world_size: NODES * WORKERS,
            timeout,
            backend: CollectiveBackend::Gloo(GlooTransport::Hostname("127.0.0.1".into())),
        })
        .collect();
    let groups = ProcessGroupAllReduce::join_local_ranks(&store, &specs)?;
    let liveness = Liveness::start(
        &store,
        node as u32,
        NODES as u32,
        LivenessBounds { timeout: heartbeat },
        timeout,
        OnSilence {
            aborts: groups.iter().map(|g| g.abort_handle()).collect(),
            journal: Box::new(|line| println!("DIST JOURNAL {line}")),
        },
    )
    .context("starting the heartbeat")?;
    let liveness = std::sync::Arc::new(liveness);
    println!("DIST JOINED");
    let quit_after = std::env::var(QUIT_VAR)
        .ok()
        .and_then(|ms| ms.parse::<u64>().ok());
    let (tx, rx) = channel();
    let endpoints: Vec<NodeEndpoint> = groups
        .into_iter()
        .map(|group| NodeEndpoint::new(group, WORKERS, Some(liveness.clone())))
        .collect();
    let aborts: Vec<_> = endpoints
        .iter()
        .filter_map(|e| e.endpoint_abort())
        .collect();
    let threads: Vec<_> = endpoints
        .into_iter()
        .enumerate()
        .map(|(worker, mut endpoint)| {
            let tx = tx.clone();
            std::thread::spawn(move || {
                let mut first = true;
                loop {
                    let mut t = contribution(endpoint.rank(), 1 << 16);
                    let started = Instant::now();
                    if let Err(e) = endpoint.sum_tensor(&mut t) {
                        let _ = tx.send((worker, started.elapsed().as_millis(), e.to_string()));
                        return;
                    }
                    if std::mem::take(&mut first) && worker == 0 {
                        println!("DIST LOOPING");
                    }
                }
            })
        })
        .collect();
    drop(tx);
    if let Some(ms) = quit_after {
        // What a failure of one of this node's workers does: the tripwire aborts every local
        // endpoint through its abort handle. The process stays alive, its sockets open.
        std::thread::sleep(Duration::from_millis(ms));
        for abort in &aborts {
            abort.abort();
        }
        println!("DIST QUIT");
        std::thread::sleep(Duration::from_secs(60));
    }
    for (worker, ms, text) in rx {
        println!("DIST ERROR {worker} {ms} {text}");
    }
    for t in threads {
        let _ = t.join();
    }
    Ok(())
}

fn start_nodes() -> (RankProcess, RankProcess) {
    start_nodes_with(&[])
}

/// Node 0, then node 1 with `node1_extra` in its environment; both looping.
fn start_nodes_with(node1_extra: &[(&str, String)]) -> (RankProcess, RankProcess) {
    let extra = [(HEARTBEAT_VAR, HEARTBEAT.as_millis().to_string())];
    let node0 = RankProcess::start_with(0, 0, "node-loop", COLLECTIVE_TIMEOUT, &extra);
    let (_, line) = node0.expect("PORT ");
    let port: u16 = line["PORT ".len()..].parse().unwrap();
    let extra1 = [&extra[..], node1_extra].concat();
    let node1 = RankProcess::start_with(1, port, "node-loop", COLLECTIVE_TIMEOUT, &extra1);
    node0.expect("LOOPING");
    node1.expect("LOOPING");
    (node0, node1)
}

/// Both of the survivor's ranks fail naming `lost` as a node, not an address, and its judge
/// journals one line naming it; returns how long after `since` the first failure came.
fn both_ranks_name(survivor: &RankProcess, lost: u32, since: Instant) -> Duration {
    let lines = survivor.expect_lines(&["ERROR", "JOURNAL"], WORKERS + 1);
    let mut first = None;
    for (at, line) in &lines {
        if let Some(journal) = line.strip_prefix("JOURNAL ") {
            assert!(journal.starts_with(&format!("node {lost}")), "{journal}");
            assert!(
                journal.contains("the job's gradient group is aborted"),
                "{journal}"
            );
            continue;
        }
        let text = line.splitn(4, ' ').nth(3).unwrap();
        assert!(
            text.contains(&format!("lost node {lost} during an all-reduce")),
            "{text}"
        );
        assert!(!text.contains("lost the peer at"), "{text}");
        first.get_or_insert(at.duration_since(since));
    }
    assert_eq!(
        lines.iter().filter(|(_, l)| l.starts_with("ERROR")).count(),
        WORKERS,
        "{lines:?}"
    );
    first.unwrap()
}

/// The heartbeat's bound, and a second for two processes on two loaded cores to print it.
fn within_the_bound(after: Duration) {
    let bound = LivenessBounds { timeout: HEARTBEAT }.bound();
    assert!(
        after < bound + Duration::from_secs(1),
        "named {after:?} after, the bound is {bound:?}"
    );
}

#[test]
fn kill_9_of_a_node_of_two_ranks_is_named_as_that_node_within_the_heartbeat_bound() {
    let started = Instant::now();
    let (node0, mut node1) = start_nodes();
    let killed = Instant::now();
    node1.kill();
    let after = both_ranks_name(&node0, 1, killed);
    within_the_bound(after);
    eprintln!(
        "kill -9 of node 1 (world 4): named after {after:?}; test {:?}",
        started.elapsed()
    );
}

#[test]
fn a_stopped_node_alive_with_its_sockets_open_is_named_within_the_heartbeat_bound() {
    let started = Instant::now();
    let (node0, node1) = start_nodes();
    let stopped = Instant::now();
    node1.signal("STOP");
    let after = both_ranks_name(&node0, 1, stopped);
    within_the_bound(after);
    assert!(after < COLLECTIVE_TIMEOUT / 4, "{after:?}");
    node1.signal("CONT");
    eprintln!(
        "SIGSTOP of node 1 (world 4): named after {after:?}; test {:?}",
        started.elapsed()
    );
}

#[test]
fn kill_9_of_node_0_which_serves_the_store_is_named_as_node_0() {
    let started = Instant::now();
    let (mut node0, node1) = start_nodes();
    let killed = Instant::now();
    node0.kill();
    let after = both_ranks_name(&node1, 0, killed);
    within_the_bound(after);
    eprintln!(
        "kill -9 of node 0 (world 4): named after {after:?}; test {:?}",
        started.elapsed()
    );
}

#[test]
fn a_node_that_gives_up_after_a_failure_of_its_own_is_named_within_a_heartbeat_period() {
    let started = Instant::now();
    let (node0, node1) = start_nodes_with(&[(QUIT_VAR, "300".into())]);
    let (quit, _) = node1.expect("QUIT");
    let after = both_ranks_name(&node0, 1, quit);
    // Published at once, read at node 0's next beat, judged within half a period: a period
    // and a half, and a second for two loaded cores.
    let period = LivenessBounds { timeout: HEARTBEAT }.period();
    assert!(
        after < period * 3 / 2 + Duration::from_secs(1),
        "named {after:?} after node 1 quit; a period is {period:?}"
    );
    eprintln!(
        "node 1 quit (world 4): named after {after:?}; test {:?}",
        started.elapsed()
    );
}
