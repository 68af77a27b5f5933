//! The engine side of the drafter-step case: loads a case, takes warmup + timed training steps
//! on one batch, and reports times, losses and memory in the same JSON shape as the reference
//! (`benches/reference/bench_step.py`).
//!
//! One step is what [`dflash_engine::train::Trainer`] does for a micro-batch after the target
//! forward, with the same engine calls: frozen embedding lookup, [`Drafter::forward`] with the
//! block-sparse attention, [`weighted_ce_backward`] (chunked LM head; with a Domino head,
//! [`domino_ce_backward`], its GRU and `embed_proj` too), clipped [`AdamW::step`] and
//! `zero_grad`.
use std::path::Path;

use serde::{Deserialize, Serialize};
use tch::{Device, Kind, Tensor};

use super::case::{read_meta, CaseTensors, StepMeta, DRAFTER_DIR};
use super::error::BenchError;
use super::flop_counter::{count_flops, CountedFlops};
use super::memory;
use super::stats::median;
use super::timing::{live_step_memory, sync, timed_loop, Timed};
use dflash_engine::device;
use dflash_engine::model::drafter::{AttentionBackend, Drafter, DrafterInputs};
use dflash_engine::train::block_objective::LossObjective;
use dflash_engine::train::domino::{domino_ce, domino_ce_backward, DominoBatch};
use dflash_engine::train::drafter_io::{load_hf, named_parameters};
use dflash_engine::train::loss::{weighted_ce, weighted_ce_backward, LossSums};
use dflash_engine::train::optim::AdamW;
use dflash_shared::metrics::AllocatorStats;
use dflashd::telemetry::allocator;

/// One implementation's run of a step case: the engine and the reference print this shape.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct StepRun {
    #[serde(rename = "impl")]
    pub implementation: String,
    pub device: String,
    pub dtype: String,
    pub threads: i64,
    /// Times of the timed steps (after warmup), ms.
    pub step_ms: Vec<f64>,
    pub median_step_ms: Option<f64>,
    /// Process CPU time of the timed steps (all threads), ms.
    pub cpu_ms: Vec<f64>,
    pub median_cpu_ms: Option<f64>,
    /// Loss of every step, warmup included (step 0 is before any update).
    pub losses: Vec<Option<f64>>,
    pub grad_norms: Vec<Option<f64>>,
    /// RSS before the first step, the peak while loading, the peak over the steps (VmHWM reset
    /// in between) and the whole-process peak, MiB.
    pub baseline_rss_mb: Option<f64>,
    pub load_peak_rss_mb: Option<f64>,
    pub step_peak_rss_mb: Option<f64>,
    pub peak_rss_mb: Option<f64>,
    pub peak_reset: bool,
    /// CUDA only: libtorch's caching allocator over the steps (warmup included), MiB: its own
    /// peak of allocated bytes (what the reference reads as `torch.cuda.max_memory_allocated`),
    /// the reserved bytes at the end, and how often a cudaMalloc failed and was retried after
    /// freeing the cache (fragmentation near capacity).
    pub cuda_max_allocated_mb: Option<f64>,
    pub cuda_reserved_mb: Option<f64>,
    pub cuda_alloc_retries: Option<u64>,
    /// Engine only: the SDPA kernel libtorch picks for the drafter's biased attention call at
    /// this case's head shapes (one block over the whole context) on this device.
    pub sdpa_backend: Option<String>,
    /// Peak live memory of one step on CPU, MiB, from a memory pass
    /// ([`StepOptions::memory_steps`], [`super::timing::live_step_memory`]).
    pub live_step_mb: Option<f64>,
    /// Engine only: the FLOPs one step's kernels executed, counted op by op
    /// ([`StepOptions::count_flops`]).
    pub counted_flops: Option<CountedFlops>,
    pub forward_only: bool,
    pub tokens: Option<usize>,
    pub positions: Option<i64>,
    pub weighted_positions: Option<i64>,
    /// Reference only: its own block inputs / labels / weights against the engine's.
    pub block_ids_match: Option<bool>,
    pub targets_match: Option<bool>,
    pub weights_max_abs_diff: Option<f64>,
    /// Medians over the timed steps of the step's phases, ms: drafter forward, chunked loss +
    /// backward, clip + optimizer update (device synchronised between phases).
    pub forward_ms: Option<f64>,
    pub backward_ms: Option<f64>,
    pub optimizer_ms: Option<f64>,
    /// Largest absolute difference of this run's output from the engine's output of the same
    /// case (attention and target cases), and the relative L2 difference.
    pub max_abs_diff: Option<f64>,
    pub rel_l2_diff: Option<f64>,
    pub torch: Option<String>,
    pub error: Option<String>,
}

impl StepRun {
    /// Growth of the resident set during the timed steps, MiB.
    pub fn step_growth_mb(&self) -> Option<f64> {
        Some(self.step_peak_rss_mb? - self.baseline_rss_mb?)
    }

    /// Takes the times and memory of a timed loop.
    pub fn absorb(&mut self, t: Timed) {
        self.step_ms = t.step_ms;
        self.median_step_ms = t.median_step_ms;
        self.cpu_ms = t.cpu_ms;
        self.median_cpu_ms = t.median_cpu_ms;
        self.baseline_rss_mb = t.baseline_rss_mb;
        self.load_peak_rss_mb = t.load_peak_rss_mb;
        self.step_peak_rss_mb = t.step_peak_rss_mb;
        self.peak_rss_mb = t.peak_rss_mb;
        self.peak_reset = t.peak_reset;
    }

    pub fn first_loss(&self) -> Option<f64> {
        self.losses.first().copied().flatten()
    }
}

#[derive(Debug, Clone, Copy)]
pub struct StepOptions {
    pub warmup: usize,
    pub steps: usize,
    pub device: Device,
    pub kind: Kind,
    /// Forward + loss only, without gradients (what the CPU flex reference can do).
    pub forward_only: bool,
    /// Non-zero makes this a memory pass (CPU only): the resident set follows live allocations
    /// from the start ([`memory::follow_live_allocations`]), which slows steps, so its times
    /// are not a timing result; after the warmup and timed steps, this many more steps
    /// measure a step's live memory ([`live_step_memory`]).
    pub memory_steps: usize,
    /// The engine's attention back-end (training uses block-sparse; dense-mask is the oracle,
    /// here for diagnosis).
    pub backend: AttentionBackend,
    /// Recompute the drafter's layers in the backward (`training.activation_checkpointing`).
    pub activation_checkpointing: bool,
    /// After the other steps, one more with every matmul and attention kernel counted
    /// ([`super::flop_counter`]): the step's executed FLOPs.
    pub count_flops: bool,
}

pub use dflash_engine::device::kind_name;

/// Split times within a step, the device synchronised at each split.
struct Lap {
    device: Device,
    last: std::time::Instant,
}

impl Lap {
    fn new(device: Device) -> Self {
        Self {
            device,
            last: std::time::Instant::now(),
        }
    }

    fn restart(&mut self) {
        self.last = std::time::Instant::now();
    }

    /// Milliseconds since the last split.
    fn split(&mut self) -> f64 {
        sync(self.device);
        let now = std::time::Instant::now();
        let ms = (now - self.last).as_secs_f64() * 1e3;
        self.last = now;
        ms
    }
}

/// Runs the engine's step on the case in `dir`.
pub fn run_engine_step(dir: &Path, opts: &StepOptions) -> Result<StepRun, BenchError> {
    let memory_pass = opts.memory_steps > 0 && opts.device == Device::Cpu;
    if memory_pass {
        memory::follow_live_allocations();
    }
    let meta = read_meta(dir)?;
    let loaded = load_hf(&dir.join(DRAFTER_DIR), opts.device, opts.kind)?;
    let mut vs = loaded.vs;
    vs.unfreeze();
    let drafter: Drafter = loaded.drafter;
    let mut optimizer = AdamW::new(named_parameters(&vs), meta.adamw.clone());
    let t = CaseTensors::read(dir, opts.device, opts.kind)?;
    let features = t.get("target_features")?;
    let (embed, lm_head) = (t.get("embed_tokens")?, t.get("lm_head")?);
    let anchors = t.get("anchors")?;
    let keep = t.get("keep")?.to_kind(Kind::Bool);
    let block_ids = t.get("block_input_ids")?;
    let targets = t.get("targets")?;
    let weights = t.get("weights")?;
    let losses_of = StepLoss {
        lm_head,
        targets,
        weights,
        denominator: weights.sum(Kind::Double).double_value(&[]),
        chunk_positions: meta.loss_chunk_positions,
    };
    let (b, q) = (block_ids.size()[0], block_ids.size()[1]);

    let mut run = engine_run(opts, &meta, &drafter, features);
    let mut losses = Vec::new();
    let mut norms = Vec::new();
    let mut phases: [Vec<f64>; 3] = Default::default();
    let mut lap = Lap::new(opts.device);
    let timed_steps = opts.warmup + opts.steps;
    let mut step = |i: usize| {
        lap.restart();
        let embeddings = lookup(embed, block_ids, b, q);
        // A Domino head's GRU reads each block's true tokens, the slots' labels (teacher
        // forcing, as `train/replica.rs` feeds it), looked up per step as the trainer does.
        let label_embeddings = drafter.domino().map(|_| lookup(embed, targets, b, q));
        let domino = losses_of.domino(&drafter, label_embeddings.as_ref());
        let forward_pass = || drafter.forward(features, &embeddings, anchors, &keep, opts.backend);
        let (loss, norm) = if opts.forward_only {
            let sums = tch::no_grad(|| losses_of.forward(&forward_pass(), domino.as_ref()));
            (sums.loss(), None)
        } else {
            // The forward split is taken when the output exists; the backward one includes
            // the layers' recomputation under checkpointing.
            let inputs = DrafterInputs {
                target_features: features,
                block_embeddings: &embeddings,
                anchors,
                keep: &keep,
            };
            let (forward, sums) = drafter.forward_backward(
                &inputs,
                opts.backend,
                opts.activation_checkpointing,
                |out| {
                    let forward = lap.split();
                    (forward, losses_of.backward(out, domino.as_ref()))
                },
            );
            let backward = lap.split();
            let report = optimizer.step(meta.lr);
            optimizer.zero_grad();
            if (opts.warmup..timed_steps).contains(&i) {
                for (phase, ms) in phases.iter_mut().zip([forward, backward, lap.split()]) {
                    phase.push(ms);
                }
            }
            (sums.loss(), Some(report?.grad_norm))
        };
        if i < timed_steps {
            losses.push(loss.is_finite().then_some(loss));
            norms.push(norm.filter(|n| n.is_finite()));
        }
        Ok(())
    };
    // The peak must be this run's steps', not the loading's.
    reset_cuda_peak(opts.device);
    let timed = timed_loop(opts.warmup, opts.steps, opts.device, &mut step)?;
    fill_device_memory(&mut run, opts.device, allocator::cuda_stats);
    if memory_pass {
        run.live_step_mb = live_step_memory(timed_steps, opts.memory_steps, &mut step)?;
    }
    if opts.count_flops {
        let (counted_step, counted) = count_flops(|| step(timed_steps + opts.memory_steps));
        counted_step?;
        run.counted_flops = Some(counted);
    }
    run.losses = losses;
    run.grad_norms = norms;
    [run.forward_ms, run.backward_ms, run.optimizer_ms] = phases.map(|p| median(&p));
    run.absorb(timed);
    Ok(run)
}

/// The run's description before any step: which engine, on what, at which case size, and
/// the SDPA kernel its attention gets.
fn engine_run(
    opts: &StepOptions,
    meta: &StepMeta,
    drafter: &Drafter,
    features: &Tensor,
) -> StepRun {
    let mut run = StepRun {
        implementation: match opts.backend {
            AttentionBackend::BlockSparse => "engine".into(),
            AttentionBackend::DenseMask => "engine-dense_mask".into(),
        },
        device: device::name(opts.device),
        dtype: kind_name(opts.kind).into(),
        threads: tch::get_num_threads() as i64,
        forward_only: opts.forward_only,
        tokens: Some(meta.tokens),
        positions: Some(meta.positions),
        weighted_positions: Some(meta.weighted_positions),
        ..StepRun::default()
    };
    let dc = drafter.config();
    let site = dflash_engine::model::sdpa::CallSite {
        name: "drafter block-sparse (bias)",
        q_heads: dc.num_attention_heads,
        kv_heads: dc.num_key_value_heads,
        head_dim: dc.head_dim,
        rows: dc.block_size,
        keys: features.size()[1] + dc.block_size,
        bias: true,
        causal: false,
        gqa: false,
    };
    dflash_engine::model::sdpa::choose_backends();
    run.sdpa_backend = Some(
        dflash_engine::model::sdpa::backend_for(&site, opts.device, opts.kind)
            .name()
            .into(),
    );
    run
}

fn reset_cuda_peak(device: Device) {
    if let Device::Cuda(index) = device {
        if let Err(e) = allocator::reset_peak(index) {
            eprintln!("cuda:{index}: allocator peak not reset ({e}); the peak includes loading");
        }
    }
}

/// The frozen embedding rows of `ids`, shaped `[b, q, hidden]`.
fn lookup(embed: &Tensor, ids: &Tensor, b: i64, q: i64) -> Tensor {
    tch::no_grad(|| embed.index_select(0, &ids.reshape([-1])).view([b, q, -1]))
}

/// The trainer's loss for the drafter's head (`train/replica.rs`) on the case's labels.
struct StepLoss<'a> {
    lm_head: &'a Tensor,
    targets: &'a Tensor,
    weights: &'a Tensor,
    denominator: f64,
    chunk_positions: i64,
}

impl StepLoss<'_> {
    /// A Domino head's batch over this step's label embeddings; `None` for DFlash's head.
    fn domino<'b>(
        &'b self,
        drafter: &'b Drafter,
        label_embeddings: Option<&'b Tensor>,
    ) -> Option<DominoBatch<'b>> {
        drafter
            .domino()
            .zip(label_embeddings)
            .map(|(head, label_embeddings)| DominoBatch {
                head,
                lm_head: self.lm_head,
                label_embeddings,
                targets: self.targets,
                weights: self.weights,
                block_size: drafter.config().block_size,
            })
    }

    fn forward(&self, out: &Tensor, domino: Option<&DominoBatch>) -> LossSums {
        match domino {
            Some(batch) => domino_ce(out, batch, LossObjective::Dflash, self.chunk_positions),
            None => weighted_ce(
                out,
                self.lm_head,
                self.targets,
                self.weights,
                self.chunk_positions,
            ),
        }
    }

    /// A Domino head's curriculum runs at λ = 0, the corrected logits alone (what the trainer
    /// passes without a schedule): λ only weighs the two terms, both computed and
    /// backpropagated whatever it is, so the kernels and the memory are the same at any λ.
    fn backward(&self, out: &Tensor, domino: Option<&DominoBatch>) -> LossSums {
        match domino {
            Some(batch) => domino_ce_backward(
                out,
                batch,
                LossObjective::Dflash,
                0.0,
                self.denominator,
                self.chunk_positions,
            ),
            None => weighted_ce_backward(
                out,
                self.lm_head,
                self.targets,
                self.weights,
                self.denominator,
                self.chunk_positions,
            ),
        }
    }
}

const MIB: f64 = 1024.0 * 1024.0;

/// On CUDA, the allocator's readings into `run` (`read` is `allocator::cuda_stats`; a reading
/// that fails is reported and leaves the fields empty, never filled in). Nothing on the CPU,
/// whose memory is the RSS fields'.
pub fn fill_device_memory<E: std::fmt::Display>(
    run: &mut StepRun,
    device: Device,
    read: impl Fn(usize) -> Result<AllocatorStats, E>,
) {
    let Device::Cuda(index) = device else {
        return;
    };
    match read(index) {
        Ok(stats) => {
            run.cuda_max_allocated_mb = Some(stats.peak_allocated_bytes as f64 / MIB);
            run.cuda_reserved_mb = Some(stats.reserved_bytes as f64 / MIB);
            run.cuda_alloc_retries = Some(stats.alloc_retries);
        }
        Err(e) => eprintln!("cuda:{index}: no allocator statistics ({e})"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::case::prepare_step_case;

    #[test]
    fn cuda_runs_report_the_allocator_and_cpu_runs_leave_it_empty() {
        let _rng = dflash_engine::device::global_rng::lock();
        let stats = AllocatorStats {
            allocated_bytes: 1 << 20,
            reserved_bytes: 6 << 20,
            peak_allocated_bytes: 5 << 20,
            alloc_retries: 2,
            ooms: 0,
        };
        let asked = std::cell::Cell::new(None);
        let read = |i: usize| -> Result<AllocatorStats, String> {
            asked.set(Some(i));
            Ok(stats.clone())
        };
        let mut run = StepRun::default();
        fill_device_memory(&mut run, Device::Cuda(3), read);
        assert_eq!(asked.get(), Some(3));
        assert_eq!(run.cuda_max_allocated_mb, Some(5.0));
        assert_eq!(run.cuda_reserved_mb, Some(6.0));
        assert_eq!(run.cuda_alloc_retries, Some(2));

        let mut cpu = StepRun::default();
        asked.set(None);
        fill_device_memory(&mut cpu, Device::Cpu, read);
        assert_eq!((asked.get(), cpu.cuda_max_allocated_mb), (None, None));

        // A failed reading leaves the fields empty.
        let mut failed = StepRun::default();
        fill_device_memory(&mut failed, Device::Cuda(0), |_| {
            Err::<AllocatorStats, _>("not initialized")
        });
        assert_eq!(failed.cuda_max_allocated_mb, None);
    }
    use crate::presets::step_preset;

    #[test]
    fn the_engine_step_runs_the_tiny_case_and_learns_on_its_batch() {
        let _rng = dflash_engine::device::global_rng::lock();
        let dir = tempfile::tempdir().unwrap();
        let mut preset = step_preset("tiny").unwrap();
        preset.batch = 2;
        prepare_step_case(&preset, dir.path()).unwrap();
        let opts = StepOptions {
            warmup: 1,
            steps: 3,
            device: Device::Cpu,
            kind: Kind::Float,
            forward_only: false,
            // The live-memory phase changes process-wide allocator settings; it is tested
            // in its own test binary (tests/bench_live_memory.rs).
            memory_steps: 0,
            backend: AttentionBackend::BlockSparse,
            activation_checkpointing: false,
            count_flops: false,
        };
        let run = run_engine_step(dir.path(), &opts).unwrap();
        assert_eq!(run.losses.len(), 4);
        assert_eq!(run.step_ms.len(), 3);
        let losses: Vec<f64> = run.losses.iter().map(|l| l.unwrap()).collect();
        // Near ln(vocab) at init; repeated steps on one batch must lower it.
        assert!((losses[0] - (512f64).ln()).abs() < 1.0, "{losses:?}");
        assert!(losses[3] < losses[0], "{losses:?}");
        assert!(run.grad_norms.iter().all(|n| n.is_some_and(|n| n > 0.0)));
        assert!(run.peak_rss_mb.unwrap() >= run.baseline_rss_mb.unwrap());

        let forward = run_engine_step(
            dir.path(),
            &StepOptions {
                forward_only: true,
                ..opts
            },
        )
        .unwrap();
        let (f0, t0) = (forward.first_loss().unwrap(), run.first_loss().unwrap());
        assert!(
            (f0 - t0).abs() < 1e-6 * t0,
            "forward-only loss {f0} vs training loss {t0} of the same weights"
        );
        assert!(
            forward.losses.iter().all(|l| *l == forward.first_loss()),
            "no update without gradients"
        );
    }
}
