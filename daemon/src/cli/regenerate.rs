//! `dflashd regenerate --target DIR --data chat.jsonl --out out.jsonl`: the chat data with every
//! assistant turn replaced by the target's own reply (greedy, or sampled and seeded per
//! conversation), as DFlash recipes train on, written as a chat `--data` file for training.
//!
//! The rows and turns are the engine's ([`dflash_engine::regenerate`],
//! [`dflash_engine::regenerate::rows`]); this file does the I/O around them: the settings
//! record beside the output, resuming from what an earlier run wrote, the ordered and synced
//! writes, and the progress line.
use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader, BufWriter, IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::Args;
use dflash_engine::data::{load_stop_tokens, ChatEncoder, ChatOptions};
use dflash_engine::decode::{Sampling, Settings};
use dflash_engine::device::{compute_kind, kind_name, name as device_name};
use dflash_engine::files::atomic_write::write_atomic;
use dflash_engine::model::target::{parse_dtype, TargetModel};
use dflash_engine::regenerate::output::{
    differences, scan_output, RegenerateRecord, RECORD_FORMAT,
};
use dflash_engine::regenerate::{run as regenerate, Finished, Job, Outcome};
use sha2::{Digest, Sha256};

use super::parse_device;

#[derive(Args, Debug)]
pub struct RegenerateArgs {
    /// Target model directory (HF layout, with `tokenizer.json` and a chat template).
    #[arg(long)]
    pub target: PathBuf,
    /// Chat JSONL (`conversations` rows) whose assistant turns are regenerated.
    #[arg(long)]
    pub data: PathBuf,
    /// Output JSONL; an existing one from an interrupted run is resumed.
    #[arg(long)]
    pub out: PathBuf,
    /// Most tokens generated per assistant turn (less where the target's context ends).
    #[arg(long, default_value_t = 2048)]
    pub max_new_tokens: usize,
    /// 0 is greedy; above 0 samples from softmax(logits / T).
    #[arg(long, default_value_t = 0.0)]
    pub temperature: f64,
    /// Sample only from the K most likely tokens (needs --temperature > 0).
    #[arg(long)]
    pub top_k: Option<usize>,
    /// Sample only from the smallest set of tokens holding this mass (needs --temperature > 0).
    #[arg(long)]
    pub top_p: Option<f64>,
    /// Seed of the draws; conversation i (0-based line) draws from seed + i.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Conversations in flight (worker threads, each with its own target caches). Default: the
    /// CPU threads of this machine.
    #[arg(long)]
    pub batch: Option<usize>,
    /// Chat template file (default: the target directory's template).
    #[arg(long)]
    pub chat_template: Option<PathBuf>,
    /// `cpu`, `cuda` or `cuda:N`.
    #[arg(long, default_value = "cpu")]
    pub device: String,
    /// Compute dtype `f32`, `bf16` or `f16` (default: bf16 on CUDA, f32 on CPU).
    #[arg(long)]
    pub dtype: Option<String>,
    /// libtorch CPU threads per worker (default: the CPU threads divided among the workers).
    #[arg(long)]
    pub threads: Option<i32>,
}

/// `<out>.regenerate.json`.
fn record_path(out: &Path) -> PathBuf {
    let mut name = out.file_name().unwrap_or_default().to_os_string();
    name.push(".regenerate.json");
    out.with_file_name(name)
}

pub fn run(args: RegenerateArgs) -> Result<()> {
    let sampling = sampling(&args)?;
    check_counts(&args)?;
    let device = parse_device(&args.device)?;
    let kind = match args.dtype.as_deref() {
        None => compute_kind(device),
        Some(name) => parse_dtype(name).map_err(|e| anyhow::anyhow!("--dtype: {e}"))?,
    };
    let data = std::fs::canonicalize(&args.data)
        .with_context(|| format!("--data {}: cannot open it", args.data.display()))?;
    if std::fs::canonicalize(&args.out).is_ok_and(|out| out == data) {
        bail!("--out is the --data file; write the regenerated data to another file");
    }
    let target_dir = std::fs::canonicalize(&args.target)
        .with_context(|| format!("--target {}: no such directory", args.target.display()))?;
    let options = ChatOptions::default();
    let encoder = ChatEncoder::from_model_dir(&target_dir, args.chat_template.as_deref(), options)?;
    let stop = load_stop_tokens(&target_dir)?;
    if stop.ids.is_empty() {
        eprintln!(
            "regenerate: stop tokens {}; every reply runs to --max-new-tokens",
            stop.describe()
        );
    }
    let stops = stop.ids;
    let record = regenerate_record(&args, &target_dir, &data, &encoder, &stops, (device, kind))?;
    let resume = prepare_output(&args.out, &record)?;
    let remaining = count_rows_after(&data, resume.after_line)?;

    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    let workers = args.batch.unwrap_or(cpus);
    let threads = args
        .threads
        .or_else(|| (device == tch::Device::Cpu).then(|| (cpus / workers).max(1) as i32));
    let target = TargetModel::load(&target_dir, device, Some(kind))?;
    let settings = Settings {
        max_new_tokens: args.max_new_tokens,
        stop_tokens: stops,
        sampling,
        seed: args.seed,
    };

    let mut writer = BufWriter::new(resume.file);
    let mut progress = Progress::new(remaining, std::io::stderr().is_terminal());
    let mut unsynced = 0usize;
    let mut read_error = None;
    let jobs = rows_after(&data, resume.after_line, &mut read_error)?;
    let sink = |finished: Finished| -> std::io::Result<()> {
        match finished.outcome {
            Outcome::Row { line, tokens, .. } => {
                writer.write_all(line.as_bytes())?;
                writer.write_all(b"\n")?;
                progress.row(tokens);
                unsynced += 1;
                // Synced per batch: a crash loses at most the rows since, which a resume
                // regenerates (identically: seeds do not depend on the run).
                if unsynced >= workers {
                    writer.flush()?;
                    writer.get_ref().sync_data()?;
                    unsynced = 0;
                }
            }
            Outcome::Skipped { reason } => {
                progress.say(&format!(
                    "data: {}:{}: {reason} (skipped)",
                    data.display(),
                    finished.index + 1
                ));
                progress.skipped();
            }
        }
        progress.draw();
        Ok(())
    };
    let result = regenerate(&target, &encoder, jobs, &settings, workers, threads, sink);
    writer.flush()?;
    writer.get_ref().sync_data()?;
    progress.finish();
    result.with_context(|| {
        format!(
            "rows written so far are kept in {}; run the same command again to resume",
            args.out.display()
        )
    })?;
    if let Some(e) = read_error {
        return Err(e).with_context(|| {
            format!(
                "reading {} stopped; {} holds the rows before it",
                data.display(),
                args.out.display()
            )
        });
    }
    report_end(&args, &data, resume.rows, &progress, workers)
}

/// The counts no run can fix: refused before anything is opened.
fn check_counts(args: &RegenerateArgs) -> Result<()> {
    if args.max_new_tokens == 0 {
        bail!("--max-new-tokens: expected at least 1");
    }
    if args.batch == Some(0) {
        bail!("--batch: expected at least 1");
    }
    if args.threads.is_some_and(|n| n < 1) {
        bail!("--threads: expected at least 1");
    }
    Ok(())
}

/// What this regeneration is, recorded beside the output: a resume must be the same one.
fn regenerate_record(
    args: &RegenerateArgs,
    target_dir: &Path,
    data: &Path,
    encoder: &ChatEncoder,
    stops: &[i64],
    (device, kind): (tch::Device, tch::Kind),
) -> Result<RegenerateRecord> {
    Ok(RegenerateRecord {
        format: RECORD_FORMAT,
        target: target_dir.display().to_string(),
        target_digest: target_digest(target_dir)?,
        data: data.display().to_string(),
        chat_template: encoder.template().origin().display().to_string(),
        chat_template_sha256: file_sha256(encoder.template().origin())?,
        enable_thinking: encoder.options().enable_thinking,
        max_new_tokens: args.max_new_tokens,
        temperature: args.temperature,
        top_k: args.top_k,
        top_p: args.top_p,
        seed: args.seed,
        stop_tokens: stops.to_vec(),
        device: device_name(device),
        dtype: kind_name(kind).to_string(),
    })
}

/// The summary line, and a refusal when nothing at all could be regenerated.
fn report_end(
    args: &RegenerateArgs,
    data: &Path,
    resumed_rows: u64,
    progress: &Progress,
    workers: usize,
) -> Result<()> {
    eprintln!(
        "regenerate: {}{}",
        progress.summary(workers),
        if resumed_rows > 0 {
            format!(
                "; resumed after {} rows already in {}",
                resumed_rows,
                args.out.display()
            )
        } else {
            String::new()
        }
    );
    if resumed_rows + progress.rows == 0 {
        bail!(
            "no conversation of {} could be regenerated ({} skipped, reasons above)",
            data.display(),
            progress.skipped
        );
    }
    Ok(())
}

fn sampling(args: &RegenerateArgs) -> Result<Sampling> {
    if args.temperature == 0.0 {
        if args.top_k.is_some() || args.top_p.is_some() {
            bail!("--top-k / --top-p sample; give them with --temperature above 0");
        }
        return Ok(Sampling::Greedy);
    }
    let sampling = Sampling::Sample {
        temperature: args.temperature,
        top_k: args.top_k,
        top_p: args.top_p,
    };
    sampling.validate()?;
    Ok(sampling)
}

fn read_json(path: &Path) -> Result<Option<serde_json::Value>> {
    if !path.is_file() {
        return Ok(None);
    }
    let text =
        std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
    serde_json::from_str(&text)
        .map(Some)
        .with_context(|| format!("{} is not valid JSON", path.display()))
}

fn file_sha256(path: &Path) -> Result<String> {
    let digest = dflash_engine::files::hash::sha256_file(path)
        .with_context(|| format!("cannot read {}", path.display()))?;
    Ok(digest.sha256)
}

/// SHA-256 over `config.json` and `tokenizer.json` (their bytes) and the weight files (their
/// names and sizes), in name order.
fn target_digest(dir: &Path) -> Result<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .with_context(|| format!("cannot list {}", dir.display()))?
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .collect();
    names.sort();
    let mut hash = Sha256::new();
    for name in names {
        let path = dir.join(&name);
        if name == "config.json" || name == "tokenizer.json" {
            hash.update(name.as_bytes());
            hash.update(file_sha256(&path)?.as_bytes());
        } else if name.ends_with(".safetensors") {
            let size = std::fs::metadata(&path)
                .with_context(|| format!("cannot read {}", path.display()))?
                .len();
            hash.update(format!("{name}:{size}").as_bytes());
        }
    }
    Ok(hex::encode(hash.finalize()))
}

/// The output, opened for appending after what an earlier run wrote.
struct Resume {
    file: File,
    /// Rows already in the output.
    rows: u64,
    /// Input line numbers up to this one are done.
    after_line: u64,
}

/// A fresh output gets the record; an existing one is resumed only with the same record, its
/// rows checked and a torn last line cut away.
fn prepare_output(out: &Path, record: &RegenerateRecord) -> Result<Resume> {
    let sidecar = record_path(out);
    let existing = std::fs::metadata(out).map(|m| m.len()).unwrap_or(0);
    let open = || {
        OpenOptions::new()
            .create(true)
            .append(true)
            .open(out)
            .with_context(|| format!("cannot open {} for writing", out.display()))
    };
    if existing == 0 {
        let text = serde_json::to_string_pretty(record)? + "\n";
        write_atomic(&sidecar, text.as_bytes())
            .with_context(|| format!("cannot write {}", sidecar.display()))?;
        return Ok(Resume {
            file: open()?,
            rows: 0,
            after_line: 0,
        });
    }
    let Some(recorded) = read_json(&sidecar)? else {
        bail!(
            "{} already has data but no {}: it was not written by `dflashd regenerate`, or its \
             record was removed, so it cannot be resumed. Choose another --out, or move it away",
            out.display(),
            sidecar.display()
        );
    };
    let changed = differences(&recorded, record);
    if !changed.is_empty() {
        bail!(
            "{} was written with other settings, so resuming would mix two kinds of rows:\n  {}\n\
             Run again with the recorded settings to resume, or write to another --out (or move \
             {} and {} away) to start over",
            out.display(),
            changed.join("\n  "),
            out.display(),
            sidecar.display()
        );
    }
    let reader =
        BufReader::new(File::open(out).with_context(|| format!("cannot read {}", out.display()))?);
    let scan =
        scan_output(reader).with_context(|| format!("{} cannot be resumed", out.display()))?;
    let file = open()?;
    if scan.torn_bytes > 0 {
        file.set_len(scan.kept_bytes)
            .with_context(|| format!("cannot cut the torn last line of {}", out.display()))?;
        file.sync_data()?;
        eprintln!(
            "regenerate: {}: the last line ({} bytes) was cut short by an interrupted run; \
             removed it, its conversation is regenerated",
            out.display(),
            scan.torn_bytes
        );
    }
    Ok(Resume {
        file,
        rows: scan.rows,
        after_line: scan.last_source_line.unwrap_or(0),
    })
}

/// Non-blank input lines after line `after` (the conversations left to do).
fn count_rows_after(data: &Path, after: u64) -> Result<u64> {
    let mut read_error = None;
    let count = rows_after(data, after, &mut read_error)?.count() as u64;
    match read_error {
        Some(e) => Err(e).with_context(|| format!("cannot read {}", data.display())),
        None => Ok(count),
    }
}

/// The non-blank lines after line `after`, read as they are needed; a read error ends them and
/// is left in `error`.
fn rows_after<'a>(
    data: &Path,
    after: u64,
    error: &'a mut Option<std::io::Error>,
) -> Result<impl Iterator<Item = Job> + 'a> {
    let file = File::open(data).with_context(|| format!("cannot read {}", data.display()))?;
    let lines = BufReader::new(file).lines();
    Ok(lines
        .enumerate()
        .map_while(move |(index, line)| match line {
            Ok(text) => Some((index as u64, text)),
            Err(e) => {
                *error = Some(e);
                None
            }
        })
        .filter(move |(index, text)| *index >= after && !text.trim().is_empty())
        .map(|(index, text)| Job { index, text }))
}

/// Conversations done of total, tokens/s and the ETA on one line of stderr, redrawn twice a
/// second on a terminal; nothing on a pipe or file until the summary.
struct Progress {
    total: u64,
    rows: u64,
    skipped: u64,
    tokens: u64,
    started: Instant,
    drawn: Option<Instant>,
    live: bool,
}

impl Progress {
    fn new(total: u64, live: bool) -> Self {
        Progress {
            total,
            rows: 0,
            skipped: 0,
            tokens: 0,
            started: Instant::now(),
            drawn: None,
            live,
        }
    }

    fn row(&mut self, tokens: usize) {
        self.rows += 1;
        self.tokens += tokens as u64;
    }

    fn skipped(&mut self) {
        self.skipped += 1;
    }

    /// A message of its own line, above the progress line.
    fn say(&mut self, text: &str) {
        if self.live {
            eprint!("\r\x1b[2K");
            self.drawn = None;
        }
        eprintln!("{text}");
    }

    fn draw(&mut self) {
        let due = self
            .drawn
            .is_none_or(|at| at.elapsed() >= Duration::from_millis(500));
        if self.live && due {
            let text = progress_text(
                self.rows + self.skipped,
                self.total,
                self.tokens,
                self.started.elapsed(),
            );
            eprint!("\r\x1b[2K{text}");
            self.drawn = Some(Instant::now());
        }
    }

    fn finish(&mut self) {
        if self.live && self.drawn.is_some() {
            eprint!("\r\x1b[2K");
        }
    }

    fn summary(&self, workers: usize) -> String {
        let secs = self.started.elapsed().as_secs_f64();
        format!(
            "{} conversations regenerated, {} skipped; {} tokens in {:.1} s ({:.1} tokens/s, {} \
             in flight)",
            self.rows,
            self.skipped,
            self.tokens,
            secs,
            rate(self.tokens, secs),
            workers
        )
    }
}

fn rate(count: u64, secs: f64) -> f64 {
    if secs > 0.0 {
        count as f64 / secs
    } else {
        0.0
    }
}

/// `regenerate: 12/100 conversations, 35.2 tokens/s, ETA 3m10s`.
fn progress_text(done: u64, total: u64, tokens: u64, elapsed: Duration) -> String {
    let secs = elapsed.as_secs_f64();
    let eta = if done == 0 || done >= total {
        "-".to_string()
    } else {
        let left = secs / done as f64 * (total - done) as f64;
        clock(Duration::from_secs_f64(left))
    };
    format!(
        "regenerate: {done}/{total} conversations, {:.1} tokens/s, ETA {eta}",
        rate(tokens, secs)
    )
}

/// `42s`, `3m10s`, `2h05m`.
fn clock(d: Duration) -> String {
    let s = d.as_secs();
    match s {
        0..=59 => format!("{s}s"),
        60..=3599 => format!("{}m{:02}s", s / 60, s % 60),
        _ => format!("{}h{:02}m", s / 3600, s % 3600 / 60),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_progress_line_counts_rate_and_eta() {
        let t = progress_text(10, 40, 500, Duration::from_secs(20));
        assert_eq!(
            t,
            "regenerate: 10/40 conversations, 25.0 tokens/s, ETA 1m00s"
        );
        assert!(progress_text(0, 5, 0, Duration::ZERO).ends_with("0.0 tokens/s, ETA -"));
        assert!(progress_text(5, 5, 9, Duration::from_secs(3)).ends_with("ETA -"));
        assert_eq!(clock(Duration::from_secs(7300)), "2h01m");
        assert_eq!(clock(Duration::from_secs(59)), "59s");
    }

    #[test]
    fn the_record_sits_beside_the_output() {
        assert_eq!(
            record_path(Path::new("/d/out.jsonl")),
            Path::new("/d/out.jsonl.regenerate.json")
        );
    }
}
