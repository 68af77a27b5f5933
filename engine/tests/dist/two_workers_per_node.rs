//! Two nodes of two drafter workers each (two OS processes, each a threaded topology of one
//! target worker and two drafter worker threads on the CPU; loopback TCPStore, libtorch's
//! Gloo; every drafter worker its own rank of one group of four) train what one process of
//! four drafter workers trains, resume exactly from a checkpoint, and report each node's own
//! figures in the job view.
//!
//! Tolerance against the one process: [`TOLERANCE`], the one the in-process equivalence tests
//! state (`engine/tests/engine/topology_equivalence.rs`). Each gradient element is a sum of
//! four fp32 values: the in-process group adds them in rank order, ((g0 + g1) + g2) + g3,
//! while Gloo's ring starts each slice of the buffer at another rank, so the same four values
//! are associated differently (≤ 3·2⁻²⁴ relative per element per step, which AdamW's
//! normalised update then carries). With two ranks (`two_node_training.rs`) one addition is
//! commutative and the tolerance is 0. Between the two nodes, between a node's two workers,
//! and between a resumed run and the straight one the tolerance is 0 here too: every rank of
//! the ring reads the same reduced bytes, and a resumed run repeats the same arithmetic.
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{ensure, Context, Result};
use dflash_engine::collective::allreduce::AllReduce;
use dflash_engine::dist::{
    CollectiveBackend, GlooTransport, GroupSpec, ProcessGroupAllReduce, TcpStore,
};
use dflash_engine::train::shard::NodeShard;
use dflash_engine::train::topology::queue::QueueConfig;
use dflash_engine::train::topology::TopologySpec;
use dflash_shared::metrics::{DeviceRole, StepMetrics};
use tch::{Device, Tensor};

use crate::rank::{env_var, WORLD as NODES};
use crate::two_node_training::{
    assert_nodes_match, config, max_abs_diff, node_trainer, trainer, OUT_VAR,
};
use crate::two_process::RankProcess;

const WORKERS: usize = 2;
const STEPS: u64 = 4;
const CHECKPOINT_AT: u64 = 2;
const TOLERANCE: f64 = 1e-5;

/// One target worker feeding `drafters` drafter worker threads, all on the CPU.
fn topology(drafters: usize) -> TopologySpec {
    TopologySpec {
        target_devices: vec![Device::Cpu],
        drafter_devices: vec![Device::Cpu; drafters],
        queue: QueueConfig {
            capacity: 8,
            high_watermark: 6,
            low_watermark: 2,
            byte_cap: 1 << 30,
        },
    }
}

/// This node's two endpoints of the job's group `name`: global ranks `node·2` and `node·2 + 1`
/// of four.
fn endpoints(
    store: &TcpStore,
    node: usize,
    name: &str,
    timeout: Duration,
) -> Result<Vec<Box<dyn AllReduce>>> {
    let specs: Vec<GroupSpec> = (0..WORKERS)
        .map(|worker| GroupSpec {
            name: name.into(),
            rank: node * WORKERS + worker,
            world_size: NODES * WORKERS,
            timeout,
            backend: CollectiveBackend::Gloo(GlooTransport::Hostname("127.0.0.1".into())),
        })
        .collect();
    Ok(ProcessGroupAllReduce::join_local_ranks(store, &specs)?
        .into_iter()
        .map(|group| Box::new(group) as Box<dyn AllReduce>)
        .collect())
}

/// A step's job view holds this node's own figures (its two drafter workers' tokens, not the
/// job's) at its slot; prints every node's tokens of the step for the parent to add up.
fn check_job_view(node: usize, m: &StepMetrics) -> Result<()> {
    let job = m
        .job
        .as_ref()
        .context("a node's step carries the job view")?;
    ensure!(
        job.this_node == node as u32 && job.nodes.len() == NODES,
        "{job:?}"
    );
    let mine = &job.nodes[node];
    ensure!(
        mine.tokens_per_s == m.tokens_per_s && mine.step_ms == m.times.total_ms,
        "node {node}'s slot {mine:?} is not its step's figures {} tokens/s in {} ms",
        m.tokens_per_s,
        m.times.total_ms
    );
    let drafters: Vec<f64> = m
        .workers
        .iter()
        .filter(|w| w.role == DeviceRole::Drafter)
        .map(|w| w.tokens_per_s)
        .collect();
    ensure!(drafters.len() == WORKERS, "{:?}", m.workers);
    let both: f64 = drafters.iter().sum();
    ensure!(
        (both - m.tokens_per_s).abs() <= 1e-9 * m.tokens_per_s,
        "the node's tokens/s {} is not its drafter workers' {drafters:?}",
        m.tokens_per_s
    );
    ensure!(mine.queue_wait_share.is_some() && mine.busy_ms <= mine.step_ms);
    let tokens: Vec<u64> = job
        .nodes
        .iter()
        .map(|n| (n.tokens_per_s * n.step_ms / 1e3).round() as u64)
        .collect();
    println!("DIST JOB step {} tokens {tokens:?}", m.step);
    Ok(())
}

/// The body of a node process: two drafter workers, global ranks `node·2 + w`. Trains
/// [`STEPS`] steps (a checkpoint at [`CHECKPOINT_AT`]), then a fresh trainer joins a new group,
/// resumes from that checkpoint and must end where the straight run ended, to the bit.
pub fn train_as_node_of_two_workers(
    store: &TcpStore,
    node: usize,
    timeout: Duration,
) -> Result<()> {
    let out = PathBuf::from(env_var(OUT_VAR)?);
    let root = out.join(format!("node{node}-checkpoints"));
    let shard = NodeShard::new(NODES, node, WORKERS, config().training.grad_accum)?;
    let group = endpoints(store, node, "drafter", timeout)?;
    let mut straight = node_trainer(topology(WORKERS), shard, group)?;
    ensure!(straight.drafter_ranks() == NODES * WORKERS);
    let mut checkpoint = None;
    for step in 1..=STEPS {
        let m = straight.train_step()?;
        check_job_view(node, &m)?;
        if step == CHECKPOINT_AT {
            checkpoint = Some(straight.save_checkpoint(&root)?);
        }
    }
    let replicas = straight.replica_weights()?;
    ensure!(replicas.len() == WORKERS);
    ensure!(
        max_abs_diff(&replicas[0], &replicas[1])? == 0.0,
        "node {node}'s two drafter workers hold different weights"
    );
    let weights = straight.master_weights();
    let named: Vec<(&str, Tensor)> = weights
        .iter()
        .map(|(n, w)| (n.as_str(), w.copy()))
        .collect();
    Tensor::save_multi(&named, out.join(format!("node{node}.ot"))).context("saving")?;
    let (total_steps, position) = (straight.total_steps(), straight.data_position());
    drop(straight);

    let group = endpoints(store, node, "drafter-resumed", timeout)?;
    let mut resumed = node_trainer(topology(WORKERS), shard, group)?;
    resumed.restore_checkpoint(&checkpoint.context("no checkpoint")?)?;
    ensure!(resumed.step_count() == CHECKPOINT_AT);
    for _ in CHECKPOINT_AT..STEPS {
        resumed.train_step()?;
    }
    ensure!(resumed.data_position() == position);
    let diff = max_abs_diff(&resumed.master_weights(), &weights)?;
    ensure!(
        diff == 0.0,
        "node {node}: resumed at step {CHECKPOINT_AT}, max |Δparam| {diff:e} at step {STEPS}"
    );
    println!("DIST TRAINED total_steps {total_steps} position {position:?}");
    Ok(())
}

/// The tokens each node trained in each step, read off its job-view lines.
fn job_lines(node: &RankProcess) -> Vec<String> {
    (0..STEPS).map(|_| node.expect("JOB").1).collect()
}

#[test]
fn two_nodes_of_two_workers_train_what_one_process_of_four_drafter_workers_trains() {
    let _serial = crate::two_process::TIMING
        .lock()
        .unwrap_or_else(|p| p.into_inner());
    let started = Instant::now();
    let out = std::env::temp_dir().join(format!("dflash-two-workers-{}", std::process::id()));
    std::fs::create_dir_all(&out).unwrap();
    let timeout = Duration::from_secs(30);
    let extra = [(OUT_VAR, out.display().to_string())];
    let node0 = RankProcess::start_with(0, 0, "train-two-workers", timeout, &extra);
    let (_, line) = node0.expect("PORT ");
    let port: u16 = line["PORT ".len()..].parse().unwrap();
    let node1 = RankProcess::start_with(1, port, "train-two-workers", timeout, &extra);

    let mut reference = trainer(topology(NODES * WORKERS));
    let initial: Vec<(String, Tensor)> = reference
        .master_weights()
        .into_iter()
        .map(|(n, t)| (n, t.copy()))
        .collect();
    let mut step_tokens = Vec::new();
    for _ in 0..STEPS {
        let m = reference.train_step().unwrap();
        step_tokens.push((m.tokens_per_s * m.times.total_ms / 1e3).round() as u64);
    }
    // Both nodes read the same job view, and each node's slot holds its own share of the
    // step: together exactly what the one process of four workers trained.
    let (jobs0, jobs1) = (job_lines(&node0), job_lines(&node1));
    assert_eq!(jobs0, jobs1, "the nodes read different job views");
    for (line, want) in jobs0.iter().zip(&step_tokens) {
        let tokens: Vec<u64> = line
            .split_once("tokens [")
            .and_then(|(_, rest)| rest.strip_suffix(']'))
            .unwrap()
            .split(", ")
            .map(|t| t.parse().unwrap())
            .collect();
        assert!(tokens.iter().all(|&t| t > 0 && t < *want), "{line}");
        assert_eq!(tokens.iter().sum::<u64>(), *want, "{line}");
    }
    // The run really trained: the weights moved, by far more than the tolerance.
    let moved = 100.0 * TOLERANCE;
    let diff = assert_nodes_match([node0, node1], &reference, &initial, &out, TOLERANCE, moved);
    eprintln!(
        "2 nodes × 2 workers vs one process of 4, {STEPS} steps and a resume: max |Δ| {diff:e}, \
         {:?}",
        started.elapsed()
    );
}
