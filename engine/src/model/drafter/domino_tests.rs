use super::*;
use tch::{nn::VarStore, Device};

fn head(hidden: i64, gru: i64, emb: i64, vocab: i64, prefix: i64) -> (VarStore, DominoHead) {
    let _rng = crate::device::global_rng::lock();
    let vs = VarStore::new(Device::Cpu);
    let cfg = DominoConfig {
        emb_dim: emb,
        gru_hidden_dim: gru,
        pure_draft_prefix_len: prefix,
    };
    let head = DominoHead::new(&vs.root(), &cfg, hidden, vocab, 0.02);
    (vs, head)
}

fn sigmoid(x: f64) -> f64 {
    1.0 / (1.0 + (-x).exp())
}

#[test]
fn the_parameters_carry_specforges_names_and_shapes() {
    let (vs, _) = head(8, 6, 4, 11, 1);
    let mut vars: Vec<(String, Vec<i64>)> = vs
        .variables()
        .into_iter()
        .map(|(n, t)| (n, t.size()))
        .collect();
    vars.sort();
    assert_eq!(
        vars,
        [
            ("embed_proj.0.weight".to_string(), vec![4, 8 + 6]),
            ("embed_proj.2.weight".to_string(), vec![11, 4]),
            ("prefix_gru.weight_hh_l0".to_string(), vec![18, 6]),
            ("prefix_gru.weight_ih_l0".to_string(), vec![18, 8]),
        ]
    );
}

/// One step by hand: H = 2, G = 1, gate rows r, z, n.
#[test]
fn one_gru_step_is_pytorchs_equations_by_hand() {
    let (_vs, head) = head(2, 1, 3, 5, 0);
    let w_ih = [0.5, -1.0, 0.25, 0.75, -0.5, 2.0]; // rows r, z, n of [3, 2]
    let w_hh = [1.5, -0.25, 0.5]; // rows r, z, n of [3, 1]
    tch::no_grad(|| {
        let mut ih = head.weight_ih.shallow_clone();
        ih.copy_(&Tensor::from_slice(&w_ih).view([3, 2]).to_kind(Kind::Float));
        let mut hh = head.weight_hh.shallow_clone();
        hh.copy_(&Tensor::from_slice(&w_hh).view([3, 1]).to_kind(Kind::Float));
    });
    let (x, h) = ([0.3, -0.7], 0.4);
    let r = sigmoid(w_ih[0] * x[0] + w_ih[1] * x[1] + w_hh[0] * h);
    let z = sigmoid(w_ih[2] * x[0] + w_ih[3] * x[1] + w_hh[1] * h);
    let n = (w_ih[4] * x[0] + w_ih[5] * x[1] + r * (w_hh[2] * h)).tanh();
    let expected = (1.0 - z) * n + z * h;
    let got = head
        .gru_step(
            &Tensor::from_slice(&x).view([1, 2]).to_kind(Kind::Float),
            &Tensor::from_slice(&[h]).view([1, 1]).to_kind(Kind::Float),
        )
        .double_value(&[0, 0]);
    assert!((got - expected).abs() < 1e-6, "{got} vs {expected}");
}

#[test]
fn the_sequence_equals_libtorchs_bias_free_gru() {
    let _rng = crate::device::global_rng::seeded(3);
    let (mut vs, head) = head(8, 6, 4, 11, 0);
    vs.set_kind(Kind::Double);
    let inputs = Tensor::randn([5, 7, 8], (Kind::Double, Device::Cpu));
    let ours = head.gru(&inputs);
    let h0 = Tensor::zeros([1, 5, 6], (Kind::Double, Device::Cpu));
    // libtorch's own GRU kernel, what `torch.nn.GRU(bias=False, batch_first=True)` runs.
    let (reference, last) = inputs.gru(
        &h0,
        &[&head.weight_ih, &head.weight_hh],
        false,
        1,
        0.0,
        false,
        false,
        true,
    );
    assert_eq!(ours.size(), [5, 7, 6]);
    let diff = (&ours - &reference).abs().max().double_value(&[]);
    assert!(diff < 1e-12, "max difference {diff}");
    assert!(ours
        .select(1, 6)
        .allclose(&last.squeeze_dim(0), 1e-12, 1e-12, false));
}

#[test]
fn each_slot_reads_the_state_after_the_tokens_before_it() {
    let _rng = crate::device::global_rng::seeded(5);
    let (mut vs, head) = head(8, 6, 4, 11, 1);
    vs.set_kind(Kind::Double);
    let bs = 4;
    let embeddings = Tensor::randn([2, 3 * bs, 8], (Kind::Double, Device::Cpu));
    let states = head.slot_states(&embeddings, bs);
    assert_eq!(states.size(), [2, 3 * bs, 6]);
    // Block 1 of row 1, by hand: slot 0 reads nothing, slot k the GRU after tokens 0..k-1.
    let block = embeddings.get(1).narrow(0, bs, bs);
    let mut h = Tensor::zeros([1, 6], (Kind::Double, Device::Cpu));
    for k in 0..bs {
        let got = states.get(1).get(bs + k);
        assert!(
            got.allclose(&h.squeeze_dim(0), 1e-12, 1e-12, false),
            "slot {k}"
        );
        h = head.gru_step(&block.narrow(0, k, 1), &h);
    }
    // The block's last token is never read.
    let changed = embeddings.copy();
    let _ = changed.get(0).get(bs - 1).fill_(7.0);
    assert!(head
        .slot_states(&changed, bs)
        .allclose(&states, 0.0, 0.0, false));
}

#[test]
fn the_prefix_slots_keep_the_base_logits_and_the_rest_are_corrected() {
    let _rng = crate::device::global_rng::seeded(9);
    let (mut vs, head) = head(8, 6, 4, 11, 1);
    vs.set_kind(Kind::Double);
    let bs = 4;
    let z = Tensor::randn([1, 2 * bs, 8], (Kind::Double, Device::Cpu));
    let states = head.slot_states(
        &Tensor::randn([1, 2 * bs, 8], (Kind::Double, Device::Cpu)),
        bs,
    );
    let lm_head = Tensor::randn([11, 8], (Kind::Double, Device::Cpu));
    let logits = head.dense_logits(&z, &states, &lm_head, bs);
    let base = z.matmul(&lm_head.tr()).to_kind(Kind::Float);
    for q in 0..2 * bs {
        let (k, got, base) = (q % bs, logits.get(0).get(q), base.get(0).get(q));
        let correction = head
            .correction(&z.get(0).get(q), &states.get(0).get(q))
            .to_kind(Kind::Float);
        if k < 2 {
            assert!(got.equal(&base), "slot {k} keeps the base logits");
            assert!(!head.corrects_slot(k));
        } else {
            assert!(
                got.allclose(&(&base + correction), 1e-6, 1e-6, false),
                "slot {k}"
            );
            assert!(head.corrects_slot(k));
        }
    }
}

/// PyTorch's own modules (`engine/tests/drafter_fixtures/make_domino.py`: `nn.GRU(bias=False)`
/// and `nn.Sequential(Linear, SiLU, Linear)`, SpecForge's declaration): their `state_dict()`
/// loads into the head by name, and the head computes what they computed.
#[test]
fn pytorchs_gru_and_embed_proj_load_by_their_state_dict_names_and_agree() {
    let dir =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/drafter_fixtures/domino");
    let read = |file: &str| -> std::collections::HashMap<String, Tensor> {
        Tensor::read_safetensors(dir.join(file))
            .unwrap()
            .into_iter()
            .collect()
    };
    let (weights, io) = (read("head.safetensors"), read("io.safetensors"));
    let (vs, head) = head(8, 6, 5, 11, 0);
    let vars = vs.variables();
    assert_eq!(vars.len(), weights.len());
    tch::no_grad(|| {
        for (name, var) in &vars {
            let source = weights
                .get(name)
                .unwrap_or_else(|| panic!("{name} is not in PyTorch's state_dict"));
            assert_eq!(source.size(), var.size(), "{name}");
            var.shallow_clone().copy_(source);
        }
    });
    let states = tch::no_grad(|| head.gru(&io["inputs"]));
    let diff = (&states - &io["states"]).abs().max().double_value(&[]);
    assert!(diff < 1e-6, "GRU states differ by {diff}");
    let correction = tch::no_grad(|| head.correction(&io["z"], &io["states"]));
    let diff = (&correction - &io["correction"])
        .abs()
        .max()
        .double_value(&[]);
    assert!(diff < 1e-6, "embed_proj differs by {diff}");
}
