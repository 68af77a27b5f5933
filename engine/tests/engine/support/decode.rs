//! The tiny hybrid target (Gated DeltaNet + gated attention), drafter and prompts of the
//! decoding tests (chain and DDTree).
use dflash_engine::decode::{
    generate_chain, generate_chain_with, generate_target_only, generate_tree, DraftLogits,
    Sampling, Settings, TreeGeneration,
};
use dflash_engine::model::drafter::{
    Dflash2Config, DominoConfig, Drafter, DrafterCache, DrafterConfig, DrafterHead, DsparkConfig,
    LayerType, MarkovHeadType,
};
use dflash_engine::model::target::{TargetConfig, TargetModel};
use tch::{nn, Device, Kind, Tensor};

use super::drafter::{randomize, seeded, single_threaded};

/// A three-layer Qwen3.5 hybrid (linear, linear, full) of vocabulary `vocab`, random (its own
/// generator, seeded by `seed`: no lock to hold). The decoding that follows runs on one thread.
pub fn target(vocab: i64, seed: i64) -> TargetModel {
    single_threaded();
    let TargetConfig::Qwen3_5(mut c) = TargetConfig::tiny_default() else {
        unreachable!()
    };
    c.vocab_size = vocab;
    c.hidden_size = 32;
    c.intermediate_size = 48;
    c.head_dim = 16;
    c.linear_key_head_dim = 8;
    c.linear_value_head_dim = 8;
    c.num_hidden_layers = 3;
    c.layer_types.truncate(3); // linear, linear, full
    TargetModel::random(TargetConfig::Qwen3_5(c), Device::Cpu, Kind::Float, seed)
}

/// A two-layer drafter (sliding, full) over taps 0 and 1 of [`target`], its weights spread
/// (`randomize`) so that its drafts vary and some are accepted. Its draws from libtorch's
/// generator are under [`seeded`] (`seed`), released on return.
pub fn drafter(vocab: i64, block_size: i64, seed: i64) -> (nn::VarStore, Drafter) {
    let cfg = DrafterConfig {
        hidden_size: 32,
        intermediate_size: 48,
        num_hidden_layers: 2,
        num_attention_heads: 4,
        num_key_value_heads: 2,
        head_dim: 8,
        rms_norm_eps: 1e-6,
        rope_theta: 10_000.0,
        layer_types: vec![LayerType::Sliding, LayerType::Full],
        sliding_window: Some(6),
        block_size,
        mask_token_id: vocab - 1,
        target_layer_ids: vec![0, 1],
        target_hidden_size: 32,
        vocab_size: vocab,
        max_position_embeddings: 512,
        num_target_layers: Some(3),
        initializer_range: 0.02,
        head: Default::default(),
    };
    let _draws = seeded(seed);
    let vs = nn::VarStore::new(Device::Cpu);
    let d = Drafter::new(&vs.root(), &cfg);
    randomize(&vs, 0.5);
    (vs, d)
}

/// Five prompts of 1 to 80 tokens (past one 64-token delta-rule chunk).
pub fn prompts(vocab: i64) -> Vec<Vec<i64>> {
    // lengths 1 to 80 (past one 64-token delta-rule chunk)
    [1usize, 5, 17, 40, 80]
        .iter()
        .enumerate()
        .map(|(p, &len)| {
            (0..len)
                .map(|i| ((i * 7 + p * 3 + i / 5) as i64) % (vocab - 1))
                .collect()
        })
        .collect()
}

/// [`prompts`] for a head's own losslessness test: the shortest (1 token), a middle one (17)
/// and the one past a delta-rule chunk (80).
pub fn head_prompts(vocab: i64) -> Vec<Vec<i64>> {
    prompts(vocab).into_iter().step_by(2).collect()
}

/// (vocabulary, block size, seed) of the losslessness tests: a vocabulary small enough for
/// drafts to be accepted often, two block sizes, and a wider vocabulary.
pub const LOSSLESS_CASES: [(i64, i64, i64); 3] = [(8, 4, 1), (8, 6, 2), (64, 4, 3)];

/// (vocabulary, block size, seed) of a head's own losslessness test, one case for each of the
/// head's variants: the small vocabulary, where drafts are accepted and trees branch, at both
/// block sizes. The wide vocabulary's rounds are the verification path every head shares, which
/// the DFlash and Domino tests cover.
pub const HEAD_LOSSLESS_CASES: [(i64, i64, i64); 3] = [(8, 4, 1), (8, 6, 2), (8, 4, 3)];

/// Greedy decoding of `max_new_tokens` tokens, no stop token.
pub fn greedy(max_new_tokens: usize) -> Settings {
    Settings {
        max_new_tokens,
        stop_tokens: vec![],
        sampling: Sampling::Greedy,
        seed: 0,
    }
}

/// [`drafter`] with a Domino head (GRU of 8, `embed_proj` through 16) whose correction keeps
/// the first `pure_draft_prefix_len` slots after the anchor uncorrected. `randomize` spreads
/// the head's weights too, so its correction is far from zero and changes drafts.
pub fn domino_drafter(
    vocab: i64,
    block_size: i64,
    seed: i64,
    pure_draft_prefix_len: i64,
) -> (nn::VarStore, Drafter) {
    let (plain_vs, plain) = drafter(vocab, block_size, seed);
    let mut cfg = plain.config().clone();
    drop((plain_vs, plain));
    cfg.head = DrafterHead::Domino(DominoConfig {
        emb_dim: 16,
        gru_hidden_dim: 8,
        pure_draft_prefix_len,
    });
    let _draws = seeded(seed);
    let vs = nn::VarStore::new(Device::Cpu);
    let d = Drafter::new(&vs.root(), &cfg);
    randomize(&vs, 0.5);
    (vs, d)
}

/// A DFlash drafter's backbone with a DSpark head of `kind` (rank 8, a confidence head), its
/// weights drawn large enough that the Markov bias moves drafts.
pub fn dspark_drafter(
    vocab: i64,
    block_size: i64,
    seed: i64,
    kind: MarkovHeadType,
) -> (nn::VarStore, Drafter) {
    let (plain_vs, plain) = drafter(vocab, block_size, seed);
    let mut cfg = plain.config().clone();
    drop((plain_vs, plain));
    cfg.head = DrafterHead::Dspark(DsparkConfig {
        markov_rank: 8,
        markov_head_type: kind,
        confidence_head: true,
        confidence_head_with_markov: true,
    });
    let _draws = seeded(seed);
    let vs = nn::VarStore::new(Device::Cpu);
    let d = Drafter::new(&vs.root(), &cfg);
    randomize(&vs, 0.5);
    (vs, d)
}

/// The target over `prompt` and the drafter's context after it; returns the context and the
/// target's greedy token after the prompt (the first block's root).
pub fn prefilled(target: &TargetModel, drafter: &Drafter, prompt: &[i64]) -> (DrafterCache, i64) {
    let mut cache = target.new_cache();
    let ids = Tensor::from_slice(prompt).view([1, prompt.len() as i64]);
    let taps = &drafter.config().target_layer_ids;
    let step = target.forward_cached(&ids, &mut cache, taps).unwrap();
    let mut context = drafter.new_cache();
    drafter.extend_context(&mut context, &step.taps);
    let last = step
        .logits
        .get(0)
        .get(prompt.len() as i64 - 1)
        .argmax(-1, false);
    (context, last.int64_value(&[]))
}

/// A DFlash drafter's backbone with DFlash2's convolutions (2 taps over groups of 8) and
/// selector (rank 4 over the unary top `top_k`), every weight drawn so the convolutions' dynamic
/// branch and the selector's transition are live and move drafts.
pub fn dflash2_drafter(
    vocab: i64,
    block_size: i64,
    seed: i64,
    top_k: i64,
) -> (nn::VarStore, Drafter) {
    let (plain_vs, plain) = drafter(vocab, block_size, seed);
    let mut cfg = plain.config().clone();
    drop((plain_vs, plain));
    cfg.head = DrafterHead::Dflash2(Dflash2Config {
        conv_kernel_size: 2,
        conv_group_size: 8,
        selector_rank: 4,
        selector_top_k: top_k,
        output_multiplier: 0.8,
        final_logit_softcapping: Some(6.0),
    });
    let _draws = seeded(seed);
    let vs = nn::VarStore::new(Device::Cpu);
    let d = Drafter::new(&vs.root(), &cfg);
    randomize(&vs, 0.5);
    (vs, d)
}

/// What [`assert_greedy_lossless`] saw of one prompt.
pub struct LosslessRun {
    /// A chain round committed a draft.
    pub accepted_chain: bool,
    /// A tree round committed a node.
    pub accepted_tree: bool,
    /// The chain drafting from the drafter's own logits and the one from the LM head alone
    /// accepted differently.
    pub base_differs: bool,
    /// The DDTree decodes at budgets 1, 4 and 16.
    pub trees: Vec<TreeGeneration>,
}

/// Greedy decoding of `prompt` (24 new tokens) with the target alone, the drafter's chain from
/// its own logits and from the LM head alone, and DDTree at budgets 1, 4 and 16: every output
/// must equal the target's, no chain round commit more than `max_commit` tokens, and the trees'
/// acceptance lengths account for every committed token. `at` names the case in failures.
pub fn assert_greedy_lossless(
    target: &TargetModel,
    drafter: &Drafter,
    prompt: &[i64],
    max_commit: usize,
    at: &str,
) -> LosslessRun {
    let settings = greedy(24);
    let plain = generate_target_only(target, prompt, &settings).unwrap();
    let chain = generate_chain(target, drafter, prompt, &settings).unwrap();
    assert_eq!(chain.output_ids, plain.output_ids, "{at}");
    assert!(
        chain.acceptance_lengths.iter().all(|&a| a <= max_commit),
        "{at}: a round committed more than {max_commit}"
    );
    let base =
        generate_chain_with(target, drafter, prompt, &settings, DraftLogits::LmHeadOnly).unwrap();
    assert_eq!(base.output_ids, plain.output_ids, "{at}: base");
    let trees: Vec<TreeGeneration> = [1usize, 4, 16]
        .iter()
        .map(|&budget| {
            let tree = generate_tree(target, drafter, prompt, &settings, budget).unwrap();
            assert_eq!(
                tree.generation.output_ids, plain.output_ids,
                "{at} {budget}"
            );
            let counted: usize = tree.generation.acceptance_lengths.iter().sum();
            assert_eq!(counted + 1, plain.output_ids.len(), "{at} {budget}");
            tree
        })
        .collect();
    LosslessRun {
        accepted_chain: chain.acceptance_lengths.iter().any(|&a| a > 1),
        accepted_tree: trees
            .iter()
            .any(|t| t.rounds.iter().any(|r| !r.accepted.is_empty())),
        base_differs: base.acceptance_lengths != chain.acceptance_lengths,
        trees,
    }
}
