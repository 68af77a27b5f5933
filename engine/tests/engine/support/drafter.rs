//! Shared fixtures of the drafter tests: a tiny config, random weights, random anchors.
use dflash_engine::model::drafter::{Dflash2Config, DrafterConfig, DrafterHead, LayerType};
use tch::{nn, Device, Kind, Tensor};

/// Small but complete: GQA (4 query heads on 2 kv heads), both layer types, a window (5)
/// shorter than the contexts used, a target hidden size different from the drafter's.
pub fn tiny_config(layer_types: Vec<LayerType>) -> DrafterConfig {
    DrafterConfig {
        hidden_size: 32,
        intermediate_size: 48,
        num_hidden_layers: layer_types.len(),
        num_attention_heads: 4,
        num_key_value_heads: 2,
        head_dim: 8,
        rms_norm_eps: 1e-6,
        rope_theta: 10_000.0,
        layer_types,
        sliding_window: Some(5),
        block_size: 4,
        mask_token_id: 3,
        target_layer_ids: vec![1, 3],
        target_hidden_size: 24,
        vocab_size: 64,
        max_position_embeddings: 256,
        num_target_layers: Some(6),
        initializer_range: 0.02,
        head: Default::default(),
    }
}

/// [`tiny_config`] with DFlash2's convolution (2 taps over groups of 8 channels) and selector
/// (rank 5 over the top 6), its unary logits scaled and soft-capped.
pub fn tiny_dflash2_config(layer_types: Vec<LayerType>) -> DrafterConfig {
    DrafterConfig {
        head: DrafterHead::Dflash2(Dflash2Config {
            conv_kernel_size: 2,
            conv_group_size: 8,
            selector_rank: 5,
            selector_top_k: 6,
            output_multiplier: 0.7,
            final_logit_softcapping: Some(9.0),
        }),
        ..tiny_config(layer_types)
    }
}

/// Replaces every parameter by `N(0, scale)` (norm weights by `1 + N(0, scale)`), so that
/// attention patterns are far from uniform and norms are non-trivial. The parameters draw in
/// name order: `variables()` is a hash map, whose order changes from one process to the next,
/// so the same seed gives the same weights in every run.
pub fn randomize(vs: &nn::VarStore, scale: f64) {
    let _rng = dflash_engine::device::global_rng::lock();
    let mut variables: Vec<(String, Tensor)> = vs.variables().into_iter().collect();
    variables.sort_by(|a, b| a.0.cmp(&b.0));
    tch::no_grad(|| {
        for (name, mut var) in variables {
            let noise = Tensor::randn(var.size(), (Kind::Float, var.device())) * scale;
            let value = if name.ends_with("norm.weight") {
                noise + 1.0
            } else {
                noise
            };
            var.copy_(&value.to_kind(var.kind()));
        }
    });
}

/// `rows` rows of `blocks` anchors in `0..=context-2`, sorted like §2.2 (but the attention
/// must not rely on that: `shuffle` permutes them), with duplicates and near neighbours so
/// blocks overlap, and some invalid slots (`keep = false`, anchor 0 as §2.2 sets it, or a
/// stale non-zero anchor).
pub fn random_anchors(rows: i64, blocks: i64, context: i64, shuffle: bool) -> (Tensor, Tensor) {
    let _rng = dflash_engine::device::global_rng::lock();
    let anchors = Tensor::randint(context - 1, [rows, blocks], (Kind::Int64, Device::Cpu));
    // Force overlaps: every third anchor copies or nudges its neighbour.
    anchors.narrow(1, 1, 1).copy_(&anchors.narrow(1, 0, 1));
    if blocks > 3 {
        let near = (anchors.narrow(1, 2, 1) + 1).clamp_max(context - 2);
        anchors.narrow(1, 3, 1).copy_(&near);
    }
    let keep = Tensor::rand([rows, blocks], (Kind::Float, Device::Cpu)).gt(0.25);
    let _ = keep.narrow(1, 0, 1).fill_(1);
    let anchors = if shuffle {
        anchors
    } else {
        anchors.sort(1, false).0
    };
    // Half the invalid slots get anchor 0 as §2.2 writes them; the others keep a stale value.
    let zero_them = Tensor::rand([rows, blocks], (Kind::Float, Device::Cpu))
        .gt(0.5)
        .logical_and(&keep.logical_not());
    let anchors = anchors.masked_fill(&zero_them, 0);
    (anchors, keep)
}

/// `‖a − b‖ / ‖b‖` (Frobenius), in f64.
pub fn relative_error(a: &Tensor, b: &Tensor) -> f64 {
    let (a, b) = (a.to_kind(Kind::Double), b.to_kind(Kind::Double));
    (&a - &b).norm().double_value(&[]) / b.norm().double_value(&[]).max(f64::MIN_POSITIVE)
}

/// libtorch's generator is process-wide and tests run on parallel threads: a test holds this
/// guard (the engine's [`dflash_engine::device::global_rng::lock`], which drafter initialisation inside
/// a `Trainer` takes too) from its seed to its last random draw, so its data depend only on
/// its own seed. Hold it no longer: tests that wait on it do not run. The decoding tests draw
/// only while building their models ([`super::decode`] seeds inside its builders).
pub fn seeded(seed: i64) -> parking_lot::ReentrantMutexGuard<'static, ()> {
    single_threaded();
    dflash_engine::device::global_rng::seeded(seed)
}

/// Runs this process's libtorch ops on one thread. The models these tests use are tiny (hidden
/// sizes of 32, vocabularies of 5 to 64): an op is microseconds of work, far below where
/// intra-op threads pay, and on a loaded 2-core machine the OpenMP threads only wait on each
/// other, so one thread makes these tests several times faster
/// (docs/development.md#where-the-suites-time-goes). The arithmetic is the same; only its
/// grouping may differ, which the tests' tolerances are for.
pub fn single_threaded() {
    tch::set_num_threads(1);
}

pub fn max_abs_diff(a: &Tensor, b: &Tensor) -> f64 {
    (a.to_kind(Kind::Double) - b.to_kind(Kind::Double))
        .abs()
        .max()
        .double_value(&[])
}
