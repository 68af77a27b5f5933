//! One node of a multi-node job at start (issue 23): the rendezvous through libtorch's
//! TCPStore (node 0 serves it), the agreement check over every node's [`StartFacts`], and the
//! trainer joined to the job's one flat gradient group (libtorch's Gloo on CPU, NCCL on CUDA).
//!
//! Every node publishes its facts and reads every other node's, then runs the same
//! [`check_agreement`], so a disagreement refuses the start on every node with the same
//! sentence naming the node and the key. Every wait is bounded by `--collective-timeout-s`.
use std::path::Path;
use std::time::Duration;

use dflash_engine::dist::{
    CollectiveBackend, GlooTransport, GroupSpec, ProcessGroupAllReduce, TcpStore,
};
use dflash_engine::train::shard::NodeShard;
use dflash_engine::train::topology::allreduce::{AllReduce, AllReduceError};
use dflash_engine::train::trainer::Trainer;
use dflash_shared::config::Config;
use dflash_shared::launch::{check_agreement, job_config, job_config_text, NodeLaunch, StartFacts};
use sha2::{Digest, Sha256};
use tch::{Device, Tensor};

/// This node's place in its job, with the store every node shares.
pub struct NodeJob {
    pub launch: NodeLaunch,
    store: TcpStore,
    timeout: Duration,
}

impl NodeJob {
    /// Node 0 serves the store on the rendezvous port; the others connect to it, retrying
    /// until `timeout` (node 0 may start later).
    pub fn rendezvous(launch: &NodeLaunch, timeout: Duration) -> Result<Self, String> {
        let r = launch
            .rendezvous
            .as_ref()
            .ok_or_else(|| format!("{launch}: a job of several nodes needs a rendezvous"))?;
        let world = launch.nnodes as usize;
        let store = if launch.node_rank == 0 {
            TcpStore::serve(&r.host, r.port, world, timeout)
        } else {
            TcpStore::connect(&r.host, r.port, world, timeout)
        }
        .map_err(|e| {
            format!(
                "node {} could not meet the job at {r}: {e}",
                launch.node_rank
            )
        })?;
        Ok(NodeJob {
            launch: launch.clone(),
            store,
            timeout,
        })
    }

    pub fn node(&self) -> u32 {
        self.launch.node_rank
    }

    /// Publishes this node's facts, waits for every node's and checks that they agree; `Err`
    /// is the refusal, the same on every node.
    pub fn agree(&self, facts: &StartFacts) -> Result<(), String> {
        let key = |n: u32| format!("start/facts/{n}");
        let bytes = serde_json::to_vec(facts).map_err(|e| e.to_string())?;
        self.store
            .set(&key(self.node()), &bytes)
            .map_err(|e| format!("publishing node {}'s start facts: {e}", self.node()))?;
        let mut all = Vec::new();
        for n in 0..self.launch.nnodes {
            let bytes = self.store.get(&key(n), self.timeout).map_err(|e| {
                format!(
                    "node {n} did not publish its start facts within {} s: {e}",
                    self.timeout.as_secs()
                )
            })?;
            let facts: StartFacts = serde_json::from_slice(&bytes)
                .map_err(|e| format!("node {n}'s start facts are unreadable: {e}"))?;
            all.push(facts);
        }
        check_agreement(&all).map_err(|d| format!("the nodes disagree: {d}"))
    }

    /// The newest checkpoint step every node holds, found through the store; this node's
    /// newer checkpoints (a node that died mid-way may be a checkpoint behind) are moved
    /// aside (`uncommon-step-…`, never deleted, each journaled by the caller) so that every
    /// node resumes from that one step. Returns the step to resume from when this node moved
    /// any (the journal records the newer one as written, so it must be named explicitly),
    /// and the moved directories.
    pub fn align_checkpoints(&self, root: &Path) -> Result<(Option<u64>, Vec<String>), String> {
        let listed = dflash_engine::train::checkpoint::list(root).map_err(|e| e.to_string())?;
        let mine: Vec<u64> = listed.iter().map(|(s, _)| *s).collect();
        let key = |n: u32| format!("start/checkpoints/{n}");
        let bytes = serde_json::to_vec(&mine).map_err(|e| e.to_string())?;
        self.store
            .set(&key(self.node()), &bytes)
            .map_err(|e| format!("publishing node {}'s checkpoints: {e}", self.node()))?;
        let mut common: Vec<u64> = mine.clone();
        for n in (0..self.launch.nnodes).filter(|&n| n != self.node()) {
            let bytes = self.store.get(&key(n), self.timeout).map_err(|e| {
                format!(
                    "node {n} did not publish its checkpoints within {} s: {e}",
                    self.timeout.as_secs()
                )
            })?;
            let theirs: Vec<u64> = serde_json::from_slice(&bytes)
                .map_err(|e| format!("node {n}'s checkpoint list is unreadable: {e}"))?;
            common.retain(|s| theirs.contains(s));
        }
        // No step in common: nothing to align to (the agreement names the resume steps).
        let Some(last_common) = common.iter().max().copied() else {
            return Ok((None, Vec::new()));
        };
        let mut moved = Vec::new();
        for (step, dir) in listed.iter().filter(|(s, _)| *s > last_common) {
            let name = dir.file_name().map(|n| n.to_string_lossy().into_owned());
            let aside = root.join(format!("uncommon-{}", name.unwrap_or_default()));
            std::fs::rename(dir, &aside)
                .map_err(|e| format!("moving {} aside: {e}", dir.display()))?;
            moved.push(format!(
                "checkpoint step {step} moved aside to {}: not every node holds it, the job \
                 resumes from step {last_common}",
                aside.display()
            ));
        }
        Ok(((!moved.is_empty()).then_some(last_common), moved))
    }

    /// Joins `trainer` (fresh, inline) to the job's flat gradient group as global rank
    /// `node` (one drafter worker per node).
    pub fn join_trainer(&self, trainer: &mut Trainer, accum: usize) -> Result<(), String> {
        let world = self.launch.nnodes as usize;
        let node = self.node() as usize;
        let backend = match trainer.topology().drafter_devices[0] {
            Device::Cuda(device) => CollectiveBackend::Nccl { device },
            _ => CollectiveBackend::Gloo(self.gloo_transport()),
        };
        let spec = GroupSpec {
            name: "drafter".into(),
            rank: node,
            world_size: world,
            timeout: self.timeout,
            backend,
        };
        let group = ProcessGroupAllReduce::join(&self.store, &spec).map_err(|e| e.to_string())?;
        let shard = NodeShard::new(world, node, 1, accum).map_err(|e| e.to_string())?;
        trainer
            .join_nodes(shard, Box::new(NodeNamed(group)))
            .map_err(|e| e.to_string())
    }

    /// `GLOO_SOCKET_IFNAME` when set (as torchrun users set it); loopback when the
    /// rendezvous is on this machine; else libtorch's default (this host's name).
    fn gloo_transport(&self) -> GlooTransport {
        if let Ok(ifname) = std::env::var("GLOO_SOCKET_IFNAME") {
            return GlooTransport::Interface(ifname);
        }
        match self.launch.rendezvous.as_ref().map(|r| r.host.as_str()) {
            Some(h @ ("127.0.0.1" | "localhost" | "::1")) => GlooTransport::Hostname(h.into()),
            _ => GlooTransport::Default,
        }
    }
}

/// This node's facts for [`NodeJob::agree`].
pub fn start_facts(
    launch: &NodeLaunch,
    config: &Config,
    run_dir: &Path,
    drafter_workers: u32,
    resume: Option<&Path>,
) -> Result<StartFacts, String> {
    let fingerprint = crate::telemetry::fingerprint::load(run_dir)
        .map_err(|e| e.to_string())?
        .ok_or("the environment fingerprint was not saved")?;
    Ok(StartFacts {
        node_rank: launch.node_rank,
        nnodes: launch.nnodes,
        config: job_config(config),
        config_digest: hex::encode(Sha256::digest(job_config_text(config).as_bytes())),
        fingerprint,
        drafter_workers,
        resume_step: resume.map_or(0, checkpoint_step),
    })
}

/// The step of a checkpoint directory (`step-0000000012` → 12).
fn checkpoint_step(dir: &Path) -> u64 {
    dir.file_name()
        .and_then(|n| n.to_str())
        .and_then(|n| {
            n.trim_start_matches(|c: char| !c.is_ascii_digit())
                .parse()
                .ok()
        })
        .unwrap_or(0)
}

/// The job's group with its peers named as nodes: one drafter worker per node, so global
/// rank `r` is node `r`, and the operator reads "lost node 1", not a rank of a group.
struct NodeNamed(ProcessGroupAllReduce);

fn named(e: AllReduceError) -> AllReduceError {
    match e {
        AllReduceError::PeerLost {
            rank,
            world,
            peer,
            detail,
        } => AllReduceError::PeerLost {
            peer: match peer.strip_prefix("rank ") {
                Some(r) => format!("node {r}"),
                None => peer,
            },
            rank,
            world,
            detail,
        },
        other => other,
    }
}

impl AllReduce for NodeNamed {
    fn rank(&self) -> usize {
        self.0.rank()
    }
    fn world_size(&self) -> usize {
        self.0.world_size()
    }
    fn sum_tensor(&mut self, buffer: &mut Tensor) -> Result<(), AllReduceError> {
        self.0.sum_tensor(buffer).map_err(named)
    }
    fn sum_f64(&mut self, values: &mut [f64]) -> Result<(), AllReduceError> {
        self.0.sum_f64(values).map_err(named)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn checkpoint_steps_and_node_names() {
        assert_eq!(
            checkpoint_step(Path::new("/r/checkpoints/step-0000000012")),
            12
        );
        let lost = named(AllReduceError::PeerLost {
            rank: 0,
            world: 2,
            peer: "rank 1".into(),
            detail: "closed".into(),
        });
        assert_eq!(
            lost.to_string(),
            "rank 0 of 2: lost node 1 during an all-reduce (closed)"
        );
    }
}
