//! Two nodes of one drafter worker each (two OS processes, loopback TCPStore, libtorch's Gloo)
//! train exactly what one process with two drafter ranks trains on the same data order.
//!
//! Tolerance: 0 on CPU, stated as [`TOLERANCE`]. Each gradient element is summed over two
//! ranks: one fp32 addition, which is commutative, so Gloo's ring (a + b on one rank, b + a on
//! the other) and the in-process group (rank 0's buffer + rank 1's) give the same bits, and so
//! does the f64 sum of Σw. Everything else (anchors, micro-batches, the optimizer) is the same
//! arithmetic on the same inputs. With more than two ranks the orders differ (a ring adds
//! partial sums in another association than rank order), and the difference would be bounded
//! by (n−1)·2⁻²⁴ relative per gradient element per step, which AdamW's normalised update then
//! carries; that case is not run here.
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{ensure, Context, Result};
use dflash_engine::collective::allreduce::AllReduce;
use dflash_engine::dist::ProcessGroupAllReduce;
use dflash_engine::embedded;
use dflash_engine::train::config::TrainConfig;
use dflash_engine::train::shard::NodeShard;
use dflash_engine::train::topology::queue::QueueConfig;
use dflash_engine::train::topology::TopologySpec;
use dflash_engine::train::trainer::{JobMembership, OpenGroup, Trainer, TrainerSpec};
use tch::{Device, Tensor};

use crate::rank::{env_var, WORLD};
use crate::two_process::RankProcess;

const STEPS: usize = 4;
const TOLERANCE: f64 = 0.0;
pub(crate) const OUT_VAR: &str = "DFLASH_DIST_OUT";

pub(crate) fn config() -> TrainConfig {
    let mut cfg = embedded::tiny_train_config();
    cfg.training.eval_every = 0;
    cfg.training.batch_size = 4;
    cfg.training.grad_accum = 1;
    cfg
}

fn spec(topology: TopologySpec) -> TrainerSpec {
    tch::set_num_threads(1);
    let target = embedded::tiny_target(None, Device::Cpu).unwrap();
    let drafter_cfg = embedded::tiny_drafter_config(target.config());
    let cfg = config();
    let samples = embedded::tiny_samples(target.config().vocab_size(), cfg.training.max_length)
        .unwrap()
        .0;
    TrainerSpec::new(target, drafter_cfg, samples, cfg, topology)
}

pub(crate) fn trainer(topology: TopologySpec) -> Trainer {
    Trainer::build(spec(topology)).unwrap()
}

/// A trainer on `topology` as node `shard` of a job, over this node's `endpoints` of the
/// job's group (already open: the build's opener hands them over).
pub(crate) fn node_trainer(
    topology: TopologySpec,
    shard: NodeShard,
    endpoints: Vec<Box<dyn AllReduce>>,
) -> Result<Trainer> {
    let open_group: OpenGroup = Box::new(move || Ok(endpoints));
    Ok(Trainer::build(TrainerSpec {
        job: Some(JobMembership::new(shard, open_group)),
        ..spec(topology)
    })?)
}

/// The body of a node process: one inline drafter worker, global rank = node.
pub fn train_as_node(group: ProcessGroupAllReduce) -> Result<()> {
    let node = group.rank();
    let shard = NodeShard::new(WORLD, node, 1, config().training.grad_accum)?;
    let mut t = node_trainer(
        TopologySpec::single(Device::Cpu),
        shard,
        vec![Box::new(group)],
    )?;
    for _ in 0..STEPS {
        t.train_step()?;
    }
    let out = PathBuf::from(env_var(OUT_VAR)?).join(format!("node{node}.ot"));
    let weights = t.master_weights();
    let named: Vec<(&str, Tensor)> = weights
        .iter()
        .map(|(n, w)| (n.as_str(), w.copy()))
        .collect();
    Tensor::save_multi(&named, &out).context("saving the weights")?;
    println!(
        "DIST TRAINED total_steps {} position {:?}",
        t.total_steps(),
        t.data_position()
    );
    Ok(())
}

pub(crate) fn max_abs_diff(a: &[(String, Tensor)], b: &[(String, Tensor)]) -> Result<f64> {
    ensure!(a.len() == b.len(), "{} vs {} tensors", a.len(), b.len());
    let mut worst = 0.0f64;
    for (name, ta) in a {
        let tb = &b
            .iter()
            .find(|(n, _)| n == name)
            .with_context(|| format!("{name} missing"))?
            .1;
        worst = worst.max((ta - tb).abs().max().double_value(&[]));
    }
    Ok(worst)
}

/// The end of a two-node run against `reference`, the one process that trained the same global
/// batch: both nodes report its step count and data position and exit cleanly; their replicas
/// (written under `out`, which is then removed) are identical and within `tolerance` of its
/// masters; and its masters moved from `initial` by more than `moved`, so the run trained.
/// Returns the nodes' largest difference from the reference.
pub(crate) fn assert_nodes_match(
    nodes: [RankProcess; 2],
    reference: &Trainer,
    initial: &[(String, Tensor)],
    out: &Path,
    tolerance: f64,
    moved: f64,
) -> f64 {
    let want_line = format!(
        "TRAINED total_steps {} position {:?}",
        reference.total_steps(),
        reference.data_position()
    );
    for node in nodes {
        assert_eq!(node.expect("TRAINED").1, want_line);
        node.wait_success();
    }
    let load = |n: usize| Tensor::load_multi(out.join(format!("node{n}.ot"))).unwrap();
    let (w0, w1) = (load(0), load(1));
    assert_eq!(
        max_abs_diff(&w0, &w1).unwrap(),
        0.0,
        "the nodes' replicas differ"
    );
    let single = reference.master_weights();
    let diff = max_abs_diff(&w0, &single).unwrap();
    assert!(
        diff <= tolerance,
        "max |Δparam| = {diff:e} against the one process"
    );
    assert!(max_abs_diff(initial, &single).unwrap() > moved);
    let _ = std::fs::remove_dir_all(out);
    diff
}

#[test]
fn two_nodes_of_one_worker_train_what_one_process_of_two_drafter_ranks_trains() {
    let _serial = crate::two_process::TIMING
        .lock()
        .unwrap_or_else(|p| p.into_inner());
    let started = Instant::now();
    let out = std::env::temp_dir().join(format!("dflash-two-node-{}", std::process::id()));
    std::fs::create_dir_all(&out).unwrap();
    let timeout = Duration::from_secs(30);
    let extra = [(OUT_VAR, out.display().to_string())];
    let node0 = RankProcess::start_with(0, 0, "train", timeout, &extra);
    let (_, line) = node0.expect("PORT ");
    let port: u16 = line["PORT ".len()..].parse().unwrap();
    let node1 = RankProcess::start_with(1, port, "train", timeout, &extra);

    let mut reference = trainer(TopologySpec {
        target_devices: vec![Device::Cpu],
        drafter_devices: vec![Device::Cpu; 2],
        queue: QueueConfig {
            capacity: 8,
            high_watermark: 6,
            low_watermark: 2,
            byte_cap: 1 << 30,
        },
    });
    let initial: Vec<(String, Tensor)> = reference
        .master_weights()
        .into_iter()
        .map(|(n, t)| (n, t.copy()))
        .collect();
    for _ in 0..STEPS {
        reference.train_step().unwrap();
    }
    // The run really trained: the weights moved.
    let diff = assert_nodes_match([node0, node1], &reference, &initial, &out, TOLERANCE, 1e-4);
    eprintln!(
        "two nodes vs one process, {STEPS} steps: max |Δ| {diff:e}, {:?}",
        started.elapsed()
    );
}
