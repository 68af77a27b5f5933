//! The live-memory phase of the benchmarks measures what a step holds at once. It changes
//! process-wide allocator settings and reads the process peak, so it runs alone in this test
//! binary rather than beside the library's parallel unit tests.
use dflash_bench::case::prepare_step_case;
use dflash_bench::plan_check::{predict, rel_error, LIVE_STEP_MEMORY_TOLERANCE};
use dflash_bench::presets::step_preset;
use dflash_bench::step::{run_engine_step, StepOptions};
use dflash_bench::timing::live_step_memory;
use dflash_engine::model::attention::AttentionBackend;
use std::sync::Mutex;

/// Every test here resets and reads the process-wide peak; they must not overlap.
static PROCESS_PEAK: Mutex<()> = Mutex::new(());

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
    let _alone = PROCESS_PEAK
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
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
    let _alone = PROCESS_PEAK
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
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
    let _alone = PROCESS_PEAK
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
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
