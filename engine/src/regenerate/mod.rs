//! Regenerating chat data with the target: each row's assistant turns replaced, in order, by
//! the target's own greedy or sampled replies ([`rows`] says which turns and
//! how; [`crate::decode::generate_target_only`] generates), on a pool of worker threads.
//!
//! "Batched" here means `workers` conversations in flight at once: one thread each, with its
//! own [`TargetModel::replicate`] (weights shared, read-only, on the same device) and its own
//! KV / Gated DeltaNet caches, each decoding one sequence at a time (`forward_cached` takes one
//! sequence length per call, so sequences are not stacked into one forward). Rows come back in
//! input order whatever finishes first, and each turn's draws are seeded from the seed, the
//! row's line and the turn alone, so neither the worker count nor a resume changes the output.
pub mod output;
pub mod rows;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{channel, Receiver};
use std::sync::Mutex;

use self::rows::{render_prompt, split_reasoning, turn_seed, RegenRow};
use crate::data::ChatEncoder;
use crate::decode::{generate_target_only, DecodeError, Settings};
use crate::device::torch_panic::panic_text;
use crate::model::error::ModelError;
use crate::model::target::TargetModel;

/// Why a worker could not finish a job.
enum Failure {
    Decode(DecodeError),
    Panic(String),
}

type Done = (u64, u64, Result<Outcome, Failure>);

/// One input line.
#[derive(Debug, Clone)]
pub struct Job {
    /// 0-based line index in the input file (line number − 1).
    pub index: u64,
    pub text: String,
}

#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    /// The regenerated row, one output line without its newline.
    Row {
        line: String,
        turns: usize,
        /// Tokens the target generated for this row.
        tokens: usize,
    },
    /// The line cannot be regenerated (it is not a chat row training would take, or its
    /// prompt does not render or fit); it is left out, with this reason.
    Skipped { reason: String },
}

/// A finished job, handed to the sink in input order.
#[derive(Debug, Clone)]
pub struct Finished {
    pub index: u64,
    pub outcome: Outcome,
}

#[derive(Debug, thiserror::Error)]
pub enum RegenerateError<E: std::error::Error + 'static> {
    #[error("regenerating input line {line}: {cause}")]
    Decode { line: u64, cause: DecodeError },
    #[error("regenerating input line {line}: a worker panicked: {message}")]
    Panicked { line: u64, message: String },
    #[error("cannot make a target replica for a worker: {0}")]
    Replica(ModelError),
    #[error(transparent)]
    Sink(E),
}

/// Regenerates one row with the decoding `settings` of every generation: `seed` is the run's
/// seed, each turn drawing from its [`turn_seed`], and `max_new_tokens` is cut where the
/// target's context ends. `Err` is a failure of the target itself (which every later row would
/// meet too); a row's own problems are an [`Outcome::Skipped`].
pub fn regenerate_row(
    target: &TargetModel,
    encoder: &ChatEncoder,
    job: &Job,
    settings: &Settings,
) -> Result<Outcome, DecodeError> {
    let skipped = |reason: String| Ok(Outcome::Skipped { reason });
    let mut row = match RegenRow::parse(job.text.trim_start_matches('\u{feff}')) {
        Ok(row) => row,
        Err(reason) => return skipped(reason),
    };
    let context = target.config().max_position_embeddings() as usize;
    let mut tokens = 0;
    for turn in 0..row.turns() {
        let prompt = match row
            .prompt(turn)
            .and_then(|p| render_prompt(encoder.template(), encoder.options(), &p))
        {
            Ok(text) => text,
            Err(reason) => return skipped(format!("assistant turn {}: {reason}", turn + 1)),
        };
        let ids = match encoder.tokenizer().encode(prompt.as_str(), false) {
            Ok(encoding) => encoding
                .get_ids()
                .iter()
                .map(|&id| i64::from(id))
                .collect::<Vec<i64>>(),
            Err(e) => return skipped(format!("assistant turn {}: tokenizer: {e}", turn + 1)),
        };
        if ids.is_empty() || ids.len() >= context {
            return skipped(format!(
                "assistant turn {}: the prompt has {} tokens; the target takes 1 to {} \
                 (max_position_embeddings {context})",
                turn + 1,
                ids.len(),
                context - 1
            ));
        }
        let decode = Settings {
            max_new_tokens: settings.max_new_tokens.min(context - ids.len()),
            seed: turn_seed(settings.seed, job.index, turn),
            ..settings.clone()
        };
        let generated = generate_target_only(target, &ids, &decode)?;
        tokens += generated.output_ids.len();
        let ids: Vec<u32> = generated
            .output_ids
            .iter()
            .filter_map(|&id| u32::try_from(id).ok())
            .collect();
        let text = match encoder.tokenizer().decode(&ids, true) {
            Ok(text) => text,
            Err(e) => return skipped(format!("assistant turn {}: decoding: {e}", turn + 1)),
        };
        row.set_reply(turn, split_reasoning(&prompt, &text));
    }
    Ok(Outcome::Row {
        turns: row.turns(),
        line: row.into_line(job.index + 1),
        tokens,
    })
}

/// Regenerates `jobs` on `workers` threads (≥ 1) and hands every result to `sink` in input
/// order. `threads_per_worker` sets libtorch's CPU threads in each worker. Stops at the first
/// target failure or sink error; what the sink received before it stays received.
pub fn run<E: std::error::Error + Send + 'static>(
    target: &TargetModel,
    encoder: &ChatEncoder,
    jobs: impl Iterator<Item = Job>,
    settings: &Settings,
    workers: usize,
    threads_per_worker: Option<i32>,
    mut sink: impl FnMut(Finished) -> Result<(), E>,
) -> Result<(), RegenerateError<E>> {
    let workers = workers.max(1);
    let replicas = (0..workers)
        .map(|_| target.replicate(target.device()))
        .collect::<Result<Vec<_>, _>>()
        .map_err(RegenerateError::Replica)?;
    let (job_tx, job_rx) = channel::<(u64, Job)>();
    let job_rx = Mutex::new(job_rx);
    let (done_tx, done_rx) = channel::<Done>();
    let stop = AtomicBool::new(false);
    std::thread::scope(|scope| {
        for replica in replicas {
            let (job_rx, done_tx, stop) = (&job_rx, done_tx.clone(), &stop);
            scope.spawn(move || {
                if let Some(n) = threads_per_worker {
                    tch::set_num_threads(n);
                }
                while let Some((seq, job)) = next_job(job_rx, stop) {
                    // A panic is reported as this job's result, so the main thread never waits
                    // for a row that will not come.
                    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                        regenerate_row(&replica, encoder, &job, settings)
                    }))
                    .map_err(|payload| Failure::Panic(panic_text(payload.as_ref())))
                    .and_then(|r| r.map_err(Failure::Decode));
                    if done_tx.send((seq, job.index, result)).is_err() {
                        return;
                    }
                }
            });
        }
        drop(done_tx);
        let result = drive(jobs, workers, &job_tx, &done_rx, &mut sink);
        stop.store(true, Ordering::Relaxed);
        drop(job_tx);
        result
    })
}

fn next_job(jobs: &Mutex<Receiver<(u64, Job)>>, stop: &AtomicBool) -> Option<(u64, Job)> {
    if stop.load(Ordering::Relaxed) {
        return None;
    }
    jobs.lock().ok()?.recv().ok()
}

/// The main thread's loop: keeps up to two jobs per worker in flight (so memory is bounded by
/// the rows in flight, not the file), and releases results in input order.
fn drive<E: std::error::Error + 'static>(
    mut jobs: impl Iterator<Item = Job>,
    workers: usize,
    job_tx: &std::sync::mpsc::Sender<(u64, Job)>,
    done_rx: &Receiver<Done>,
    sink: &mut impl FnMut(Finished) -> Result<(), E>,
) -> Result<(), RegenerateError<E>> {
    let cap = 2 * workers as u64;
    let (mut fed, mut released) = (0u64, 0u64);
    let mut waiting: BTreeMap<u64, Finished> = BTreeMap::new();
    let mut exhausted = false;
    loop {
        while !exhausted && fed - released < cap {
            match jobs.next() {
                Some(job) => {
                    // The workers outlive this loop, so the channel is open.
                    let _ = job_tx.send((fed, job));
                    fed += 1;
                }
                None => exhausted = true,
            }
        }
        if released == fed {
            return Ok(());
        }
        let Ok((seq, index, result)) = done_rx.recv() else {
            unreachable!("workers only exit once the job channel closes, and panics are caught");
        };
        let line = index + 1;
        let outcome = result.map_err(|failure| match failure {
            Failure::Decode(cause) => RegenerateError::Decode { line, cause },
            Failure::Panic(message) => RegenerateError::Panicked { line, message },
        })?;
        waiting.insert(seq, Finished { index, outcome });
        while let Some(finished) = waiting.remove(&released) {
            sink(finished).map_err(RegenerateError::Sink)?;
            released += 1;
        }
    }
}
