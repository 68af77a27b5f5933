//! Evaluation places the LM head on the evaluating device once per evaluation and each forward
//! group's features once per group, however many anchor chunks the group is split into.
use dflash_engine::device::placements_on_this_thread;
use dflash_engine::train::eval::evaluate;

use crate::support::topology::{config, cpu_topology, tiny_samples, trainer};

#[test]
fn the_lm_head_and_features_are_placed_once_not_per_anchor_chunk() {
    let t = trainer(config(1, 1), cpu_topology(1, 1));
    let samples = tiny_samples();
    let held: Vec<_> = samples.iter().take(3).collect();
    let mut opts = t.eval_options();
    opts.rows_per_forward = 1;
    // One anchor per forward: every sample is many chunks, so a per-chunk copy would show.
    opts.anchors_per_forward = 1;
    let before = placements_on_this_thread();
    let report = evaluate(t.target(), t.drafter(), &held, &opts).unwrap();
    let placed = placements_on_this_thread() - before;
    assert!(
        report.blocks > 3 * held.len() as u64,
        "each sample must span several chunks for this test to mean anything: {report:?}"
    );
    assert_eq!(
        placed,
        1 + held.len() as u64,
        "one LM head for the evaluation plus one feature tensor per group of rows"
    );
}
