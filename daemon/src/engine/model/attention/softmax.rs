//! Masked attention that also returns a differentiable log-sum-exp, so that two attentions
//! over disjoint key sets can be merged exactly.
use tch::{Device, Kind, Tensor};

/// Score of a hidden key. Finite on purpose: a row whose keys are all hidden (a block at
/// anchor 0 has no context) then gets a uniform softmax and an LSE near this value instead of
/// NaN; its merge weight `exp(lse - lse_total)` underflows to exactly 0, so neither its output
/// nor its gradient reaches anything. `-inf` would give `exp(-inf - -inf) = NaN`.
pub(crate) const HIDDEN_SCORE: f64 = -1.0e30;

/// `q` `[..., Tq, D]`, `k`/`v` `[..., Tk, D]` (broadcastable batch dims), `visible` bool
/// broadcastable to `[..., Tq, Tk]`. Returns `(out [..., Tq, D]` in `q`'s dtype,
/// `lse [..., Tq]` fp32`)`. Scores, softmax and LSE are fp32 whatever the activation dtype.
///
/// Memory matters here (this runs on every chunk of every layer): besides its inputs,
/// autograd keeps only the fp32 probabilities and the (head-broadcast) mask, and the only
/// score-sized temporaries are the scores and the probabilities themselves.
pub(crate) fn attention_with_lse(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    visible: &Tensor,
    scale: f64,
) -> (Tensor, Tensor) {
    // Scaling q (small) instead of the scores (large) saves a score-sized temporary.
    let mut scores = (q * scale)
        .matmul(&k.transpose(-2, -1))
        .to_kind(Kind::Float);
    // In place is safe: the matmul saves its inputs, not its output.
    let _ = scores.masked_fill_(&visible.logical_not(), HIDDEN_SCORE);
    let probs = scores.softmax(-1, Kind::Float);
    // lse = max_j s_j - log(max_j p_j), exact since p_j = exp(s_j - lse); avoids the
    // score-sized temporaries of `logsumexp`. p_max >= 1/Tk, so the log is well conditioned.
    let lse_value = tch::no_grad(|| scores.amax([-1], false) - probs.amax([-1], false).log());
    // d lse / d scores = probs. Writing lse as `Σ_j probs_j.detach() · s_j` plus a constant
    // gives exactly that gradient while autograd saves only `probs` (already kept by the
    // softmax and the PV matmul); the batched dot avoids a score-sized product.
    let linear = probs
        .detach()
        .unsqueeze(-2)
        .matmul(&scores.unsqueeze(-1))
        .squeeze_dim(-1)
        .squeeze_dim(-1);
    let lse = &linear + (lse_value - linear.detach());
    let out = probs.to_kind(q.kind()).matmul(v);
    (out, lse)
}

/// Same contract as [`attention_with_lse`] for `q` `[B, H, Tq, D]`, `k`/`v` `[B, H, Tk, D]`,
/// `visible` `[B, 1, Tq, Tk]`, but through libtorch's fused `scaled_dot_product_attention`,
/// which never keeps the `[Tq, Tk]` probabilities for backward (it recomputes them). Rows with
/// no visible key get `lse = HIDDEN_SCORE` (merge weight exactly 0) and a finite output.
///
/// SDPA does not return a differentiable LSE, so it is assembled from its value and its
/// gradient separately:
/// - value: `logsumexp` of the masked scores, computed without autograd (a transient
///   score-sized tensor, nothing kept);
/// - gradient: `∂lse_q/∂s_qj = p_qj`, so `∂lse_q/∂q_q = scale·Σ_j p_qj k_j` and
///   `∂lse_q/∂k_j = scale·p_qj q_q`. Both are the gradients of `scale·q_q·k̄_q` where
///   `k̄ = SDPA(q.detach(), k.detach(), values = k)`: an attention whose weights are held
///   fixed and whose values are the live keys.
pub(crate) fn fused_attention_with_lse(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    visible: &Tensor,
    scale: f64,
) -> (Tensor, Tensor) {
    // [B, 1, Tq]. Empty rows get key 0 unmasked so that the kernel never sees an all-hidden
    // row (NaN); their output is then finite garbage with weight exactly 0.
    let has_key = visible.any_dim(-1, false);
    let first_key = Tensor::zeros([visible.size()[3]], (Kind::Bool, visible.device()));
    let _ = first_key.narrow(0, 0, 1).fill_(1);
    let rescue = has_key.logical_not().unsqueeze(-1).logical_and(&first_key);
    let visible = visible.logical_or(&rescue);
    // One additive mask shared by both kernel calls (a bool mask would be converted, and
    // kept, once per call).
    let bias = Tensor::zeros(visible.size(), (q.kind(), q.device()))
        .masked_fill(&visible.logical_not(), f64::NEG_INFINITY);
    let (out, lse_value) = if q.device() == Device::Cpu {
        // The CPU flash kernel returns the log-sum-exp with the output: no second pass over
        // the scores and no score-sized fp32 temporary.
        let (out, lse) = Tensor::internal_scaled_dot_product_flash_attention_for_cpu(
            q,
            k,
            v,
            0.0,
            false,
            Some(&bias),
            scale,
        );
        (out, lse.detach())
    } else {
        let lse = tch::no_grad(|| {
            let mut scores = (q * scale)
                .matmul(&k.transpose(-2, -1))
                .to_kind(Kind::Float);
            let _ = scores.masked_fill_(&visible.logical_not(), f64::NEG_INFINITY);
            scores.logsumexp([-1], false)
        });
        (
            Tensor::scaled_dot_product_attention(q, k, v, Some(&bias), 0.0, false, scale, false),
            lse,
        )
    };
    let key_mean = Tensor::scaled_dot_product_attention(
        &q.detach(),
        &k.detach(),
        k,
        Some(&bias),
        0.0,
        false,
        scale,
        false,
    );
    let linear = (q.to_kind(Kind::Float) * key_mean.to_kind(Kind::Float)).sum_dim_intlist(
        -1,
        false,
        Kind::Float,
    ) * scale;
    let lse = &linear + (lse_value - linear.detach());
    let hidden = Tensor::full_like(&lse, HIDDEN_SCORE);
    (out, lse.where_self(&has_key, &hidden))
}

/// Exact merge of two attentions of the same queries over disjoint key sets:
/// `softmax` over the union equals the LSE-weighted mix of the parts.
/// `out_*` `[..., D]` (activation dtype), `lse_*` `[...]` fp32. Returns the activation dtype.
pub(crate) fn merge_by_lse(
    out_a: &Tensor,
    lse_a: &Tensor,
    out_b: &Tensor,
    lse_b: &Tensor,
) -> Tensor {
    let total = lse_a.logaddexp(lse_b);
    let weight_a = (lse_a - &total).exp().unsqueeze(-1);
    let weight_b = (lse_b - &total).exp().unsqueeze(-1);
    let merged = out_a.to_kind(Kind::Float) * weight_a + out_b.to_kind(Kind::Float) * weight_b;
    merged.to_kind(out_a.kind())
}

#[cfg(test)]
mod tests {
    use super::*;
    use tch::Device;

    #[test]
    fn split_keys_merged_by_lse_equal_one_softmax_in_value_and_gradient() {
        tch::manual_seed(3);
        let opts = (Kind::Float, Device::Cpu);
        let q = Tensor::randn([2, 5, 8], opts).set_requires_grad(true);
        let k = Tensor::randn([2, 9, 8], opts).set_requires_grad(true);
        let v = Tensor::randn([2, 9, 8], opts).set_requires_grad(true);
        let visible = Tensor::rand([2, 5, 9], opts).gt(0.3);
        // Row 0 of batch 0 sees nothing in the first part.
        let _ = visible.get(0).get(0).narrow(0, 0, 4).fill_(0);
        let _ = visible.narrow(-1, 4, 5).fill_(1);
        let (whole, _) = attention_with_lse(&q, &k, &v, &visible, 0.3);
        let (a, la) = attention_with_lse(
            &q,
            &k.narrow(1, 0, 4),
            &v.narrow(1, 0, 4),
            &visible.narrow(-1, 0, 4),
            0.3,
        );
        let (b, lb) = attention_with_lse(
            &q,
            &k.narrow(1, 4, 5),
            &v.narrow(1, 4, 5),
            &visible.narrow(-1, 4, 5),
            0.3,
        );
        let merged = merge_by_lse(&a, &la, &b, &lb);
        assert!(merged.allclose(&whole, 1e-5, 1e-6, false));
        let probe = Tensor::randn([2, 5, 8], opts);
        let grads = |out: &Tensor| {
            Tensor::run_backward(
                &[(out * &probe).sum(Kind::Float)],
                &[&q, &k, &v],
                false,
                false,
            )
        };
        for (x, y) in grads(&merged).iter().zip(grads(&whole).iter()) {
            assert!(
                x.allclose(y, 1e-5, 1e-6, false),
                "gradient differs: {}",
                (x - y).abs().max()
            );
        }
    }

    #[test]
    fn fused_kernel_gives_the_same_output_lse_and_gradients_as_the_explicit_one() {
        tch::manual_seed(4);
        let opts = (Kind::Float, Device::Cpu);
        let q = (Tensor::randn([2, 3, 6, 8], opts) * 1.5).set_requires_grad(true);
        let k = (Tensor::randn([2, 3, 7, 8], opts) * 1.5).set_requires_grad(true);
        let v = Tensor::randn([2, 3, 7, 8], opts).set_requires_grad(true);
        let visible = Tensor::rand([2, 1, 6, 7], opts).gt(0.4);
        let _ = visible.get(1).get(0).get(2).fill_(0); // one row without any visible key
        let rows = visible.any_dim(-1, false).expand([2, 3, 6], false); // rows that see something
        let (out_f, lse_f) = fused_attention_with_lse(&q, &k, &v, &visible, 0.35);
        let (out_e, lse_e) = attention_with_lse(&q, &k, &v, &visible, 0.35);
        assert_eq!(lse_f.double_value(&[1, 0, 2]) as f32, HIDDEN_SCORE as f32);
        assert!(out_f.isfinite().all().int64_value(&[]) == 1);
        let live = rows.unsqueeze(-1).to_kind(Kind::Float);
        assert!((&out_f * &live).allclose(&(&out_e * &live), 1e-5, 1e-6, false));
        assert!(lse_f.masked_select(&rows).allclose(
            &lse_e.masked_select(&rows),
            1e-5,
            1e-6,
            false
        ));
        // Gradients of a loss that uses both outputs, restricted to rows that see something
        // (the others have merge weight 0 and are not compared).
        let probe_out = Tensor::randn([2, 3, 6, 8], opts) * &live;
        let probe_lse = Tensor::randn([2, 3, 6], opts) * rows.to_kind(Kind::Float);
        let grads = |out: &Tensor, lse: &Tensor| {
            let loss = (out * &probe_out).sum(Kind::Float) + (lse * &probe_lse).sum(Kind::Float);
            Tensor::run_backward(&[loss], &[&q, &k, &v], false, false)
        };
        for (a, b) in grads(&out_f, &lse_f)
            .iter()
            .zip(grads(&out_e, &lse_e).iter())
        {
            assert!(
                a.allclose(b, 1e-4, 1e-5, false),
                "gradient differs by {}",
                (a - b).abs().max()
            );
        }
    }
}
