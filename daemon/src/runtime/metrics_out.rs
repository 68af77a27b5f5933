//! `metrics.jsonl` (one `StepMetrics` object per line, flushed per step), the same line as a
//! TensorBoard event when `[tensorboard]` is on, and the progress lines on stdout. A write
//! failure is reported once, journaled, and training goes on: the same metrics still reach the
//! status, the subscribers and the run's recording.
//!
//! Each line goes out in one `write` with its newline, and opening cuts off a torn last line
//! (a kill -9 inside a write): otherwise the next start's first line would be glued to the
//! fragment and both lost to every reader. The torn line's step is never lost with it: a step's
//! line is written before its checkpoint, so a kill that tore it also lost the step, which the
//! resumed run trains (and writes) again.
use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use dflash_shared::events::{EventKind, Severity};
use dflash_shared::metrics::{tree_label, StepMetrics, TreeOracleTau};

use super::tensorboard::TensorBoardOut;
use crate::run::handle::RunHandle;

pub struct MetricsOut {
    file: File,
    path: PathBuf,
    tensorboard: Option<TensorBoardOut>,
    log_every: u64,
    total_steps: u64,
    failed: bool,
}

impl MetricsOut {
    pub fn open(path: &Path, log_every: u64, total_steps: u64) -> std::io::Result<Self> {
        if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
            std::fs::create_dir_all(parent)?;
        }
        let file = OpenOptions::new()
            .create(true)
            .read(true)
            .append(true)
            .open(path)?;
        let torn = cut_torn_tail(&file)?;
        if torn > 0 {
            tracing::warn!(
                path = %path.display(),
                bytes = torn,
                "cut off a torn last metrics line (the previous process died writing it)"
            );
        }
        Ok(MetricsOut {
            file,
            path: path.to_path_buf(),
            tensorboard: None,
            log_every,
            total_steps,
            failed: false,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Also writes every line to `tensorboard`'s event file.
    pub fn with_tensorboard(mut self, tensorboard: TensorBoardOut) -> Self {
        self.tensorboard = Some(tensorboard);
        self
    }

    pub fn write(&mut self, m: &StepMetrics, handle: &RunHandle) {
        // Serialized once: the event file's scalars are the numbers of this very line.
        let value = serde_json::to_value(m);
        if let (Some(tb), Ok(value)) = (&mut self.tensorboard, &value) {
            tb.write(value, handle);
        }
        let written = value
            .map_err(std::io::Error::other)
            .and_then(|value| {
                let mut line = serde_json::to_string(&value).map_err(std::io::Error::other)?;
                line.push('\n');
                self.file.write_all(line.as_bytes())
            })
            .and_then(|_| self.file.flush());
        if let Err(e) = written {
            if !self.failed {
                self.failed = true;
                let message = format!(
                    "writing metrics to {} failed ({e}); later lines are skipped, status and the recording still have them",
                    self.path.display()
                );
                tracing::error!("{message}");
                handle.record_event_logged(Severity::Warn, EventKind::Note { message });
            }
        }
        if let Some(line) = progress_line(m, self.total_steps, self.log_every) {
            say(&line);
        }
    }
}

/// Truncates `file` after its last newline; returns how many bytes were cut (0 when it ends
/// on a complete line or is empty).
fn cut_torn_tail(mut file: &File) -> std::io::Result<u64> {
    let len = file.metadata()?.len();
    // Lines are a few hundred bytes; the search goes back in 4 KiB pieces.
    let mut end = len;
    let mut buf = [0u8; 4096];
    while end > 0 {
        let start = end.saturating_sub(buf.len() as u64);
        let piece = &mut buf[..(end - start) as usize];
        file.seek(SeekFrom::Start(start))?;
        file.read_exact(piece)?;
        if let Some(i) = piece.iter().rposition(|&b| b == b'\n') {
            let keep = start + i as u64 + 1;
            if keep < len {
                file.set_len(keep)?;
            }
            return Ok(len - keep);
        }
        end = start;
    }
    if len > 0 {
        file.set_len(0)?;
    }
    Ok(len)
}

/// Prints a line on stdout. A stdout nobody reads any more (`dflashd start | head`) is not a
/// reason to stop training, so a failed write is ignored rather than a panic.
pub fn say(line: &str) {
    let _ = writeln!(std::io::stdout().lock(), "{line}");
}

/// The stdout line for a step: every `log_every` steps and on every evaluation, offline or
/// online. The tree τ at the serving budget stands beside chain τ as `tree@<budget>`, offline
/// (the oracle) and online (that budget's DDTree method).
pub fn progress_line(m: &StepMetrics, total_steps: u64, log_every: u64) -> Option<String> {
    let show = m.tau.is_some() || m.online.is_some() || (log_every > 0 && m.step % log_every == 0);
    show.then(|| {
        let mut tau = m.tau.map(|t| format!(" tau {t:.3}")).unwrap_or_default();
        if let Some((budget, t)) = m.tau_tree.as_ref().and_then(TreeOracleTau::at_serve_budget) {
            tau.push_str(&format!(" {} {t:.3}", tree_label(budget)));
        }
        if let Some(online) = &m.online {
            tau.push_str(" online");
            for (method, t) in online.methods() {
                let name = match online.serve_tree_budget {
                    Some(budget) if method == format!("ddtree_{budget}") => tree_label(budget),
                    _ => method,
                };
                tau.push_str(&format!(" {name} {t:.3}"));
            }
            tau.push_str(&format!(
                " ({} prompts, {:.1} s)",
                online.prompts, online.seconds
            ));
        }
        let mfu = m
            .mfu
            .map(|u| format!(" mfu {:.1}%", 100.0 * u))
            .unwrap_or_default();
        format!(
            "step {}/{} epoch {} loss {:.4} acc {:.3}{tau} lr {:.2e} grad_norm {:.3} tok/s {:.0} draft_pos/s {:.0}{mfu}",
            m.step,
            total_steps,
            m.epoch,
            m.loss,
            m.accuracy,
            m.lr,
            m.grad_norm,
            m.tokens_per_s,
            m.draft_positions_per_s
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use dflash_shared::metrics::StepTimes;

    #[test]
    fn a_torn_last_line_is_cut_off_and_complete_lines_are_kept() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("metrics.jsonl");
        let open = |p: &Path| OpenOptions::new().read(true).append(true).open(p).unwrap();
        std::fs::write(&path, "{\"step\":1}\n{\"step\":2}\n{\"st").unwrap();
        assert_eq!(cut_torn_tail(&open(&path)).unwrap(), 4);
        assert_eq!(
            std::fs::read_to_string(&path).unwrap(),
            "{\"step\":1}\n{\"step\":2}\n"
        );
        assert_eq!(cut_torn_tail(&open(&path)).unwrap(), 0);
        assert_eq!(
            std::fs::read_to_string(&path).unwrap(),
            "{\"step\":1}\n{\"step\":2}\n"
        );
        // A line longer than one search piece, torn with no newline before it at all.
        std::fs::write(&path, "x".repeat(10_000)).unwrap();
        assert_eq!(cut_torn_tail(&open(&path)).unwrap(), 10_000);
        assert_eq!(std::fs::metadata(&path).unwrap().len(), 0);
        // A newline far back (more than one piece) is found.
        std::fs::write(&path, format!("{{}}\n{}", "y".repeat(9_000))).unwrap();
        assert_eq!(cut_torn_tail(&open(&path)).unwrap(), 9_000);
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "{}\n");
    }

    #[test]
    fn progress_lines_on_schedule_and_on_evaluations() {
        let mut m = StepMetrics {
            ts_ms: 0,
            step: 10,
            epoch: 1,
            loss: 2.0,
            accuracy: 0.25,
            tau: None,
            tau_tree: None,
            lr: 1e-3,
            grad_norm: 0.5,
            tokens_per_s: 1500.0,
            draft_positions_per_s: 24_000.0,
            mfu: None,
            workers: vec![],
            times: StepTimes::default(),
            online: None,
            domino: None,
            dspark: None,
            dflash2: None,
            job: None,
        };
        assert_eq!(
            progress_line(&m, 600, 10).unwrap(),
            "step 10/600 epoch 1 loss 2.0000 acc 0.250 lr 1.00e-3 grad_norm 0.500 tok/s 1500 draft_pos/s 24000"
        );
        m.mfu = Some(0.123);
        assert!(progress_line(&m, 600, 10).unwrap().ends_with(" mfu 12.3%"));
        m.mfu = None;
        m.step = 11;
        assert_eq!(progress_line(&m, 600, 10), None);
        assert_eq!(progress_line(&m, 600, 0), None);
        m.tau = Some(2.5);
        assert!(progress_line(&m, 600, 0)
            .unwrap()
            .contains(" tau 2.500 lr "));
        m.tau_tree = Some(dflash_shared::metrics::TreeOracleTau {
            serve_budget: 32,
            by_budget: [(8, 2.75), (32, 3.125)].into_iter().collect(),
        });
        assert!(progress_line(&m, 600, 0)
            .unwrap()
            .contains(" tau 2.500 tree@32 3.125 lr "));
        m.tau = None;
        m.tau_tree = None;
        m.online = Some(dflash_shared::metrics::OnlineAcceptance {
            tau_chain: 2.25,
            tau_ddtree: [(8, 2.5), (32, 2.75)].into_iter().collect(),
            serve_tree_budget: None,
            offline_tau: None,
            base: None,
            prompts: 8,
            seconds: 1.25,
        });
        assert!(
            progress_line(&m, 600, 0).unwrap().contains(
                " acc 0.250 online chain 2.250 ddtree_8 2.500 ddtree_32 2.750 (8 prompts, 1.2 s) lr "
            ),
            "{:?}",
            progress_line(&m, 600, 0)
        );
        m.online.as_mut().unwrap().serve_tree_budget = Some(32);
        assert!(
            progress_line(&m, 600, 0).unwrap().contains(
                " online chain 2.250 ddtree_8 2.500 tree@32 2.750 (8 prompts, 1.2 s) lr "
            ),
            "{:?}",
            progress_line(&m, 600, 0)
        );
    }
}
