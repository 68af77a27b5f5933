//! Chain speculative decoding (z-lab `dflash_generate`) and the target alone, one prompt.
use rand::rngs::StdRng;
use rand::SeedableRng;
use tch::{Kind, Tensor};

use super::error::DecodeError;
use super::sampling::{distribution, sample_index, verify_draft, Sampling, Verdict};
use crate::model::drafter::{Drafter, DrafterCache};
use crate::model::target::{TargetCache, TargetModel};

#[derive(Debug, Clone, PartialEq)]
pub struct Settings {
    pub max_new_tokens: usize,
    /// Generation ends after any of these (it is kept in the output).
    pub stop_tokens: Vec<i64>,
    pub sampling: Sampling,
    /// Seed of the draws (unused when greedy).
    pub seed: u64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Generation {
    /// The new tokens, after the prompt.
    pub output_ids: Vec<i64>,
    /// Tokens produced per verifying target forward, the bonus token included (the prefill's
    /// first token is not counted). The target alone produces 1 per forward.
    pub acceptance_lengths: Vec<usize>,
}

impl Generation {
    /// Mean acceptance length (τ of this prompt); 0 with no round.
    pub fn tau(&self) -> f64 {
        if self.acceptance_lengths.is_empty() {
            return 0.0;
        }
        self.acceptance_lengths.iter().sum::<usize>() as f64 / self.acceptance_lengths.len() as f64
    }
}

/// Appends `tokens` to `out` until a stop token or `max_new_tokens`; returns how many were
/// appended and whether generation is over.
pub(super) fn push_tokens(
    out: &mut Vec<i64>,
    tokens: &[i64],
    settings: &Settings,
) -> (usize, bool) {
    let mut appended = 0;
    for &t in tokens {
        if out.len() >= settings.max_new_tokens {
            return (appended, true);
        }
        out.push(t);
        appended += 1;
        if settings.stop_tokens.contains(&t) {
            return (appended, true);
        }
    }
    (appended, out.len() >= settings.max_new_tokens)
}

pub(super) fn argmax(logits: &Tensor) -> i64 {
    logits.argmax(-1, false).int64_value(&[])
}

/// The token chosen from `logits` `[V]` by `sampling`.
fn choose(logits: &Tensor, sampling: Sampling, rng: &mut StdRng) -> i64 {
    match sampling {
        Sampling::Greedy => argmax(logits),
        s => sample_index(&distribution(logits, s), rng) as i64,
    }
}

fn prompt_tensor(prompt: &[i64], target: &TargetModel) -> Result<Tensor, DecodeError> {
    if prompt.is_empty() {
        return Err(DecodeError::EmptyPrompt);
    }
    Ok(Tensor::from_slice(prompt)
        .view([1, prompt.len() as i64])
        .to_device(target.device()))
}

/// The target alone, one token per forward: the reference a speculative decoder must equal
/// (greedy: token for token; sampled: in distribution).
pub fn generate_target_only(
    target: &TargetModel,
    prompt: &[i64],
    settings: &Settings,
) -> Result<Generation, DecodeError> {
    settings.sampling.validate()?;
    let mut rng = StdRng::seed_from_u64(settings.seed);
    let mut cache = target.new_cache();
    let ids = prompt_tensor(prompt, target)?;
    let step = target.forward_cached(&ids, &mut cache, &[])?;
    let mut logits = step.logits.get(0).get(prompt.len() as i64 - 1);
    let mut out = Vec::new();
    let mut rounds = Vec::new();
    if settings.max_new_tokens == 0 {
        return Ok(Generation {
            output_ids: out,
            acceptance_lengths: rounds,
        });
    }
    let mut first = true;
    loop {
        let token = choose(&logits, settings.sampling, &mut rng);
        let (_, done) = push_tokens(&mut out, &[token], settings);
        if !first {
            rounds.push(1);
        }
        first = false;
        if done {
            break;
        }
        let input = Tensor::from_slice(&[token])
            .view([1, 1])
            .to_device(target.device());
        logits = target
            .forward_cached(&input, &mut cache, &[])?
            .logits
            .get(0)
            .get(0);
    }
    Ok(Generation {
        output_ids: out,
        acceptance_lengths: rounds,
    })
}

pub(super) fn check_fit(target: &TargetModel, drafter: &Drafter) -> Result<(), DecodeError> {
    let (t, d) = (target.config(), drafter.config());
    let mismatch = |what: String| Err(DecodeError::Mismatch { what });
    if d.hidden_size != t.hidden_size() {
        return mismatch(format!(
            "drafter hidden_size {} ≠ target hidden_size {} (blocks are embedded with the target's table)",
            d.hidden_size,
            t.hidden_size()
        ));
    }
    if d.target_hidden_size != t.hidden_size() {
        return mismatch(format!(
            "drafter target_hidden_size {} ≠ target hidden_size {}",
            d.target_hidden_size,
            t.hidden_size()
        ));
    }
    if let Some(&l) = d.target_layer_ids.iter().find(|&&l| l >= t.num_layers()) {
        return mismatch(format!(
            "drafter taps target layer {l}, the target has {} layers",
            t.num_layers()
        ));
    }
    if d.mask_token_id < 0 || d.mask_token_id >= t.vocab_size() {
        return mismatch(format!(
            "mask_token_id {} is outside the target's vocabulary 0..{}",
            d.mask_token_id,
            t.vocab_size()
        ));
    }
    if d.block_size < 2 {
        return mismatch(format!(
            "block_size {} drafts nothing; need ≥ 2",
            d.block_size
        ));
    }
    Ok(())
}

/// The target over the prompt into `cache`, its tap features into the drafter's `context`;
/// returns the logits `[V]` after the prompt's last token.
pub(super) fn prefill(
    target: &TargetModel,
    drafter: &Drafter,
    prompt: &[i64],
    cache: &mut TargetCache,
    context: &mut DrafterCache,
) -> Result<Tensor, DecodeError> {
    let ids = prompt_tensor(prompt, target)?;
    let step = target.forward_cached(&ids, cache, &drafter.config().target_layer_ids)?;
    drafter.extend_context(context, &step.taps);
    Ok(step.logits.get(0).get(prompt.len() as i64 - 1))
}

/// The drafter's block at the anchor after `context`, `[last, MASK × (bs−1)]`, through the
/// target's LM head: logits `[bs−1, V]` (fp32) for the positions after `last`.
pub(super) fn draft_logits(
    target: &TargetModel,
    drafter: &Drafter,
    context: &DrafterCache,
    last: i64,
) -> Tensor {
    let cfg = drafter.config();
    let bs = cfg.block_size;
    let mut block_ids = vec![cfg.mask_token_id; bs as usize];
    block_ids[0] = last;
    let block = Tensor::from_slice(&block_ids)
        .view([1, bs])
        .to_device(target.device());
    let embedded = Tensor::embedding(target.embed_tokens(), &block, -1, false, false);
    let hidden = drafter.draft_block(context, &embedded);
    tch::no_grad(|| {
        hidden
            .get(0)
            .narrow(0, 1, bs - 1)
            .to_kind(target.kind())
            .linear::<Tensor>(target.lm_head(), None)
            .to_kind(Kind::Float)
    })
}

/// Chain speculative decoding, the DFlash reference's round: block `[last token, MASK × (bs−1)]`
/// drafted at the anchor after the accepted context; the target verifies it in one forward; the
/// leading drafts it agrees with (greedy) or accepts by the rejection rule (sampled) are kept,
/// plus its bonus token; both caches go back to the accepted prefix.
pub fn generate_chain(
    target: &TargetModel,
    drafter: &Drafter,
    prompt: &[i64],
    settings: &Settings,
) -> Result<Generation, DecodeError> {
    settings.sampling.validate()?;
    check_fit(target, drafter)?;
    let cfg = drafter.config();
    let (bs, taps) = (cfg.block_size, cfg.target_layer_ids.as_slice());
    let device = target.device();
    let mut rng = StdRng::seed_from_u64(settings.seed);
    let mut cache = target.new_cache();
    let mut context = drafter.new_cache();

    let first = prefill(target, drafter, prompt, &mut cache, &mut context)?;
    let mut out = Vec::new();
    let mut rounds = Vec::new();
    if settings.max_new_tokens == 0 {
        return Ok(Generation {
            output_ids: out,
            acceptance_lengths: rounds,
        });
    }
    let mut last = choose(&first, settings.sampling, &mut rng);
    if push_tokens(&mut out, &[last], settings).1 {
        return Ok(Generation {
            output_ids: out,
            acceptance_lengths: rounds,
        });
    }
    loop {
        // draft
        let draft_logits = draft_logits(target, drafter, &context, last);
        let mut proposals = Vec::with_capacity(bs as usize - 1);
        let mut drafts = Vec::with_capacity(bs as usize - 1);
        for i in 0..bs - 1 {
            let logits = draft_logits.get(i);
            match settings.sampling {
                Sampling::Greedy => drafts.push(argmax(&logits)),
                s => {
                    let q = distribution(&logits, s);
                    drafts.push(sample_index(&q, &mut rng) as i64);
                    proposals.push(q);
                }
            }
        }

        // verify
        let mut verify_ids = vec![last];
        verify_ids.extend_from_slice(&drafts);
        let input = Tensor::from_slice(&verify_ids)
            .view([1, bs])
            .to_device(device);
        let start = cache.len();
        let step = target.forward_cached(&input, &mut cache, taps)?;
        let logits = step.logits.get(0);
        let mut accepted = 0usize;
        let mut next = None;
        for (i, &draft) in drafts.iter().enumerate() {
            let row = logits.get(i as i64);
            match settings.sampling {
                Sampling::Greedy => {
                    let want = argmax(&row);
                    if want != draft {
                        next = Some(want);
                        break;
                    }
                }
                s => {
                    let p = distribution(&row, s);
                    if let Verdict::Replaced(t) =
                        verify_draft(&p, &proposals[i], draft as usize, &mut rng)
                    {
                        next = Some(t as i64);
                        break;
                    }
                }
            }
            accepted += 1;
        }
        let bonus = match next {
            Some(t) => t,
            None => choose(&logits.get(bs - 1), settings.sampling, &mut rng),
        };

        // commit
        let mut produced = drafts[..accepted].to_vec();
        produced.push(bonus);
        let (appended, done) = push_tokens(&mut out, &produced, settings);
        rounds.push(appended);
        if done {
            break;
        }
        let kept = 1 + accepted as i64; // `last` and the accepted drafts
        cache.crop(start + kept)?;
        drafter.extend_context(&mut context, &step.taps.narrow(1, 0, kept));
        last = bonus;
    }
    Ok(Generation {
        output_ids: out,
        acceptance_lengths: rounds,
    })
}
