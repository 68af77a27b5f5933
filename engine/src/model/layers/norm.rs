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
    if recorded(x) || recorded(weight) {
        lean_normalized_fp32(x, eps).to_kind(dtype) * weight
    } else {
        normalized_fp32(x, eps).to_kind(dtype) * weight
    }
}

/// Whether autograd records the ops on `t` here (grad mode on and `t` requiring a gradient):
/// a view made under `no_grad` does not require one.
fn recorded(t: &Tensor) -> bool {
    t.requires_grad() && t.alias().requires_grad()
}

/// [`normalized_fp32`] with the same value, bit for bit, whose graph keeps `x` itself (2 bytes
/// an element in bf16) where the written-out formula keeps its fp32 copy (4 bytes): autograd
/// saves the inputs of a product, so each product that needs `x` for a gradient takes the
/// detached `x` (the same storage) as its other factor.
///
/// - `mean(x32 · x)` is `mean(x32²)` (bf16 squares are exact in fp32), but its gradient with
///   respect to `x32` is half the true one (`x` is detached): `2v − v.detach()` is `v` exactly
///   and doubles it back, on the `[rows, 1]` statistics only.
/// - `x̂ = x32 · r.detach() + x · (r − r.detach())` is `x32 · r` (the second term is `x · 0`),
///   with the gradient through `x32` from the first product (which keeps `r`) and the one
///   through `r` from the second (which keeps `x`).
///
/// Both gradients reach `x32` in fp32 and are cast to the input dtype once, as before; they
/// are the same sums written differently, so the gradient agrees up to rounding.
fn lean_normalized_fp32(x: &Tensor, eps: f64) -> Tensor {
    let x32 = x.to_kind(Kind::Float);
    let x_saved = x.detach();
    let half = (&x32 * &x_saved).mean_dim(-1, true, Kind::Float);
    let mean_sq = &half * 2.0 - half.detach();
    let rstd = (mean_sq + eps).rsqrt();
    let rstd_fixed = rstd.detach();
    &x32 * &rstd_fixed + x_saved * (&rstd - &rstd_fixed)
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
        let _rng = crate::device::global_rng::seeded(1);
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
    fn lean_bf16_norm_equals_the_written_out_one_bitwise_forward_and_closely_backward() {
        let _rng = crate::device::global_rng::seeded(0);
        let opts = (Kind::Float, tch::Device::Cpu);
        // A wide row (the real hidden size's reduction length) and a narrow one (head_dim).
        for shape in [[3i64, 7, 5120], [2, 9, 128]] {
            let width = shape[2];
            let x = (Tensor::randn(shape, opts) * 3.0)
                .to_kind(Kind::BFloat16)
                .set_requires_grad(true);
            let w = (Tensor::randn([width], opts) * 0.1 + 1.0)
                .to_kind(Kind::BFloat16)
                .set_requires_grad(true);
            let probe = Tensor::randn(shape, opts).to_kind(Kind::BFloat16);
            let written = |x: &Tensor| normalized_fp32(x, 1e-6).to_kind(Kind::BFloat16) * &w;
            let lean = rms_norm(&x, &w, 1e-6);
            let reference = written(&x);
            assert!(
                lean.equal(&reference),
                "{shape:?}: forward differs in {} elements",
                lean.ne_tensor(&reference).sum(Kind::Int64).int64_value(&[])
            );
            let grads = |y: &Tensor| {
                Tensor::run_backward(&[(y * &probe).sum(Kind::Float)], &[&x, &w], false, false)
            };
            // The fp64 gradient of the same function: both bf16 gradients are within bf16
            // rounding of it, and of each other.
            let x64 = x.to_kind(Kind::Double).detach().set_requires_grad(true);
            let w64 = w.to_kind(Kind::Double).detach().set_requires_grad(true);
            let y64 = &x64 * (x64.square().mean_dim(-1, true, Kind::Double) + 1e-6).rsqrt() * &w64;
            let exact = Tensor::run_backward(
                &[(&y64 * probe.to_kind(Kind::Double)).sum(Kind::Double)],
                &[&x64, &w64],
                false,
                false,
            );
            let rel = |a: &Tensor, b: &Tensor| {
                let d = (a.to_kind(Kind::Double) - b.to_kind(Kind::Double))
                    .abs()
                    .max();
                d.double_value(&[]) / b.abs().max().double_value(&[])
            };
            for ((l, r), e) in grads(&lean).iter().zip(&grads(&reference)).zip(&exact) {
                let (lean_err, written_err) = (rel(l, e), rel(r, e));
                // One bf16 rounding of the result is 2^-9 ≈ 0.002 relative; the weight's
                // gradient sums bf16 products over rows.
                assert!(
                    lean_err < 0.01,
                    "{shape:?}: lean gradient off by {lean_err}"
                );
                assert!(rel(l, r) < 0.01, "{shape:?}: lean vs written {}", rel(l, r));
                assert!(
                    lean_err <= 2.0 * written_err + 4e-3,
                    "{lean_err} vs {written_err}"
                );
            }
        }
    }

    #[test]
    fn zero_centered_with_zero_weight_equals_plain_with_unit_weight() {
        let _rng = crate::device::global_rng::seeded(2);
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
