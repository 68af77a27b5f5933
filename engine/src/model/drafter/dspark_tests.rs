use std::collections::HashMap;

use super::*;
use crate::model::drafter::{Drafter, DrafterHead};
use tch::{nn::VarStore, Device};

const H: i64 = 6;
const V: i64 = 13;
const R: i64 = 3;

fn config(kind: MarkovHeadType, rank: i64, confidence: bool, with_markov: bool) -> DsparkConfig {
    DsparkConfig {
        markov_rank: rank,
        markov_head_type: kind,
        confidence_head: confidence,
        confidence_head_with_markov: with_markov,
    }
}

/// A head in f64 with a larger init than the real one, so every term moves the output.
fn head(cfg: &DsparkConfig, seed: i64) -> (VarStore, DsparkHead) {
    let _rng = crate::device::global_rng::seeded(seed);
    let mut vs = VarStore::new(Device::Cpu);
    let head = DsparkHead::new(&vs.root(), cfg, H, V, 0.5);
    vs.set_kind(Kind::Double);
    // Non-zero biases, so the tests see where each one enters.
    tch::no_grad(|| {
        for (name, mut var) in vs.variables() {
            if name.ends_with("bias") {
                var.copy_(&(Tensor::randn(var.size(), (Kind::Double, Device::Cpu)) * 0.3));
            }
        }
    });
    (vs, head)
}

fn vars(vs: &VarStore) -> HashMap<String, Tensor> {
    vs.variables()
}

fn randn(size: &[i64]) -> Tensor {
    let _rng = crate::device::global_rng::lock();
    Tensor::randn(size, (Kind::Double, Device::Cpu))
}

fn assert_close(a: &Tensor, b: &Tensor, what: &str) {
    assert_eq!(a.size(), b.size(), "{what}: shapes");
    let diff = (a - b).abs().max().double_value(&[]);
    let scale = b.abs().max().double_value(&[]).max(1e-12);
    assert!(
        diff <= 1e-10 * scale.max(1.0),
        "{what}: {diff} against {scale}"
    );
}

fn shapes(cfg: &DsparkConfig) -> Vec<(String, Vec<i64>)> {
    let _rng = crate::device::global_rng::lock();
    let vs = VarStore::new(Device::Cpu);
    let _head = DsparkHead::new(&vs.root(), cfg, H, V, 0.02);
    let mut list: Vec<(String, Vec<i64>)> = vs
        .variables()
        .into_iter()
        .map(|(n, t)| (n, t.size()))
        .collect();
    list.sort();
    list
}

fn named(list: &[(&str, &[i64])]) -> Vec<(String, Vec<i64>)> {
    list.iter()
        .map(|(n, s)| (n.to_string(), s.to_vec()))
        .collect()
}

#[test]
fn the_parameters_carry_specforges_names_and_shapes() {
    let markov: [(&str, &[i64]); 2] = [
        ("markov_head.markov_w1.weight", &[V, R]),
        ("markov_head.markov_w2.weight", &[V, R]),
    ];
    assert_eq!(
        shapes(&config(MarkovHeadType::Vanilla, R, false, false)),
        named(&markov)
    );
    let mut gated = markov.to_vec();
    gated.extend([
        ("markov_head.gate_proj.bias", &[R][..]),
        ("markov_head.gate_proj.weight", &[R, H + R][..]),
    ]);
    gated.sort();
    assert_eq!(
        shapes(&config(MarkovHeadType::Gated, R, false, false)),
        named(&gated)
    );
    let mut rnn = markov.to_vec();
    rnn.extend([
        ("markov_head.joint_proj.bias", &[3 * R][..]),
        ("markov_head.joint_proj.weight", &[3 * R, 2 * R + H][..]),
    ]);
    rnn.sort();
    assert_eq!(
        shapes(&config(MarkovHeadType::Rnn, R, false, false)),
        named(&rnn)
    );
    let mut with_markov = markov.to_vec();
    with_markov.extend([
        ("confidence_head.proj.bias", &[1][..]),
        ("confidence_head.proj.weight", &[1, H + R][..]),
    ]);
    with_markov.sort();
    assert_eq!(
        shapes(&config(MarkovHeadType::Vanilla, R, true, true)),
        named(&with_markov)
    );
    assert_eq!(
        shapes(&config(MarkovHeadType::Vanilla, 0, true, false)),
        named(&[
            ("confidence_head.proj.bias", &[1]),
            ("confidence_head.proj.weight", &[1, H]),
        ])
    );
}

#[test]
fn the_init_is_transformers_normal_weights_and_zero_biases() {
    let _rng = crate::device::global_rng::seeded(2);
    let vs = VarStore::new(Device::Cpu);
    let cfg = config(MarkovHeadType::Rnn, 16, true, true);
    let head = DsparkHead::new(&vs.root(), &cfg, 64, 2000, 0.02);
    let mut total = 0;
    for (name, var) in vs.variables() {
        total += var.numel() as i64;
        if name.ends_with("bias") {
            assert_eq!(var.abs().sum(Kind::Double).double_value(&[]), 0.0, "{name}");
            continue;
        }
        if var.numel() < 1000 {
            continue; // too few draws for the statistics below
        }
        let std = var.std(true).double_value(&[]);
        let mean = var.mean(Kind::Double).double_value(&[]);
        assert!((std - 0.02).abs() < 0.002, "{name}: std {std}");
        assert!(mean.abs() < 0.002, "{name}: mean {mean}");
    }
    assert_eq!(head.numel(), total);
}

#[test]
fn the_vanilla_bias_is_w2_times_the_previous_tokens_row_of_w1() {
    let (vs, head) = head(&config(MarkovHeadType::Vanilla, R, false, false), 1);
    let v = vars(&vs);
    let prev = Tensor::from_slice(&[3i64, 0, 12, 3, 7, 5]).view([2, 3]);
    let hidden = randn(&[2, 3, H]);
    let markov = head.markov().unwrap();
    let (w1, w2) = (
        &v["markov_head.markov_w1.weight"],
        &v["markov_head.markov_w2.weight"],
    );
    for (i, token) in [3i64, 0, 12, 3, 7, 5].into_iter().enumerate() {
        let expected = w2.matmul(&w1.get(token));
        let got = markov.block_bias(&prev, &hidden).view([6, V]).get(i as i64);
        assert_close(&got, &expected, "vanilla bias");
    }
}

#[test]
fn the_gated_bias_gates_the_embedding_by_the_slots_state() {
    let (vs, head) = head(&config(MarkovHeadType::Gated, R, false, false), 2);
    let v = vars(&vs);
    let prev = Tensor::from_slice(&[4i64, 9, 1, 4]).view([2, 2]);
    let hidden = randn(&[2, 2, H]);
    let bias = head.markov().unwrap().block_bias(&prev, &hidden);
    let (w1, w2) = (
        &v["markov_head.markov_w1.weight"],
        &v["markov_head.markov_w2.weight"],
    );
    let (g, gb) = (
        &v["markov_head.gate_proj.weight"],
        &v["markov_head.gate_proj.bias"],
    );
    for (n, k, token) in [(0, 0, 4i64), (0, 1, 9), (1, 0, 1), (1, 1, 4)] {
        let e = w1.get(token);
        // σ(G·[h ; e] + g) ⊙ e, the hidden state first (dspark.py:134).
        let gate =
            (g.matmul(&Tensor::cat(&[hidden.get(n).get(k), e.shallow_clone()], 0)) + gb).sigmoid();
        let expected = w2.matmul(&(gate * e));
        assert_close(&bias.get(n).get(k), &expected, "gated bias");
    }
}

/// The recurrence with rank 1 and H = 1, written out in scalars for a two-slot block.
#[test]
fn the_rnn_steps_by_hand_from_a_zero_state() {
    let _rng = crate::device::global_rng::seeded(3);
    let cfg = config(MarkovHeadType::Rnn, 1, false, false);
    let vs = VarStore::new(Device::Cpu);
    let head = DsparkHead::new(&vs.root(), &cfg, 1, 3, 0.02);
    let (w1, w2) = ([0.5, -1.0, 2.0], [1.5, -0.5, 0.25]); // [V = 3, r = 1]
                                                          // joint_proj rows γ, c, o; columns s, W₁[prev], h (dspark.py:162).
    let j = [[0.3, -0.7, 1.1], [0.9, 0.4, -0.6], [-1.2, 0.8, 0.5]];
    let jb = [0.1, -0.2, 0.05];
    tch::no_grad(|| {
        let v = vs.variables();
        let set = |name: &str, values: &[f64], shape: &[i64]| {
            let mut var = v[name].shallow_clone();
            var.copy_(&Tensor::from_slice(values).view(shape).to_kind(Kind::Float));
        };
        set("markov_head.markov_w1.weight", &w1, &[3, 1]);
        set("markov_head.markov_w2.weight", &w2, &[3, 1]);
        set("markov_head.joint_proj.weight", &j.concat(), &[3, 3]);
        set("markov_head.joint_proj.bias", &jb, &[3]);
    });
    let sigmoid = |x: f64| 1.0 / (1.0 + (-x).exp());
    let (prev, h) = ([2usize, 0], [0.6, -0.3]);
    let mut s = 0.0;
    let mut expected = Vec::new();
    for k in 0..2 {
        let e = w1[prev[k]];
        let row = |r: usize| j[r][0] * s + j[r][1] * e + j[r][2] * h[k] + jb[r];
        let (gamma, c, o) = (sigmoid(row(0)), row(1).tanh(), row(2).tanh());
        expected.extend(w2.iter().map(|w| w * o)); // the output reads the state before the update
        s = gamma * s + (1.0 - gamma) * c;
    }
    let bias = head.markov().unwrap().block_bias(
        &Tensor::from_slice(&[2i64, 0]).view([1, 2]),
        &Tensor::from_slice(&h).view([1, 2, 1]).to_kind(Kind::Float),
    );
    let got = Vec::<f64>::try_from(bias.to_kind(Kind::Double).view([-1])).unwrap();
    for (g, e) in got.iter().zip(&expected) {
        assert!((g - e).abs() < 1e-6, "{got:?} vs {expected:?}");
    }
}

#[test]
fn decoding_steps_reproduce_the_teacher_forced_blocks() {
    let _rng = crate::device::global_rng::seeded(4);
    for kind in [
        MarkovHeadType::Vanilla,
        MarkovHeadType::Gated,
        MarkovHeadType::Rnn,
    ] {
        let (_vs, head) = head(&config(kind, R, false, false), 3);
        let markov = head.markov().unwrap();
        let prev = Tensor::randint(V, [5, 4], (Kind::Int64, Device::Cpu));
        let hidden = randn(&[5, 4, H]);
        let blocks = markov.block_bias(&prev, &hidden);
        let mut state = markov.initial_state(5, &hidden);
        for k in 0..4 {
            let (bias, next) = markov.step(&prev.select(1, k), &hidden.select(1, k), &state);
            assert_close(&bias, &blocks.select(1, k), kind.as_str());
            state = next;
        }
        // Per position (chunk-friendly) for the stateless variants only.
        match markov.position_latents(&prev, &hidden) {
            Some(latents) => assert_close(&markov.project(&latents), &blocks, kind.as_str()),
            None => assert_eq!(kind, MarkovHeadType::Rnn),
        }
    }
}

#[test]
fn the_rnn_carries_its_state_within_a_block_only() {
    let _rng = crate::device::global_rng::seeded(5);
    let (_vs, head) = head(&config(MarkovHeadType::Rnn, R, false, false), 4);
    let markov = head.markov().unwrap();
    let prev = Tensor::randint(V, [2, 3], (Kind::Int64, Device::Cpu));
    let hidden = randn(&[2, 3, H]);
    let together = markov.block_bias(&prev, &hidden);
    // Block 1 alone gives the same bias: nothing leaks across blocks.
    let alone = markov.block_bias(&prev.narrow(0, 1, 1), &hidden.narrow(0, 1, 1));
    assert_close(&together.narrow(0, 1, 1), &alone, "block 1");
    // Slot 1 differs from a fresh block's first slot: the state matters.
    let fresh = markov.block_bias(&prev.narrow(1, 1, 1), &hidden.narrow(1, 1, 1));
    let diff = (together.narrow(1, 1, 1) - fresh)
        .abs()
        .max()
        .double_value(&[]);
    assert!(diff > 1e-3, "the recurrence must carry something: {diff}");
}

#[test]
fn the_confidence_logit_reads_the_hidden_state_and_optionally_the_markov_embedding() {
    let prev = Tensor::from_slice(&[5i64, 2, 11]);
    for with_markov in [false, true] {
        let (vs, head) = head(&config(MarkovHeadType::Gated, R, true, with_markov), 5);
        let v = vars(&vs);
        let hidden = randn(&[3, H]);
        let input = if with_markov {
            let e = v["markov_head.markov_w1.weight"].index_select(0, &prev);
            Tensor::cat(&[&hidden, &e], -1)
        } else {
            hidden.shallow_clone()
        };
        let expected = input
            .matmul(&v["confidence_head.proj.weight"].tr())
            .view([3])
            + &v["confidence_head.proj.bias"];
        let got = head.confidence_logit(&hidden, &prev).unwrap();
        assert_close(&got, &expected, "confidence logit");
    }
    let (_vs, none) = head(&config(MarkovHeadType::Vanilla, R, false, false), 6);
    assert!(none.confidence_logit(&randn(&[3, H]), &prev).is_none());
}

/// The variables of `vs` by name, in the order they were created (and drew from the generator).
fn creation_order(vs: &VarStore) -> Vec<String> {
    let named = vs.variables();
    vs.trainable_variables()
        .iter()
        .map(|t| {
            named
                .iter()
                .find(|(_, v)| v.data_ptr() == t.data_ptr())
                .map(|(n, _)| n.clone())
                .expect("every trainable variable is named")
        })
        .collect()
}

#[test]
fn a_dspark_drafter_has_the_dflash_drafters_backbone_and_its_heads_after_it() {
    let _rng = crate::device::global_rng::seeded(6);
    let target = crate::embedded::tiny_target_config();
    let dflash_cfg = crate::embedded::tiny_dflash_drafter_config(&target);
    let dspark = config(MarkovHeadType::Rnn, 8, true, true);
    let dspark_cfg = crate::model::drafter::DrafterConfig {
        head: DrafterHead::Dspark(dspark),
        ..dflash_cfg.clone()
    };
    let plain_vs = VarStore::new(Device::Cpu);
    let plain = Drafter::new(&plain_vs.root(), &dflash_cfg);
    let vs = VarStore::new(Device::Cpu);
    let drafter = Drafter::new(&vs.root(), &dspark_cfg);
    assert!(plain.dspark().is_none() && plain.domino().is_none());
    let head = drafter.dspark().expect("a DSpark head");
    assert_eq!(head.config(), &dspark);
    // The backbone's variables are created first and in the same order, so from one seed
    // they draw the same values as a DFlash drafter's; the heads' come after them.
    let (backbone, order) = (creation_order(&plain_vs), creation_order(&vs));
    assert_eq!(order[..backbone.len()], backbone[..]);
    let all = vs.variables();
    for name in &backbone {
        assert_eq!(
            all[name].size(),
            plain_vs.variables()[name].size(),
            "{name}"
        );
    }
    let heads = &order[backbone.len()..];
    assert!(heads
        .iter()
        .all(|n| n.starts_with("markov_head.") || n.starts_with("confidence_head.")));
    let extra: i64 = heads.iter().map(|n| all[n].numel() as i64).sum();
    assert_eq!(extra, head.numel());
    assert_eq!(
        all["markov_head.markov_w1.weight"].size(),
        [dflash_cfg.vocab_size, 8]
    );
}
