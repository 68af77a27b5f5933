//! AdamW on fp32 master weights with global-norm gradient clipping (spec §2.8).
//!
//! With fp32 parameters (the CPU default) the master *is* the parameter. With bf16 parameters
//! (GPU) an fp32 master copy takes the update and is copied back into the bf16 parameter, so
//! small updates are not lost to bf16 rounding. The update follows `torch.optim.AdamW`
//! (decoupled weight decay, bias-corrected moments, `eps` added after the bias-corrected sqrt).
//!
//! Why not libtorch's fused multi-tensor kernel (`_fused_adamw_`): it is not the same
//! arithmetic. `scripts/fused_adamw_check.py` runs both on fp32 masters through 200 steps of
//! weight decay, a warmup + cosine lr and clipping (torch 2.11, CPU): the first moments agree
//! to the bit, but the second moments differ (3.4e-7 relative after 200 steps) and the
//! weights differ from step 1 on (1.6e-7 relative to the largest weight, up to 13,376 ulp on
//! the smallest ones). A run's weights would no longer be today's, so today's update stays.
//! tch 0.24 does not expose the kernel either; using it would take a C++ shim like
//! `csrc/cuda_stream.cpp`.
use std::collections::HashMap;

use serde::{Deserialize, Serialize};
use tch::{Kind, Tensor};

#[derive(Debug, thiserror::Error)]
pub enum OptimError {
    #[error("gradient norm is not finite ({norm}); the optimizer step was skipped and the weights are unchanged")]
    NonFiniteGradients { norm: f64 },
    #[error("optimizer state is missing tensor `{0}`")]
    MissingState(String),
    #[error("optimizer state tensor `{name}` has shape {found:?}, expected {expected:?}")]
    ShapeMismatch {
        name: String,
        expected: Vec<i64>,
        found: Vec<i64>,
    },
    #[error("optimizer state holds `{0}`, which is not a parameter of this drafter")]
    UnknownState(String),
    /// Weights replace an initialisation only before the first step: after it the moments
    /// belong to the weights they were accumulated on.
    #[error("the optimizer has taken {step} step(s): initial weights apply before the first")]
    NotFresh { step: u64 },
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AdamWConfig {
    pub beta1: f64,
    pub beta2: f64,
    pub eps: f64,
    pub weight_decay: f64,
    /// Global L2 norm the gradients are clipped to; `None` disables clipping.
    pub max_grad_norm: Option<f64>,
}

impl Default for AdamWConfig {
    fn default() -> Self {
        Self {
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            weight_decay: 0.0,
            max_grad_norm: Some(1.0),
        }
    }
}

struct Slot {
    name: String,
    param: Tensor,
    /// `None` when `param` is already fp32 (it is its own master).
    master: Option<Tensor>,
    exp_avg: Tensor,
    exp_avg_sq: Tensor,
}

impl Slot {
    fn master(&self) -> &Tensor {
        self.master.as_ref().unwrap_or(&self.param)
    }
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StepReport {
    /// Global gradient norm before clipping.
    pub grad_norm: f64,
    /// Factor the gradients were scaled by (1.0 when not clipped).
    pub clip_coef: f64,
}

/// Global L2 norm (fp32) over the defined tensors of `grads`; 0 when none is defined.
fn global_norm(grads: &[Tensor]) -> f64 {
    tch::no_grad(|| {
        let norms: Vec<Tensor> = grads
            .iter()
            .filter(|g| g.defined())
            .map(|g| g.to_kind(Kind::Float).norm())
            .collect();
        if norms.is_empty() {
            return 0.0;
        }
        Tensor::stack(&norms, 0).norm().double_value(&[])
    })
}

/// Drops gradients the way `torch.optim.Optimizer.zero_grad()` does by default (`set_to_none`),
/// so they hold no memory between steps and the next backward writes them afresh instead of
/// adding into zeros. tch 0.24 has no `grad = None`; libtorch's own optimizer does exactly
/// this in its `zero_grad`, so one holds the parameters for that call alone and never steps.
struct GradReleaser(tch::COptimizer);

impl GradReleaser {
    fn new<'a>(params: impl IntoIterator<Item = &'a Tensor>) -> Option<Self> {
        let mut holder = tch::COptimizer::sgd(0.0, 0.0, 0.0, 0.0, false).ok()?;
        for p in params {
            holder.add_parameters(p, 0).ok()?;
        }
        Some(Self(holder))
    }

    fn release(&self) -> bool {
        self.0.zero_grad().is_ok()
    }
}

pub struct AdamW {
    cfg: AdamWConfig,
    slots: Vec<Slot>,
    step: u64,
    /// `None` only if libtorch refused to build the holder; gradients are then zeroed in place.
    grad_releaser: Option<GradReleaser>,
}

pub const EXP_AVG_PREFIX: &str = "exp_avg.";
pub const EXP_AVG_SQ_PREFIX: &str = "exp_avg_sq.";

impl AdamW {
    /// `params`: the trainable tensors by name. Order is normalised (sorted by name) so the
    /// update and the state layout do not depend on hash-map order.
    pub fn new(mut params: Vec<(String, Tensor)>, cfg: AdamWConfig) -> Self {
        params.sort_by(|a, b| a.0.cmp(&b.0));
        let slots = tch::no_grad(|| {
            params
                .into_iter()
                .map(|(name, param)| {
                    let master =
                        (param.kind() != Kind::Float).then(|| param.to_kind(Kind::Float).detach());
                    let zeros = || Tensor::zeros(param.size(), (Kind::Float, param.device()));
                    Slot {
                        name,
                        exp_avg: zeros(),
                        exp_avg_sq: zeros(),
                        param,
                        master,
                    }
                })
                .collect::<Vec<Slot>>()
        });
        Self {
            cfg,
            grad_releaser: GradReleaser::new(slots.iter().map(|s| &s.param)),
            slots,
            step: 0,
        }
    }

    pub fn config(&self) -> &AdamWConfig {
        &self.cfg
    }

    /// Optimizer steps taken so far (torch's `state['step']`).
    pub fn step_count(&self) -> u64 {
        self.step
    }

    pub fn param_names(&self) -> impl Iterator<Item = &str> {
        self.slots.iter().map(|s| s.name.as_str())
    }

    /// Element count of each parameter, in the optimizer's (name-sorted) order: the layout of
    /// a flat gradient buffer for [`Self::step_with_grads`].
    pub fn param_numels(&self) -> Vec<i64> {
        self.slots.iter().map(|s| s.param.numel() as i64).collect()
    }

    /// Shape of each parameter, in slot order.
    pub fn param_shapes(&self) -> Vec<Vec<i64>> {
        self.slots.iter().map(|s| s.param.size()).collect()
    }

    /// Each parameter's current gradient (undefined where none was computed), in slot order.
    pub fn param_grads(&self) -> Vec<Tensor> {
        self.slots.iter().map(|s| s.param.grad()).collect()
    }

    /// Global L2 norm of the current gradients (fp32), without modifying them.
    pub fn grad_norm(&self) -> f64 {
        global_norm(&self.param_grads())
    }

    /// Clips the gradients to the configured global norm and applies one AdamW update at `lr`.
    /// Parameters without a gradient are skipped, as torch does. A non-finite gradient norm
    /// leaves every weight and moment untouched and returns an error.
    pub fn step(&mut self, lr: f64) -> Result<StepReport, OptimError> {
        self.step_scaled(lr, 1.0)
    }

    /// As [`Self::step`] on the parameters' gradients multiplied by `scale` (e.g. `1/Σw` when
    /// the backward ran on the loss numerator): clipping and the reported norm see the scaled
    /// gradient.
    pub fn step_scaled(&mut self, lr: f64, scale: f64) -> Result<StepReport, OptimError> {
        let grads = self.param_grads();
        self.apply(lr, &grads, scale)
    }

    /// As [`Self::step_scaled`] with gradients given from outside (e.g. views of an
    /// all-reduced flat buffer), one per parameter in slot order; an undefined tensor skips
    /// its parameter.
    pub fn step_with_grads(
        &mut self,
        lr: f64,
        grads: &[Tensor],
        scale: f64,
    ) -> Result<StepReport, OptimError> {
        assert_eq!(
            grads.len(),
            self.slots.len(),
            "one gradient per optimizer parameter"
        );
        self.apply(lr, grads, scale)
    }

    fn apply(&mut self, lr: f64, grads: &[Tensor], scale: f64) -> Result<StepReport, OptimError> {
        let grad_norm = global_norm(grads) * scale;
        if !grad_norm.is_finite() {
            return Err(OptimError::NonFiniteGradients { norm: grad_norm });
        }
        let clip_coef = match self.cfg.max_grad_norm {
            Some(max) => (max / (grad_norm + 1e-6)).min(1.0),
            None => 1.0,
        };
        let factor = clip_coef * scale;
        self.step += 1;
        let t = self.step as i32;
        let (b1, b2) = (self.cfg.beta1, self.cfg.beta2);
        let bias_correction1 = 1.0 - b1.powi(t);
        let bias_correction2_sqrt = (1.0 - b2.powi(t)).sqrt();
        let step_size = lr / bias_correction1;
        tch::no_grad(|| {
            for (slot, grad) in self.slots.iter_mut().zip(grads) {
                if !grad.defined() {
                    continue;
                }
                let mut g = grad.to_kind(Kind::Float);
                if factor != 1.0 {
                    g *= factor;
                }
                let mut master = slot.master().shallow_clone();
                if self.cfg.weight_decay != 0.0 {
                    let _ = master.g_mul_scalar_(1.0 - lr * self.cfg.weight_decay);
                }
                let _ = slot.exp_avg.lerp_(&g, 1.0 - b1);
                // In place as far as tch allows (torch's single-tensor AdamW): two temporaries
                // per parameter instead of six.
                let _ = slot.exp_avg_sq.g_mul_scalar_(b2);
                let _ = slot.exp_avg_sq.addcmul_(&g, &(&g * (1.0 - b2)));
                // denom = (sqrt(v) / bc2 + eps) / -step_size, so that `addcdiv_` subtracts
                // step_size · m / (sqrt(v) / bc2 + eps).
                let mut denom = slot.exp_avg_sq.sqrt();
                let _ = denom.g_div_scalar_(bias_correction2_sqrt);
                let _ = denom.g_add_scalar_(self.cfg.eps);
                let _ = denom.g_div_scalar_(-step_size);
                let _ = master.addcdiv_(&slot.exp_avg, &denom);
                if slot.master.is_some() {
                    slot.param.copy_(&master);
                }
            }
        });
        Ok(StepReport {
            grad_norm,
            clip_coef,
        })
    }

    /// Clears the gradients: released (undefined until the next backward), as torch does.
    pub fn zero_grad(&mut self) {
        if self
            .grad_releaser
            .as_ref()
            .is_some_and(GradReleaser::release)
        {
            return;
        }
        for slot in &mut self.slots {
            slot.param.zero_grad();
        }
    }

    /// The fp32 weights the optimizer updates, by parameter name (for checkpoints and export).
    pub fn master_weights(&self) -> Vec<(String, Tensor)> {
        self.slots
            .iter()
            .map(|s| (s.name.clone(), s.master().shallow_clone()))
            .collect()
    }

    /// First and second moments, named `exp_avg.<param>` / `exp_avg_sq.<param>`.
    pub fn moment_tensors(&self) -> Vec<(String, Tensor)> {
        let mut out = Vec::with_capacity(2 * self.slots.len());
        for s in &self.slots {
            out.push((
                format!("{EXP_AVG_PREFIX}{}", s.name),
                s.exp_avg.shallow_clone(),
            ));
            out.push((
                format!("{EXP_AVG_SQ_PREFIX}{}", s.name),
                s.exp_avg_sq.shallow_clone(),
            ));
        }
        out
    }

    /// Replaces the weights of an optimizer that has taken no step (a warm start): the fp32
    /// masters take `weights` exactly (converted to fp32), the parameters their value in their
    /// own dtype, and the moments stay zero. Every parameter must be present with its exact
    /// shape, and nothing else; nothing is modified unless all of them are.
    pub fn initialise_weights(
        &mut self,
        weights: &HashMap<String, Tensor>,
    ) -> Result<(), OptimError> {
        if self.step != 0 {
            return Err(OptimError::NotFresh { step: self.step });
        }
        let mut staged = Vec::with_capacity(self.slots.len());
        for s in &self.slots {
            let w = weights
                .get(&s.name)
                .ok_or_else(|| OptimError::MissingState(s.name.clone()))?;
            if w.size() != s.param.size() {
                return Err(OptimError::ShapeMismatch {
                    name: s.name.clone(),
                    expected: s.param.size(),
                    found: w.size(),
                });
            }
            staged.push(w.shallow_clone());
        }
        let known: std::collections::HashSet<&str> =
            self.slots.iter().map(|s| s.name.as_str()).collect();
        if let Some(extra) = weights.keys().find(|k| !known.contains(k.as_str())) {
            return Err(OptimError::UnknownState(extra.clone()));
        }
        tch::no_grad(|| {
            for (slot, w) in self.slots.iter_mut().zip(staged) {
                let mut master = slot.master().shallow_clone();
                master.copy_(&w.to_device(master.device()).to_kind(Kind::Float));
                if slot.master.is_some() {
                    slot.param.copy_(&master);
                }
            }
        });
        Ok(())
    }

    /// Restores weights, moments and the step counter. Every parameter must be present with
    /// its exact shape; nothing is modified unless all of them are.
    pub fn restore(
        &mut self,
        master: &HashMap<String, Tensor>,
        moments: &HashMap<String, Tensor>,
        step: u64,
    ) -> Result<(), OptimError> {
        let lookup = |map: &HashMap<String, Tensor>,
                      name: String,
                      shape: &[i64]|
         -> Result<Tensor, OptimError> {
            let t = map
                .get(&name)
                .ok_or_else(|| OptimError::MissingState(name.clone()))?;
            if t.size() != shape {
                return Err(OptimError::ShapeMismatch {
                    name,
                    expected: shape.to_vec(),
                    found: t.size(),
                });
            }
            Ok(t.shallow_clone())
        };
        let mut staged = Vec::with_capacity(self.slots.len());
        for s in &self.slots {
            let shape = s.param.size();
            staged.push((
                lookup(master, s.name.clone(), &shape)?,
                lookup(moments, format!("{EXP_AVG_PREFIX}{}", s.name), &shape)?,
                lookup(moments, format!("{EXP_AVG_SQ_PREFIX}{}", s.name), &shape)?,
            ));
        }
        let known: std::collections::HashSet<&str> =
            self.slots.iter().map(|s| s.name.as_str()).collect();
        if let Some(extra) = master.keys().find(|k| !known.contains(k.as_str())) {
            return Err(OptimError::UnknownState(extra.clone()));
        }
        tch::no_grad(|| {
            for (slot, (w, m, v)) in self.slots.iter_mut().zip(staged) {
                let device = slot.param.device();
                let mut target = slot.master().shallow_clone();
                target.copy_(&w.to_device(device).to_kind(Kind::Float));
                if slot.master.is_some() {
                    slot.param.copy_(&target);
                }
                slot.exp_avg
                    .copy_(&m.to_device(device).to_kind(Kind::Float));
                slot.exp_avg_sq
                    .copy_(&v.to_device(device).to_kind(Kind::Float));
            }
        });
        self.step = step;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tch::Device;

    fn leaf(values: &[f32]) -> Tensor {
        Tensor::from_slice(values).set_requires_grad(true)
    }

    #[test]
    fn first_step_moves_each_weight_by_lr_against_the_gradient_sign() {
        // After one step m̂ = g and v̂ = g², so the update is lr · g/(|g| + eps) ≈ lr · sign(g).
        let p = leaf(&[1.0, -2.0, 0.5]);
        (&p * Tensor::from_slice(&[3.0f32, -0.5, 0.0]))
            .sum(Kind::Float)
            .backward();
        let mut opt = AdamW::new(
            vec![("p".into(), p.shallow_clone())],
            AdamWConfig {
                max_grad_norm: None,
                ..Default::default()
            },
        );
        opt.step(0.1).unwrap();
        let got: Vec<f32> = Vec::try_from(&p.detach()).unwrap();
        assert!((got[0] - 0.9).abs() < 1e-6, "{got:?}");
        assert!((got[1] - -1.9).abs() < 1e-6, "{got:?}");
        assert_eq!(got[2], 0.5);
        assert_eq!(opt.step_count(), 1);
    }

    #[test]
    fn matches_a_hand_computed_two_step_adamw_with_weight_decay() {
        let cfg = AdamWConfig {
            weight_decay: 0.1,
            max_grad_norm: None,
            ..Default::default()
        };
        let p = leaf(&[1.0]);
        let mut opt = AdamW::new(vec![("p".into(), p.shallow_clone())], cfg.clone());
        let (mut w, mut m, mut v) = (1.0f64, 0.0f64, 0.0f64);
        for (t, g) in [(1, 0.5f64), (2, -0.25)] {
            opt.zero_grad();
            (&p * g).sum(Kind::Float).backward();
            opt.step(0.01).unwrap();
            w *= 1.0 - 0.01 * 0.1;
            m = 0.9 * m + 0.1 * g;
            v = 0.999 * v + 0.001 * g * g;
            let mhat = m / (1.0 - 0.9f64.powi(t));
            let denom = v.sqrt() / (1.0 - 0.999f64.powi(t)).sqrt() + 1e-8;
            w -= 0.01 * mhat / denom;
        }
        let got = p.double_value(&[0]);
        assert!((got - w).abs() < 1e-6, "got {got}, want {w}");
    }

    #[test]
    fn clipping_scales_gradients_to_the_max_norm() {
        let p = leaf(&[0.0, 0.0]);
        (&p * Tensor::from_slice(&[3.0f32, 4.0]))
            .sum(Kind::Float)
            .backward();
        let mut opt = AdamW::new(
            vec![("p".into(), p.shallow_clone())],
            AdamWConfig::default(),
        );
        let report = opt.step(1e-3).unwrap();
        assert!((report.grad_norm - 5.0).abs() < 1e-5);
        assert!((report.clip_coef - 0.2).abs() < 1e-6);
        // Moments saw the clipped gradient: m = 0.1 · (0.6, 0.8).
        let m: Vec<f32> = Vec::try_from(&opt.moment_tensors()[0].1).unwrap();
        assert!(
            (m[0] - 0.06).abs() < 1e-6 && (m[1] - 0.08).abs() < 1e-6,
            "{m:?}"
        );
    }

    #[test]
    fn a_scaled_step_equals_a_step_on_the_scaled_gradient() {
        let run = |grad: [f32; 2], scale: f64, external: bool| {
            let p = leaf(&[0.5, -1.0]);
            (&p * Tensor::from_slice(&grad)).sum(Kind::Float).backward();
            let mut opt = AdamW::new(
                vec![("p".into(), p.shallow_clone())],
                AdamWConfig::default(),
            );
            let report = if external {
                let g = p.grad().copy();
                opt.step_with_grads(0.1, &[g], scale).unwrap()
            } else {
                opt.step_scaled(0.1, scale).unwrap()
            };
            (Vec::<f32>::try_from(&p.detach()).unwrap(), report)
        };
        let (direct, direct_report) = run([0.3, 0.4], 1.0, false);
        for external in [false, true] {
            let (scaled, report) = run([3.0, 4.0], 0.1, external);
            assert_eq!(report.clip_coef, direct_report.clip_coef);
            assert!((report.grad_norm - 0.5).abs() < 1e-6, "{report:?}");
            for (a, b) in scaled.iter().zip(&direct) {
                assert!((a - b).abs() < 1e-6, "{scaled:?} vs {direct:?}");
            }
        }
        // Clipping sees the scaled norm: 50 · 0.1 = 5 is clipped to 1.
        let (_, clipped) = run([30.0, 40.0], 0.1, true);
        assert!((clipped.grad_norm - 5.0).abs() < 1e-4 && (clipped.clip_coef - 0.2).abs() < 1e-6);
    }

    #[test]
    fn zero_grad_releases_gradients_and_the_next_backward_writes_them_afresh() {
        let p = leaf(&[1.0, 2.0]);
        let mut opt = AdamW::new(
            vec![("p".into(), p.shallow_clone())],
            AdamWConfig::default(),
        );
        (&p * 3.0).sum(Kind::Float).backward();
        opt.step(0.1).unwrap();
        opt.zero_grad();
        assert!(
            !p.grad().defined(),
            "released like torch's zero_grad(set_to_none=True), not kept as zeros"
        );
        // The next backward's gradient is its own, not added to a stale one.
        (&p * 5.0).sum(Kind::Float).backward();
        assert_eq!(Vec::<f32>::try_from(p.grad()).unwrap(), [5.0, 5.0]);
        assert!(opt.grad_norm() > 7.0);
    }

    #[test]
    fn non_finite_gradients_leave_weights_untouched() {
        let p = leaf(&[1.0]);
        (&p * f64::NAN).sum(Kind::Float).backward();
        let mut opt = AdamW::new(
            vec![("p".into(), p.shallow_clone())],
            AdamWConfig::default(),
        );
        assert!(matches!(
            opt.step(0.1),
            Err(OptimError::NonFiniteGradients { .. })
        ));
        assert_eq!(p.double_value(&[0]), 1.0);
        assert_eq!(opt.step_count(), 0);
    }

    #[test]
    fn bf16_params_keep_an_fp32_master_that_accumulates_tiny_updates() {
        let p = Tensor::from_slice(&[1.0f32])
            .to_kind(Kind::BFloat16)
            .set_requires_grad(true);
        let mut opt = AdamW::new(
            vec![("p".into(), p.shallow_clone())],
            AdamWConfig::default(),
        );
        for _ in 0..10 {
            opt.zero_grad();
            (&p * 1.0).to_kind(Kind::Float).sum(Kind::Float).backward();
            opt.step(1e-4).unwrap();
        }
        // 10 updates of ~1e-4 are below bf16 resolution at 1.0 (2^-7) each, but not in the master.
        let master = opt.master_weights()[0].1.double_value(&[0]);
        assert!((master - (1.0 - 1e-3)).abs() < 1e-5, "{master}");
        assert_eq!(p.kind(), Kind::BFloat16);
    }

    #[test]
    fn restore_round_trips_and_rejects_wrong_shapes() {
        let p = leaf(&[1.0, 2.0]);
        (&p * 2.0).sum(Kind::Float).backward();
        let mut opt = AdamW::new(
            vec![("p".into(), p.shallow_clone())],
            AdamWConfig::default(),
        );
        opt.step(0.1).unwrap();
        let master: HashMap<String, Tensor> = opt
            .master_weights()
            .into_iter()
            .map(|(n, t)| (n, t.copy()))
            .collect();
        let moments: HashMap<String, Tensor> = opt
            .moment_tensors()
            .into_iter()
            .map(|(n, t)| (n, t.copy()))
            .collect();

        let q = leaf(&[0.0, 0.0]);
        let mut fresh = AdamW::new(
            vec![("p".into(), q.shallow_clone())],
            AdamWConfig::default(),
        );
        fresh.restore(&master, &moments, 1).unwrap();
        assert!(q.equal(&p));
        assert_eq!(fresh.step_count(), 1);

        let mut bad: HashMap<String, Tensor> =
            master.iter().map(|(n, t)| (n.clone(), t.copy())).collect();
        bad.insert("p".into(), Tensor::zeros([3], (Kind::Float, Device::Cpu)));
        let err = fresh.restore(&bad, &moments, 1).unwrap_err();
        assert!(err.to_string().contains("shape [3]"), "{err}");
        let mut missing: HashMap<String, Tensor> =
            moments.iter().map(|(n, t)| (n.clone(), t.copy())).collect();
        missing.remove("exp_avg_sq.p");
        assert!(
            matches!(fresh.restore(&master, &missing, 1), Err(OptimError::MissingState(n)) if n == "exp_avg_sq.p")
        );
    }
}
