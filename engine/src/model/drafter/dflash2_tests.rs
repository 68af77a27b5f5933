use super::*;
use crate::model::drafter::{Drafter, DrafterConfig, DrafterHead};
use tch::{nn::VarStore, Device, Kind};

const H: i64 = 8;
const V: i64 = 11;

fn config(taps: i64, group: i64) -> Dflash2Config {
    Dflash2Config {
        conv_kernel_size: taps,
        conv_group_size: group,
        selector_rank: 3,
        selector_top_k: 4,
        output_multiplier: 0.5,
        final_logit_softcapping: Some(2.0),
    }
}

fn randn(size: &[i64]) -> Tensor {
    let _rng = crate::device::global_rng::lock();
    Tensor::randn(size, (Kind::Double, Device::Cpu))
}

fn at(t: &Tensor, index: &[i64]) -> f64 {
    t.double_value(index)
}

fn assert_close(a: &Tensor, b: &Tensor, what: &str) {
    assert_eq!(a.size(), b.size(), "{what}: shapes");
    let diff = (a - b).abs().max().double_value(&[]);
    assert!(diff <= 1e-10, "{what}: differs by {diff}");
}

/// A convolution in f64 with every parameter drawn, so the base kernel is not the identity and
/// the dynamic branch is live.
fn random_conv(cfg: &Dflash2Config, block_size: i64, seed: i64) -> (VarStore, GroupedConv) {
    let _rng = crate::device::global_rng::seeded(seed);
    let mut vs = VarStore::new(Device::Cpu);
    let conv = GroupedConv::new(&vs.root(), cfg, H, block_size);
    vs.set_kind(Kind::Double);
    tch::no_grad(|| {
        for (_, mut var) in vs.variables() {
            var.copy_(&(randn(&var.size()) * 0.5));
        }
    });
    (vs, conv)
}

#[test]
fn the_convolution_is_the_written_out_sum_inside_each_block() {
    // 3 taps over groups of 4 channels (2 groups), blocks of 4, two rows of three blocks.
    let cfg = config(3, 4);
    let (bs, taps, group) = (4, 3, 4);
    let (_vs, conv) = random_conv(&cfg, bs, 1);
    let x = randn(&[2, 3 * bs, H]);
    let y = randn(&[2, 3 * bs, H]);
    let (input_side, kernel) = conv.prepare(&x);
    let output_side = conv.finish(&y, &kernel);
    let base = &conv.base_kernel;
    // Δ = x·Wᵀ, viewed as [side, tap, group] per position.
    let delta = x.matmul(&conv.kernel_projection.tr());
    for (side, input, out) in [(0, &x, &input_side), (1, &y, &output_side)] {
        for row in 0..2 {
            for t in 0..3 * bs {
                let slot = t % bs;
                for c in 0..H {
                    let mut want = 0.0;
                    for tap in 0..taps.min(slot + 1) {
                        let d = at(&delta, &[row, t, side * taps * 2 + tap * 2 + c / group]);
                        let coefficient = at(base, &[side, tap, c]) + d;
                        want += coefficient * at(input, &[row, t - tap, c]);
                    }
                    let got = at(out, &[row, t, c]);
                    assert!(
                        (got - want).abs() < 1e-10,
                        "side {side}, row {row}, position {t}, channel {c}: {got} against {want}"
                    );
                }
            }
        }
    }
}

#[test]
fn a_fresh_convolution_is_the_identity() {
    let _rng = crate::device::global_rng::seeded(1);
    let cfg = config(2, 4);
    let vs = VarStore::new(Device::Cpu);
    let conv = GroupedConv::new(&vs.root(), &cfg, H, 4);
    let x = Tensor::randn([1, 8, H], (Kind::Float, Device::Cpu));
    let (input_side, kernel) = conv.prepare(&x);
    assert!(input_side.equal(&x));
    assert!(conv.finish(&x, &kernel).equal(&x));
}

#[test]
fn the_selector_score_is_the_unary_score_plus_the_written_out_transition() {
    let _rng = crate::device::global_rng::seeded(2);
    let cfg = config(2, 4);
    let mut vs = VarStore::new(Device::Cpu);
    let selector = CandidateSelector::new(&vs.root(), &cfg, H, V, 0.5);
    vs.set_kind(Kind::Double);
    tch::no_grad(|| {
        for (_, mut var) in vs.variables() {
            var.copy_(&randn(&var.size()));
        }
    });
    let positions = 5;
    let hidden = randn(&[positions, H]);
    let logits = randn(&[positions, V]) * 3.0;
    let unary = selector.unary(&logits);
    let (unary_top, candidates) = selector.candidates(&unary);
    let previous = Tensor::from_slice(&[0i64, 3, 10, 3, 7]);
    let scores = selector.score(&candidates, &unary_top, &hidden, &previous);
    let projected = hidden.matmul(&selector.hidden_projection.tr());
    for p in 0..positions {
        let prev = previous.int64_value(&[p]);
        for k in 0..4 {
            let c = candidates.int64_value(&[p, k]);
            // U = s·tanh(0.5·logit / s) with s = 2.
            let u = 2.0 * (0.5 * at(&logits, &[p, c]) / 2.0).tanh();
            assert!((at(&unary_top, &[p, k]) - u).abs() < 1e-6);
            let transition: f64 = (0..3)
                .map(|r| {
                    at(&selector.predecessor_codebook, &[prev, r])
                        * at(&projected, &[p, r])
                        * at(&selector.successor_codebook, &[c, r])
                })
                .sum();
            let want = at(&unary_top, &[p, k]) + transition;
            assert!(
                (at(&scores, &[p, k]) - want).abs() < 1e-5,
                "position {p}, candidate {k}"
            );
        }
        // The candidates are the unary top-K, best first.
        let sorted = unary.get(p).sort(0, true).0;
        assert_close(
            &unary_top.get(p).to_kind(Kind::Double),
            &sorted.narrow(0, 0, 4).to_kind(Kind::Double),
            "top-K",
        );
    }
}

#[test]
fn a_fresh_selector_ranks_as_the_unary_scores_and_walks_greedily_from_the_anchor() {
    let _rng = crate::device::global_rng::seeded(3);
    let cfg = config(2, 4);
    let vs = VarStore::new(Device::Cpu);
    let selector = CandidateSelector::new(&vs.root(), &cfg, H, V, 0.5);
    let hidden = Tensor::randn([2, 3, H], (Kind::Float, Device::Cpu));
    let unary = selector.unary(&Tensor::randn([2, 3, V], (Kind::Float, Device::Cpu)));
    let (unary_top, candidates) = selector.candidates(&unary);
    let previous = Tensor::from_slice(&[1i64, 2]);
    // B = 0: no transition, the scores are the unary ones.
    let scores = selector.score(
        &candidates.select(1, 0),
        &unary_top.select(1, 0),
        &hidden.select(1, 0),
        &previous,
    );
    assert!(scores.equal(&unary_top.select(1, 0)));
    // With a live B the walk is the slot-by-slot argmax given the previous pick.
    tch::no_grad(|| {
        let mut b = selector.successor_codebook.shallow_clone();
        b.copy_(&(Tensor::randn([V, 3], (Kind::Float, Device::Cpu)) * 4.0));
    });
    let path = selector.greedy_path(&candidates, &unary_top, &hidden, &previous);
    for row in 0..2 {
        let mut prev = previous.int64_value(&[row]);
        for slot in 0..3 {
            let s = selector.score(
                &candidates.get(row).get(slot).unsqueeze(0),
                &unary_top.get(row).get(slot).unsqueeze(0),
                &hidden.get(row).get(slot).unsqueeze(0),
                &Tensor::from_slice(&[prev]),
            );
            let best = s.argmax(-1, false).int64_value(&[0]);
            prev = candidates.int64_value(&[row, slot, best]);
            assert_eq!(
                path.int64_value(&[row, slot]),
                prev,
                "row {row} slot {slot}"
            );
        }
    }
}

fn tiny_drafter(head: DrafterHead) -> DrafterConfig {
    DrafterConfig {
        hidden_size: H,
        intermediate_size: 12,
        num_hidden_layers: 2,
        num_attention_heads: 2,
        num_key_value_heads: 1,
        head_dim: 4,
        rms_norm_eps: 1e-6,
        rope_theta: 10_000.0,
        layer_types: vec![super::super::LayerType::Full; 2],
        sliding_window: None,
        block_size: 4,
        mask_token_id: 1,
        target_layer_ids: vec![0],
        target_hidden_size: H,
        vocab_size: V,
        max_position_embeddings: 64,
        num_target_layers: Some(2),
        initializer_range: 0.02,
        head,
    }
}

#[test]
fn the_parameters_carry_specforges_names_and_shapes_and_a_fresh_drafter_is_dflashs() {
    let cfg = config(2, 4);
    let dflash2 = tiny_drafter(DrafterHead::Dflash2(cfg));
    let _rng = crate::device::global_rng::seeded(4);
    let vs2 = VarStore::new(Device::Cpu);
    let drafter2 = Drafter::new(&vs2.root(), &dflash2);
    let _rng = crate::device::global_rng::seeded(4);
    let vs1 = VarStore::new(Device::Cpu);
    let drafter1 = Drafter::new(&vs1.root(), &tiny_drafter(DrafterHead::Dflash));
    let (one, two) = (vs1.variables(), vs2.variables());
    let mut added: Vec<(String, Vec<i64>)> = two
        .iter()
        .filter(|(name, _)| !one.contains_key(*name))
        .map(|(n, t)| (n.clone(), t.size()))
        .collect();
    added.sort();
    // 2·taps·G = 2·2·(8/4) = 8 rows of the kernel projection.
    let mut want = vec![
        (
            "candidate_selector.hidden_projection.weight".into(),
            vec![3, H],
        ),
        ("candidate_selector.predecessor_codebook".into(), vec![V, 3]),
        ("candidate_selector.successor_codebook".into(), vec![V, 3]),
    ];
    for layer in 0..2 {
        for conv in ["attention_conv", "mlp_conv"] {
            want.push((format!("layers.{layer}.{conv}.base_kernel"), vec![2, 2, H]));
            want.push((
                format!("layers.{layer}.{conv}.kernel_projection.weight"),
                vec![8, H],
            ));
        }
    }
    want.sort();
    assert_eq!(added, want);
    // The backbone draws the same weights, and with the identity convolutions computes the
    // same output.
    for (name, t) in &one {
        assert!(t.equal(&two[name]), "{name}");
    }
    let features = Tensor::randn([1, 10, H], (Kind::Float, Device::Cpu));
    let embeddings = Tensor::randn([1, 8, H], (Kind::Float, Device::Cpu));
    let anchors = Tensor::from_slice(&[3i64, 6]).view([1, 2]);
    let keep = Tensor::ones([1, 2], (Kind::Bool, Device::Cpu));
    let backend = super::super::AttentionBackend::DenseMask;
    let out1 = drafter1.forward(&features, &embeddings, &anchors, &keep, backend);
    let out2 = drafter2.forward(&features, &embeddings, &anchors, &keep, backend);
    assert!(out1.equal(&out2));
}
