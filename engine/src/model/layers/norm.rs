//! RMSNorm variants. All compute the normalisation in fp32 and return the input dtype, as the
//! reference implementations do; bf16 statistics drift visibly over 64 layers.
use tch::{Kind, Tensor};

fn normalized_fp32(x: &Tensor, eps: f64) -> Tensor {
    let x32 = x.to_kind(Kind::Float);
    let mean_sq = x32.square().mean_dim(-1, true, Kind::Float);
    x32 * (mean_sq + eps).rsqrt()
}

/// Qwen3 RMSNorm: `w * x̂` (the drafter's norms; weights initialised to 1).
pub fn rms_norm(x: &Tensor, weight: &Tensor, eps: f64) -> Tensor {
    let dtype = x.kind();
    if dtype == Kind::Float && weight.kind() == Kind::Float {
        // In fp32 there is no cast to order: libtorch's fused kernel computes the same
        // `x · rsqrt(mean(x²) + eps) · w` in one pass forward and one backward, instead of
        // five elementwise kernels each way (the small drafter's steps are bound by them).
        let last = *x.size().last().expect("rms_norm needs a last dimension");
        return x.rms_norm([last], Some(weight), eps);
    }
    // Qwen3 casts x̂ back before the multiply; keep that order for bit-level parity in bf16.
    normalized_fp32(x, eps).to_kind(dtype) * weight
}

/// Qwen3.5 zero-centred RMSNorm: `x̂ * (1 + w)` in fp32 (weights initialised to 0).
pub fn rms_norm_zero_centered(x: &Tensor, weight: &Tensor, eps: f64) -> Tensor {
    let dtype = x.kind();
    (normalized_fp32(x, eps) * (weight.to_kind(Kind::Float) + 1.0)).to_kind(dtype)
}

/// Qwen3.5 gated RMSNorm of the Gated DeltaNet output: `w * x̂ * silu(z)`.
pub fn rms_norm_gated(x: &Tensor, gate: &Tensor, weight: &Tensor, eps: f64) -> Tensor {
    let dtype = x.kind();
    // transformers' `Qwen3_5RMSNormGated` casts x̂ back and multiplies by `w` in the input dtype,
    // then applies the fp32 gate; in bf16 this order is what makes the GDN output bit-identical.
    let normed = (weight * normalized_fp32(x, eps).to_kind(dtype)).to_kind(Kind::Float);
    (normed * gate.to_kind(Kind::Float).silu()).to_kind(dtype)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rms_norm_has_unit_rms_with_unit_weight() {
        let x = Tensor::from_slice(&[3.0f32, 4.0, 0.0, 0.0]).view([1, 4]);
        let y = rms_norm(&x, &Tensor::ones([4], (Kind::Float, tch::Device::Cpu)), 0.0);
        let rms = y.square().mean(Kind::Float).sqrt().double_value(&[]);
        assert!((rms - 1.0).abs() < 1e-6, "rms {rms}");
    }

    #[test]
    fn fused_fp32_path_equals_the_written_out_formula_in_value_and_gradients() {
        let x = Tensor::randn([3, 5, 16], (Kind::Float, tch::Device::Cpu)).set_requires_grad(true);
        let w = Tensor::randn([16], (Kind::Float, tch::Device::Cpu)).set_requires_grad(true);
        let probe = Tensor::randn([3, 5, 16], (Kind::Float, tch::Device::Cpu));
        let grads = |y: Tensor| {
            let g =
                Tensor::run_backward(&[(&y * &probe).sum(Kind::Float)], &[&x, &w], false, false);
            (y, g)
        };
        let (fused, fused_grads) = grads(rms_norm(&x, &w, 1e-6));
        let (written, written_grads) = grads(normalized_fp32(&x, 1e-6) * &w);
        let diff = |a: &Tensor, b: &Tensor| (a - b).abs().max().double_value(&[]);
        assert!(diff(&fused, &written) < 1e-6);
        for (a, b) in fused_grads.iter().zip(&written_grads) {
            assert!(diff(a, b) < 1e-5, "gradient differs by {}", diff(a, b));
        }
    }

    #[test]
    fn zero_centered_with_zero_weight_equals_plain_with_unit_weight() {
        let x = Tensor::randn([2, 8], (Kind::Float, tch::Device::Cpu));
        let a = rms_norm_zero_centered(
            &x,
            &Tensor::zeros([8], (Kind::Float, tch::Device::Cpu)),
            1e-6,
        );
        let b = rms_norm(
            &x,
            &Tensor::ones([8], (Kind::Float, tch::Device::Cpu)),
            1e-6,
        );
        assert!(a.allclose(&b, 1e-6, 1e-6, false));
    }
}
