//! The parameter list of a target (names relative to the checkpoint's body prefix, shapes, HF-like
//! initialisers) and a store the model modules take their tensors from.
use std::collections::HashMap;

use rand::{Rng, SeedableRng};
use tch::{Device, Kind, Tensor};

use crate::model::error::ModelError;

/// How `TargetModel::random` fills a parameter (HF `_init_weights` conventions, except that norms
/// get a small random perturbation so that a wrong norm convention changes the output).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Init {
    /// Normal(0, std): linear, conv and embedding weights.
    Normal(f64),
    /// Zero-centred norm weight `x̂·(1+w)`: 0 + N(0, NORM_NOISE).
    ZeroCenteredNorm,
    /// Plain or gated norm weight `w·x̂`: 1 + N(0, NORM_NOISE).
    UnitNorm,
    /// GDN `dt_bias`: ones, as HF.
    Ones,
    /// GDN `A_log`: log(U(0.01, 16)), as HF.
    ALog,
    /// Biases.
    Zeros,
}

pub const INIT_STD: f64 = 0.02;
const NORM_NOISE: f64 = 0.1;

#[derive(Debug, Clone)]
pub struct ParamSpec {
    /// Relative name, e.g. `layers.0.mlp.up_proj.weight`; `lm_head.weight` is top level.
    pub name: String,
    pub shape: Vec<i64>,
    pub init: Init,
}

impl ParamSpec {
    pub fn new(name: impl Into<String>, shape: &[i64], init: Init) -> Self {
        Self {
            name: name.into(),
            shape: shape.to_vec(),
            init,
        }
    }
}

/// Tensors by relative name; modules `take` theirs while being built.
pub struct Params {
    tensors: HashMap<String, Tensor>,
}

impl Params {
    pub fn new(tensors: HashMap<String, Tensor>) -> Self {
        Self { tensors }
    }

    pub fn take(&mut self, name: &str) -> Result<Tensor, ModelError> {
        self.tensors
            .remove(name)
            .ok_or_else(|| ModelError::MissingTensor {
                file: "(parameter list)".into(),
                tensor: name.to_string(),
            })
    }

    pub fn get(&self, name: &str) -> Result<&Tensor, ModelError> {
        self.tensors
            .get(name)
            .ok_or_else(|| ModelError::MissingTensor {
                file: "(parameter list)".into(),
                tensor: name.to_string(),
            })
    }

    pub fn take_opt(&mut self, name: &str) -> Option<Tensor> {
        self.tensors.remove(name)
    }

    /// Fresh parameters per `specs`, deterministic in `seed` (own RNG: the global torch RNG of
    /// other threads is left alone).
    pub fn random(specs: &[ParamSpec], device: Device, kind: Kind, seed: i64) -> Self {
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed as u64);
        let tensors = specs
            .iter()
            .map(|spec| {
                let numel = spec.shape.iter().product::<i64>() as usize;
                let values: Vec<f32> = (0..numel).map(|_| sample(spec.init, &mut rng)).collect();
                let tensor = Tensor::from_slice(&values)
                    .view(spec.shape.as_slice())
                    .to_device(device)
                    .to_kind(kind);
                (spec.name.clone(), tensor)
            })
            .collect();
        Self { tensors }
    }
}

fn sample(init: Init, rng: &mut impl Rng) -> f32 {
    let value = match init {
        Init::Normal(std) => std * standard_normal(rng),
        Init::ZeroCenteredNorm => NORM_NOISE * standard_normal(rng),
        Init::UnitNorm => 1.0 + NORM_NOISE * standard_normal(rng),
        Init::Ones => 1.0,
        Init::ALog => rng.random_range(0.01f64..16.0).ln(),
        Init::Zeros => 0.0,
    };
    value as f32
}

/// Box–Muller; `rand_distr` is not a dependency and one transform is all that is needed.
fn standard_normal(rng: &mut impl Rng) -> f64 {
    let u1: f64 = rng.random_range(f64::MIN_POSITIVE..1.0);
    let u2: f64 = rng.random();
    (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn random_is_deterministic_in_seed_and_follows_init() {
        let specs = [
            ParamSpec::new("w", &[64, 64], Init::Normal(0.02)),
            ParamSpec::new("a", &[1000], Init::ALog),
            ParamSpec::new("n", &[8], Init::UnitNorm),
        ];
        let mut a = Params::random(&specs, Device::Cpu, Kind::Float, 7);
        let mut b = Params::random(&specs, Device::Cpu, Kind::Float, 7);
        let mut c = Params::random(&specs, Device::Cpu, Kind::Float, 8);
        let wa = a.take("w").unwrap();
        assert!(wa.equal(&b.take("w").unwrap()));
        assert!(!wa.equal(&c.take("w").unwrap()));
        let std = wa.std(true).double_value(&[]);
        assert!((std - 0.02).abs() < 0.002, "std {std}");
        let alog = a.take("a").unwrap();
        let (lo, hi) = (alog.min().double_value(&[]), alog.max().double_value(&[]));
        assert!(
            lo >= 0.01f64.ln() - 1e-6 && hi <= 16f64.ln() + 1e-6,
            "{lo} {hi}"
        );
        let n = a.take("n").unwrap();
        assert!((n.mean(Kind::Float).double_value(&[]) - 1.0).abs() < 0.2);
        assert!(a.take("w").is_err());
    }
}
