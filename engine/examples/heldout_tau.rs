//! Greedy chain speculative decoding of the embedded default's held-out prompts
//! (`assets/tiny/heldout_prompts.jsonl`) against the embedded target: τ (tokens per target
//! forward) of a drafter, trained or not, and how often the target's answer is the tiny
//! language's rule (it ends with the end-of-turn token inside the limit).
//!
//! ```text
//! cargo run --release -p dflash-engine --example heldout_tau -- [EXPORTED_DRAFTER_DIR]
//! ```
//! With no argument the drafter is the embedded default's, freshly initialised (seed 0); with
//! one, the drafter `dflashd export` wrote from a run of the embedded default.
use std::path::Path;

use anyhow::{bail, Context, Result};
use dflash_engine::decode::{generate_chain, generate_target_only, Sampling, Settings};
use dflash_engine::embedded;
use dflash_engine::model::drafter::Drafter;
use dflash_engine::train::drafter_io::load_hf;
use tch::{nn, Device, Kind};

/// The task of a prompt's last user turn: the token after its last `USER` (3).
fn last_task(prompt: &[i64]) -> i64 {
    let user = prompt.iter().rposition(|&t| t == 3).unwrap_or(0);
    prompt.get(user + 1).copied().unwrap_or(-1)
}

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    tch::set_num_threads(1);
    let target = embedded::tiny_target(None, Device::Cpu)?;
    let (_vs, drafter, what) = match &args[..] {
        [] => {
            let _rng = dflash_engine::device::global_rng::seeded(0);
            let vs = nn::VarStore::new(Device::Cpu);
            let d = Drafter::new(&vs.root(), &embedded::tiny_drafter_config(target.config()));
            (vs, d, "untrained drafter".to_string())
        }
        [dir] => {
            let loaded = load_hf(Path::new(dir), Device::Cpu, Kind::Float)
                .with_context(|| format!("loading the exported drafter {dir}"))?;
            (loaded.vs, loaded.drafter, format!("drafter {dir}"))
        }
        _ => bail!("usage: heldout_tau [EXPORTED_DRAFTER_DIR]"),
    };
    let settings = Settings {
        max_new_tokens: 64,
        stop_tokens: vec![embedded::TINY_END_OF_TURN],
        sampling: Sampling::Greedy,
        seed: 0,
    };
    let prompts = embedded::tiny_heldout_prompts();
    let (mut taus, mut tokens, mut forwards, mut closed) = (Vec::new(), 0usize, 0usize, 0usize);
    for (i, prompt) in prompts.iter().enumerate() {
        let chain = generate_chain(&target, &drafter, prompt, &settings)?;
        let plain = generate_target_only(&target, prompt, &settings)?;
        if chain.output_ids != plain.output_ids {
            bail!("prompt {i}: chain output differs from the target's greedy output");
        }
        closed += usize::from(plain.output_ids.last() == Some(&embedded::TINY_END_OF_TURN));
        tokens += chain.acceptance_lengths.iter().sum::<usize>();
        forwards += chain.acceptance_lengths.len();
        println!(
            "prompt {i:2} (task token {}): tau {:.3} over {} rounds, acceptance {:?}",
            last_task(prompt),
            chain.tau(),
            chain.acceptance_lengths.len(),
            chain.acceptance_lengths
        );
        taus.push(chain.tau());
    }
    let mean = taus.iter().sum::<f64>() / taus.len() as f64;
    println!(
        "{what}: chain tau {mean:.3} (mean over {} prompts), pooled {:.3}; lossless on all; \
         the target closed its turn on {closed}/{} prompts",
        prompts.len(),
        tokens as f64 / forwards.max(1) as f64,
        prompts.len()
    );
    Ok(())
}
