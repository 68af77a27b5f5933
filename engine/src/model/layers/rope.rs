//! Rotary position embedding in the neox ("rotate_half") form used by Qwen3 and Qwen3.5.
//!
//! `rotary_dim` may be smaller than the head dim (Qwen3.5 rotates the first 64 of 256 dims);
//! the remaining dims pass through unchanged.
use tch::{Device, Kind, Tensor};

pub struct Rotary {
    /// `[rotary_dim / 2]`, fp32: θ^(-2i/rotary_dim).
    inv_freq: Tensor,
}

impl Rotary {
    pub fn new(rotary_dim: i64, theta: f64, device: Device) -> Self {
        let exponents =
            Tensor::arange_start_step(0, rotary_dim, 2, (Kind::Float, device)) / rotary_dim as f64;
        // `1 / θ^e` in fp32 exactly as transformers computes it: exp(-e·ln θ) differs in the last
        // bits, and those bits were the whole remaining difference to HF's hidden states.
        let inv_freq = Tensor::pow_scalar(theta, &exponents).reciprocal();
        Self { inv_freq }
    }

    pub fn rotary_dim(&self) -> i64 {
        self.inv_freq.size()[0] * 2
    }

    /// `positions`: integer tensor of any shape `[...]`. Returns `(cos, sin)` of shape
    /// `[..., rotary_dim]`, fp32 (callers cast to the activation dtype).
    pub fn cos_sin(&self, positions: &Tensor) -> (Tensor, Tensor) {
        let angles = positions.to_kind(Kind::Float).unsqueeze(-1) * &self.inv_freq;
        let emb = Tensor::cat(&[&angles, &angles], -1);
        (emb.cos(), emb.sin())
    }
}

fn rotate_half(x: &Tensor) -> Tensor {
    let half = x.size().last().copied().unwrap_or(0) / 2;
    let first = x.narrow(-1, 0, half);
    let second = x.narrow(-1, half, half);
    Tensor::cat(&[&second.neg(), &first], -1)
}

/// `x`: `[B, T, heads, head_dim]`; `cos`, `sin`: `[B, T, rotary_dim]` (or broadcastable).
/// Rotates the first `rotary_dim` dims of every head.
pub fn apply_rotary(x: &Tensor, cos: &Tensor, sin: &Tensor) -> Tensor {
    let head_dim = *x.size().last().expect("apply_rotary needs a head dim");
    let rotary_dim = *cos.size().last().expect("cos needs a last dim");
    let cos = cos.unsqueeze(-2).to_kind(x.kind());
    let sin = sin.unsqueeze(-2).to_kind(x.kind());
    if rotary_dim == head_dim {
        return x * &cos + rotate_half(x) * &sin;
    }
    let rotated = x.narrow(-1, 0, rotary_dim);
    let passed = x.narrow(-1, rotary_dim, head_dim - rotary_dim);
    let rotated = &rotated * &cos + rotate_half(&rotated) * &sin;
    Tensor::cat(&[&rotated, &passed], -1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rotation_preserves_norm_and_position_zero_is_identity() {
        let _rng = crate::device::global_rng::seeded(1);
        let rope = Rotary::new(8, 10_000.0, Device::Cpu);
        let x = Tensor::randn([1, 3, 2, 8], (Kind::Float, Device::Cpu));
        let (cos, sin) = rope.cos_sin(&Tensor::from_slice(&[0i64, 5, 17]).view([1, 3]));
        let y = apply_rotary(&x, &cos, &sin);
        assert!(y
            .get(0)
            .get(0)
            .allclose(&x.get(0).get(0), 1e-6, 1e-6, false));
        let nx = x.square().sum_dim_intlist(-1, false, Kind::Float);
        let ny = y.square().sum_dim_intlist(-1, false, Kind::Float);
        assert!(nx.allclose(&ny, 1e-4, 1e-5, false));
    }

    #[test]
    fn partial_rotary_leaves_tail_dims_untouched() {
        let _rng = crate::device::global_rng::seeded(2);
        let rope = Rotary::new(4, 10_000.0, Device::Cpu);
        let x = Tensor::randn([1, 2, 1, 10], (Kind::Float, Device::Cpu));
        let (cos, sin) = rope.cos_sin(&Tensor::from_slice(&[3i64, 9]).view([1, 2]));
        let y = apply_rotary(&x, &cos, &sin);
        assert!(y.narrow(-1, 4, 6).equal(&x.narrow(-1, 4, 6)));
        assert!(!y
            .narrow(-1, 0, 4)
            .allclose(&x.narrow(-1, 0, 4), 1e-3, 1e-3, false));
    }
}
