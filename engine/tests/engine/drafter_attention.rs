//! Mask oracle: the block-sparse attention equals the dense-mask attention, in value and in
//! gradient, for random anchors (overlapping, unsorted, invalid), both layer rules, GQA, and
//! chunk budgets that split the context part into many chunks.

use crate::support::drafter::{max_abs_diff, random_anchors, relative_error, seeded};
use dflash_engine::model::attention::{
    block_sparse_attention, block_sparse_attention_scheduled, dense_mask_attention,
    BlockAttentionInputs, ChunkSchedule, GroupedHeads, LayerRule, ScheduledBlocks,
};
use tch::{Device, Kind, Tensor};

/// f32 tolerance of the oracle comparison: both sides are exact reformulations; what is left
/// is summation order (chunked matmuls, the fused kernel's tiling), a few ulps of O(1) values.
const F32_TOL: f64 = 1e-5;

struct Problem {
    q: Tensor,
    context_key: Tensor,
    context_value: Tensor,
    block_key: Tensor,
    block_value: Tensor,
    anchors: Tensor,
    keep: Tensor,
    block_size: i64,
}

fn problem(batch: i64, blocks: i64, bs: i64, context: i64, kind: Kind, shuffle: bool) -> Problem {
    let _rng = dflash_engine::device::global_rng::lock();
    let (heads, kv_heads, dim) = (4, 2, 8);
    let q_len = blocks * bs;
    let leaf = |shape: &[i64], scale: f64| {
        (Tensor::randn(shape, (Kind::Float, Device::Cpu)) * scale)
            .to_kind(kind)
            .set_requires_grad(true)
    };
    let (anchors, keep) = random_anchors(batch, blocks, context, shuffle);
    Problem {
        // Scale 1.5 on q and k makes the softmax peaked, so a wrong mask shows.
        q: leaf(&[batch, q_len, heads, dim], 1.5),
        context_key: leaf(&[batch, context, kv_heads, dim], 1.5),
        context_value: leaf(&[batch, context, kv_heads, dim], 1.0),
        block_key: leaf(&[batch, q_len, kv_heads, dim], 1.5),
        block_value: leaf(&[batch, q_len, kv_heads, dim], 1.0),
        anchors,
        keep,
        block_size: bs,
    }
}

impl Problem {
    fn inputs(&self, rule: LayerRule) -> BlockAttentionInputs<'_> {
        BlockAttentionInputs {
            query: &self.q,
            context_key: &self.context_key,
            context_value: &self.context_value,
            block_key: &self.block_key,
            block_value: &self.block_value,
            anchors: &self.anchors,
            keep: &self.keep,
            block_size: self.block_size,
            rule,
            scale: 8f64.powf(-0.5),
        }
    }

    fn leaves(&self) -> [&Tensor; 5] {
        [
            &self.q,
            &self.context_key,
            &self.context_value,
            &self.block_key,
            &self.block_value,
        ]
    }

    /// Output and the gradients of `<out, probe>` w.r.t. every input.
    fn run(&self, out: &Tensor, probe: &Tensor) -> Vec<Tensor> {
        let loss = (out.to_kind(Kind::Float) * probe).sum(Kind::Float);
        Tensor::run_backward(&[loss], &self.leaves(), false, false)
    }
}

fn rules() -> [LayerRule; 3] {
    [
        LayerRule::Full,
        LayerRule::Sliding { window: 5 },
        LayerRule::Sliding { window: 2 },
    ]
}

#[test]
fn block_sparse_equals_dense_in_value_and_gradient_f32() {
    let _rng = seeded(11);
    for (shuffle, budget) in [(false, 1 << 25), (true, 300), (false, 1)] {
        for rule in rules() {
            let p = problem(2, 9, 4, 23, Kind::Float, shuffle);
            let dense = dense_mask_attention(&p.inputs(rule));
            let sparse = block_sparse_attention(&p.inputs(rule), budget);
            assert_eq!(sparse.size(), dense.size());
            assert!(
                sparse.isfinite().all().int64_value(&[]) == 1,
                "{rule:?}: non-finite output"
            );
            let diff = max_abs_diff(&sparse, &dense);
            assert!(
                diff < F32_TOL,
                "{rule:?} budget {budget}: forward differs by {diff}"
            );
            let probe = Tensor::randn(dense.size(), (Kind::Float, Device::Cpu));
            let names = [
                "query",
                "context_key",
                "context_value",
                "block_key",
                "block_value",
            ];
            for ((name, gs), gd) in names
                .iter()
                .zip(p.run(&sparse, &probe))
                .zip(p.run(&dense, &probe))
            {
                let diff = max_abs_diff(&gs, &gd);
                assert!(
                    diff < F32_TOL,
                    "{rule:?} budget {budget}: d/d{name} differs by {diff}"
                );
                assert!(gs.isfinite().all().int64_value(&[]) == 1);
            }
        }
    }
}

#[test]
fn oracle_detects_a_wrong_visibility_rule() {
    let _rng = seeded(12);
    // The comparison above must be able to fail: the block-sparse result for one rule
    // differs from the dense result for a neighbouring rule (a window one token longer).
    let p = problem(1, 6, 4, 17, Kind::Float, false);
    let sparse = block_sparse_attention(&p.inputs(LayerRule::Sliding { window: 5 }), 1 << 25);
    let dense = dense_mask_attention(&p.inputs(LayerRule::Sliding { window: 6 }));
    assert!(max_abs_diff(&sparse, &dense) > 1e-3);
}

#[test]
fn block_sparse_matches_dense_in_bf16_within_bf16_rounding() {
    let _rng = seeded(13);
    for rule in rules() {
        let p = problem(2, 8, 4, 21, Kind::BFloat16, true);
        let dense = dense_mask_attention(&p.inputs(rule));
        let sparse = block_sparse_attention(&p.inputs(rule), 200);
        assert_eq!(sparse.kind(), Kind::BFloat16);
        // bf16 keeps 8 significant bits; scores and softmax are fp32 on both sides, so what
        // differs is the rounding of the bf16 products and of the merge: well under 1%.
        let diff = relative_error(&sparse, &dense);
        eprintln!("{rule:?}: bf16 relative error, forward {diff:.5}");
        assert!(diff < 1e-2, "{rule:?}: bf16 forward relative error {diff}");
        let probe = Tensor::randn(dense.size(), (Kind::Float, Device::Cpu));
        for (gs, gd) in p
            .run(&sparse, &probe)
            .iter()
            .zip(p.run(&dense, &probe).iter())
        {
            let diff = relative_error(gs, gd);
            eprintln!("{rule:?}: bf16 relative error, gradient {diff:.5}");
            assert!(diff < 2e-2, "{rule:?}: bf16 gradient relative error {diff}");
        }
    }
}

#[test]
fn blocks_without_any_context_are_finite_and_equal_to_dense() {
    let _rng = seeded(0);
    // Every block at anchor 0 or invalid: the context part is empty for all rows.
    let p = problem(1, 3, 4, 9, Kind::Float, false);
    let anchors = Tensor::from_slice(&[0i64, 0, 5]).view([1, 3]);
    let keep = Tensor::from_slice(&[true, true, false]).view([1, 3]);
    let inputs = BlockAttentionInputs {
        anchors: &anchors,
        keep: &keep,
        ..p.inputs(LayerRule::Full)
    };
    let sparse = block_sparse_attention(&inputs, 1 << 25);
    let dense = dense_mask_attention(&inputs);
    assert!(max_abs_diff(&sparse, &dense) < F32_TOL);
    let probe = Tensor::randn(dense.size(), (Kind::Float, Device::Cpu));
    let grads = p.run(&sparse, &probe);
    // No context is visible, so the context keys and values get no gradient at all (the
    // block-sparse path never reads them: autograd reports the gradient as undefined).
    for grad in &grads[1..3] {
        assert!(!grad.defined() || grad.abs().max().double_value(&[]) == 0.0);
    }
}

#[test]
fn folded_grouped_heads_equal_dense_in_value_and_gradient_f32() {
    // `GroupedHeads::Folded` is the layout off the CPU (each kv head's query heads stacked as
    // rows of one head, the mask repeated along rows); it runs here on the CPU so that it is
    // held to the same oracle at the same tolerance. Two calls on one schedule, as two layers
    // make: the second reuses the folded masks the first built.
    let _rng = seeded(14);
    let names = [
        "query",
        "context_key",
        "context_value",
        "block_key",
        "block_value",
    ];
    for (shuffle, budget) in [(false, 1 << 25), (true, 300), (false, 1)] {
        for rule in rules() {
            let p = problem(2, 9, 4, 23, Kind::Float, shuffle);
            let blocks = ScheduledBlocks {
                rule,
                anchors: &p.anchors,
                keep: &p.keep,
                block_size: p.block_size,
                context_len: 23,
                heads: 4,
            };
            let schedule = ChunkSchedule::new(&blocks, budget, (Kind::Float, Device::Cpu))
                .with_grouped_heads(GroupedHeads::Folded);
            let dense = dense_mask_attention(&p.inputs(rule));
            let probe = Tensor::randn(dense.size(), (Kind::Float, Device::Cpu));
            let dense_grads = p.run(&dense, &probe);
            for layer in 0..2 {
                let sparse = block_sparse_attention_scheduled(&p.inputs(rule), &schedule);
                let diff = max_abs_diff(&sparse, &dense);
                assert!(
                    diff < F32_TOL,
                    "{rule:?} budget {budget} call {layer}: folded forward differs by {diff}"
                );
                for ((name, gs), gd) in names
                    .iter()
                    .zip(p.run(&sparse, &probe))
                    .zip(dense_grads.iter())
                {
                    let diff = max_abs_diff(&gs, gd);
                    assert!(
                        diff < F32_TOL,
                        "{rule:?} budget {budget} call {layer}: folded d/d{name} differs by {diff}"
                    );
                }
            }
        }
    }
}
