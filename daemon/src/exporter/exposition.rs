//! The Prometheus text exposition of one run: what the control socket's status publishes,
//! written in Prometheus words. Pure: a [`Scrape`] in, text out, no I/O and no clock read.
//!
//! A value nobody measured has no sample, and a metric without samples is left out whole (no
//! GPU on CPU, no queue in the inline topology, no loss before the first step): nothing is
//! filled in with a zero it did not read.
//!
//! Names follow Prometheus conventions: the `dflash_` prefix, base units in the name
//! (`_seconds`, `_bytes`, `_ratio`), `_total` on counters (the library appends it), and the
//! constant label `run` on every series. GPU series carry `UUID` as DCGM's exporter spells
//! it, so a query can join them with DCGM's on `UUID`.
//!
//! Adding a figure is one more `gauge(...)` line in the section it belongs to, and one more
//! `set` where its value is read.
use std::sync::atomic::AtomicU64;

use dflash_shared::health::Fingerprint;
use dflash_shared::metrics::{GpuTelemetry, StepMetrics, TimestampMs};
use dflash_shared::status::{RunState, StatusSnapshot};
use prometheus_client::encoding::prometheus_text;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::info::Info;
use prometheus_client::registry::Registry;

/// The `Content-Type` of what [`render`] returns (text format 0.0.4).
pub const CONTENT_TYPE: &str = prometheus_text::CONTENT_TYPE;

/// Everything one scrape reads, taken from the run's `RunHandle` in one go.
#[derive(Debug, Clone, Copy)]
pub struct Scrape<'a> {
    pub status: &'a StatusSnapshot,
    /// The last metrics line the run loop published; `None` before the first one.
    pub last: Option<&'a StepMetrics>,
    /// The environment this start recorded; `None` if it could not be read back.
    pub environment: Option<&'a Fingerprint>,
    /// The scrape's wall time, for ages.
    pub now_ms: TimestampMs,
}

type Labels = Vec<(&'static str, String)>;
type GaugeFamily = Family<Labels, Gauge<f64, AtomicU64>>;
type CounterFamily = Family<Labels, Counter<f64, AtomicU64>>;

/// The registry of one scrape; each section registers its families, then fills what it knows.
struct Exposition {
    registry: Registry,
}

impl Exposition {
    /// Every series carries `run`; on a node of a multi-node job also `node`, so the scrapes
    /// of a job's daemons sum and compare by node (a single node's series are unchanged).
    fn new(run_name: &str, node: Option<u32>) -> Self {
        let mut labels = vec![("run".into(), run_name.to_string().into())];
        if let Some(node) = node {
            labels.push(("node".into(), node.to_string().into()));
        }
        Exposition {
            registry: Registry::with_prefix_and_labels("dflash", labels.into_iter()),
        }
    }

    fn gauge(&mut self, name: &'static str, help: &'static str) -> GaugeFamily {
        let family = GaugeFamily::default();
        self.registry.register(name, help, family.clone());
        family
    }

    /// A cumulative figure; `name` without `_total`, which the encoder appends.
    fn counter(&mut self, name: &'static str, help: &'static str) -> CounterFamily {
        let family = CounterFamily::default();
        self.registry.register(name, help, family.clone());
        family
    }

    fn info(&mut self, name: &'static str, help: &'static str, labels: Labels) {
        self.registry.register(name, help, Info::new(labels));
    }

    fn encode(&self) -> String {
        let mut text = String::new();
        prometheus_text::encode(&mut text, &self.registry)
            .expect("writing to a String does not fail");
        text
    }
}

/// A series without labels (beyond the constant `run`).
fn set(family: &GaugeFamily, value: f64) {
    family.get_or_create(&Vec::new()).set(value);
}

fn set_labelled(family: &GaugeFamily, labels: Labels, value: f64) {
    family.get_or_create(&labels).set(value);
}

fn count(family: &CounterFamily, labels: Labels, total: f64) {
    family.get_or_create(&labels).inc_by(total);
}

fn seconds(ms: f64) -> f64 {
    ms / 1000.0
}

fn timestamp_seconds(ms: TimestampMs) -> f64 {
    ms as f64 / 1000.0
}

/// The serde name of a unit-like enum value (`training`, `drafter`, `warn`).
fn word<T: serde::Serialize>(value: &T) -> String {
    serde_json::to_value(value)
        .ok()
        .and_then(|v| v.as_str().map(str::to_string))
        .unwrap_or_default()
}

/// The run's text exposition.
pub fn render(scrape: &Scrape<'_>) -> String {
    let node = scrape.status.job.as_ref().map(|j| j.node);
    let mut e = Exposition::new(&scrape.status.run.name, node);
    run(&mut e, scrape);
    training(&mut e, scrape);
    job(&mut e, scrape);
    evaluation(&mut e, scrape);
    queue(&mut e, scrape);
    gpus(&mut e, scrape);
    host(&mut e, scrape);
    checkpoints(&mut e, scrape);
    alerts(&mut e, scrape);
    caches(&mut e, scrape);
    environment(&mut e, scrape);
    e.encode()
}

/// A node of a multi-node job: the job's figures after the last step, as this node read them
/// from the per-step all-reduce of every node's (`dflash_shared::job`).
fn job(e: &mut Exposition, s: &Scrape<'_>) {
    let Some(status) = &s.status.job else {
        return;
    };
    let nodes = e.gauge("job_nodes", "Nodes in this multi-node job");
    let tokens = e.gauge(
        "job_tokens_per_second",
        "Training tokens per second of the whole job in the last step: every node's summed",
    );
    let positions = e.gauge(
        "job_draft_positions_per_second",
        "Draft positions per second of the whole job in the last step",
    );
    let node_tokens = e.gauge(
        "job_node_tokens_per_second",
        "Training tokens per second of one node of the job in the last step",
    );
    let node_busy = e.gauge(
        "job_node_busy_seconds",
        "One node's own work in the last step: its step less its wait in the cross-node all-reduce",
    );
    let straggler = e.gauge(
        "job_straggler",
        "1 for the node holding the job back (its own work longer than the next slowest node's by at least detectors.straggler.behind_frac, a fifth by default), 0 for the others",
    );
    set(&nodes, f64::from(status.nnodes));
    let Some(view) = &status.view else {
        return;
    };
    set(&tokens, view.tokens_per_s);
    set(&positions, view.draft_positions_per_s);
    let held_back_by = view.straggler.as_ref().map(|st| st.node);
    for n in &view.nodes {
        let labels = || vec![("job_node", n.node.to_string())];
        set_labelled(&node_tokens, labels(), n.tokens_per_s);
        set_labelled(&node_busy, labels(), seconds(n.busy_ms));
        let named = f64::from(u8::from(held_back_by == Some(n.node)));
        set_labelled(&straggler, labels(), named);
    }
}

const RUN_STATES: [RunState; 9] = [
    RunState::Starting,
    RunState::WarmingUp,
    RunState::Training,
    RunState::Evaluating,
    RunState::Checkpointing,
    RunState::Paused,
    RunState::Stopping,
    RunState::Finished,
    RunState::Failed,
];

fn run(e: &mut Exposition, s: &Scrape<'_>) {
    let state = e.gauge(
        "run_state",
        "1 for the state the run is in, 0 for every other state",
    );
    let started = e.gauge(
        "run_start_time_seconds",
        "When this daemon started the run, Unix time",
    );
    let eta = e.gauge(
        "run_eta_timestamp_seconds",
        "When the run is expected to finish at the current pace, Unix time",
    );
    let pending = e.gauge(
        "pending_actions",
        "Destructive actions filed and waiting for an operator's confirmation",
    );
    let run = &s.status.run;
    for candidate in RUN_STATES {
        let on = if candidate == run.state { 1.0 } else { 0.0 };
        set_labelled(&state, vec![("state", word(&candidate))], on);
    }
    set(&started, timestamp_seconds(run.started_ms));
    if let Some(ms) = run.eta_ms {
        set(&eta, timestamp_seconds(ms));
    }
    set(&pending, s.status.pending_actions.len() as f64);
}

fn training(e: &mut Exposition, s: &Scrape<'_>) {
    let step = e.gauge("train_step", "Optimizer steps taken");
    let total_steps = e.gauge("train_total_steps", "Optimizer steps in the whole schedule");
    let epoch = e.gauge("train_epoch", "The epoch in progress, counted from 1");
    let epochs = e.gauge("train_epochs", "Epochs in the whole schedule");
    let loss = e.gauge(
        "train_loss",
        "Training loss of the last step (the held-out loss on the evaluation before step 1)",
    );
    let accuracy = e.gauge(
        "train_accuracy_ratio",
        "Top-1 accuracy over weighted draft positions of the last step",
    );
    let lr = e.gauge("train_learning_rate", "Learning rate of the last step");
    let grad_norm = e.gauge(
        "train_grad_norm",
        "Global gradient norm of the last step, before clipping",
    );
    let tokens = e.gauge(
        "train_tokens_per_second",
        "Training-sequence tokens consumed per second in the last step, all workers together",
    );
    let worker_tokens = e.gauge(
        "train_worker_tokens_per_second",
        "Training-sequence tokens one worker consumed per second in the last step",
    );
    let positions = e.gauge(
        "train_draft_positions_per_second",
        "Draft positions (kept anchors x block size) trained per second in the last step",
    );
    let mfu = e.gauge(
        "train_mfu_ratio",
        "Model FLOPs utilisation of the last step: analytic FLOPs per second over the devices' dense peaks (absent where a peak is unknown)",
    );
    let worker_mfu = e.gauge(
        "train_worker_mfu_ratio",
        "One worker's model FLOPs utilisation in the last step (absent where its device's peak is unknown)",
    );
    let baseline = e.gauge(
        "train_baseline_tokens_per_second",
        "The throughput detector's baseline the current tokens per second are judged against (on a node of a multi-node job, the job's tokens per second)",
    );
    let phase = e.gauge(
        "train_step_phase_seconds",
        "Wall time of each phase of the last step",
    );
    let duration = e.gauge("train_step_duration_seconds", "Wall time of the last step");

    let run = &s.status.run;
    set(&step, run.step as f64);
    set(&total_steps, run.total_steps as f64);
    set(&epoch, f64::from(run.epoch));
    set(&epochs, f64::from(run.epochs));
    if let Some(baseline_tps) = s.status.throughput.baseline_tokens_per_s {
        set(&baseline, baseline_tps);
    }
    let Some(m) = s.last else {
        return;
    };
    set(&loss, m.loss);
    set(&accuracy, m.accuracy);
    set(&lr, m.lr);
    set(&grad_norm, m.grad_norm);
    set(&tokens, m.tokens_per_s);
    set(&positions, m.draft_positions_per_s);
    if let Some(u) = m.mfu {
        set(&mfu, u);
    }
    for w in &m.workers {
        let labels = vec![("device", w.device.clone()), ("role", word(&w.role))];
        if let Some(u) = w.mfu {
            set_labelled(&worker_mfu, labels.clone(), u);
        }
        set_labelled(&worker_tokens, labels, w.tokens_per_s);
    }
    let t = &m.times;
    for (name, ms) in [
        ("data_wait", t.data_wait_ms),
        ("target_forward", t.target_forward_ms),
        ("queue_wait", t.queue_wait_ms),
        ("drafter_forward_backward", t.drafter_forward_backward_ms),
        ("all_reduce", t.all_reduce_ms),
        ("optimizer", t.optimizer_ms),
    ] {
        set_labelled(&phase, vec![("phase", name.to_string())], seconds(ms));
    }
    set(&duration, seconds(t.total_ms));
}

/// The `mode` of the held-out evaluation's DDTree oracle τ.
const OFFLINE_TREE_ORACLE: &str = "offline_tree_oracle";

fn evaluation(e: &mut Exposition, s: &Scrape<'_>) {
    let tau = e.gauge(
        "eval_acceptance_length",
        "Acceptance length tau of the last evaluation; mode=\"offline\": held-out data, an \
         anchor at every valid position, chain; mode=\"offline_tree_oracle\": the same blocks, \
         the best-first DDTree of <budget> nodes built from the drafter's distributions, \
         method=\"ddtree_<budget>\" (the metrics line's tau_tree_oracle_<budget>); \
         mode=\"online\": speculative decoding against the target, tokens per target forward, \
         method=\"chain\" or \"ddtree_<budget>\" (the metrics line's online_tau_chain and \
         online_tau_ddtree_<budget>)",
    );
    let serve_tree = e.gauge(
        "eval_serve_tree_acceptance_length",
        "Tree acceptance length tau at the DDTree budget the drafter is served with \
         (training.serve_tree_budget, the budget label), the figure a run is judged by; \
         mode=\"offline_tree_oracle\" or \"online\" as for dflash_eval_acceptance_length",
    );
    if let Some(t) = s.status.last_tau {
        set_labelled(&tau, vec![("mode", "offline".to_string())], t);
    }
    if let Some(tree) = &s.status.last_tau_tree {
        for (budget, t) in &tree.by_budget {
            let method = format!("ddtree_{budget}");
            let labels = vec![
                ("mode", OFFLINE_TREE_ORACLE.to_string()),
                ("method", method),
            ];
            set_labelled(&tau, labels, *t);
        }
        if let Some((budget, t)) = tree.at_serve_budget() {
            let labels = vec![
                ("mode", OFFLINE_TREE_ORACLE.to_string()),
                ("budget", budget.to_string()),
            ];
            set_labelled(&serve_tree, labels, t);
        }
    }
    let Some(online) = &s.status.last_online else {
        return;
    };
    for (method, t) in online.acceptance.methods() {
        let labels = vec![("mode", "online".to_string()), ("method", method)];
        set_labelled(&tau, labels, t);
    }
    if let Some((budget, t)) = online.acceptance.serve_tau_ddtree() {
        let labels = vec![
            ("mode", "online".to_string()),
            ("budget", budget.to_string()),
        ];
        set_labelled(&serve_tree, labels, t);
    }
    let step = e.gauge(
        "eval_online_step",
        "Optimizer step the last online evaluation ran at",
    );
    let prompts = e.gauge(
        "eval_online_prompts",
        "Prompts the last online evaluation decoded",
    );
    let duration = e.gauge(
        "eval_online_duration_seconds",
        "Wall time the last online evaluation took (training waits for it)",
    );
    set(&step, online.step as f64);
    set(&prompts, online.acceptance.prompts as f64);
    set(&duration, online.acceptance.seconds);
    if let Some(gap) = online.acceptance.gap_fraction() {
        let ratio = e.gauge(
            "eval_serve_gap_ratio",
            "How far online chain tau fell short of the offline tau of the same moment, as a \
             fraction of it (negative: online is the higher); the serve_gap alert judges it",
        );
        set(&ratio, gap);
    }
}

fn queue(e: &mut Exposition, s: &Scrape<'_>) {
    let depth = e.gauge("queue_depth", "Hidden-state items in the queue");
    let capacity = e.gauge("queue_capacity", "Items the queue holds at most");
    let resident = e.gauge(
        "queue_resident_bytes",
        "Bytes of hidden states resident in the queue",
    );
    let byte_cap = e.gauge(
        "queue_capacity_bytes",
        "Resident bytes at which producers block",
    );
    let pushed = e.gauge(
        "queue_producer_items_per_second",
        "Items pushed per second over the last sampling interval",
    );
    let popped = e.gauge(
        "queue_consumer_items_per_second",
        "Items popped per second over the last sampling interval",
    );
    let blocked = e.counter(
        "queue_producer_blocked_seconds",
        "Time target workers spent blocked on a full queue",
    );
    let starved = e.counter(
        "queue_consumer_starved_seconds",
        "Time drafter ranks spent waiting on an empty queue",
    );
    let q = &s.status.queue;
    // A topology without a queue (one device for both roles) never publishes a reading.
    if q.ts_ms == 0 {
        return;
    }
    set(&depth, q.depth as f64);
    set(&capacity, q.capacity as f64);
    set(&resident, q.bytes_resident as f64);
    set(&byte_cap, q.byte_cap as f64);
    set(&pushed, q.producer_rate);
    set(&popped, q.consumer_rate);
    count(&blocked, Vec::new(), seconds(q.producer_blocked_ms));
    count(&starved, Vec::new(), seconds(q.consumer_starved_ms));
}

fn gpus(e: &mut Exposition, s: &Scrape<'_>) {
    let info = e.gauge(
        "gpu_info",
        "1 for each GPU NVML sees, with its model; join other series on UUID (as DCGM labels)",
    );
    let used = e.gauge(
        "gpu_memory_used_bytes",
        "GPU memory in use, as NVML reports it (nvidia-smi's figure)",
    );
    let total = e.gauge("gpu_memory_total_bytes", "GPU memory in all, from NVML");
    let allocated = e.gauge(
        "gpu_allocator_allocated_bytes",
        "Bytes libtorch's caching allocator has handed out on this GPU",
    );
    let reserved = e.gauge(
        "gpu_allocator_reserved_bytes",
        "Bytes libtorch's caching allocator holds from the driver on this GPU",
    );
    let peak = e.gauge(
        "gpu_allocator_peak_allocated_bytes",
        "Most bytes allocated at once since the previous sample",
    );
    let retries = e.counter(
        "gpu_allocator_retries",
        "Allocations libtorch retried after freeing its cache (memory pressure)",
    );
    let ooms = e.counter(
        "gpu_allocator_ooms",
        "Out-of-memory errors libtorch's allocator raised",
    );
    let utilization = e.gauge(
        "gpu_utilization_ratio",
        "Fraction of the last sample period a kernel ran, from NVML",
    );
    let power = e.gauge("gpu_power_watts", "Power draw, from NVML");
    let temperature = e.gauge("gpu_temperature_celsius", "GPU temperature, from NVML");
    // Without NVML (every CPU machine) there is no GPU and no GPU series.
    let GpuTelemetry::Available { gpus } = &s.status.gpus else {
        return;
    };
    for g in gpus {
        let labels = vec![
            ("gpu", g.index.to_string()),
            ("UUID", g.uuid.clone().unwrap_or_default()),
            ("role", word(&g.role)),
        ];
        let mut with_model = labels.clone();
        with_model.push(("model", g.name.clone()));
        set_labelled(&info, with_model, 1.0);
        let put = |family: &GaugeFamily, value: Option<f64>| {
            if let Some(v) = value {
                set_labelled(family, labels.clone(), v);
            }
        };
        put(&used, g.memory_used_bytes.map(|b| b as f64));
        put(&total, g.memory_total_bytes.map(|b| b as f64));
        put(
            &utilization,
            g.utilization_pct.map(|p| f64::from(p) / 100.0),
        );
        put(&power, g.power_w);
        put(&temperature, g.temperature_c.map(f64::from));
        if let Some(a) = &g.allocator {
            put(&allocated, Some(a.allocated_bytes as f64));
            put(&reserved, Some(a.reserved_bytes as f64));
            put(&peak, Some(a.peak_allocated_bytes as f64));
            count(&retries, labels.clone(), a.alloc_retries as f64);
            count(&ooms, labels.clone(), a.ooms as f64);
        }
    }
}

fn host(e: &mut Exposition, s: &Scrape<'_>) {
    let rss = e.gauge(
        "host_process_resident_memory_bytes",
        "Resident memory of the dflashd process",
    );
    let used = e.gauge("host_memory_used_bytes", "Host memory in use");
    let total = e.gauge("host_memory_total_bytes", "Host memory in all");
    let Some(h) = &s.status.host else {
        return;
    };
    set(&rss, h.process_rss_bytes as f64);
    set(&used, h.host_memory_used_bytes as f64);
    set(&total, h.host_memory_total_bytes as f64);
}

fn checkpoints(e: &mut Exposition, s: &Scrape<'_>) {
    let written = e.gauge(
        "checkpoint_last_success_timestamp_seconds",
        "When the newest checkpoint was written, Unix time",
    );
    let age = e.gauge(
        "checkpoint_age_seconds",
        "Time since the newest checkpoint was written: the training a crash now would lose",
    );
    let step = e.gauge("checkpoint_last_step", "Step of the newest checkpoint");
    let size = e.gauge(
        "checkpoint_last_size_bytes",
        "Size of the newest checkpoint",
    );
    let Some(c) = s.status.checkpoints.last() else {
        return;
    };
    set(&written, timestamp_seconds(c.written_ms));
    set(&age, seconds((s.now_ms - c.written_ms).max(0) as f64));
    set(&step, c.step as f64);
    set(&size, c.bytes as f64);
}

fn alerts(e: &mut Exposition, s: &Scrape<'_>) {
    let active = e.gauge(
        "alerts_active",
        "Alerts the health detectors hold now, by detector and severity",
    );
    let mut counts: std::collections::BTreeMap<(String, String), f64> = Default::default();
    for a in &s.status.alerts {
        *counts
            .entry((a.detector.clone(), word(&a.level)))
            .or_default() += 1.0;
    }
    for ((detector, severity), n) in counts {
        set_labelled(
            &active,
            vec![("detector", detector), ("severity", severity)],
            n,
        );
    }
}

fn caches(e: &mut Exposition, s: &Scrape<'_>) {
    let warm = e.gauge(
        "cache_warm",
        "1 if the compile or kernel cache is warm (present with entries), else 0",
    );
    let present = e.gauge("cache_present", "1 if the cache directory or file exists");
    let size = e.gauge("cache_size_bytes", "Bytes the cache holds");
    let entries = e.gauge("cache_entries", "Entries (files) in the cache");
    for c in &s.status.caches {
        let labels = || vec![("cache", c.name.clone())];
        let flag = |b: bool| if b { 1.0 } else { 0.0 };
        set_labelled(&warm, labels(), flag(c.warm));
        set_labelled(&present, labels(), flag(c.present));
        set_labelled(&size, labels(), c.size_bytes as f64);
        set_labelled(&entries, labels(), c.entries as f64);
    }
}

fn environment(e: &mut Exposition, s: &Scrape<'_>) {
    let Some(f) = s.environment else {
        e.info(
            "environment",
            "The environment this start recorded (its fingerprint)",
            Vec::new(),
        );
        return;
    };
    let or_empty = |v: &Option<String>| v.clone().unwrap_or_default();
    let labels = vec![
        ("hostname", or_empty(&f.hostname)),
        ("dflashd_version", or_empty(&f.dflashd_version)),
        ("code_git_commit", or_empty(&f.code_git_commit)),
        ("libtorch_version", or_empty(&f.libtorch_version)),
        ("tch_version", or_empty(&f.tch_version)),
        ("cuda_runtime", or_empty(&f.cuda_runtime)),
        ("cuda_driver", or_empty(&f.cuda_driver)),
        ("gpu_models", f.gpu_models.join(",")),
        ("cuda_alloc_conf", or_empty(&f.cuda_alloc_conf)),
        (
            "python_torch",
            f.python_packages.get("torch").cloned().unwrap_or_default(),
        ),
        ("config_hash", or_empty(&f.config_hash)),
        ("data_hash", or_empty(&f.data_hash)),
    ];
    e.info(
        "environment",
        "The environment this start recorded (its fingerprint)",
        labels,
    );
}

#[cfg(test)]
#[path = "exposition_tests.rs"]
mod tests;
