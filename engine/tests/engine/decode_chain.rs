//! Chain speculative decoding: lossless against the target alone, greedy (token for token) and
//! sampled (in distribution, by chi-square tests at fixed seeds); and `run_online`, the prompt
//! set runner, against the one-prompt calls it is made of.
//!
//! The statistical tests: Pearson's chi-square of observed counts against the exact
//! distribution, cells with an expected count under 5 merged into one, compared with the
//! 1 − 10⁻³ quantile of χ²(cells − 1) (Wilson–Hilferty approximation). A correct sampler fails
//! such a test with probability 10⁻³ per seed; the seeds are fixed, so CI sees the same draw
//! every run (these seeds pass), and a wrong rule (e.g. accepting every draft, or drawing the
//! replacement from p instead of the residual) exceeds the bound by far.
use dflash_engine::decode::{
    acceptance, distribution, generate_chain, generate_target_only, prompt_settings, run_online,
    verify_draft, Method, Sampling, Settings, Verdict,
};
use dflash_engine::model::drafter::{AttentionBackend, Drafter};
use dflash_engine::model::target::TargetModel;
use dflash_engine::train::continuation_eval::{
    evaluate_greedy_continuations, greedy_continuations,
};
use dflash_engine::train::eval::EvalOptions;
use dflash_engine::train::labels::LabelMaskRule;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tch::Tensor;

use crate::support::decode::{domino_drafter, drafter, greedy, prompts, target, LOSSLESS_CASES};

#[test]
fn greedy_chain_output_equals_the_target_alone_on_every_prompt() {
    let mut accepted_some = false;
    for (vocab, block_size, seed) in LOSSLESS_CASES {
        let target = target(vocab, seed);
        let (_vs, drafter) = drafter(vocab, block_size, seed + 10);
        let settings = greedy(30);
        for prompt in prompts(vocab) {
            let plain = generate_target_only(&target, &prompt, &settings).unwrap();
            let chain = generate_chain(&target, &drafter, &prompt, &settings).unwrap();
            assert_eq!(
                chain.output_ids,
                plain.output_ids,
                "vocab {vocab} block {block_size} prompt of {}",
                prompt.len()
            );
            // every output token but the prefill's is counted in exactly one round
            let counted: usize = chain.acceptance_lengths.iter().sum();
            assert_eq!(counted + 1, chain.output_ids.len());
            assert!(chain
                .acceptance_lengths
                .iter()
                .all(|&a| (1..=block_size as usize).contains(&a)));
            accepted_some |= chain.acceptance_lengths.iter().any(|&a| a > 1);
        }
    }
    assert!(
        accepted_some,
        "no round accepted a draft: acceptance went untested"
    );
}

/// The rounds z-lab's `dflash_generate` loop would count at `max_new_tokens`, read off a
/// longer greedy generation's rounds (the same rounds, in full): every round that starts while
/// at most `max_new_tokens` tokens are committed (`while start < max_length`).
fn peer_rounds(longer: &[usize], max_new_tokens: usize) -> Vec<usize> {
    let mut committed = 1; // the prefill's token
    longer
        .iter()
        .take_while(|&&len| {
            let runs = committed <= max_new_tokens;
            committed += len;
            runs
        })
        .copied()
        .collect()
}

#[test]
fn peer_counting_runs_the_last_round_in_full_and_the_round_after_an_exact_fill() {
    let (mut cut, mut exact) = (0, 0);
    // until a case has shown both a cut last round and an exact fill (the first does, with
    // the fixtures' weights; the others stand in should they change)
    for (vocab, block_size, seed) in [(5, 6, 1), (8, 6, 4), (64, 4, 3)] {
        let target = target(vocab, seed);
        let (_vs, drafter) = drafter(vocab, block_size, seed + 10);
        let prompt = prompts(vocab).remove(2);
        let longer = generate_chain(&target, &drafter, &prompt, &greedy(60)).unwrap();
        for max_new_tokens in 1..=24 {
            let g = generate_chain(&target, &drafter, &prompt, &greedy(max_new_tokens)).unwrap();
            let at = format!("vocab {vocab} block {block_size}, max_new_tokens {max_new_tokens}");
            assert_eq!(g.output_ids, longer.output_ids[..max_new_tokens], "{at}");
            let peer = peer_rounds(&longer.acceptance_lengths, max_new_tokens);
            assert_eq!(g.peer_acceptance_lengths, peer, "{at}");
            // the output's rounds: the same, the last clipped to what fits, none past the output
            let n = g.acceptance_lengths.len();
            let counted: usize = g.acceptance_lengths.iter().sum();
            assert_eq!(counted + 1, max_new_tokens, "{at}");
            assert!(peer.len() == n || peer.len() == n + 1, "{at}");
            if n > 0 {
                assert_eq!(g.acceptance_lengths[..n - 1], peer[..n - 1], "{at}");
                assert!(g.acceptance_lengths[n - 1] <= peer[n - 1], "{at}");
            }
            cut += usize::from(n > 0 && g.acceptance_lengths[n - 1] < peer[n - 1]);
            exact += usize::from(peer.len() == n + 1);
        }
        if cut > 0 && exact > 0 {
            break;
        }
    }
    assert!(
        cut > 0 && exact > 0,
        "cut {cut}, exact {exact}: a case went untested"
    );
}

#[test]
fn a_stop_token_ends_the_output_and_clips_the_round() {
    let target = target(8, 1);
    let (_vs, drafter) = drafter(8, 4, 11);
    let prompt = prompts(8).remove(2);
    let free = greedy(30);
    let plain = generate_target_only(&target, &prompt, &free).unwrap();
    let stop = plain.output_ids[5];
    let first = plain.output_ids.iter().position(|&t| t == stop).unwrap();
    let settings = Settings {
        stop_tokens: vec![stop],
        ..free
    };
    let chain = generate_chain(&target, &drafter, &prompt, &settings).unwrap();
    assert_eq!(chain.output_ids, plain.output_ids[..=first].to_vec());
    let counted: usize = chain.acceptance_lengths.iter().sum();
    assert_eq!(counted + 1, chain.output_ids.len());
    // the peers count the stop token's round in full and run no round after it (they check
    // after a round, so a stop as the prefill's token still gets one)
    let unstopped = generate_chain(&target, &drafter, &prompt, &free).unwrap();
    let rounds = chain.acceptance_lengths.len().max(1);
    assert_eq!(
        chain.peer_acceptance_lengths,
        unstopped.acceptance_lengths[..rounds]
    );
}

fn wilson_hilferty_quantile(df: f64, z: f64) -> f64 {
    let a = 2.0 / (9.0 * df);
    df * (1.0 - a + z * a.sqrt()).powi(3)
}

/// Pearson's statistic with cells of expected count < 5 merged; (statistic, bound at 1e-3).
fn chi_square(counts: &[u64], probabilities: &[f64]) -> (f64, f64) {
    let n: u64 = counts.iter().sum();
    let (mut stat, mut cells) = (0.0, 0usize);
    let (mut small_obs, mut small_exp) = (0.0, 0.0);
    for (&c, &p) in counts.iter().zip(probabilities) {
        let expected = p * n as f64;
        if expected < 5.0 {
            assert!(p > 0.0 || c == 0, "a token of probability 0 was drawn");
            small_obs += c as f64;
            small_exp += expected;
        } else {
            stat += (c as f64 - expected).powi(2) / expected;
            cells += 1;
        }
    }
    if small_exp > 0.0 {
        stat += (small_obs - small_exp).powi(2) / small_exp;
        cells += 1;
    }
    (stat, wilson_hilferty_quantile((cells - 1) as f64, 3.0902))
}

#[test]
fn the_rejection_rule_outputs_the_target_distribution() {
    // q differs from p everywhere, puts mass where p has none and none where p has some
    let p = [0.30, 0.25, 0.20, 0.15, 0.10, 0.0];
    let q = [0.05, 0.10, 0.40, 0.0, 0.25, 0.20];
    let mut rng = StdRng::seed_from_u64(7);
    let mut counts = [0u64; 6];
    for _ in 0..20_000 {
        let u: f64 = rng.random();
        let mut acc = 0.0;
        let draft = q.iter().position(|&x| {
            acc += x;
            u < acc
        });
        let draft = draft.unwrap_or(4);
        let token = match verify_draft(&p, &q, draft, &mut rng) {
            Verdict::Accepted => draft,
            Verdict::Replaced(t) => t,
        };
        counts[token] += 1;
    }
    assert_eq!(counts[5], 0);
    let (stat, bound) = chi_square(&counts, &p);
    assert!(
        stat < bound,
        "chi-square {stat} ≥ {bound}: counts {counts:?}"
    );
}

/// The exact distribution of the 2nd and 3rd generated tokens (joint, vocab² cells) when the
/// target samples with `sampling` after `prompt`.
fn exact_second_and_third(target: &TargetModel, prompt: &[i64], sampling: Sampling) -> Vec<f64> {
    let v = target.config().vocab_size();
    let next = |ids: &[i64]| -> Vec<f64> {
        let t = Tensor::from_slice(ids).view([1, ids.len() as i64]);
        let step = target
            .forward_cached(&t, &mut target.new_cache(), &[])
            .unwrap();
        distribution(&step.logits.get(0).get(ids.len() as i64 - 1), sampling)
    };
    let mut joint = vec![0.0; (v * v) as usize];
    let first = next(prompt);
    for (x1, &p1) in first.iter().enumerate() {
        if p1 == 0.0 {
            continue;
        }
        let mut ids = prompt.to_vec();
        ids.push(x1 as i64);
        let second = next(&ids);
        for (x2, &p2) in second.iter().enumerate() {
            if p2 == 0.0 {
                continue;
            }
            let mut ids2 = ids.clone();
            ids2.push(x2 as i64);
            for (x3, &p3) in next(&ids2).iter().enumerate() {
                joint[x2 * v as usize + x3] += p1 * p2 * p3;
            }
        }
    }
    joint
}

#[test]
fn sampled_chain_matches_the_target_sampling_distribution() {
    let vocab = 5;
    let target = target(vocab, 4);
    let (_vs, drafter) = drafter(vocab, 4, 14);
    sampled_chain_matches_the_target(&target, &drafter, vocab);
}

#[test]
fn a_domino_drafters_sampled_chain_matches_the_target_sampling_distribution() {
    // drafts are drawn from the corrected distributions, which the rejection rule divides by
    let vocab = 5;
    let target = target(vocab, 4);
    let (_vs, drafter) = domino_drafter(vocab, 4, 14, 0);
    sampled_chain_matches_the_target(&target, &drafter, vocab);
}

fn sampled_chain_matches_the_target(target: &TargetModel, drafter: &Drafter, vocab: i64) {
    let prompt = vec![1, 2, 3, 0, 2];
    for sampling in [
        Sampling::Sample {
            temperature: 1.0,
            top_k: None,
            top_p: None,
        },
        Sampling::Sample {
            temperature: 0.7,
            top_k: Some(4),
            top_p: Some(0.9),
        },
    ] {
        let exact = exact_second_and_third(target, &prompt, sampling);
        let mut counts = vec![0u64; exact.len()];
        let mut rounds_with_acceptance = 0;
        for seed in 0..800u64 {
            let settings = Settings {
                max_new_tokens: 3,
                stop_tokens: vec![],
                sampling,
                seed,
            };
            let g = generate_chain(target, drafter, &prompt, &settings).unwrap();
            counts[(g.output_ids[1] * vocab + g.output_ids[2]) as usize] += 1;
            rounds_with_acceptance += usize::from(g.acceptance_lengths[0] > 1);
        }
        let (stat, bound) = chi_square(&counts, &exact);
        assert!(stat < bound, "{sampling:?}: chi-square {stat} ≥ {bound}");
        assert!(
            rounds_with_acceptance > 30,
            "{sampling:?}: only {rounds_with_acceptance} rounds accepted a draft"
        );
    }
}

#[test]
fn run_online_is_the_one_prompt_calls_with_their_figures() {
    let (vocab, block_size) = (8, 4);
    let target = target(vocab, 1);
    let (_vs, drafter) = drafter(vocab, block_size, 11);
    let prompts = prompts(vocab);
    let greedy = Settings {
        max_new_tokens: 12,
        stop_tokens: vec![],
        sampling: Sampling::Greedy,
        seed: 5,
    };
    let report = run_online(&target, &drafter, &prompts, &greedy, &[Method::Chain]).unwrap();
    let chain = &report.methods[0];
    assert_eq!(chain.method, Method::Chain);
    assert_eq!(chain.lossless, Some(true), "{:?}", chain.mismatched_prompts);
    for (i, prompt) in prompts.iter().enumerate() {
        let alone = generate_target_only(&target, prompt, &greedy).unwrap();
        assert_eq!(report.target_only.generations[i], alone);
        assert_eq!(
            chain.generations[i],
            generate_chain(&target, &drafter, prompt, &greedy).unwrap()
        );
    }
    let lengths = chain
        .generations
        .iter()
        .map(|g| g.acceptance_lengths.as_slice());
    assert_eq!(chain.acceptance, acceptance(lengths));
    let peer_lengths = chain
        .generations
        .iter()
        .map(|g| g.peer_acceptance_lengths.as_slice());
    assert_eq!(chain.acceptance_peer_counting, acceptance(peer_lengths));
    assert_eq!(chain.tokens, prompts.len() * 12);
    assert_eq!(report.target_only.tokens, prompts.len() * 12);
    // every output token but each prompt's prefill token is a round's
    assert_eq!(chain.acceptance.round_tokens, chain.tokens - prompts.len());
    let tau = chain.acceptance.tau.unwrap();
    assert!(tau > 1.0 && tau <= block_size as f64, "{tau}");
    assert!(chain.seconds > 0.0 && chain.tokens_per_s() > 0.0);

    // offline τ on the same continuations, as `dflashd eval --data` computes it
    let opts = EvalOptions {
        anchors_per_forward: 64,
        rows_per_forward: 2,
        gamma: 7.0,
        rule: LabelMaskRule::Independent,
        chunk_positions: 2048,
        backend: AttentionBackend::BlockSparse,
        dpace_alpha: 0.5,
        dpace_normalization: Default::default(),
        tree_budgets: vec![],
        serve_tree_budget: None,
        tree_block_subsample: 1,
        dspark: Default::default(),
        selector_alpha: 1.0,
    };
    let offline =
        evaluate_greedy_continuations(&target, &drafter, &prompts, &report, &opts).unwrap();
    assert_eq!(offline.too_short, 0);
    assert_eq!(offline.report.samples, prompts.len());
    // anchors at every continuation token but the last: 11 per prompt
    assert_eq!(offline.report.blocks, 11 * prompts.len() as u64);
    let offline_tau = offline.tau().unwrap();
    assert!(
        offline_tau >= 1.0 && offline_tau <= block_size as f64,
        "{offline_tau}"
    );
}

#[test]
fn sampled_online_runs_seed_each_prompt_and_measure_offline_on_greedy_text() {
    let vocab = 8;
    let target = target(vocab, 2);
    let (_vs, drafter) = drafter(vocab, 4, 12);
    let prompts: Vec<Vec<i64>> = prompts(vocab).into_iter().take(3).collect();
    let sampled = Settings {
        max_new_tokens: 8,
        stop_tokens: vec![],
        sampling: Sampling::Sample {
            temperature: 0.8,
            top_k: None,
            top_p: None,
        },
        seed: 40,
    };
    let report = run_online(&target, &drafter, &prompts, &sampled, &[Method::Chain]).unwrap();
    let chain = &report.methods[0];
    assert_eq!(chain.lossless, None);
    for (i, prompt) in prompts.iter().enumerate() {
        let own = prompt_settings(&sampled, i);
        assert_eq!(own.seed, 40 + i as u64);
        assert_eq!(
            chain.generations[i],
            generate_chain(&target, &drafter, prompt, &own).unwrap()
        );
    }
    let greedy = Settings {
        sampling: Sampling::Greedy,
        ..sampled.clone()
    };
    let expected: Vec<Vec<i64>> = prompts
        .iter()
        .map(|p| {
            generate_target_only(&target, p, &greedy)
                .unwrap()
                .output_ids
        })
        .collect();
    assert_eq!(
        greedy_continuations(&target, &prompts, &report).unwrap(),
        expected
    );
}
