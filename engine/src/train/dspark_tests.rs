use std::collections::HashMap;

use super::*;
use crate::model::drafter::{DsparkConfig, MarkovHeadType};
use crate::train::anchors::AnchorBatch;
use crate::train::labels::{next_token_block_labels, next_token_prev_ids, Rows};
use tch::nn::VarStore;

const BS: i64 = 4;
const B: i64 = 2;
const N: i64 = 2;
const S: i64 = 9;
const H: i64 = 8;
const V: i64 = 11;
const R: i64 = 3;
const GAMMA: f64 = 3.0;
const LOSS_WEIGHTS: DsparkLossWeights = DsparkLossWeights {
    ce: 0.3,
    l1: 0.7,
    confidence: 0.5,
};
/// Row 0 has a loss-mask hole at position 4 (inside its first block) and a block at 6 that
/// runs past the row's end (S = 9); row 1 is supervised throughout.
const LOSS_MASK: [u8; 18] = [
    0, 1, 1, 1, 0, 1, 1, 1, 1, //
    0, 1, 1, 1, 1, 1, 1, 1, 1,
];
const ANCHORS: [[i64; 2]; 2] = [[1, 6], [0, 3]];

fn dspark(kind: MarkovHeadType, rank: i64, confidence: bool, with_markov: bool) -> DsparkConfig {
    DsparkConfig {
        markov_rank: rank,
        markov_head_type: kind,
        confidence_head: confidence,
        confidence_head_with_markov: with_markov,
    }
}

/// Every head layout the tests run: each Markov variant, with and without a confidence head
/// reading the Markov embedding, and no Markov head at all.
fn layouts() -> Vec<DsparkConfig> {
    use MarkovHeadType::{Gated, Rnn, Vanilla};
    vec![
        dspark(Vanilla, R, false, false),
        dspark(Vanilla, R, true, true),
        dspark(Gated, R, true, false),
        dspark(Gated, R, true, true),
        dspark(Rnn, R, true, false),
        dspark(Rnn, R, true, true),
        dspark(Vanilla, 0, true, false),
        dspark(Vanilla, 0, false, false),
    ]
}

/// A tiny DSpark setup in f64: the drafter output `x·proj` (x the leaf), the LM head, the
/// target's last hidden states, and the rows the labels are built from.
struct Setup {
    vs: VarStore,
    head: DsparkHead,
    x: Tensor,
    proj: Tensor,
    lm_head: Tensor,
    last_hidden: Tensor,
    ids: Vec<i64>,
    anchors: AnchorBatch,
}

/// What the labels module builds for the setup's rows, as tensors.
struct Inputs {
    targets: Tensor,
    prev: Tensor,
    weights: Tensor,
    valid: Tensor,
    teacher: Tensor,
}

fn setup(cfg: &DsparkConfig, seed: i64, keep: bool) -> Setup {
    let _rng = crate::device::global_rng::seeded(seed);
    let mut vs = VarStore::new(Device::Cpu);
    // A larger init than the real one, so every head moves the loss visibly.
    let head = DsparkHead::new(&vs.root(), cfg, H, V, 0.5);
    vs.set_kind(Kind::Double);
    let opts = (Kind::Double, Device::Cpu);
    tch::no_grad(|| {
        for (name, mut var) in vs.variables() {
            if name.ends_with("bias") {
                var.copy_(&(Tensor::randn(var.size(), opts) * 0.3));
            }
        }
    });
    let anchors = AnchorBatch {
        batch: B as usize,
        width: N as usize,
        positions: ANCHORS.concat(),
        keep: vec![keep; (B * N) as usize],
    };
    Setup {
        vs,
        head,
        x: Tensor::randn([B, N * BS, H], opts).set_requires_grad(true),
        proj: Tensor::randn([H, H], opts),
        lm_head: Tensor::randn([V, H], opts),
        last_hidden: Tensor::randn([B, S, H], opts),
        ids: Vec::<i64>::try_from(Tensor::randint(V, [B * S], (Kind::Int64, Device::Cpu))).unwrap(),
        anchors,
    }
}

impl Setup {
    fn rows(&self) -> Rows<'_> {
        Rows {
            input_ids: &self.ids,
            loss_mask: &LOSS_MASK,
            batch: B as usize,
            seq_len: S as usize,
        }
    }

    fn inputs(&self) -> Inputs {
        let labels = next_token_block_labels(self.rows(), &self.anchors, BS as usize, Some(GAMMA));
        let prev = next_token_prev_ids(self.rows(), &self.anchors, BS as usize);
        let anchors = Tensor::from_slice(&self.anchors.positions).view([B, N]);
        let keep = Tensor::from_slice(&self.anchors.keep).view([B, N]);
        Inputs {
            targets: Tensor::from_slice(&labels.targets).view([B, N * BS]),
            prev: Tensor::from_slice(&prev).view([B, N * BS]),
            weights: Tensor::from_slice(&labels.weights)
                .view([B, N * BS])
                .to_kind(Kind::Double),
            valid: Tensor::from_slice(&labels.valid).view([B, N * BS]),
            teacher: teacher_hidden_for_slots(&self.last_hidden, &anchors, &keep, BS),
        }
    }

    fn batch<'a>(&'a self, inputs: &'a Inputs, loss_weights: DsparkLossWeights) -> DsparkBatch<'a> {
        DsparkBatch {
            head: &self.head,
            lm_head: &self.lm_head,
            targets: &inputs.targets,
            prev_tokens: &inputs.prev,
            weights: &inputs.weights,
            valid: &inputs.valid,
            teacher_hidden: &inputs.teacher,
            block_size: BS,
            loss_weights,
        }
    }

    fn out(&self) -> Tensor {
        self.x.matmul(&self.proj)
    }

    fn var(&self, name: &str) -> Option<Tensor> {
        self.vs.variables().get(name).map(Tensor::shallow_clone)
    }

    /// Every gradient the loss reaches: the drafter input's and each head parameter's.
    fn grads(&self) -> Vec<(String, Tensor)> {
        let x_grad = self.x.grad();
        let x_grad = if x_grad.defined() {
            x_grad.copy()
        } else {
            self.x.zeros_like()
        };
        let mut list = vec![("x".to_string(), x_grad)];
        let mut vars: Vec<(String, Tensor)> = self.vs.variables().into_iter().collect();
        vars.sort_by(|a, b| a.0.cmp(&b.0));
        for (name, var) in vars {
            let g = var.grad();
            list.push((
                name,
                if g.defined() {
                    g.copy()
                } else {
                    var.zeros_like()
                },
            ));
        }
        list
    }

    fn zero_grads(&self) {
        let vars = self.vs.trainable_variables();
        for t in std::iter::once(&self.x).chain(vars.iter()) {
            let mut g = t.grad();
            if g.defined() {
                let _ = g.zero_();
            }
        }
    }
}

/// Each slot of the setup written out from the rows, independently of `labels.rs`: label
/// position `a+k+1`, prefix-cumulative mask, `exp(−k/γ)` from slot 0, the previous token and
/// the teacher's position `a+k`.
struct Slot {
    target: i64,
    prev: i64,
    mask: f64,
    weight: f64,
    teacher_position: i64,
}

fn slots(s: &Setup) -> Vec<Slot> {
    let mut out = Vec::new();
    for (b, row_anchors) in ANCHORS.iter().enumerate() {
        for (j, &a) in row_anchors.iter().enumerate() {
            let a = a as usize;
            let keep = s.anchors.keep[b * N as usize + j];
            let row = |p: usize| s.ids[b * S as usize + p.min(S as usize - 1)];
            let mut alive = keep;
            for k in 0..BS as usize {
                let label = a + k + 1;
                alive = alive && label < S as usize && LOSS_MASK[b * S as usize + label] == 1;
                let mask = f64::from(u8::from(alive));
                out.push(Slot {
                    target: if keep {
                        row(label)
                    } else {
                        s.ids[b * S as usize]
                    },
                    prev: if k == 0 || keep {
                        row(a + k)
                    } else {
                        s.ids[b * S as usize]
                    },
                    mask,
                    // Rounded to f32 as the labels store it.
                    weight: mask * f64::from((-(k as f64) / GAMMA).exp() as f32),
                    teacher_position: if keep {
                        (label.min(S as usize - 1) - 1) as i64
                    } else {
                        0
                    },
                });
            }
        }
    }
    out
}

/// The Markov bias of every slot `[Q, V]`, written out from the parameters.
fn dense_bias(s: &Setup, z: &Tensor, prev: &Tensor) -> Option<Tensor> {
    let w1 = s.var("markov_head.markov_w1.weight")?;
    let w2 = s.var("markov_head.markov_w2.weight")?;
    let e = w1.index_select(0, prev);
    if let (Some(g), Some(gb)) = (
        s.var("markov_head.gate_proj.weight"),
        s.var("markov_head.gate_proj.bias"),
    ) {
        let gate = (Tensor::cat(&[z, &e], -1).matmul(&g.tr()) + gb).sigmoid();
        return Some((gate * e).matmul(&w2.tr()));
    }
    let (Some(j), Some(jb)) = (
        s.var("markov_head.joint_proj.weight"),
        s.var("markov_head.joint_proj.bias"),
    ) else {
        return Some(e.matmul(&w2.tr()));
    };
    let mut rows = Vec::new();
    for block in 0..B * N {
        let mut state = Tensor::zeros([R], (Kind::Double, Device::Cpu));
        for k in 0..BS {
            let f = block * BS + k;
            let input = Tensor::cat(&[state.shallow_clone(), e.get(f), z.get(f)], 0);
            let parts = input.matmul(&j.tr()) + &jb;
            let (gamma, c, o) = (
                parts.narrow(0, 0, R).sigmoid(),
                parts.narrow(0, R, R).tanh(),
                parts.narrow(0, 2 * R, R).tanh(),
            );
            rows.push(w2.matmul(&o));
            state = &gamma * &state + (1.0 - &gamma) * c;
        }
    }
    Some(Tensor::stack(&rows, 0))
}

/// The dense objective and its telemetry, in f64 over every slot at once.
struct Dense {
    /// `numerator / Σw`, in the graph.
    loss: Tensor,
    numerator: f64,
    weight: f64,
    correct: f64,
    counted: f64,
    tau: f64,
    base_tau: f64,
    /// The teacher-forced greedy chain: `tau_of` over 0/1 hits.
    greedy_tau: f64,
    base_greedy_tau: f64,
    confidence_abs_error: f64,
    confidence_mean: f64,
}

fn dense(s: &Setup, loss_weights: DsparkLossWeights) -> Dense {
    let slots = slots(s);
    let col =
        |f: &dyn Fn(&Slot) -> f64| Tensor::from_slice(&slots.iter().map(f).collect::<Vec<_>>());
    let (mask, w) = (col(&|x| x.mask), col(&|x| x.weight));
    let idx =
        |f: &dyn Fn(&Slot) -> i64| Tensor::from_slice(&slots.iter().map(f).collect::<Vec<_>>());
    let (target, prev) = (idx(&|x| x.target), idx(&|x| x.prev));
    let z = s.out().view([-1, H]);
    let base = z.matmul(&s.lm_head.tr());
    let logits = match dense_bias(s, &z, &prev) {
        Some(bias) => &base + bias,
        None => base.shallow_clone(),
    };
    let ce = logits.cross_entropy_loss::<Tensor>(&target, None, Reduction::None, -100, 0.0);
    let teacher_rows: Vec<Tensor> = slots
        .iter()
        .enumerate()
        .map(|(f, x)| {
            s.last_hidden
                .get(f as i64 / (N * BS))
                .get(x.teacher_position)
        })
        .collect();
    let p = Tensor::stack(&teacher_rows, 0)
        .matmul(&s.lm_head.tr())
        .softmax(-1, Kind::Double)
        .detach();
    let l1_of = |l: &Tensor| {
        (l.softmax(-1, Kind::Double) - &p)
            .abs()
            .sum_dim_intlist(-1, false, Kind::Double)
    };
    let l1 = l1_of(&logits);
    let a = (l1.detach() * -0.5 + 1.0).clamp(0.0, 1.0);
    let base_a = (l1_of(&base).detach() * -0.5 + 1.0).clamp(0.0, 1.0);
    let logit_terms = (&ce * &w).sum(Kind::Double) * loss_weights.ce
        + (&l1 * &w).sum(Kind::Double) * loss_weights.l1;
    let mut confidence_term = Tensor::zeros([], (Kind::Double, Device::Cpu));
    let (mut abs_error, mut confidence_sum) = (0.0, 0.0);
    if let (Some(pw), Some(pb)) = (
        s.var("confidence_head.proj.weight"),
        s.var("confidence_head.proj.bias"),
    ) {
        let input = if s.head.config().confidence_head_with_markov {
            let w1 = s.var("markov_head.markov_w1.weight").unwrap();
            Tensor::cat(&[z.shallow_clone(), w1.index_select(0, &prev)], -1)
        } else {
            z.shallow_clone()
        };
        let c = input.matmul(&pw.tr()).view([-1]) + pb;
        // BCE with logits written out: log(1 + e^c) − a·c.
        let bce = c.exp().log1p() - &a * &c;
        confidence_term = (&bce * &w).sum(Kind::Double) * loss_weights.confidence;
        abs_error = ((c.sigmoid() - &a).abs() * &w)
            .sum(Kind::Double)
            .double_value(&[]);
        confidence_sum = (c.sigmoid() * &mask).sum(Kind::Double).double_value(&[]);
    }
    let numerator = logit_terms + confidence_term;
    let weight = w.sum(Kind::Double).double_value(&[]);
    let counted = mask.sum(Kind::Double).double_value(&[]);
    let hits = logits
        .argmax(-1, false)
        .eq_tensor(&target)
        .to_kind(Kind::Double);
    let tau_of = |a: &Tensor| {
        let (a, m) = (
            Vec::<f64>::try_from(a).unwrap(),
            Vec::<f64>::try_from(&mask).unwrap(),
        );
        let (mut total, mut blocks) = (0.0, 0.0);
        for (ab, mb) in a.chunks(BS as usize).zip(m.chunks(BS as usize)) {
            if mb.iter().all(|m| *m == 0.0) {
                continue;
            }
            let (mut run, mut expected) = (1.0, 1.0);
            for (ak, mk) in ab.iter().zip(mb) {
                run *= ak * mk;
                expected += run;
            }
            total += expected;
            blocks += 1.0;
        }
        total / f64::max(blocks, 1.0)
    };
    Dense {
        numerator: numerator.double_value(&[]),
        loss: numerator / weight.max(1e-300),
        weight,
        correct: (&hits * &mask).sum(Kind::Double).double_value(&[]),
        counted,
        tau: tau_of(&a),
        base_tau: tau_of(&base_a),
        greedy_tau: tau_of(&hits),
        base_greedy_tau: tau_of(
            &base
                .argmax(-1, false)
                .eq_tensor(&target)
                .to_kind(Kind::Double),
        ),
        confidence_abs_error: abs_error / weight.max(1e-300),
        confidence_mean: confidence_sum / counted.max(1.0),
    }
}

fn assert_grads_close(chunked: &[(String, Tensor)], dense: &[(String, Tensor)], what: &str) {
    for ((name, a), (_, b)) in chunked.iter().zip(dense) {
        let scale = b.abs().max().double_value(&[]);
        let diff = (a - b).abs().max().double_value(&[]);
        assert!(
            diff <= 1e-9 * scale.max(1e-9),
            "{what}: {name}: {diff} against {scale}"
        );
        assert!(scale > 1e-8, "{what}: {name} must get a gradient");
    }
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-9 * b.abs().max(1.0)
}

#[test]
fn every_layouts_loss_and_gradients_are_the_dense_formulas() {
    for (i, cfg) in layouts().iter().enumerate() {
        let what = format!("{cfg:?}");
        let s = setup(cfg, 10 + i as i64, true);
        let inputs = s.inputs();
        let expected = dense(&s, LOSS_WEIGHTS);
        // Chunks of 3 positions: one block each, the leaves' path.
        let sums = dspark_backward(
            &s.out(),
            &s.batch(&inputs, LOSS_WEIGHTS),
            expected.weight,
            3,
        );
        let chunked = s.grads();
        s.zero_grads();
        expected.loss.backward();
        assert!(
            close(sums.weighted_ce, expected.numerator),
            "{what}: numerator {} vs {}",
            sums.weighted_ce,
            expected.numerator
        );
        assert!(
            close(sums.normaliser, expected.weight) && close(sums.weight, expected.weight),
            "{what}"
        );
        assert!(
            close(sums.loss(), expected.loss.double_value(&[])),
            "{what}"
        );
        assert_eq!(
            (sums.correct as f64, sums.counted as f64),
            (expected.correct, expected.counted),
            "{what}"
        );
        let m = sums.dspark_metrics();
        assert!(
            close(m.greedy_tau, expected.greedy_tau)
                && close(m.base_greedy_tau, expected.base_greedy_tau),
            "{what}: greedy tau {} vs {}",
            m.greedy_tau,
            expected.greedy_tau
        );
        assert!(
            close(m.tau_probabilistic, expected.tau),
            "{what}: tau {} vs {}",
            m.tau_probabilistic,
            expected.tau
        );
        assert!(
            close(m.base_tau_probabilistic, expected.base_tau),
            "{what}: base tau"
        );
        assert!(
            close(m.confidence_abs_error, expected.confidence_abs_error),
            "{what}"
        );
        assert!(close(m.confidence_mean, expected.confidence_mean), "{what}");
        assert!(close(m.acc, expected.correct / expected.counted), "{what}");
        if cfg.has_markov_head() {
            assert!(
                (expected.tau - expected.base_tau).abs() > 1e-6,
                "{what}: the Markov head moves τ"
            );
        } else {
            assert!(
                close(m.tau_probabilistic, m.base_tau_probabilistic),
                "{what}"
            );
        }
        assert_grads_close(&chunked, &s.grads(), &what);
    }
}

#[test]
fn the_slots_after_a_mask_hole_and_past_the_end_are_not_trained() {
    let s = setup(&dspark(MarkovHeadType::Vanilla, R, true, true), 3, true);
    let inputs = s.inputs();
    let valid = Vec::<bool>::try_from(inputs.valid.view([-1])).unwrap();
    // Row 0: the block at 1 stops before the hole at 4 (slot 2's label), the block at 6
    // before the row's end (slot 2's label is position 9); row 1 trains every slot.
    let expected: Vec<bool> = [
        [true, true, false, false],
        [true, true, false, false],
        [true; 4],
        [true; 4],
    ]
    .concat();
    assert_eq!(valid, expected);
    // Their drafter outputs get no gradient at all.
    let out = s.out().detach().set_requires_grad(true);
    let w = inputs.weights.sum(Kind::Double).double_value(&[]);
    let _ = dspark_backward(&out, &s.batch(&inputs, LOSS_WEIGHTS), w, 64);
    let out_grad = out.grad().view([-1, H]);
    for (f, v) in valid.iter().enumerate() {
        let size = out_grad
            .get(f as i64)
            .abs()
            .sum(Kind::Double)
            .double_value(&[]);
        assert_eq!(size < 1e-9, !v, "slot {f}: gradient {size}");
    }
}

#[test]
fn the_chunk_size_changes_nothing() {
    for cfg in layouts() {
        let s = setup(&cfg, 21, true);
        let inputs = s.inputs();
        let run = |chunk: i64| {
            s.zero_grads();
            let sums = dspark_backward(&s.out(), &s.batch(&inputs, LOSS_WEIGHTS), 2.0, chunk);
            (sums, s.grads())
        };
        let (one_block, grads_one) = run(1);
        let (all, grads_all) = run(1000);
        for (a, b) in one_block.to_array().iter().zip(all.to_array()) {
            assert!(close(*a, b), "{cfg:?}: {one_block:?} vs {all:?}");
        }
        assert_grads_close(&grads_one, &grads_all, &format!("{cfg:?}"));
        let evaluated = dspark_loss(&s.out(), &s.batch(&inputs, LOSS_WEIGHTS), 2);
        for (a, b) in evaluated.to_array().iter().zip(all.to_array()) {
            assert!(
                close(*a, b),
                "{cfg:?}: evaluation {evaluated:?} vs training {all:?}"
            );
        }
    }
}

#[test]
fn a_micro_batch_without_a_kept_anchor_is_zero_with_no_gradient() {
    let s = setup(&dspark(MarkovHeadType::Rnn, R, true, true), 5, false);
    let inputs = s.inputs();
    let sums = dspark_backward(&s.out(), &s.batch(&inputs, LOSS_WEIGHTS), 1.0, 4);
    assert_eq!(sums, LossSums::default());
    assert_eq!(sums.loss(), 0.0);
    for (name, g) in s.grads() {
        assert_eq!(g.abs().sum(Kind::Double).double_value(&[]), 0.0, "{name}");
    }
    assert_eq!(
        dspark_loss(&s.out(), &s.batch(&inputs, LOSS_WEIGHTS), 4),
        LossSums::default()
    );
}

/// The confidence loss alone: it trains the backbone and `W₁` (the head reads `h` and the
/// Markov embedding undetached) but not `W₂` nor the gate (its target `a` is detached).
#[test]
fn the_confidence_term_reaches_the_backbone_but_not_through_its_target() {
    let s = setup(&dspark(MarkovHeadType::Gated, R, true, true), 6, true);
    let inputs = s.inputs();
    let only = DsparkLossWeights {
        ce: 0.0,
        l1: 0.0,
        confidence: 1.0,
    };
    let _ = dspark_backward(&s.out(), &s.batch(&inputs, only), 1.0, 4);
    let reached: HashMap<String, bool> = s
        .grads()
        .into_iter()
        .map(|(n, g)| (n, g.abs().sum(Kind::Double).double_value(&[]) > 0.0))
        .collect();
    for (name, expected) in [
        ("x", true),
        ("confidence_head.proj.weight", true),
        ("confidence_head.proj.bias", true),
        ("markov_head.markov_w1.weight", true),
        ("markov_head.markov_w2.weight", false),
        ("markov_head.gate_proj.weight", false),
        ("markov_head.gate_proj.bias", false),
    ] {
        assert_eq!(reached[name], expected, "{name}");
    }
}

#[test]
fn the_teacher_state_of_slot_k_is_the_targets_at_a_plus_k() {
    // Position p's state holds p, so the gather shows the positions read.
    let last_hidden = Tensor::arange(6, (Kind::Double, Device::Cpu))
        .view([1, 6, 1])
        .expand([1, 6, 2], false)
        .contiguous();
    let anchors = Tensor::from_slice(&[1i64, 3, 0]).view([1, 3]);
    let keep = Tensor::from_slice(&[true, true, false]).view([1, 3]);
    let got = teacher_hidden_for_slots(&last_hidden, &anchors, &keep, 3);
    let positions = Vec::<f64>::try_from(got.select(2, 0).view([-1])).unwrap();
    // Block at 1: labels 2, 3, 4 → states 1, 2, 3. Block at 3: labels 4, 5, 6 (clamped to
    // 5) → 3, 4, 4. Unkept: position 0.
    assert_eq!(positions, [1.0, 2.0, 3.0, 3.0, 4.0, 4.0, 0.0, 0.0, 0.0]);
}

#[test]
fn the_loss_weights_come_from_the_training_section() {
    let section = DsparkSection::default();
    let w = DsparkLossWeights::from(&section);
    assert_eq!((w.ce, w.l1, w.confidence), (0.1, 0.9, 1.0));
}
