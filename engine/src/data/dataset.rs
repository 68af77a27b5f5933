//! Loading a JSONL data file into samples, accounting for every line.
//!
//! A bad line never stops the load: it is recorded in [`LoadReport::bad_lines`] with its line
//! number and reason, and skipped. Only file-level problems (missing file, unreadable file, no
//! usable line at all) are errors.
//!
//! Memory follows the longest line, not the file: a line over [`LoadOptions::max_line_bytes`]
//! is consumed without being kept and becomes a bad line naming `data.max_line_bytes`, and the
//! lines handed to the workers at a time are bounded in bytes as well as in count, so a few
//! huge rows are never parsed (and tokenized, which takes many times a line's size) together.
use std::fs::File;
use std::io::{self, BufRead, BufReader};
use std::path::Path;

use super::encoder::ChatEncoder;
use super::error::DataError;
use super::pretokenized;
use super::sample::{has_consecutive_supervised, BadLine, LoadReport, Sample};

/// Lines handed to the worker threads at a time; bounds memory on multi-GB files.
const BATCH_LINES: usize = 4096;
/// Bytes of lines handed to the worker threads at a time; a batch ends after the line that
/// reaches it, so one line longer than this is processed alone.
const BATCH_BYTES: u64 = 8 << 20;

/// What the lines of a file are.
#[derive(Debug, Clone, Copy)]
pub enum DataFormat<'a> {
    /// `{"input_ids": [...], "loss_mask": [...]}` rows.
    Pretokenized,
    /// SpecForge-style `{"conversations": [...]}` rows, rendered and tokenized by the encoder.
    Chat(&'a ChatEncoder),
}

#[derive(Debug, Clone)]
pub struct LoadOptions {
    /// Rows longer than this are cut to it (SF `max_length`).
    pub max_length: usize,
    /// Token ids must be below this (the model's embedding rows), when given.
    pub vocab_size: Option<usize>,
    /// Worker threads for tokenization; 0 uses every available core.
    pub threads: usize,
    /// A line longer than this many bytes (its line end not counted) is a bad line, skipped
    /// without being read into memory (the config's `data.max_line_bytes`).
    pub max_line_bytes: u64,
}

/// One line as read from the file.
enum RawLine {
    Line(Vec<u8>),
    /// Longer than the limit: only its length was kept.
    TooLong {
        bytes: u64,
    },
}

impl RawLine {
    fn bytes(&self) -> u64 {
        match self {
            RawLine::Line(l) => l.len() as u64,
            RawLine::TooLong { bytes } => *bytes,
        }
    }
}

/// Reads one line (keeping its `\n`) if it has at most `limit` bytes before the line end;
/// a longer one is read to its end and dropped, so memory never exceeds `limit` plus the
/// reader's buffer. `None` at the end of the input.
fn read_line_bounded<R: BufRead>(reader: &mut R, limit: u64) -> io::Result<Option<RawLine>> {
    let mut line = Vec::new();
    let (mut content, mut any, mut too_long) = (0u64, false, false);
    loop {
        let buf = reader.fill_buf()?;
        if buf.is_empty() {
            break;
        }
        any = true;
        let (take, ends) = match buf.iter().position(|&b| b == b'\n') {
            Some(i) => (i + 1, true),
            None => (buf.len(), false),
        };
        content += (take - usize::from(ends)) as u64;
        if !too_long && content > limit {
            too_long = true;
            line = Vec::new();
        }
        if !too_long {
            line.extend_from_slice(&buf[..take]);
        }
        reader.consume(take);
        if ends {
            break;
        }
    }
    Ok(match (any, too_long) {
        (false, _) => None,
        (true, true) => Some(RawLine::TooLong { bytes: content }),
        (true, false) => Some(RawLine::Line(line)),
    })
}

enum Outcome {
    Blank,
    Sample { sample: Sample, truncated: bool },
    TooShort,
    Bad(String),
}

/// Reads `path` line by line in `format`; samples come back in file order.
pub fn load(
    path: &Path,
    format: DataFormat<'_>,
    options: &LoadOptions,
) -> Result<(Vec<Sample>, LoadReport), DataError> {
    if options.max_length < 2 {
        return Err(DataError::BadOption {
            key: "data.max_length",
            expected: "at least 2 tokens",
            found: options.max_length.to_string(),
        });
    }
    if options.max_line_bytes == 0 {
        return Err(DataError::BadOption {
            key: "data.max_line_bytes",
            expected: "at least 1 byte (e.g. \"16 MiB\")",
            found: "0".to_string(),
        });
    }
    if !path.is_file() {
        return Err(DataError::MissingFile {
            what: "data file",
            path: path.to_path_buf(),
        });
    }
    let io_error = |source| DataError::Io {
        what: "data file",
        path: path.to_path_buf(),
        cause: source,
    };
    let mut reader = BufReader::new(File::open(path).map_err(io_error)?);
    let threads = match options.threads {
        0 => std::thread::available_parallelism().map_or(1, |n| n.get()),
        n => n,
    };
    let mut samples = Vec::new();
    let mut report = LoadReport::default();
    let mut batch: Vec<RawLine> = Vec::with_capacity(BATCH_LINES);
    loop {
        batch.clear();
        let mut batch_bytes = 0u64;
        while batch.len() < BATCH_LINES && batch_bytes < BATCH_BYTES {
            let Some(line) =
                read_line_bounded(&mut reader, options.max_line_bytes).map_err(io_error)?
            else {
                break;
            };
            batch_bytes += line.bytes();
            batch.push(line);
        }
        if batch.is_empty() {
            break;
        }
        let first_line = report.lines + 1;
        for (offset, outcome) in process_batch(&batch, format, options, threads)
            .into_iter()
            .enumerate()
        {
            let line = first_line + offset as u64;
            report.lines += 1;
            match outcome {
                Outcome::Blank => report.blank_lines += 1,
                Outcome::TooShort => report.skipped_too_short.push(line),
                Outcome::Bad(reason) => report.bad_lines.push(BadLine {
                    file: path.to_path_buf(),
                    line,
                    reason,
                }),
                Outcome::Sample { sample, truncated } => {
                    report.samples += 1;
                    report.truncated += u64::from(truncated);
                    samples.push(sample);
                }
            }
        }
    }
    if samples.is_empty() {
        return Err(DataError::NoUsableSamples {
            path: path.to_path_buf(),
            lines: report.lines,
            bad: report.bad_lines.len(),
            too_short: report.skipped_too_short.len(),
            first_bad: report
                .bad_lines
                .first()
                .map(|b| format!("; first bad line: {b}"))
                .unwrap_or_default(),
        });
    }
    Ok((samples, report))
}

/// Processes lines on up to `threads` scoped threads, keeping their order.
fn process_batch(
    lines: &[RawLine],
    format: DataFormat<'_>,
    options: &LoadOptions,
    threads: usize,
) -> Vec<Outcome> {
    let chunk = lines.len().div_ceil(threads.max(1)).max(1);
    if threads <= 1 || lines.len() <= chunk {
        return lines
            .iter()
            .map(|l| process_line(l, format, options))
            .collect();
    }
    std::thread::scope(|scope| {
        let workers: Vec<_> = lines
            .chunks(chunk)
            .map(|part| {
                scope.spawn(move || {
                    part.iter()
                        .map(|l| process_line(l, format, options))
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        workers
            .into_iter()
            .flat_map(|w| match w.join() {
                Ok(outcomes) => outcomes,
                // Line processing returns errors rather than panicking; a panic here is a bug
                // in a dependency, and hiding it would drop lines silently.
                Err(panic) => std::panic::resume_unwind(panic),
            })
            .collect()
    })
}

fn process_line(raw: &RawLine, format: DataFormat<'_>, options: &LoadOptions) -> Outcome {
    let raw = match raw {
        RawLine::Line(raw) => raw,
        RawLine::TooLong { bytes } => {
            return Outcome::Bad(format!(
                "the line is {bytes} bytes, over data.max_line_bytes = {}; it was skipped \
                 without being read. Raise data.max_line_bytes if rows this long are intended \
                 (a chat row takes many times its size in memory while it is tokenized)",
                options.max_line_bytes
            ))
        }
    };
    let Ok(text) = std::str::from_utf8(raw) else {
        return Outcome::Bad("not valid UTF-8".to_string());
    };
    // Windows line ends and a UTF-8 byte-order mark are editor artifacts, not bad data.
    let text = text
        .trim_end_matches(['\n', '\r'])
        .trim_start_matches('\u{feff}');
    if text.trim().is_empty() {
        return Outcome::Blank;
    }
    let parsed = match format {
        DataFormat::Pretokenized => pretokenized::parse_line(text, options.vocab_size),
        DataFormat::Chat(encoder) => encoder
            .encode_line(text)
            .and_then(|encoded| check_vocab(encoded.sample, options.vocab_size)),
    };
    match parsed {
        Err(reason) => Outcome::Bad(reason),
        Ok(sample) => finish(sample, options.max_length),
    }
}

fn check_vocab(sample: Sample, vocab_size: Option<usize>) -> Result<Sample, String> {
    if let Some(limit) = vocab_size {
        if let Some(pos) = sample
            .input_ids
            .iter()
            .position(|&id| id as u64 >= limit as u64)
        {
            return Err(format!(
                "token {pos} has id {} but the model's vocab_size is {limit}; the tokenizer \
                 does not match the model",
                sample.input_ids[pos]
            ));
        }
    }
    Ok(sample)
}

/// Truncates to `max_length`, then drops rows DFlash cannot anchor on.
fn finish(mut sample: Sample, max_length: usize) -> Outcome {
    let truncated = sample.len() > max_length;
    sample.input_ids.truncate(max_length);
    sample.loss_mask.truncate(max_length);
    if has_consecutive_supervised(&sample.loss_mask) {
        Outcome::Sample { sample, truncated }
    } else {
        Outcome::TooShort
    }
}

impl LoadReport {
    /// One line for logs and the journal.
    pub fn summary(&self) -> String {
        let mut text = format!(
            "{} samples from {} lines: {} bad, {} without two consecutive supervised tokens, \
             {} blank, {} truncated to max_length",
            self.samples,
            self.lines,
            self.bad_lines.len(),
            self.skipped_too_short.len(),
            self.blank_lines,
            self.truncated
        );
        if let Some(first) = self.bad_lines.first() {
            text.push_str(&format!("; first bad line: {first}"));
        }
        text
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn outcome(line: &str, max_length: usize) -> Outcome {
        let options = LoadOptions {
            max_length,
            vocab_size: Some(100),
            threads: 1,
            max_line_bytes: 1 << 20,
        };
        process_line(
            &RawLine::Line(line.as_bytes().to_vec()),
            DataFormat::Pretokenized,
            &options,
        )
    }

    #[test]
    fn crlf_bom_and_blank_lines_are_not_bad_data() {
        let row = "\u{feff}{\"input_ids\":[1,2,3],\"loss_mask\":[0,1,1]}\r\n";
        assert!(matches!(
            outcome(row, 8),
            Outcome::Sample {
                truncated: false,
                ..
            }
        ));
        assert!(matches!(outcome(" \t\r\n", 8), Outcome::Blank));
        assert!(matches!(
            process_line(&RawLine::Line(vec![0xff, b'\n']), DataFormat::Pretokenized, &LoadOptions { max_length: 8, vocab_size: None, threads: 1, max_line_bytes: 8 }),
            Outcome::Bad(reason) if reason.contains("UTF-8")
        ));
    }

    #[test]
    fn truncation_happens_before_the_anchor_check() {
        let row = r#"{"input_ids":[1,2,3,4],"loss_mask":[0,0,1,1]}"#;
        assert!(matches!(
            outcome(row, 4),
            Outcome::Sample {
                truncated: false,
                ..
            }
        ));
        assert!(matches!(outcome(row, 3), Outcome::TooShort));
        let row = r#"{"input_ids":[1,2,3,4],"loss_mask":[1,1,1,0]}"#;
        match outcome(row, 2) {
            Outcome::Sample { sample, truncated } => {
                assert!(truncated);
                assert_eq!(
                    (sample.input_ids, sample.loss_mask),
                    (vec![1, 2], vec![1, 1])
                );
            }
            _ => panic!("expected a truncated sample"),
        }
    }

    #[test]
    fn a_line_over_the_limit_is_consumed_without_being_kept() {
        let text = format!("ab\n{}\r\ncd", "x".repeat(100));
        let mut reader = io::BufReader::with_capacity(8, text.as_bytes());
        let mut read = || read_line_bounded(&mut reader, 10).unwrap();
        assert!(matches!(read(), Some(RawLine::Line(l)) if l == b"ab\n"));
        // 100 x and the \r (the \n is the line end): never more than 10 bytes kept.
        assert!(matches!(read(), Some(RawLine::TooLong { bytes: 101 })));
        assert!(matches!(read(), Some(RawLine::Line(l)) if l == b"cd"));
        assert!(read().is_none());
        // Exactly at the limit is a line.
        let mut exact = io::BufReader::with_capacity(4, &b"0123456789\n"[..]);
        assert!(matches!(
            read_line_bounded(&mut exact, 10).unwrap(),
            Some(RawLine::Line(l)) if l.len() == 11
        ));
    }
}
