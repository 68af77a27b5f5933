//! Evaluation places the LM head on the evaluating device once per evaluation and each forward
//! group's features once per group, however many anchor chunks the group is split into.
use dflash_engine::device::placements_on_this_thread;
use dflash_engine::embedded;
use dflash_engine::model::drafter::DrafterHead;
use dflash_engine::train::eval::{evaluate, EvalReport};
use dflash_engine::train::trainer::Trainer;
use tch::Device;

use crate::support::topology::{config, cpu_topology, tiny_samples};

/// Evaluates 3 held-out rows one row per forward and one anchor per chunk (every row is many
/// chunks, so a per-chunk copy of a weight would show); the placements it made and its report.
fn placements_evaluating(head: Option<DrafterHead>) -> (u64, u64, EvalReport) {
    tch::set_num_threads(1);
    let target = embedded::tiny_target(None, Device::Cpu).unwrap();
    let mut drafter = embedded::tiny_drafter_config(target.config());
    if let Some(head) = head {
        drafter.head = head;
    }
    let t = Trainer::with_topology(
        target,
        drafter,
        tiny_samples(),
        config(1, 1),
        cpu_topology(1, 1),
    )
    .unwrap();
    let samples = tiny_samples();
    let held: Vec<_> = samples.iter().take(3).collect();
    let mut opts = t.eval_options();
    opts.rows_per_forward = 1;
    opts.anchors_per_forward = 1;
    let before = placements_on_this_thread();
    let report = evaluate(t.target(), t.drafter(), &held, &opts).unwrap();
    let placed = placements_on_this_thread() - before;
    assert!(
        report.blocks > 3 * held.len() as u64,
        "each sample must span several chunks for this test to mean anything: {report:?}"
    );
    (placed, held.len() as u64, report)
}

#[test]
fn the_lm_head_and_features_are_placed_once_not_per_anchor_chunk() {
    let (placed, groups, _) = placements_evaluating(Some(DrafterHead::Dflash));
    assert_eq!(
        placed,
        1 + groups,
        "one LM head for the evaluation plus one feature tensor per group of rows"
    );
    // A Domino head (the embedded default's) adds one placement per chunk: the embeddings of
    // that chunk's labels its GRU reads, data of the chunk, never a weight.
    let (placed, groups, report) = placements_evaluating(None);
    assert_eq!(placed, 1 + groups + report.blocks, "{report:?}");
}
