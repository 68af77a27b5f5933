//! One node of a multi-node job at start (issue 23): the rendezvous through libtorch's
//! TCPStore (node 0 serves it), the agreement check over every node's [`StartFacts`], and the
//! trainer joined to the job's one flat gradient group of every drafter worker of every node
//! (libtorch's Gloo on CPU, NCCL on CUDA).
//!
//! Every node publishes its facts and reads every other node's, then runs the same
//! [`check_agreement`], so a disagreement refuses the start on every node with the same
//! sentence naming the node and the key; a warm start then compares the SHA-256 of the
//! `drafter.init_from` files each node loaded ([`NodeJob::agree_init_from`]). Every wait is
//! bounded by `--collective-timeout-s`. Once the group is joined, the node's heartbeat
//! (`dflash_engine::dist::liveness`, `nodes.heartbeat_timeout_s`) names a node that died or
//! hung, in the group's failures and at the checkpoint witness.
use std::path::Path;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use dflash_engine::collective::allreduce::AllReduce;
use dflash_engine::dist::{
    CollectiveBackend, GlooTransport, GroupSpec, Liveness, LivenessBounds, NodeEndpoint, OnSilence,
    ProcessGroupAllReduce, StoreError, TcpStore,
};
use dflash_engine::train::shard::NodeShard;
use dflash_engine::train::trainer::{JobMembership, OpenGroup};
use dflash_engine::train::warm_start::WarmStart;
use dflash_engine::train::TrainError;
use dflash_shared::config::{Config, DEFAULT_HEARTBEAT_TIMEOUT_S};
use dflash_shared::events::Severity;
use dflash_shared::launch::{
    check_agreement, check_init_from, job_config, job_config_text, Disagreement, InitFromFacts,
    NodeLaunch, StartFacts, WeightFileFact,
};
use serde::de::DeserializeOwned;
use serde::Serialize;
use sha2::{Digest, Sha256};
use tch::{Device, Tensor};

/// A journal several threads of a node write through: the checkpoint witness (its agreement
/// lines, `Info`) and the heartbeat judge (a silent peer, `Warn`: the run pauses on it).
type SharedJournal = Arc<Mutex<Box<dyn Fn(Severity, String) + Send>>>;

/// This node's place in its job, with the store every node shares.
pub struct NodeJob {
    pub launch: NodeLaunch,
    /// Shared with the checkpoint witness on the training thread.
    store: Arc<TcpStore>,
    timeout: Duration,
    /// `nodes.heartbeat_timeout_s`: how long a node's heartbeat may stop before it is named.
    heartbeat: LivenessBounds,
    /// This node's heartbeat and judge, started once the gradient group is joined; read by the
    /// checkpoint witness, which then names a silent node instead of waiting out the timeout.
    liveness: Arc<OnceLock<Arc<Liveness>>>,
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
            store: Arc::new(store),
            timeout,
            heartbeat: LivenessBounds {
                timeout: Duration::from_secs_f64(DEFAULT_HEARTBEAT_TIMEOUT_S),
            },
            liveness: Arc::new(OnceLock::new()),
        })
    }

    /// The heartbeat timeout the job's config sets (`nodes.heartbeat_timeout_s`, validated
    /// with the config; the start's agreement makes it the same on every node).
    pub fn with_heartbeat_timeout(mut self, timeout: Duration) -> Self {
        self.heartbeat = LivenessBounds { timeout };
        self
    }

    pub fn node(&self) -> u32 {
        self.launch.node_rank
    }

    /// Publishes this node's facts, waits for every node's and checks that they agree; `Err`
    /// is the refusal, the same on every node.
    pub fn agree(&self, facts: &StartFacts) -> Result<(), String> {
        self.agree_on("start/facts", "start facts", "", facts, check_agreement)
    }

    /// Publishes `mine` as this node's `{prefix}/{node}` and reads every node's, in node order
    /// (its own included), each wait bounded by the timeout. `what` names the value in the
    /// errors; `late_hint` is added to a node's late answer, where there is a likely cause.
    fn exchange<T: Serialize + DeserializeOwned>(
        &self,
        prefix: &str,
        what: &str,
        late_hint: &str,
        mine: &T,
    ) -> Result<Vec<T>, String> {
        let key = |n: u32| format!("{prefix}/{n}");
        let bytes = serde_json::to_vec(mine).map_err(|e| e.to_string())?;
        self.store
            .set(&key(self.node()), &bytes)
            .map_err(|e| format!("publishing node {}'s {what}: {e}", self.node()))?;
        (0..self.launch.nnodes)
            .map(|n| {
                let bytes = self.store.get(&key(n), self.timeout).map_err(|e| {
                    format!(
                        "node {n} did not publish its {what} within {} s{late_hint}: {e}",
                        self.timeout.as_secs()
                    )
                })?;
                serde_json::from_slice(&bytes)
                    .map_err(|e| format!("node {n}'s {what} are unreadable: {e}"))
            })
            .collect()
    }

    /// [`Self::exchange`], then `check` over every node's value: `Err` is the refusal, the
    /// same on every node, and node 0 keeps its store up until every node has read it.
    fn agree_on<T: Serialize + DeserializeOwned>(
        &self,
        prefix: &str,
        what: &str,
        late_hint: &str,
        mine: &T,
        check: impl FnOnce(&[T]) -> Result<(), Disagreement>,
    ) -> Result<(), String> {
        let all = self.exchange(prefix, what, late_hint, mine)?;
        let verdict = check(&all).map_err(|d| format!("the nodes disagree: {d}"));
        if verdict.is_err() {
            self.hold_the_store_until_every_node_read(prefix)?;
        }
        verdict
    }

    /// Node 0 serves the store, and a refused start ends its process: before it goes, every
    /// node must have read what it needs, or a slower node reads a closed socket instead of
    /// the same refusal. Each node marks `{what}/read/{n}`; node 0 waits for all the marks,
    /// bounded by the timeout.
    fn hold_the_store_until_every_node_read(&self, what: &str) -> Result<(), String> {
        let key = |n: u32| format!("{what}/read/{n}");
        self.store
            .set(&key(self.node()), b"1")
            .map_err(|e| format!("marking node {}'s {what} read: {e}", self.node()))?;
        if self.node() == 0 {
            let keys: Vec<String> = (0..self.launch.nnodes).map(key).collect();
            let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
            // A node that never marks (it died) only delays node 0's own refusal.
            let _ = self.store.wait(&keys, self.timeout);
        }
        Ok(())
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
        let all = self.exchange("start/checkpoints", "checkpoints", "", &mine)?;
        let common: Vec<u64> = mine
            .iter()
            .copied()
            .filter(|s| all.iter().all(|theirs| theirs.contains(s)))
            .collect();
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

    /// This node's membership of the job, for the trainer's one build (`TrainerSpec::job`):
    /// each of this node's `L` drafter workers (`drafter_devices`; one when target and
    /// drafter run inline) as its own rank `node·L + worker` of the job's flat gradient group
    /// of `N·L`, its endpoint joined on its own thread and connection
    /// (`ProcessGroupAllReduce::join_local_ranks`) when the build opens the group, once the
    /// trainer's workers have started; the straggler bar (`detectors.straggler.behind_frac`,
    /// node-local) and the checkpoint witness, which journal through `journal` at the severity
    /// each line has.
    pub fn membership(
        &self,
        drafter_devices: &[Device],
        accum: usize,
        straggler_behind_frac: f64,
        journal: impl Fn(Severity, String) + Send + 'static,
    ) -> Result<JobMembership, TrainError> {
        let nodes = self.launch.nnodes as usize;
        let node = self.node() as usize;
        let workers = drafter_devices.len();
        let specs: Vec<GroupSpec> = drafter_devices
            .iter()
            .enumerate()
            .map(|(worker, device)| GroupSpec {
                name: "drafter".into(),
                rank: node * workers + worker,
                world_size: nodes * workers,
                timeout: self.timeout,
                backend: match device {
                    Device::Cuda(device) => CollectiveBackend::Nccl { device: *device },
                    _ => CollectiveBackend::Gloo(self.gloo_transport()),
                },
            })
            .collect();
        let shard = NodeShard::new(nodes, node, workers, accum)?;
        let store = Arc::clone(&self.store);
        // One journal for the witness's lines and the heartbeat judge's, called from their
        // own threads.
        let journal: SharedJournal = Arc::new(Mutex::new(Box::new(journal)));
        let verdicts = Arc::clone(&journal);
        let (nnodes, heartbeat, timeout) = (self.launch.nnodes, self.heartbeat, self.timeout);
        let liveness = Arc::clone(&self.liveness);
        let open_group: OpenGroup = Box::new(move || {
            let groups = ProcessGroupAllReduce::join_local_ranks(&store, &specs)
                .map_err(|e| TrainError::Topology(format!("node {node}: {e}")))?;
            // The heartbeats start here, right after a join every rank of every node waited
            // for, so every node counts the others fresh from about the same moment.
            let on_silence = OnSilence {
                aborts: groups.iter().map(|g| g.abort_handle()).collect(),
                journal: Box::new(move |line| {
                    tracing::warn!("{line}");
                    (verdicts.lock().unwrap_or_else(|p| p.into_inner()))(Severity::Warn, line);
                }),
            };
            let beating =
                Liveness::start(&store, node as u32, nnodes, heartbeat, timeout, on_silence)
                    .map(Arc::new)
                    .map_err(|e| TrainError::Topology(format!("node {node}'s heartbeat: {e}")))?;
            let _ = liveness.set(Arc::clone(&beating));
            Ok(groups
                .into_iter()
                .map(|group| {
                    let named = NodeEndpoint::new(group, workers, Some(Arc::clone(&beating)));
                    Box::new(named) as Box<dyn AllReduce>
                })
                .collect())
        });
        Ok(JobMembership {
            shard,
            open_group,
            straggler_behind_frac,
            checkpoint_witness: Some(self.checkpoint_witness(move |line| {
                (journal.lock().unwrap_or_else(|p| p.into_inner()))(Severity::Info, line)
            })),
        })
    }

    /// After loading `drafter.init_from` on a fresh start: this node publishes the SHA-256 of
    /// every weights file it loaded (`warm`; digests only, never weights), reads every node's,
    /// and checks that all loaded node 0's files ([`check_init_from`]). `Err` is the refusal,
    /// the same on every node. Every node of a job warm-starts or none does (the config and
    /// the resume step agreed), so every node makes this exchange or none.
    pub fn agree_init_from(&self, warm: Option<&WarmStart>) -> Result<(), String> {
        let mine = InitFromFacts {
            node_rank: self.node(),
            files: warm.map_or_else(Vec::new, |w| {
                w.files
                    .iter()
                    .map(|f| WeightFileFact {
                        name: f.file.file_name().map_or_else(
                            || f.file.display().to_string(),
                            |n| n.to_string_lossy().into_owned(),
                        ),
                        bytes: f.bytes,
                        sha256: f.sha256.clone(),
                    })
                    .collect()
            }),
        };
        self.agree_on(
            "start/init_from",
            "drafter.init_from digests",
            " (did its warm start fail? its journal says)",
            &mine,
            check_init_from,
        )
    }

    /// After every checkpoint: this node publishes a SHA-256 of its fp32 master weights and
    /// compares every node's with node 0's (the replicas must be identical after every step).
    /// Agreement is journaled through `journal`; a difference, or a node that does not answer
    /// within the timeout, fails the checkpoint (the run pauses) naming the node.
    fn checkpoint_witness(
        &self,
        journal: impl Fn(String) + Send + 'static,
    ) -> dflash_engine::train::trainer::CheckpointWitness {
        let (store, timeout) = (Arc::clone(&self.store), self.timeout);
        let (node, nnodes) = (self.node(), self.launch.nnodes);
        let liveness = Arc::clone(&self.liveness);
        Box::new(move |step, weights| {
            let key = |n: u32| format!("checkpoint/{step}/digest/{n}");
            let mine = state_digest(weights);
            store
                .set(&key(node), mine.as_bytes())
                .map_err(|e| format!("publishing node {node}'s state digest: {e}"))?;
            let mut reference = String::new();
            for n in 0..nnodes {
                let theirs = get_unless_silent(&store, &key(n), timeout, liveness.get()).map_err(
                    |e| match e {
                        Waited::Store(e) => format!(
                            "node {n} gave no state digest within {} s: {e}",
                            timeout.as_secs()
                        ),
                        Waited::Silent(why) => {
                            format!("node {n} gave no state digest: {why}")
                        }
                    },
                )?;
                let theirs = String::from_utf8_lossy(&theirs).into_owned();
                if n == 0 {
                    reference = theirs;
                } else if theirs != reference {
                    return Err(format!(
                        "node {n}'s state digest {} differs from node 0's {}: the replicas \
                         diverged",
                        &theirs[..12.min(theirs.len())],
                        &reference[..12.min(reference.len())]
                    ));
                }
            }
            journal(format!(
                "checkpoint step {step}: the state of all {nnodes} nodes agrees (SHA-256 of \
                 the fp32 weights {})",
                &mine[..12]
            ));
            Ok(())
        })
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
        resume_step: resume
            .and_then(dflash_engine::train::checkpoint::checkpoint_step)
            .unwrap_or(0),
    })
}

/// SHA-256 over the fp32 master weights, names and values in order.
fn state_digest(weights: &[(String, Tensor)]) -> String {
    let mut h = Sha256::new();
    for (name, t) in weights {
        h.update(name.as_bytes());
        // Master weights are fp32; the conversion only makes the bytes well defined for any
        // kind, so the digest never skips a tensor.
        let flat = t
            .to_device(Device::Cpu)
            .to_kind(tch::Kind::Float)
            .contiguous()
            .view([-1]);
        let values = Vec::<f32>::try_from(&flat).expect("a contiguous fp32 tensor reads back");
        for v in values {
            h.update(v.to_le_bytes());
        }
    }
    hex::encode(h.finalize())
}

/// Why a wait on the store ended without the value.
enum Waited {
    Store(StoreError),
    /// The heartbeat judge named a silent node meanwhile.
    Silent(String),
}

/// `key`'s value, waiting up to `timeout` as `store.get` does, but looking between polls of
/// the key (`check`, which does not wait) for the heartbeat judge's verdict: a node the judge
/// names meanwhile (it hung or died at the checkpoint) ends the wait within the heartbeat's
/// bound, not the collective timeout's. Polls rather than short `get`s: c10d logs two warning
/// lines for every wait that times out.
fn get_unless_silent(
    store: &TcpStore,
    key: &str,
    timeout: Duration,
    liveness: Option<&Arc<Liveness>>,
) -> Result<Vec<u8>, Waited> {
    let Some(liveness) = liveness else {
        return store.get(key, timeout).map_err(Waited::Store);
    };
    let poll = (liveness.bounds().period() / 10).clamp(Duration::from_millis(10), POLL_MAX);
    let silent = || {
        liveness
            .verdict()
            .filter(|v| v.aborts())
            .map(|v| Waited::Silent(v.to_string()))
    };
    let deadline = Instant::now() + timeout;
    loop {
        match store.check(&[key]) {
            Ok(true) => return store.get(key, timeout).map_err(Waited::Store),
            Ok(false) => {}
            Err(e) => return Err(silent().unwrap_or(Waited::Store(e))),
        }
        if let Some(why) = silent() {
            return Err(why);
        }
        if Instant::now() >= deadline {
            return Err(Waited::Store(StoreError::Timeout {
                op: "get",
                keys: vec![key.to_string()],
                after: timeout,
                detail: "no node set it".into(),
            }));
        }
        std::thread::sleep(poll);
    }
}

/// The longest pause between two looks at a key the checkpoint witness waits for.
const POLL_MAX: Duration = Duration::from_millis(100);

#[cfg(test)]
mod tests {
    use super::*;
    use dflash_shared::launch::{LaunchSource, Origin, Rendezvous};

    fn launch(node_rank: u32, port: u16) -> NodeLaunch {
        NodeLaunch {
            nnodes: 2,
            node_rank,
            rendezvous: Some(Rendezvous {
                host: "127.0.0.1".into(),
                port,
            }),
            source: LaunchSource {
                nnodes: Origin::Flag("--nnodes".into()),
                node_rank: Origin::Flag("--node-rank".into()),
                rendezvous_host: None,
                rendezvous_port: None,
            },
        }
    }

    /// Two nodes' witnesses over one loopback store: equal weights agree (journaled on both),
    /// one differing element fails the checkpoint on both, naming node 1.
    #[test]
    fn the_checkpoint_witness_agrees_on_equal_states_and_names_the_node_that_diverged() {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let timeout = Duration::from_secs(10);
        let node1 = std::thread::spawn(move || NodeJob::rendezvous(&launch(1, port), timeout));
        let job0 = NodeJob::rendezvous(&launch(0, port), timeout).unwrap();
        let job1 = node1.join().unwrap().unwrap();
        let weights = |bump: f64| {
            let w = Tensor::arange(6, (tch::Kind::Float, Device::Cpu)).view([2, 3]);
            let _ = w.get(1).get(2).fill_(5.0 + bump);
            vec![("layers.0.w".to_string(), w)]
        };
        let journaled = std::sync::Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
        let witness = |job: &NodeJob| {
            let j = std::sync::Arc::clone(&journaled);
            job.checkpoint_witness(move |m| j.lock().unwrap().push(m))
        };
        let (mut w0, mut w1) = (witness(&job0), witness(&job1));

        let other = std::thread::spawn(move || {
            let same = w1(4, &weights(0.0));
            let differs = w1(6, &weights(1e-3));
            (same, differs)
        });
        assert_eq!(w0(4, &weights(0.0)), Ok(()));
        let at_6 = w0(6, &weights(0.0));
        let (same, differs) = other.join().unwrap();
        assert_eq!(same, Ok(()));
        for err in [at_6.unwrap_err(), differs.unwrap_err()] {
            assert!(
                err.starts_with("node 1's state digest ") && err.ends_with("the replicas diverged"),
                "{err}"
            );
        }
        let lines = journaled.lock().unwrap().clone();
        assert_eq!(lines.len(), 2, "{lines:?}");
        assert!(lines
            .iter()
            .all(|l| l.starts_with("checkpoint step 4: the state of all 2 nodes agrees")));
    }

    /// A node that never answers at a checkpoint (here: it never even beats) fails the
    /// witness within the heartbeat's bound, naming it, not at the collective timeout.
    #[test]
    fn the_checkpoint_witness_names_a_silent_node_within_the_heartbeat_bound() {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let timeout = Duration::from_secs(20);
        let node1 = std::thread::spawn(move || NodeJob::rendezvous(&launch(1, port), timeout));
        let job0 = NodeJob::rendezvous(&launch(0, port), timeout)
            .unwrap()
            .with_heartbeat_timeout(Duration::from_secs(1));
        let _job1 = node1.join().unwrap().unwrap();
        let journaled = Arc::new(Mutex::new(Vec::<String>::new()));
        let lines = Arc::clone(&journaled);
        let liveness = Liveness::start(
            &job0.store,
            0,
            2,
            job0.heartbeat,
            timeout,
            OnSilence {
                aborts: Vec::new(),
                journal: Box::new(move |l| lines.lock().unwrap().push(l)),
            },
        )
        .unwrap();
        let _ = job0.liveness.set(Arc::new(liveness));
        let mut witness = job0.checkpoint_witness(|_| {});
        let started = Instant::now();
        let w = Tensor::zeros([2], (tch::Kind::Float, Device::Cpu));
        let err = witness(4, &[("w".to_string(), w)]).unwrap_err();
        let took = started.elapsed();
        assert!(
            err.starts_with("node 1 gave no state digest: node 1's heartbeat has not advanced"),
            "{err}"
        );
        assert!(took < Duration::from_secs(3), "{took:?}: {err}");
        let lines = journaled.lock().unwrap().clone();
        assert!(lines[0].starts_with("node 1's heartbeat"), "{lines:?}");
    }
}
