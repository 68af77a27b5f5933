//! The gated delta rule of Gated DeltaNet, in chunked form (prefill) and plain recurrent form
//! (test oracle, and the shape of a single-token decode step).
//!
//! Per value head, with state `S ∈ R^{Dk×Dv}` (fp32):
//! `S ← S·exp(g_t)`; `δ = β_t (v_t − Sᵀk_t)`; `S ← S + k_t δᵀ`; `o_t = Sᵀq_t`,
//! where q, k are L2-normalised (eps 1e-6) and q is scaled by `Dk^-0.5` (HF
//! `use_qk_l2norm_in_kernel=True`). Key heads are shared by `Hv/Hk` consecutive value heads.
use tch::{Kind, Tensor};

pub const CHUNK_SIZE: i64 = 64;

/// Inputs: `q`, `k` `[B,T,Hk,Dk]`; `v` `[B,T,Hv,Dv]`; `g` (log decay ≤ 0), `beta` `[B,T,Hv]`.
/// Output `[B,T,Hv,Dv]` in `q`'s dtype and the final state `[B,Hv,Dk,Dv]` (fp32).
pub struct DeltaRuleInputs<'a> {
    pub q: &'a Tensor,
    pub k: &'a Tensor,
    pub v: &'a Tensor,
    pub g: &'a Tensor,
    pub beta: &'a Tensor,
}

/// q, k, v, g, beta as `[B,H,T,·]` fp32 with key heads expanded and q/k normalised.
struct Prepared {
    q: Tensor,
    k: Tensor,
    v: Tensor,
    g: Tensor,
    beta: Tensor,
}

fn prepare(x: &DeltaRuleInputs<'_>) -> Prepared {
    let num_k_heads = x.k.size()[2];
    let num_v_heads = x.v.size()[2];
    let expand = |t: &Tensor| {
        if num_v_heads == num_k_heads {
            t.shallow_clone()
        } else {
            t.repeat_interleave_self_int(num_v_heads / num_k_heads, 2, None)
        }
    };
    let heads_first = |t: Tensor| t.transpose(1, 2).to_kind(Kind::Float).contiguous();
    let q = l2_normalize(&heads_first(expand(x.q)));
    let k = l2_normalize(&heads_first(expand(x.k)));
    let head_dim = q.size()[3];
    Prepared {
        q: q * (head_dim as f64).powf(-0.5),
        k,
        v: heads_first(x.v.shallow_clone()),
        g: heads_first(x.g.shallow_clone()),
        beta: heads_first(x.beta.shallow_clone()),
    }
}

fn dims4(t: &Tensor) -> (i64, i64, i64, i64) {
    let s = t.size();
    (s[0], s[1], s[2], s[3])
}

/// `x / sqrt(Σx² + 1e-6)` over the last dim (the FLA / HF convention, eps inside the root).
fn l2_normalize(x: &Tensor) -> Tensor {
    x * (x.square().sum_dim_intlist(-1, true, Kind::Float) + 1e-6).rsqrt()
}

/// Chunked gated delta rule (WY/UT form): within a chunk of `C` tokens, the `C` sequential rank-1
/// updates are condensed into one unit-lower-triangular solve, so the sequential loop runs over
/// `T/C` chunks instead of `T` tokens. Same result as [`recurrent_gated_delta_rule`] up to rounding.
pub fn chunk_gated_delta_rule(
    x: &DeltaRuleInputs<'_>,
    chunk: i64,
    initial_state: Option<&Tensor>,
) -> (Tensor, Tensor) {
    let out_kind = x.q.kind();
    let Prepared { q, k, v, g, beta } = prepare(x);
    let (batch, heads, seq, dk) = dims4(&q);
    let dv = v.size()[3];
    let pad = (chunk - seq % chunk) % chunk;
    let padded = seq + pad;
    let num_chunks = padded / chunk;
    // Zero padding at the end: padded tokens come after every real one, so they cannot change
    // any real output (causality); their rows are dropped below.
    let pad_seq = |t: &Tensor| t.constant_pad_nd([0, 0, 0, pad]);
    let (q, k, v) = (pad_seq(&q), pad_seq(&k), pad_seq(&v));
    let (g, beta) = (g.constant_pad_nd([0, pad]), beta.constant_pad_nd([0, pad]));

    let chunked = |t: &Tensor, d: i64| t.reshape([batch, heads, num_chunks, chunk, d]);
    let k_beta = chunked(&(&k * beta.unsqueeze(-1)), dk);
    let v_beta = chunked(&(&v * beta.unsqueeze(-1)), dv);
    let q = chunked(&q, dk);
    let k = chunked(&k, dk);
    // c_i = Σ_{j≤i} g_j inside each chunk (log of the decay from chunk start to i)
    let c = g
        .reshape([batch, heads, num_chunks, chunk])
        .cumsum(-1, Kind::Float);
    let strictly_upper = Tensor::ones([chunk, chunk], (Kind::Bool, q.device())).triu(1);
    // D_ij = exp(c_i - c_j) for j ≤ i, 0 above the diagonal
    let pair_decay = (c.unsqueeze(-1) - c.unsqueeze(-2))
        .masked_fill(&strictly_upper, f64::NEG_INFINITY)
        .exp();
    let k_t = k.transpose(-1, -2);
    let ut_system = k_beta.matmul(&k_t) * &pair_decay;
    let intra = q.matmul(&k_t) * &pair_decay;
    let c_exp = c.exp().unsqueeze(-1);
    // (I + strictly_lower(A))⁻¹ applied to vβ and to kβ·exp(c)
    let new_values = ut_system.linalg_solve_triangular(&v_beta, false, true, true);
    let decayed_keys = ut_system.linalg_solve_triangular(&(&k_beta * &c_exp), false, true, true);

    let c_last = c.narrow(-1, chunk - 1, 1);
    let q_decayed = &q * &c_exp;
    let k_to_end = &k * (&c_last - &c).exp().unsqueeze(-1);
    let chunk_decay = c_last.exp().unsqueeze(-1);

    let mut state = match initial_state {
        Some(s) => s.to_kind(Kind::Float),
        None => Tensor::zeros([batch, heads, dk, dv], (Kind::Float, q.device())),
    };
    let mut outputs = Vec::with_capacity(num_chunks as usize);
    for i in 0..num_chunks {
        let at = |t: &Tensor| t.select(2, i);
        let corrected = at(&new_values) - at(&decayed_keys).matmul(&state);
        outputs.push(at(&q_decayed).matmul(&state) + at(&intra).matmul(&corrected));
        state = &state * at(&chunk_decay) + at(&k_to_end).transpose(-1, -2).matmul(&corrected);
    }
    let out = Tensor::cat(&outputs, 2).narrow(2, 0, seq);
    (out.transpose(1, 2).contiguous().to_kind(out_kind), state)
}

/// Token-by-token gated delta rule: the definition, used as the oracle for the chunked form.
pub fn recurrent_gated_delta_rule(
    x: &DeltaRuleInputs<'_>,
    initial_state: Option<&Tensor>,
) -> (Tensor, Tensor) {
    let out_kind = x.q.kind();
    let Prepared { q, k, v, g, beta } = prepare(x);
    let (batch, heads, seq, dk) = dims4(&q);
    let dv = v.size()[3];
    let mut state = match initial_state {
        Some(s) => s.to_kind(Kind::Float),
        None => Tensor::zeros([batch, heads, dk, dv], (Kind::Float, q.device())),
    };
    let mut outputs = Vec::with_capacity(seq as usize);
    for t in 0..seq {
        let (q_t, k_t, v_t) = (q.select(2, t), k.select(2, t), v.select(2, t));
        state = &state * g.select(2, t).exp().unsqueeze(-1).unsqueeze(-1);
        let predicted = k_t.unsqueeze(-2).matmul(&state).squeeze_dim(-2);
        let delta = (v_t - predicted) * beta.select(2, t).unsqueeze(-1);
        state = &state + k_t.unsqueeze(-1) * delta.unsqueeze(-2);
        outputs.push(q_t.unsqueeze(-2).matmul(&state).squeeze_dim(-2));
    }
    let out = Tensor::stack(&outputs, 2);
    (out.transpose(1, 2).contiguous().to_kind(out_kind), state)
}

#[cfg(test)]
mod tests {
    use super::*;
    use tch::Device;

    fn random_inputs(
        seq: i64,
        hk: i64,
        hv: i64,
        d: i64,
    ) -> (Tensor, Tensor, Tensor, Tensor, Tensor) {
        let _rng = crate::device::global_rng::lock();
        let opts = (Kind::Float, Device::Cpu);
        let q = Tensor::randn([2, seq, hk, d], opts);
        let k = Tensor::randn([2, seq, hk, d], opts);
        let v = Tensor::randn([2, seq, hv, d + 3], opts);
        // decays spanning near-1 to strong, as A_log ∈ log(U(0.01,16)) with softplus gives
        let g = -(Tensor::rand([2, seq, hv], opts) * 3.0).exp() * 0.3;
        let beta = Tensor::rand([2, seq, hv], opts);
        (q, k, v, g, beta)
    }

    #[test]
    fn chunked_equals_recurrent_across_chunk_boundaries_and_padding() {
        let _rng = crate::device::global_rng::seeded(11);
        for (seq, chunk) in [(100, 64), (64, 64), (37, 16), (5, 64)] {
            let (q, k, v, g, beta) = random_inputs(seq, 2, 4, 8);
            let x = DeltaRuleInputs {
                q: &q,
                k: &k,
                v: &v,
                g: &g,
                beta: &beta,
            };
            let (o_chunk, s_chunk) = chunk_gated_delta_rule(&x, chunk, None);
            let (o_rec, s_rec) = recurrent_gated_delta_rule(&x, None);
            assert_eq!(o_chunk.size(), vec![2, seq, 4, 11]);
            let diff = (&o_chunk - &o_rec).abs().max().double_value(&[]);
            let sdiff = (&s_chunk - &s_rec).abs().max().double_value(&[]);
            assert!(
                diff < 1e-5 && sdiff < 1e-5,
                "seq {seq} chunk {chunk}: out {diff} state {sdiff}"
            );
        }
    }

    #[test]
    fn initial_state_carries_over_exactly_like_one_long_sequence() {
        let _rng = crate::device::global_rng::seeded(12);
        let (q, k, v, g, beta) = random_inputs(90, 1, 2, 8);
        let whole = DeltaRuleInputs {
            q: &q,
            k: &k,
            v: &v,
            g: &g,
            beta: &beta,
        };
        let (o_all, _) = chunk_gated_delta_rule(&whole, 16, None);
        let part = |t: &Tensor, s: i64, l: i64| t.narrow(1, s, l);
        let (q1, k1, v1, g1, b1) = (
            part(&q, 0, 40),
            part(&k, 0, 40),
            part(&v, 0, 40),
            part(&g, 0, 40),
            part(&beta, 0, 40),
        );
        let (q2, k2, v2, g2, b2) = (
            part(&q, 40, 50),
            part(&k, 40, 50),
            part(&v, 40, 50),
            part(&g, 40, 50),
            part(&beta, 40, 50),
        );
        let (_, s1) = chunk_gated_delta_rule(
            &DeltaRuleInputs {
                q: &q1,
                k: &k1,
                v: &v1,
                g: &g1,
                beta: &b1,
            },
            16,
            None,
        );
        let second = DeltaRuleInputs {
            q: &q2,
            k: &k2,
            v: &v2,
            g: &g2,
            beta: &b2,
        };
        let (o2, _) = recurrent_gated_delta_rule(&second, Some(&s1));
        let diff = (o_all.narrow(1, 40, 50) - o2).abs().max().double_value(&[]);
        assert!(diff < 1e-5, "{diff}");
    }

    #[test]
    fn grouped_key_heads_serve_consecutive_value_heads() {
        let _rng = crate::device::global_rng::seeded(13);
        let (q, k, v, g, beta) = random_inputs(10, 2, 4, 4);
        let (o, _) = recurrent_gated_delta_rule(
            &DeltaRuleInputs {
                q: &q,
                k: &k,
                v: &v,
                g: &g,
                beta: &beta,
            },
            None,
        );
        // value head 1 must use key head 0 (heads 0,1 ← key 0; 2,3 ← key 1)
        let pick = |t: &Tensor, h: i64| t.narrow(2, h, 1);
        let (q0, k0, v1, g1, b1) = (
            pick(&q, 0),
            pick(&k, 0),
            pick(&v, 1),
            pick(&g, 1),
            pick(&beta, 1),
        );
        let single = DeltaRuleInputs {
            q: &q0,
            k: &k0,
            v: &v1,
            g: &g1,
            beta: &b1,
        };
        let (o1, _) = recurrent_gated_delta_rule(&single, None);
        assert!(pick(&o, 1).allclose(&o1, 1e-6, 1e-6, false));
    }
}
