//! Activation checkpointing (`Drafter::forward_backward` recomputing the layers before the
//! last in the backward): the gradients of every parameter and of both inputs are the plain
//! forward's, in f32 and bf16, and still the dense-mask oracle's.

use std::collections::BTreeMap;

use crate::support::drafter::{max_abs_diff, random_anchors, randomize, seeded, tiny_config};
use dflash_engine::model::drafter::{
    AttentionBackend, Drafter, DrafterConfig, DrafterInputs, LayerType,
};
use dflash_engine::train::loss::weighted_ce_backward;
use tch::{nn, Device, Kind, Tensor};

/// The oracle tests' tolerance (`drafter_model.rs`), relative to each gradient's scale.
const F32_TOL: f64 = 1e-5;

fn build(cfg: &DrafterConfig, seed: i64) -> (nn::VarStore, Drafter) {
    let _rng = seeded(seed);
    let vs = nn::VarStore::new(Device::Cpu);
    let drafter = Drafter::new(&vs.root(), cfg);
    randomize(&vs, 0.3);
    (vs, drafter)
}

struct Batch {
    features: Tensor,
    embeddings: Tensor,
    anchors: Tensor,
    keep: Tensor,
    /// The loss: weighted CE through a random head, so the chunked backward's second pass
    /// (through the detached output) runs too.
    head: Tensor,
    targets: Tensor,
    weights: Tensor,
}

fn batch(cfg: &DrafterConfig, rows: i64, blocks: i64, context: i64) -> Batch {
    let _rng = dflash_engine::device::global_rng::lock();
    let (anchors, keep) = random_anchors(rows, blocks, context, true);
    let q = blocks * cfg.block_size;
    let f = (Kind::Float, Device::Cpu);
    Batch {
        features: Tensor::randn([rows, context, cfg.feature_size()], f),
        embeddings: Tensor::randn([rows, q, cfg.hidden_size], f),
        anchors,
        keep,
        head: Tensor::randn([cfg.vocab_size, cfg.hidden_size], f),
        targets: Tensor::randint(cfg.vocab_size, [rows, q], (Kind::Int64, Device::Cpu)),
        weights: Tensor::rand([rows, q], f) * Tensor::rand([rows, q], f).gt(0.3),
    }
}

/// The output and the gradients (by name; the inputs as `target_features` and
/// `block_embeddings`) of one forward and backward of `b` in `kind`.
fn gradients(
    vs: &nn::VarStore,
    drafter: &Drafter,
    b: &Batch,
    backend: AttentionBackend,
    checkpointing: bool,
) -> (Tensor, BTreeMap<String, Tensor>) {
    let kind = drafter.dtype();
    for (_, var) in vs.variables() {
        let mut grad = var.grad();
        if grad.defined() {
            let _ = grad.zero_();
        }
    }
    // Fresh leaves per run (in f32 `to_kind` returns the batch's own tensor, whose gradient
    // would otherwise accumulate over runs).
    let leaf = |t: &Tensor| t.to_kind(kind).detach().copy().set_requires_grad(true);
    let (features, embeddings) = (leaf(&b.features), leaf(&b.embeddings));
    let head = b.head.to_kind(kind);
    let denominator = b.weights.sum(Kind::Double).double_value(&[]);
    let inputs = DrafterInputs {
        target_features: &features,
        block_embeddings: &embeddings,
        anchors: &b.anchors,
        keep: &b.keep,
    };
    let out = drafter.forward_backward(&inputs, backend, checkpointing, |out| {
        let sums = weighted_ce_backward(out, &head, &b.targets, &b.weights, denominator, 3);
        assert!(sums.counted > 3, "the loss must run in several chunks");
        out.detach().copy()
    });
    // A copy, as the next run zeroes the parameters' gradients in place; none stays none.
    let copied = |grad: Tensor| if grad.defined() { grad.copy() } else { grad };
    let mut grads: BTreeMap<String, Tensor> = vs
        .variables()
        .into_iter()
        .map(|(name, var)| (name, copied(var.grad())))
        .collect();
    grads.insert("target_features".into(), copied(features.grad()));
    grads.insert("block_embeddings".into(), copied(embeddings.grad()));
    (out, grads)
}

fn three_layers() -> DrafterConfig {
    tiny_config(vec![
        LayerType::Sliding,
        LayerType::Full,
        LayerType::Sliding,
    ])
}

/// Parameters whose gradient comes through the context: summed over the layers in another
/// order with checkpointing, so equal up to rounding; every other gradient is bit for bit.
fn through_the_context(name: &str) -> bool {
    name.starts_with("fc.") || name.starts_with("hidden_norm.") || name == "target_features"
}

/// Checkpointed against plain in `kind`: the output and every gradient bit for bit, but for
/// those through the context, within `context_tol` of their scale.
fn assert_checkpointing_changes_nothing(cfg: &DrafterConfig, b: &Batch, kind: Kind, tol: f64) {
    let (mut vs, drafter) = build(cfg, 2);
    if kind != Kind::Float {
        vs.set_kind(kind);
    }
    let (plain, plain_grads) = gradients(&vs, &drafter, b, AttentionBackend::BlockSparse, false);
    let (ckpt, ckpt_grads) = gradients(&vs, &drafter, b, AttentionBackend::BlockSparse, true);
    assert!(ckpt.equal(&plain), "{kind:?}: the output changed");
    assert_eq!(plain_grads.len(), ckpt_grads.len());
    let mut worst_context = 0.0f64;
    for (name, p) in &plain_grads {
        let c = &ckpt_grads[name];
        assert!(
            p.defined() && c.defined(),
            "{kind:?}: no gradient for {name}"
        );
        assert_eq!(c.kind(), p.kind(), "{name}");
        let scale = p.abs().max().double_value(&[]);
        assert!(scale > 0.0, "{kind:?}: {name} has a zero gradient");
        if through_the_context(name) {
            let rel = max_abs_diff(c, p) / scale;
            worst_context = worst_context.max(rel);
            assert!(
                rel <= tol,
                "{kind:?}: d/d{name} differs by {rel:e} of its scale (tolerance {tol:e})"
            );
        } else {
            assert!(
                c.equal(p),
                "{kind:?}: d/d{name} differs by {} (scale {scale}); a layer's recompute must \
                 reproduce its gradient bit for bit",
                max_abs_diff(c, p)
            );
        }
    }
    eprintln!("{kind:?}: worst relative difference through the context {worst_context:e}");
}

#[test]
fn checkpointed_f32_gradients_equal_the_plain_ones_for_every_parameter_and_input() {
    let _rng = seeded(3);
    let cfg = three_layers();
    // A few blocks in one chunk, and enough that the schedules chunk and sort the blocks.
    for (blocks, context) in [(7, 22), (400, 200)] {
        let b = batch(&cfg, 2, blocks, context);
        // Summing the same per-layer terms in another order moves an f32 sum by a few ulps
        // (2^-23 ≈ 1.2e-7 each) of its largest term.
        assert_checkpointing_changes_nothing(&cfg, &b, Kind::Float, 1e-6);
    }
}

#[test]
fn checkpointed_bf16_gradients_equal_the_plain_ones_for_every_parameter_and_input() {
    let _rng = seeded(5);
    let cfg = three_layers();
    let b = batch(&cfg, 2, 7, 22);
    // The context's gradient is a bf16 sum: another order moves it by about one bf16 ulp
    // (2^-8 ≈ 0.004) of its largest term, and `fc`'s gradient (a matmul over it) with it.
    assert_checkpointing_changes_nothing(&cfg, &b, Kind::BFloat16, 0.01);
}

#[test]
fn checkpointed_block_sparse_gradients_equal_the_dense_mask_oracle() {
    let _rng = seeded(7);
    let cfg = three_layers();
    let b = batch(&cfg, 1, 400, 200);
    let (vs, drafter) = build(&cfg, 4);
    let (sparse, sparse_grads) = gradients(&vs, &drafter, &b, AttentionBackend::BlockSparse, true);
    let (dense, dense_grads) = gradients(&vs, &drafter, &b, AttentionBackend::DenseMask, false);
    let diff = max_abs_diff(&sparse, &dense);
    assert!(diff < F32_TOL, "forward differs by {diff}");
    for (name, gd) in &dense_grads {
        assert!(sparse_grads[name].defined(), "no gradient for {name}");
        let scale = gd.abs().max().double_value(&[]).max(1.0);
        let diff = max_abs_diff(&sparse_grads[name], gd);
        assert!(
            diff < F32_TOL * scale,
            "d/d{name} differs by {diff} (scale {scale})"
        );
    }
}

#[test]
fn a_one_layer_drafter_and_a_loss_without_gradient_run_checkpointed() {
    let _rng = seeded(9);
    // One layer: nothing to recompute, the layer's input is the block embeddings.
    let cfg = tiny_config(vec![LayerType::Full]);
    let b = batch(&cfg, 1, 5, 16);
    assert_checkpointing_changes_nothing(&cfg, &b, Kind::Float, 1e-6);

    // A loss that backpropagates nothing (no weighted position): no gradient anywhere.
    let cfg = three_layers();
    let (vs, drafter) = build(&cfg, 6);
    let b = batch(&cfg, 1, 5, 16);
    let inputs = DrafterInputs {
        target_features: &b.features,
        block_embeddings: &b.embeddings,
        anchors: &b.anchors,
        keep: &b.keep,
    };
    drafter.forward_backward(&inputs, AttentionBackend::BlockSparse, true, |_| ());
    for (name, var) in vs.variables() {
        assert!(!var.grad().defined(), "{name} got a gradient from no loss");
    }
}
