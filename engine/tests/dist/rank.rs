//! One rank process: joins the group on loopback and plays its scenario, reporting on stdout
//! in lines that start with `DIST `.
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use dflash_engine::collective::allreduce::{sum_in_buckets, AllReduce};
use dflash_engine::dist::{
    CollectiveBackend, GlooTransport, GroupSpec, ProcessGroupAllReduce, TcpStore,
};
use tch::{Device, Kind, Tensor};

pub const RANK_VAR: &str = "DFLASH_DIST_RANK";
pub const PORT_VAR: &str = "DFLASH_DIST_PORT";
pub const SCENARIO_VAR: &str = "DFLASH_DIST_SCENARIO";
pub const TIMEOUT_VAR: &str = "DFLASH_DIST_TIMEOUT_MS";
pub const WORLD: usize = 2;

/// Rank `r`'s contribution: exact in fp32, so the sum over ranks is exact too.
pub fn contribution(rank: usize, n: i64) -> Tensor {
    (Tensor::arange(n, (Kind::Float, Device::Cpu)).remainder(97.0) * 0.25) * (rank as f64 + 1.0)
}

fn env(name: &str) -> Result<String> {
    std::env::var(name).with_context(|| format!("{name} is not set"))
}

pub fn env_var(name: &str) -> Result<String> {
    env(name)
}

pub fn run(rank: usize) -> Result<()> {
    let port: u16 = env(PORT_VAR)?.parse()?;
    let timeout = Duration::from_millis(env(TIMEOUT_VAR)?.parse()?);
    let store = if rank == 0 {
        TcpStore::serve("127.0.0.1", port, WORLD, timeout)?
    } else {
        TcpStore::connect("127.0.0.1", port, WORLD, timeout)?
    };
    println!("DIST PORT {}", store.port());
    if env(SCENARIO_VAR)? == "node-loop" {
        // A node of two ranks with its heartbeat, summing until its peers are gone.
        return crate::node_liveness::loop_as_node(store, rank, timeout);
    }
    if env(SCENARIO_VAR)? == "train-two-workers" {
        // A node of two drafter workers joins the job's group with two ranks of its own.
        return crate::two_workers_per_node::train_as_node_of_two_workers(&store, rank, timeout);
    }
    let spec = GroupSpec {
        name: "test".into(),
        rank,
        world_size: WORLD,
        timeout,
        backend: CollectiveBackend::Gloo(GlooTransport::Hostname("127.0.0.1".into())),
    };
    let mut group = ProcessGroupAllReduce::join(&store, &spec)?;
    println!("DIST JOINED");
    match env(SCENARIO_VAR)?.as_str() {
        "sum" => exact_sums(&mut group),
        "loop" => sum_until_an_error(&mut group),
        "train" => crate::two_node_training::train_as_node(group),
        "stall" if rank == 1 => {
            // Alive and joined, but never calls the collective; the parent kills it.
            std::thread::sleep(Duration::from_secs(60));
            Ok(())
        }
        "stall" => {
            let started = Instant::now();
            let mut t = contribution(rank, 8);
            let outcome = group.sum_tensor(&mut t);
            report_error(started, outcome)
        }
        other => bail!("unknown scenario {other:?}"),
    }
}

fn report_error(started: Instant, outcome: Result<(), impl std::fmt::Display>) -> Result<()> {
    match outcome {
        Ok(()) => bail!("the collective succeeded without its peer"),
        Err(e) => {
            println!("DIST ERROR {} {e}", started.elapsed().as_millis());
            Ok(())
        }
    }
}

fn exact_sums(group: &mut ProcessGroupAllReduce) -> Result<()> {
    let rank = group.rank();
    let n = 1000;
    let mut t = contribution(rank, n);
    group.sum_tensor(&mut t)?;
    let want = contribution(0, n) + contribution(1, n);
    let (got, want) = (Vec::<f32>::try_from(&t)?, Vec::<f32>::try_from(&want)?);
    ensure!(
        got.iter()
            .zip(&want)
            .all(|(a, b)| a.to_bits() == b.to_bits()),
        "fp32 sum differs: {:?}… vs {:?}…",
        &got[..4],
        &want[..4]
    );
    let mut stats = [rank as f64 + 0.5, 1e10 * (rank as f64 + 1.0), -0.125];
    group.sum_f64(&mut stats)?;
    ensure!(stats == [2.0, 3e10, -0.25], "f64 sums: {stats:?}");
    // The trainer's path: gradients cut into a small bucket, tensors straddling its edges.
    let shapes: [&[i64]; 4] = [&[5], &[1], &[3, 4], &[3]];
    let grad =
        |r: usize, i: usize, s: &[i64]| (contribution(r, s.iter().product()) + i as f64).view(s);
    let mut grads: Vec<Tensor> = shapes
        .iter()
        .enumerate()
        .map(|(i, s)| grad(rank, i, s))
        .collect();
    let mut bucket = Tensor::zeros([4], (Kind::Float, Device::Cpu));
    sum_in_buckets(group, &mut grads, &mut bucket)?;
    for (i, (g, s)) in grads.iter().zip(shapes).enumerate() {
        let want = grad(0, i, s) + grad(1, i, s);
        ensure!(g.equal(&want), "bucketed gradient {i} differs: {g:?}");
    }
    println!("DIST OK rank {rank}");
    Ok(())
}

fn sum_until_an_error(group: &mut ProcessGroupAllReduce) -> Result<()> {
    let mut t = contribution(group.rank(), 1 << 20);
    let mut first = true;
    loop {
        let started = Instant::now();
        if let Err(e) = group.sum_tensor(&mut t) {
            return report_error(started, Err::<(), _>(e));
        }
        if std::mem::take(&mut first) {
            println!("DIST LOOPING");
        }
        t = contribution(group.rank(), 1 << 20);
    }
}
