//! The live-memory phase of the benchmarks measures what a step holds at once. It changes
//! process-wide allocator settings and reads the process peak, so it runs alone in this test
//! binary rather than beside the library's parallel unit tests.
use dflash_bench::case::prepare_step_case;
use dflash_bench::plan_check::{predict, rel_error, LIVE_STEP_MEMORY_TOLERANCE};
use dflash_bench::presets::step_preset;
use dflash_bench::step::{run_engine_step, StepOptions};
use dflash_bench::timing::live_step_memory;
use dflash_engine::model::attention::AttentionBackend;
use dflash_engine::model::drafter::{Dflash2Config, DrafterConfig, DsparkConfig};
use std::sync::Mutex;

/// Every test here resets and reads the process-wide peak; they must not overlap.
static PROCESS_PEAK: Mutex<()> = Mutex::new(());

/// Holds [`PROCESS_PEAK`] for a test that measures this process's memory; a test that panicked
/// while holding it leaves nothing behind that matters here.
fn alone() -> std::sync::MutexGuard<'static, ()> {
    PROCESS_PEAK
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// The embedded default's drafter with a plain DFlash head, over the tiny target.
fn tiny_dflash_drafter() -> DrafterConfig {
    let target = dflash_engine::model::target::TargetConfig::tiny_default();
    dflash_engine::embedded::tiny_dflash_drafter_config(&target)
}

/// A step holding `mib` MiB at once, in 256 KiB pieces.
fn hold(mib: usize) -> usize {
    let pieces: Vec<Vec<u8>> = (0..mib * 4).map(|_| vec![1u8; 256 << 10]).collect();
    std::hint::black_box(&pieces);
    pieces.len()
}

/// Earlier steps as a training loop leaves them: 64 MiB of 256 KiB pieces freed between small
/// allocations that stay alive, so glibc keeps the freed pieces' pages cached in its heap
/// (they are not at its top, so nothing returns them). A later step reuses them without the
/// resident set growing, which is what made the plain growth figure depend on history.
fn cache_freed_pieces() -> Vec<Vec<u8>> {
    let mut survivors = Vec::new();
    for _ in 0..3 {
        let pieces: Vec<Vec<u8>> = (0..256)
            .map(|_| {
                survivors.push(vec![0u8; 64]);
                vec![1u8; 256 << 10]
            })
            .collect();
        std::hint::black_box(&pieces);
    }
    survivors
}

#[test]
fn live_memory_counts_what_a_step_holds_even_after_earlier_steps_cached_it() {
    let _alone = alone();
    let survivors = cache_freed_pieces();
    let mut steps = Vec::new();
    let live = live_step_memory(7, 2, |i| {
        steps.push(i);
        hold(64);
        Ok(())
    })
    .unwrap()
    .expect("Linux with glibc separates the live peak");
    assert_eq!(steps, [7, 8], "indices continue from the caller's loop");
    assert!(
        (56.0..96.0).contains(&live),
        "a step holding 64 MiB measured {live:.1} MiB"
    );

    let idle = live_step_memory(0, 2, |_| Ok(())).unwrap().unwrap();
    assert!(
        idle < 8.0,
        "a step that holds nothing measured {idle:.1} MiB"
    );
    assert_eq!(live_step_memory(0, 0, |_| Ok(())).unwrap(), None);
    drop(survivors);
}

#[test]
fn the_engine_step_reports_its_live_memory_after_the_timed_steps() {
    let _alone = alone();
    let dir = tempfile::tempdir().unwrap();
    let mut preset = step_preset("tiny").unwrap();
    preset.batch = 2;
    prepare_step_case(&preset, dir.path()).unwrap();
    let opts = StepOptions {
        warmup: 1,
        steps: 2,
        device: tch::Device::Cpu,
        kind: tch::Kind::Float,
        forward_only: false,
        memory_steps: 2,
        backend: AttentionBackend::BlockSparse,
        activation_checkpointing: false,
        count_flops: false,
    };
    let run = run_engine_step(dir.path(), &opts).unwrap();
    assert_eq!(run.losses.len(), 3, "memory steps are not timed steps");
    assert_eq!(run.step_ms.len(), 2);
    let live = run.live_step_mb.expect("CPU on glibc measures live memory");
    // Batch 2 of the tiny drafter: activations, gradients, logits and the optimizer's
    // temporaries come to a few MiB; far less than the whole process.
    assert!(
        live > 0.5 && live < run.peak_rss_mb.unwrap() / 2.0,
        "live step memory {live:.1} MiB of a {:.0} MiB process",
        run.peak_rss_mb.unwrap()
    );
}

/// The memory plan against the memory pass, as `dflash-bench --cases plan` holds it: the live
/// step memory `plan::drafter_memory` predicts at the case's own anchors, keep flags and loss
/// weights, within [`LIVE_STEP_MEMORY_TOLERANCE`] of what a step of the case holds, with and
/// without activation checkpointing. One warmup step (one-time initialisation), then the
/// memory steps, as the case's memory pass runs them, on 1 thread as its children do.
fn assert_the_plan_predicts_the_live_step_memory(config: &str) {
    let _alone = alone();
    tch::set_num_threads(1);
    let dir = tempfile::tempdir().unwrap();
    prepare_step_case(&step_preset(config).unwrap(), dir.path()).unwrap();
    for activation_checkpointing in [false, true] {
        let opts = StepOptions {
            warmup: 1,
            steps: 0,
            device: tch::Device::Cpu,
            kind: tch::Kind::Float,
            forward_only: false,
            memory_steps: 1,
            backend: AttentionBackend::BlockSparse,
            activation_checkpointing,
            count_flops: false,
        };
        let run = run_engine_step(dir.path(), &opts).unwrap();
        let measured = run.live_step_mb.expect("CPU on glibc measures live memory");
        let predicted = predict(config, dir.path(), activation_checkpointing)
            .unwrap()
            .predicted_step_mb;
        let error = rel_error(predicted, measured).expect("a step holds memory");
        eprintln!(
            "{config}, checkpointing {activation_checkpointing}: predicted {predicted:.1} MiB, \
             measured {measured:.1} MiB ({:+.1} %)",
            error * 100.0
        );
        assert!(
            error.abs() <= LIVE_STEP_MEMORY_TOLERANCE,
            "{config}, checkpointing {activation_checkpointing}: predicted {predicted:.1} MiB \
             against {measured:.1} MiB measured ({:+.1} %)",
            error * 100.0
        );
    }
}

/// DFlash's head: `small`, a sliding and a full layer with several attention chunks each.
#[test]
fn the_memory_plan_predicts_a_dflash_steps_live_memory() {
    assert_the_plan_predicts_the_live_step_memory("small");
}

/// The same drafter with a Domino head: its label embeddings, GRU states and the second
/// vocabulary-wide logits of every loss chunk are in both the prediction and the measurement.
#[test]
fn the_memory_plan_predicts_a_domino_steps_live_memory() {
    assert_the_plan_predicts_the_live_step_memory("small-domino");
}

/// Live memory of one loss over a fresh drafter output `[1, q, h]` per step: `backward` runs it
/// and backpropagates, and the gradients of `vs`'s parameters are released between steps as the
/// trainer's `zero_grad` does. One warmup step, then one measured.
fn loss_live_mib(
    vs: &tch::nn::VarStore,
    (q, h): (i64, i64),
    backward: impl Fn(&tch::Tensor),
) -> f64 {
    let _rng = dflash_engine::device::global_rng::seeded(1);
    use tch::{Device, Kind, Tensor};
    // Before the warmup: a `[c, V]` tensor under glibc's largest dynamic mmap threshold that
    // the warmup freed would otherwise come from the heap and stay resident.
    assert!(dflash_bench::memory::follow_live_allocations());
    let mut releaser = tch::COptimizer::sgd(0.0, 0.0, 0.0, 0.0, false).unwrap();
    for p in vs.trainable_variables() {
        releaser.add_parameters(&p, 0).unwrap();
    }
    let step = |_: usize| {
        let out = Tensor::randn([1, q, h], (Kind::Float, Device::Cpu)).set_requires_grad(true);
        backward(&out);
        releaser.zero_grad().unwrap();
        Ok(())
    };
    step(0).unwrap();
    live_step_memory(1, 1, step)
        .unwrap()
        .expect("Linux with glibc separates the live peak")
}

/// The plan's loss chunk of `d` (`plan/drafter.rs::loss_or_backward_peak`, the step's peak
/// here), in MiB, for one row of `blocks` whole blocks holding `weighted` weighted positions
/// over `head` head positions, in loss chunks of `chunk` weighted positions, on CPU in fp32.
fn plan_loss_chunk_mib(
    d: &DrafterConfig,
    blocks: i64,
    weighted: i64,
    head: i64,
    chunk: i64,
) -> f64 {
    use dflash_engine::plan::drafter::{drafter_memory, RankContext};
    use dflash_engine::plan::shape::{ActivationPrecision, StepShape};
    let shape = StepShape {
        batch: 1,
        seq_len: 10 * blocks + 20,
        anchors: (0..blocks).map(|j| 10 * j).collect(),
        keep: vec![true; blocks as usize],
        weighted_positions: weighted,
        corrected_positions: 0,
        head_positions: head,
        loss_chunk_positions: chunk,
        tree_budget: 0,
    };
    let rank = RankContext::alone(ActivationPrecision::Fp32Cpu, true);
    let plan = drafter_memory(d, &shape, rank);
    assert_eq!(plan.peak_phase, "loss");
    plan.step
        .iter()
        .find(|c| c.name.starts_with("loss chunk"))
        .unwrap()
        .bytes
        / (1024.0 * 1024.0)
}

/// The loss chunk's prediction within 3 % of the loss's live memory.
fn assert_the_loss_chunk_is_predicted(case: &str, predicted: f64, measured: f64) {
    let error = rel_error(predicted, measured).expect("a step holds memory");
    eprintln!(
        "{case}: predicted {predicted:.1} MiB, measured {measured:.1} MiB ({:+.1} %)",
        error * 100.0
    );
    assert!(
        error.abs() <= 0.03,
        "{case}: predicted {predicted:.1} MiB against {measured:.1} MiB ({:+.1} %)",
        error * 100.0
    );
}

/// Live memory of DSpark's loss over `q` positions in chunks of `chunk` (`train/dspark.rs`,
/// every slot supervised) at a vocabulary large enough that its `[c, V]` tensors are nearly
/// all of it.
fn dspark_loss_live_mib(d: &DrafterConfig, head: &DsparkConfig, q: i64, chunk: i64) -> f64 {
    let _rng = dflash_engine::device::global_rng::seeded(2);
    use dflash_engine::model::drafter::DsparkHead;
    use dflash_engine::train::dspark::{dspark_backward, DsparkBatch, DsparkLossWeights};
    use tch::{nn, Device, Kind, Tensor};
    let (v, h, ht) = (d.vocab_size, d.hidden_size, d.target_hidden_size);
    let opts = (Kind::Float, Device::Cpu);
    let vs = nn::VarStore::new(Device::Cpu);
    let head = DsparkHead::new(&vs.root(), head, h, v, d.initializer_range);
    let lm_head = Tensor::randn([v, h], opts);
    let ids = || Tensor::randint(v, [1, q], (Kind::Int64, Device::Cpu));
    let (targets, prev) = (ids(), ids());
    let weights = Tensor::ones([1, q], opts);
    let valid = Tensor::ones([1, q], (Kind::Bool, Device::Cpu));
    let teacher = Tensor::randn([1, q, ht], opts);
    let batch = DsparkBatch {
        head: &head,
        lm_head: &lm_head,
        targets: &targets,
        prev_tokens: &prev,
        weights: &weights,
        valid: &valid,
        teacher_hidden: &teacher,
        block_size: d.block_size,
        loss_weights: DsparkLossWeights::default(),
    };
    loss_live_mib(&vs, (q, h), |out| {
        let _ = dspark_backward(out, &batch, 1.0, chunk);
    })
}

/// The plan's DSpark loss chunk (`plan/drafter.rs::loss_chunk_vocab_bytes` and
/// `dspark_chunk_bytes`: nine fp32 `[c, V]` tensors at its peak, eight without a Markov head)
/// against what DSpark's loss holds at once on CPU. Two chunks: the second's peak also holds
/// `W₂`'s gradient, which the first's backward wrote.
#[test]
fn the_memory_plan_predicts_a_dspark_loss_chunks_live_memory() {
    use dflash_engine::model::drafter::{DrafterHead, DsparkConfig, MarkovHeadType};
    let _alone = alone();
    tch::set_num_threads(1);
    let tiny = tiny_dflash_drafter();
    // 8 whole blocks of 8 supervised slots, two loss chunks of 4 blocks.
    let (blocks, q) = (8, 8 * tiny.block_size);
    for markov_rank in [4, 0] {
        let head = DsparkConfig {
            markov_rank,
            markov_head_type: MarkovHeadType::Vanilla,
            confidence_head: true,
            confidence_head_with_markov: markov_rank > 0,
        };
        let d = DrafterConfig {
            vocab_size: 50_000,
            head: DrafterHead::Dspark(head),
            ..tiny.clone()
        };
        let predicted = plan_loss_chunk_mib(&d, blocks, q, q, q / 2);
        let measured = dspark_loss_live_mib(&d, &head, q, q / 2);
        assert_the_loss_chunk_is_predicted(
            &format!("DSpark loss chunk, rank {markov_rank}"),
            predicted,
            measured,
        );
    }
}

/// Live memory of DFlash2's loss (`train/dflash2.rs::dflash2_backward`, as the replica calls it
/// per micro-batch: DFlash's objective, the selector trained at α 1) over one row of `blocks`
/// whole blocks, slot 0 of each unweighted and the rest γ-weighted, in chunks of `chunk`
/// weighted positions, with the selector the drafter builds (`CandidateSelector::new`).
fn dflash2_loss_live_mib(d: &DrafterConfig, head: &Dflash2Config, blocks: i64, chunk: i64) -> f64 {
    let _rng = dflash_engine::device::global_rng::seeded(3);
    use dflash_engine::model::drafter::CandidateSelector;
    use dflash_engine::train::block_objective::LossObjective;
    use dflash_engine::train::dflash2::{dflash2_backward, Dflash2Batch};
    use tch::{nn, Device, Kind, Tensor};
    let (v, h, bs) = (d.vocab_size, d.hidden_size, d.block_size);
    let q = blocks * bs;
    let opts = (Kind::Float, Device::Cpu);
    let vs = nn::VarStore::new(Device::Cpu);
    let selector = CandidateSelector::new(&vs.root(), head, h, v, d.initializer_range);
    let lm_head = Tensor::randn([v, h], opts);
    let targets = Tensor::randint(v, [1, q], (Kind::Int64, Device::Cpu));
    let decay = Tensor::arange(bs, opts).neg().exp();
    let weights = (decay * Tensor::arange(bs, opts).gt(0.0).to_kind(Kind::Float))
        .repeat([blocks])
        .view([1, q]);
    let batch = Dflash2Batch {
        selector: &selector,
        lm_head: &lm_head,
        targets: &targets,
        weights: &weights,
        block_size: bs,
        selector_alpha: 1.0,
        stop_gradient: false,
    };
    loss_live_mib(&vs, (q, h), |out| {
        let _ = dflash2_backward(out, &batch, LossObjective::Dflash, 1.0, chunk);
    })
}

/// The plan's DFlash2 loss chunk (`plan/drafter.rs::loss_chunk_vocab_bytes` and
/// `dflash2_chunk_bytes`: five fp32 `[c, V]` tensors per slot of the chunk's blocks at its
/// peak, six with a soft cap, and the codebooks' gradients) against what DFlash2's loss holds at
/// once on CPU, over SpecForge's top 16 candidates at the tiny drafter's selector rank: without
/// a multiplier or cap (SpecForge's defaults) and with both, in two chunks of 8 blocks and in
/// one (the codebooks' gradients are in both peaks: the selector's backward runs first).
#[test]
fn the_memory_plan_predicts_a_dflash2_loss_chunks_live_memory() {
    use dflash_engine::model::drafter::DrafterHead;
    let _alone = alone();
    tch::set_num_threads(1);
    let tiny = tiny_dflash_drafter();
    // 16 whole blocks of 8 slots, 7 of them weighted: one loss chunk, or two of 8 blocks.
    let bs = tiny.block_size;
    let blocks = 16;
    let (weighted, q) = (blocks * (bs - 1), blocks * bs);
    for (output_multiplier, final_logit_softcapping, chunk) in [
        (1.0, None, weighted / 2),
        (0.5, Some(30.0), weighted / 2),
        (0.5, Some(30.0), weighted),
    ] {
        let head = Dflash2Config {
            conv_kernel_size: 2,
            conv_group_size: 16,
            selector_rank: 64,
            selector_top_k: 16,
            output_multiplier,
            final_logit_softcapping,
        };
        let d = DrafterConfig {
            vocab_size: 50_000,
            head: DrafterHead::Dflash2(head),
            ..tiny.clone()
        };
        let predicted = plan_loss_chunk_mib(&d, blocks, weighted, q, chunk);
        let measured = dflash2_loss_live_mib(&d, &head, blocks, chunk);
        assert_the_loss_chunk_is_predicted(
            &format!(
                "DFlash2 loss chunk, multiplier {output_multiplier}, soft cap \
                 {final_logit_softcapping:?}, {} chunk(s)",
                weighted / chunk
            ),
            predicted,
            measured,
        );
    }
}

/// The plan's Markov latents (`plan/drafter.rs::dspark_activations`: what each variant keeps
/// for backward over every slot) against what the teacher-forced latents of a step hold once
/// formed on CPU (`MarkovHead::block_latents`, as `train/dspark.rs` forms them): the plan's
/// `DSpark` consumer less its teacher states, its inputs and the latents' gradient, which the
/// loss writes later. The RNN's peak also holds its last state `[blocks, r]` while the slots'
/// latents are stacked, freed on return, so before the loss (1.4 % here).
#[test]
fn the_memory_plan_predicts_the_markov_latents_each_variant_keeps() {
    use dflash_engine::model::drafter::{DrafterHead, DsparkHead, MarkovHeadType};
    use dflash_engine::plan::drafter::{drafter_memory, RankContext};
    use dflash_engine::plan::shape::{ActivationPrecision, StepShape};
    use tch::{nn, Device, Kind, Tensor};
    let _alone = alone();
    // Inside `alone()`, as the helpers above take it: one order for the two locks.
    let _rng = dflash_engine::device::global_rng::seeded(4);
    tch::set_num_threads(1);
    assert!(dflash_bench::memory::follow_live_allocations());
    let tiny = tiny_dflash_drafter();
    // 1,024 blocks of the tiny drafter's 8 slots, wide enough that the latents are megabytes.
    let (bs, blocks, r) = (tiny.block_size, 1024i64, 256i64);
    let d = DrafterConfig {
        hidden_size: 512,
        ..tiny.clone()
    };
    let shape = StepShape {
        batch: 1,
        seq_len: blocks + bs,
        anchors: (0..blocks).collect(),
        keep: vec![true; blocks as usize],
        weighted_positions: 0,
        corrected_positions: 0,
        head_positions: 0,
        loss_chunk_positions: 1,
        tree_budget: 0,
    };
    let rank = RankContext::alone(ActivationPrecision::Fp32Cpu, true);
    let q = (blocks * bs) as f64;
    for kind in [
        MarkovHeadType::Vanilla,
        MarkovHeadType::Gated,
        MarkovHeadType::Rnn,
    ] {
        let config = DsparkConfig {
            markov_rank: r,
            markov_head_type: kind,
            confidence_head: false,
            confidence_head_with_markov: false,
        };
        let d = DrafterConfig {
            head: DrafterHead::Dspark(config),
            ..d.clone()
        };
        let consumer = drafter_memory(&d, &shape, rank)
            .step
            .iter()
            .find(|c| c.name.starts_with("DSpark"))
            .unwrap()
            .bytes;
        let others = q * d.target_hidden_size as f64 * 4.0 + q * 13.0 + q * r as f64 * 4.0;
        let predicted = (consumer - others) / (1024.0 * 1024.0);
        let vs = nn::VarStore::new(Device::Cpu);
        let head = DsparkHead::new(&vs.root(), &config, d.hidden_size, d.vocab_size, 0.02);
        let opts = (Kind::Float, Device::Cpu);
        let hidden = Tensor::randn([blocks, bs, d.hidden_size], opts).set_requires_grad(true);
        let prev = Tensor::randint(d.vocab_size, [blocks, bs], (Kind::Int64, Device::Cpu));
        // One warmup: the first call's one-time initialisation is not the latents'.
        drop(head.markov().unwrap().block_latents(&prev, &hidden));
        let mut held = Vec::new();
        let measured = live_step_memory(1, 1, |_| {
            held.push(head.markov().unwrap().block_latents(&prev, &hidden));
            Ok(())
        })
        .unwrap()
        .expect("Linux with glibc separates the live peak");
        let error = rel_error(predicted, measured).expect("the latents hold memory");
        eprintln!(
            "{kind:?} latents: predicted {predicted:.1} MiB, measured {measured:.1} MiB ({:+.1} %)",
            error * 100.0
        );
        assert!(
            error.abs() <= 0.05,
            "{kind:?}: predicted {predicted:.1} MiB against {measured:.1} MiB"
        );
    }
}
