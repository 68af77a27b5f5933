//! Causal grouped-query attention core shared by the Qwen3.5 gated attention and Qwen3 attention.
use tch::{Kind, Tensor};

use crate::model::layers::Rotary;

/// `q`: `[B,T,Hq,D]`, `k`, `v`: `[B,T,Hkv,D]` with `Hq % Hkv == 0`; query head h reads kv head
/// `h / (Hq/Hkv)` (HF `repeat_kv`). Returns `[B,T,Hq,D]`. Softmax statistics in fp32 whatever the
/// activation dtype (SDPA's kernels do this for half precision).
pub fn causal_gqa_attention(q: &Tensor, k: &Tensor, v: &Tensor, scale: f64) -> Tensor {
    let (q, k, v) = (q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2));
    Tensor::scaled_dot_product_attention(&q, &k, &v, None::<Tensor>, 0.0, true, scale, true)
        .transpose(1, 2)
}

/// As [`causal_gqa_attention`] for `T` queries over `S ≥ T` keys (a cache, then the queries' own),
/// with `visible` `[T,S]` bool (`true` = attend) saying which keys each query sees.
pub fn masked_gqa_attention(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    visible: &Tensor,
    scale: f64,
) -> Tensor {
    let (q, k, v) = (q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2));
    Tensor::scaled_dot_product_attention(&q, &k, &v, Some(visible), 0.0, false, scale, true)
        .transpose(1, 2)
}

/// `[T, past + T]` bool: new token `i` (at position `past + i`) sees keys `0..=past + i`.
pub fn causal_offset_mask(past: i64, new: i64, device: tch::Device) -> Tensor {
    let query = Tensor::arange_start(past, past + new, (Kind::Int64, device)).unsqueeze(-1);
    let key = Tensor::arange(past + new, (Kind::Int64, device)).unsqueeze(0);
    key.le_tensor(&query)
}

/// cos/sin `[T, rotary_dim]` for positions `0..T` (a prefill from the sequence start).
pub fn prefill_cos_sin(rotary: &Rotary, seq: i64, device: tch::Device) -> (Tensor, Tensor) {
    rotary.cos_sin(&Tensor::arange(seq, (Kind::Int64, device)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use tch::Device;

    /// Loop reference: softmax over j ≤ i of q_i·k_j·scale, kv head shared by consecutive q heads.
    fn reference(q: &Tensor, k: &Tensor, v: &Tensor, scale: f64) -> Tensor {
        let (hq, hkv, t) = (q.size()[2], k.size()[2], q.size()[1]);
        let mut rows = Vec::new();
        for h in 0..hq {
            let kv_head = h / (hq / hkv);
            let qh = q.select(2, h);
            let kh = k.select(2, kv_head);
            let vh = v.select(2, kv_head);
            let scores = qh.matmul(&kh.transpose(-1, -2)) * scale;
            let mask = Tensor::ones([t, t], (Kind::Bool, Device::Cpu)).triu(1);
            let probs = scores
                .masked_fill(&mask, f64::NEG_INFINITY)
                .softmax(-1, Kind::Float);
            rows.push(probs.matmul(&vh));
        }
        Tensor::stack(&rows, 2)
    }

    #[test]
    fn masked_attention_with_the_offset_mask_equals_the_causal_rows_it_continues() {
        let _rng = crate::device::global_rng::seeded(6);
        let opts = (Kind::Float, Device::Cpu);
        let q = Tensor::randn([1, 9, 4, 8], opts);
        let k = Tensor::randn([1, 9, 2, 8], opts);
        let v = Tensor::randn([1, 9, 2, 8], opts);
        let whole = causal_gqa_attention(&q, &k, &v, 0.35);
        let mask = causal_offset_mask(6, 3, Device::Cpu);
        let tail = masked_gqa_attention(&q.narrow(1, 6, 3), &k, &v, &mask, 0.35);
        assert!(tail.allclose(&whole.narrow(1, 6, 3), 1e-5, 1e-6, false));
    }

    #[test]
    fn sdpa_gqa_matches_loop_reference() {
        let _rng = crate::device::global_rng::seeded(5);
        let opts = (Kind::Float, Device::Cpu);
        let q = Tensor::randn([2, 7, 6, 8], opts);
        let k = Tensor::randn([2, 7, 2, 8], opts);
        let v = Tensor::randn([2, 7, 2, 8], opts);
        let got = causal_gqa_attention(&q, &k, &v, 0.3);
        let want = reference(&q, &k, &v, 0.3);
        assert!(got.allclose(&want, 1e-5, 1e-5, false));
    }
}
