//! Chain speculative decoding (z-lab `dflash_generate`) and the target alone, one prompt.
use rand::rngs::StdRng;
use rand::SeedableRng;
use tch::Tensor;

use super::draft::{BlockDraft, DraftLogits};
use super::error::DecodeError;
use super::sampling::{argmax, distribution, sample_index, verify_draft, Sampling, Verdict};
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
    /// first token is not counted), clipped where the output stops: every output token but the
    /// prefill's is counted once. The target alone produces 1 per forward.
    pub acceptance_lengths: Vec<usize>,
    /// The same generation counted as z-lab's `dflash_generate` (`dflash/model.py` @e763f23)
    /// and DDTree's `ddtree_generate` (`ddtree.py`) count it: every round in full (accepted
    /// drafts + 1, never clipped at `max_new_tokens` or at a stop token), and rounds run while
    /// fewer than `max_new_tokens + 1` tokens are committed and, after the first round, no
    /// stop token is among them. So where the output fills `max_new_tokens` exactly (or ends
    /// at the prefill's token) the peers run one more round, and so does this decoder, for
    /// the count only: its tokens are not in `output_ids`. See [`PeerCount`].
    pub peer_acceptance_lengths: Vec<usize>,
}

impl Generation {
    /// Mean acceptance length (τ of this prompt); 0 with no round.
    pub fn tau(&self) -> f64 {
        mean(&self.acceptance_lengths)
    }

    /// Mean acceptance length counted as the peers count it (`peer_acceptance_lengths`); 0
    /// with no round.
    pub fn tau_peer_counting(&self) -> f64 {
        mean(&self.peer_acceptance_lengths)
    }
}

fn mean(lengths: &[usize]) -> f64 {
    if lengths.is_empty() {
        return 0.0;
    }
    lengths.iter().sum::<usize>() as f64 / lengths.len() as f64
}

/// One generation's output and its rounds, counted both ways ([`Generation`]): the output stops
/// at `max_new_tokens` or a stop token and its rounds are clipped there; the peers' loop runs
/// each round in full and goes on while its uncut output holds at most `max_new_tokens` tokens
/// (`while start < max_length`, `start` the index of its last committed token) and no stop
/// token was committed before the round (checked after each round, the prefill's token
/// included, so a first token that is a stop still gets one round).
///
/// Both follow the same tokens: a round commits its accepted drafts and the bonus token either
/// way, and the output is only cut in its last round. Once the output is complete the peers'
/// loop runs at most one more round: when the output filled `max_new_tokens` exactly, or ended
/// at the prefill's token.
pub(super) struct PeerCount<'a> {
    settings: &'a Settings,
    output_ids: Vec<i64>,
    acceptance_lengths: Vec<usize>,
    peer_acceptance_lengths: Vec<usize>,
    /// The output is complete (`max_new_tokens` reached or a stop token appended).
    closed: bool,
    /// Tokens the peers' loop has committed, the prefill's included, none cut.
    peer_committed: usize,
    /// A stop token is among them.
    peer_stop_seen: bool,
}

impl<'a> PeerCount<'a> {
    /// Before the prefill's token; with `max_new_tokens` 0 nothing is generated either way.
    pub(super) fn new(settings: &'a Settings) -> Self {
        PeerCount {
            settings,
            output_ids: Vec::new(),
            acceptance_lengths: Vec::new(),
            peer_acceptance_lengths: Vec::new(),
            closed: settings.max_new_tokens == 0,
            peer_committed: 0,
            peer_stop_seen: false,
        }
    }

    /// The prefill's token: output, and no round.
    pub(super) fn first(&mut self, token: i64) {
        if !self.closed {
            self.closed = push_tokens(&mut self.output_ids, &[token], self.settings).1;
        }
        self.peer_committed = 1;
        self.peer_stop_seen = self.settings.stop_tokens.contains(&token);
    }

    /// Whether the peers' loop runs another round.
    fn peer_runs_another(&self) -> bool {
        let first_round = self.peer_acceptance_lengths.is_empty();
        self.peer_committed >= 1
            && self.peer_committed <= self.settings.max_new_tokens
            && (first_round || !self.peer_stop_seen)
    }

    /// The output has room for another round's tokens.
    pub(super) fn output_open(&self) -> bool {
        !self.closed
    }

    /// The peers' extra round of the target alone, counted without running it: one forward
    /// produces one token, whatever it is, and no round follows it (the output is complete, so
    /// after it the peers have committed `max_new_tokens + 1` tokens or seen a stop token).
    pub(super) fn peer_round_of_one(&mut self) {
        debug_assert!(self.closed && self.peer_runs_another());
        self.peer_acceptance_lengths.push(1);
        self.peer_committed += 1;
    }

    /// Whether a decoder runs another round: its output is open, or the peers would count one
    /// more.
    pub(super) fn another_round(&self) -> bool {
        !self.closed || self.peer_runs_another()
    }

    /// A round that produced `produced` (its accepted drafts and its bonus token, in full).
    /// Returns whether it was one of the output's rounds (`false`: the peers' extra round).
    pub(super) fn round(&mut self, produced: &[i64]) -> bool {
        debug_assert!(self.another_round());
        if self.peer_runs_another() {
            self.peer_acceptance_lengths.push(produced.len());
            self.peer_committed += produced.len();
            self.peer_stop_seen |= produced
                .iter()
                .any(|t| self.settings.stop_tokens.contains(t));
        }
        if self.closed {
            return false;
        }
        let (appended, done) = push_tokens(&mut self.output_ids, produced, self.settings);
        self.acceptance_lengths.push(appended);
        self.closed = done;
        true
    }

    pub(super) fn finish(self) -> Generation {
        Generation {
            output_ids: self.output_ids,
            acceptance_lengths: self.acceptance_lengths,
            peer_acceptance_lengths: self.peer_acceptance_lengths,
        }
    }
}

/// Appends `tokens` to `out` until a stop token or `max_new_tokens`; returns how many were
/// appended and whether generation is over.
fn push_tokens(out: &mut Vec<i64>, tokens: &[i64], settings: &Settings) -> (usize, bool) {
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
    let logits = step.logits.get(0).get(prompt.len() as i64 - 1);
    let mut count = PeerCount::new(settings);
    if settings.max_new_tokens == 0 {
        return Ok(count.finish());
    }
    let mut token = choose(&logits, settings.sampling, &mut rng);
    count.first(token);
    while count.output_open() {
        let input = Tensor::from_slice(&[token])
            .view([1, 1])
            .to_device(target.device());
        let logits = target
            .forward_cached(&input, &mut cache, &[])?
            .logits
            .get(0)
            .get(0);
        token = choose(&logits, settings.sampling, &mut rng);
        count.round(&[token]);
    }
    // the peers' baseline (`dflash_generate` with block size 1) counts 1 for its extra round
    // whatever its token: no forward runs for it, so the output may end at the context's end
    if count.another_round() {
        count.peer_round_of_one();
    }
    debug_assert!(!count.another_round());
    Ok(count.finish())
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

/// Chain speculative decoding, the DFlash reference's round: block `[last token, MASK × (bs−1)]`
/// drafted at the anchor after the accepted context; the target verifies it in one forward; the
/// leading drafts it agrees with (greedy) or accepts by the rejection rule (sampled) are kept,
/// plus its bonus token; both caches go back to the accepted prefix. A Domino drafter drafts
/// from its corrected logits ([`generate_chain_with`]).
pub fn generate_chain(
    target: &TargetModel,
    drafter: &Drafter,
    prompt: &[i64],
    settings: &Settings,
) -> Result<Generation, DecodeError> {
    generate_chain_with(target, drafter, prompt, settings, DraftLogits::Drafter)
}

/// [`generate_chain`] drafting from `logits`: a Domino drafter's slots in order, each slot's
/// correction reading the drafts before it (`draft.rs`); sampled, each draft is drawn from
/// the corrected distribution, which is then the proposal the rejection rule divides by.
pub fn generate_chain_with(
    target: &TargetModel,
    drafter: &Drafter,
    prompt: &[i64],
    settings: &Settings,
    logits: DraftLogits,
) -> Result<Generation, DecodeError> {
    settings.sampling.validate()?;
    check_fit(target, drafter)?;
    let cfg = drafter.config();
    let taps = cfg.target_layer_ids.as_slice();
    let device = target.device();
    let mut rng = StdRng::seed_from_u64(settings.seed);
    let mut cache = target.new_cache();
    let mut context = drafter.new_cache();

    let first = prefill(target, drafter, prompt, &mut cache, &mut context)?;
    let mut count = PeerCount::new(settings);
    if settings.max_new_tokens == 0 {
        return Ok(count.finish());
    }
    let mut last = choose(&first, settings.sampling, &mut rng);
    count.first(last);
    while count.another_round() {
        // draft
        let block = BlockDraft::new(target, drafter, &context, last, logits);
        let drafted = block.slots();
        let mut state = block.start(last);
        let mut proposals = Vec::with_capacity(drafted as usize);
        let mut drafts = Vec::with_capacity(drafted as usize);
        for slot in 1..=drafted {
            let logits = block.slot_logits(slot, &state);
            let draft = match settings.sampling {
                Sampling::Greedy => argmax(&logits),
                s => {
                    let q = distribution(&logits, s);
                    let drawn = sample_index(&q, &mut rng) as i64;
                    proposals.push(q);
                    drawn
                }
            };
            drafts.push(draft);
            if slot < drafted {
                state = block.read(&state, slot, draft);
            }
        }

        // verify
        let mut verify_ids = vec![last];
        verify_ids.extend_from_slice(&drafts);
        let input = Tensor::from_slice(&verify_ids)
            .view([1, drafted + 1])
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
            None => choose(&logits.get(drafted), settings.sampling, &mut rng),
        };

        // commit
        let mut produced = drafts[..accepted].to_vec();
        produced.push(bonus);
        count.round(&produced);
        if !count.another_round() {
            break;
        }
        let kept = 1 + accepted as i64; // `last` and the accepted drafts
        cache.crop(start + kept)?;
        drafter.extend_context(&mut context, &step.taps.narrow(1, 0, kept));
        last = bonus;
    }
    Ok(count.finish())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(max_new_tokens: usize, stop_tokens: &[i64]) -> Settings {
        Settings {
            max_new_tokens,
            stop_tokens: stop_tokens.to_vec(),
            sampling: Sampling::Greedy,
            seed: 0,
        }
    }

    /// Feeds `rounds` (each round's accepted drafts + bonus, in full) while a decoder would.
    fn count(settings: &Settings, first: i64, rounds: &[&[i64]]) -> (Generation, Vec<bool>) {
        let mut c = PeerCount::new(settings);
        c.first(first);
        let mut counted = Vec::new();
        for produced in rounds {
            assert!(c.another_round(), "round {produced:?} would not run");
            counted.push(c.round(produced));
        }
        assert!(!c.another_round(), "a further round would run");
        (c.finish(), counted)
    }

    #[test]
    fn a_last_round_cut_at_max_new_tokens_counts_clipped_and_in_full() {
        // 10 new tokens: the prefill's, then rounds of 4 and 4 (9 so far); the third round
        // produces 3, of which 1 fits.
        let s = settings(10, &[]);
        let (g, counted) = count(&s, 5, &[&[1, 2, 3, 4], &[1, 2, 3, 4], &[6, 6, 6]]);
        assert_eq!(g.output_ids, vec![5, 1, 2, 3, 4, 1, 2, 3, 4, 6]);
        assert_eq!(counted, vec![true, true, true]);
        assert_eq!(g.acceptance_lengths, vec![4, 4, 1]);
        assert_eq!(g.tau(), 3.0); // (4 + 4 + 1) / 3
        assert_eq!(g.peer_acceptance_lengths, vec![4, 4, 3]);
        assert_eq!(g.tau_peer_counting(), 11.0 / 3.0); // (4 + 4 + 3) / 3
    }

    #[test]
    fn an_output_that_fills_max_new_tokens_exactly_gets_the_peers_extra_round() {
        // 9 new tokens filled exactly by the prefill's and rounds of 4 and 4: the peers'
        // loop still has `start < max_length` and runs a round the output does not keep.
        let s = settings(9, &[]);
        let (g, counted) = count(&s, 5, &[&[1, 2, 3, 4], &[1, 2, 3, 4], &[7, 7]]);
        assert_eq!(g.output_ids.len(), 9);
        assert_eq!(counted, vec![true, true, false]);
        assert_eq!((&g.acceptance_lengths[..], g.tau()), (&[4, 4][..], 4.0));
        assert_eq!(g.peer_acceptance_lengths, vec![4, 4, 2]);
        assert_eq!(g.tau_peer_counting(), 10.0 / 3.0);
        // one new token: no round of the output's, one of the peers'
        let (g, counted) = count(&settings(1, &[]), 5, &[&[1, 2, 3]]);
        assert_eq!((&g.output_ids[..], &counted[..]), (&[5][..], &[false][..]));
        assert!(g.acceptance_lengths.is_empty());
        assert_eq!((&g.peer_acceptance_lengths[..], g.tau()), (&[3][..], 0.0));
        // none: no round either way
        let zero = settings(0, &[]);
        let none = PeerCount::new(&zero);
        assert!(!none.another_round());
        let g = none.finish();
        assert!(g.output_ids.is_empty() && g.peer_acceptance_lengths.is_empty());
    }

    #[test]
    fn a_stop_token_clips_the_output_round_but_not_the_peers() {
        let s = settings(30, &[8]);
        let (g, counted) = count(&s, 5, &[&[1, 2, 3], &[4, 8, 2, 6]]);
        assert_eq!(g.output_ids, vec![5, 1, 2, 3, 4, 8]);
        assert_eq!(counted, vec![true, true]);
        assert_eq!(g.acceptance_lengths, vec![3, 2]);
        assert_eq!(g.peer_acceptance_lengths, vec![3, 4]);
        assert_eq!((g.tau(), g.tau_peer_counting()), (2.5, 3.5));
        // a stop as the prefill's token ends the output; the peers check after a round, so
        // they run one
        let (g, counted) = count(&s, 8, &[&[1, 2]]);
        assert_eq!((&g.output_ids[..], &counted[..]), (&[8][..], &[false][..]));
        assert_eq!(g.peer_acceptance_lengths, vec![2]);
    }
}
