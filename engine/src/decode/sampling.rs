//! Next-token distributions (temperature, top-k, top-p) and the standard speculative rejection
//! rule (Leviathan et al. 2023; DFlash `dflash_generate`), on CPU `f64` vectors so that a seeded
//! Rust RNG makes every draw reproducible.
use rand::Rng;
use tch::{Kind, Tensor};

use super::error::DecodeError;

#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Sampling {
    /// Argmax (ties: the lowest token id, as `torch.argmax`).
    Greedy,
    /// Draw from `softmax(logits / temperature)` restricted to the `top_k` most likely tokens
    /// and then to the smallest set whose mass reaches `top_p` (both optional), renormalised.
    Sample {
        temperature: f64,
        top_k: Option<usize>,
        top_p: Option<f64>,
    },
}

impl Sampling {
    pub fn validate(&self) -> Result<(), DecodeError> {
        let bad = |what: String| Err(DecodeError::BadSampling { what });
        match *self {
            Self::Greedy => Ok(()),
            Self::Sample { temperature, .. } if !(temperature > 0.0 && temperature.is_finite()) => {
                bad(format!(
                    "temperature {temperature} must be > 0 (use greedy for 0)"
                ))
            }
            Self::Sample { top_k: Some(0), .. } => bad("top_k 0 keeps no token; use ≥ 1".into()),
            Self::Sample { top_p: Some(p), .. } if !(p > 0.0 && p <= 1.0) => {
                bad(format!("top_p {p} must be in (0, 1]"))
            }
            Self::Sample { .. } => Ok(()),
        }
    }
}

/// The greedy token of `logits` `[V]` (ties: the lowest token id, as `torch.argmax`).
pub(super) fn argmax(logits: &Tensor) -> i64 {
    logits.argmax(-1, false).int64_value(&[])
}

/// `logits` `[V]` → the distribution tokens are drawn from (`Greedy`: one-hot on the argmax).
pub fn distribution(logits: &Tensor, sampling: Sampling) -> Vec<f64> {
    let logits = Vec::<f64>::try_from(logits.to_kind(Kind::Double).to_device(tch::Device::Cpu))
        .expect("a 1-d logits tensor");
    match sampling {
        Sampling::Greedy => {
            let mut best = 0;
            for (i, &l) in logits.iter().enumerate() {
                if l > logits[best] {
                    best = i;
                }
            }
            let mut p = vec![0.0; logits.len()];
            p[best] = 1.0;
            p
        }
        Sampling::Sample {
            temperature,
            top_k,
            top_p,
        } => {
            let max = logits.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let mut p: Vec<f64> = logits
                .iter()
                .map(|l| ((l - max) / temperature).exp())
                .collect();
            normalise(&mut p);
            // most likely first; equal probabilities by token id (a stable sort)
            let mut order: Vec<usize> = (0..p.len()).collect();
            order.sort_by(|&a, &b| p[b].total_cmp(&p[a]));
            let mut kept = top_k.unwrap_or(p.len()).min(p.len());
            if let Some(top_p) = top_p {
                let mut mass = 0.0;
                for (rank, &token) in order.iter().take(kept).enumerate() {
                    mass += p[token];
                    if mass >= top_p {
                        kept = rank + 1;
                        break;
                    }
                }
            }
            for &token in &order[kept..] {
                p[token] = 0.0;
            }
            normalise(&mut p);
            p
        }
    }
}

fn normalise(p: &mut [f64]) {
    let total: f64 = p.iter().sum();
    p.iter_mut().for_each(|x| *x /= total);
}

/// A draw from `p` (which sums to 1 up to rounding).
pub fn sample_index(p: &[f64], rng: &mut impl Rng) -> usize {
    let u: f64 = rng.random::<f64>() * p.iter().sum::<f64>();
    let mut acc = 0.0;
    let mut last_positive = 0;
    for (i, &x) in p.iter().enumerate() {
        if x > 0.0 {
            acc += x;
            last_positive = i;
            if u < acc {
                return i;
            }
        }
    }
    last_positive
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Accepted,
    /// Rejected; the token drawn in its place from the residual.
    Replaced(usize),
}

/// The rejection rule for a draft `draft ~ q` against the target's `p`: accept with
/// probability `min(1, p/q)` (`u·q < p`); otherwise draw from `max(p − q, 0)` normalised. The
/// output token is then distributed exactly as `p`.
pub fn verify_draft(p: &[f64], q: &[f64], draft: usize, rng: &mut impl Rng) -> Verdict {
    let u: f64 = rng.random();
    if u * q[draft] < p[draft] {
        return Verdict::Accepted;
    }
    let residual: Vec<f64> = p.iter().zip(q).map(|(p, q)| (p - q).max(0.0)).collect();
    if residual.iter().sum::<f64>() <= 0.0 {
        // p == q up to rounding: a rejection has probability ~0; fall back to p itself
        return Verdict::Replaced(sample_index(p, rng));
    }
    Verdict::Replaced(sample_index(&residual, rng))
}

#[cfg(test)]
#[path = "sampling_tests.rs"]
mod tests;
