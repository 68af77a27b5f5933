//! From samples to batches: the held-out split, the per-epoch order and padding.
//!
//! The split and the order come from [`crate::data`] (one definition of "data position" for the
//! engine and the daemon); everything is a pure function of the run seed and the position
//! `(epoch, index)`, so a run restarted from a checkpoint sees exactly the batches the
//! uninterrupted run would have.
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::error::TrainError;
use super::labels::Rows;
use crate::data::{epoch_order, holdout_split, HoldoutSplit, Sample};

/// Holds out `held_out` samples, chosen from the seed ([`holdout_split`]); both parts are in
/// file order.
pub fn split_held_out(
    n_samples: usize,
    held_out: usize,
    seed: u64,
) -> Result<HoldoutSplit, TrainError> {
    if held_out == 0 {
        return Ok(HoldoutSplit {
            train: (0..n_samples).collect(),
            eval: Vec::new(),
        });
    }
    if held_out >= n_samples {
        return Err(TrainError::Config {
            key: "held_out".into(),
            detail: format!(
                "is {held_out}, which leaves no training sample of the {n_samples} in the data"
            ),
        });
    }
    // `round(n · k/n)` is `k` exactly for any realistic n, so the count is honoured.
    let split = holdout_split(n_samples, seed, held_out as f64 / n_samples as f64)?;
    debug_assert_eq!(split.eval.len(), held_out);
    Ok(split)
}

/// SHA-256 over the samples (ids and masks), so a resumed run can tell whether its data
/// changed underneath it, whatever file or format it came from.
pub fn data_digest(samples: &[Sample]) -> String {
    let mut h = Sha256::new();
    for s in samples {
        h.update((s.input_ids.len() as u64).to_le_bytes());
        for id in &s.input_ids {
            h.update(id.to_le_bytes());
        }
        h.update(&s.loss_mask);
    }
    hex::encode(h.finalize())
}

/// Where the next batch starts: `index` counts samples already consumed in `epoch`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DataPosition {
    pub epoch: u32,
    pub index: usize,
}

/// A padded batch. Rows are right-padded with `pad_id` and `loss_mask` 0.
#[derive(Debug, Clone, PartialEq)]
pub struct Batch {
    pub input_ids: Vec<i64>,
    pub loss_mask: Vec<u8>,
    pub batch: usize,
    pub seq_len: usize,
    /// Real (unpadded) tokens in the batch.
    pub tokens: usize,
    /// The epoch this batch belongs to.
    pub epoch: u32,
}

impl Batch {
    pub fn rows(&self) -> Rows<'_> {
        Rows {
            input_ids: &self.input_ids,
            loss_mask: &self.loss_mask,
            batch: self.batch,
            seq_len: self.seq_len,
        }
    }

    pub fn masks(&self) -> Vec<&[u8]> {
        (0..self.batch).map(|b| self.rows().mask(b)).collect()
    }
}

pub fn collate(samples: &[&Sample], pad_id: i64, epoch: u32) -> Batch {
    collate_to(samples, pad_id, epoch, longest(samples))
}

/// The longest row of `samples` (0 for none).
pub fn longest(samples: &[&Sample]) -> usize {
    samples.iter().map(|s| s.len()).max().unwrap_or(0)
}

/// `longest` rounded up to a multiple of `multiple` (0 or 1: unchanged): the padded row
/// length of a training batch, so that a run sees at most `max_length / multiple` distinct
/// sequence lengths and the device allocator and kernel plans see a bounded set of shapes.
pub fn bucketed_len(longest: usize, multiple: usize) -> usize {
    if multiple <= 1 {
        return longest;
    }
    longest.div_ceil(multiple) * multiple
}

/// As [`collate`], right-padded to `seq_len` (at least the longest row) with `pad_id` and
/// loss mask 0. The padding is harmless: the target is causal, so no real position sees it;
/// no anchor or label lies in it (loss mask 0), so the drafter never attends to it or trains
/// on it; `tokens` counts only the rows' own tokens.
pub fn collate_to(samples: &[&Sample], pad_id: i64, epoch: u32, seq_len: usize) -> Batch {
    assert!(
        seq_len >= longest(samples),
        "a batch cannot be padded to fewer tokens than its longest row"
    );
    let mut input_ids = vec![pad_id; samples.len() * seq_len];
    let mut loss_mask = vec![0u8; samples.len() * seq_len];
    for (b, s) in samples.iter().enumerate() {
        input_ids[b * seq_len..b * seq_len + s.len()].copy_from_slice(&s.input_ids);
        loss_mask[b * seq_len..b * seq_len + s.len()].copy_from_slice(&s.loss_mask);
    }
    let tokens = samples.iter().map(|s| s.len()).sum();
    Batch {
        input_ids,
        loss_mask,
        batch: samples.len(),
        seq_len,
        tokens,
        epoch,
    }
}

/// Walks the training samples epoch by epoch in a seeded order, `batch_size` at a time.
/// The last batch of an epoch may be smaller; batches never span two epochs.
#[derive(Debug, Clone)]
pub struct Loader {
    train: Vec<usize>,
    batch_size: usize,
    seed: u64,
    pad_id: i64,
    position: DataPosition,
    order: Vec<usize>,
}

impl Loader {
    pub fn new(train: Vec<usize>, batch_size: usize, seed: u64, pad_id: i64) -> Self {
        let mut loader = Self {
            train,
            batch_size: batch_size.max(1),
            seed,
            pad_id,
            position: DataPosition::default(),
            order: Vec::new(),
        };
        loader.order = loader.epoch_order(0);
        loader
    }

    /// The order in which epoch `epoch` visits the training samples.
    pub fn epoch_order(&self, epoch: u32) -> Vec<usize> {
        epoch_order(self.train.len(), self.seed, u64::from(epoch))
            .into_iter()
            .map(|i| self.train[i])
            .collect()
    }

    pub fn batches_per_epoch(&self) -> usize {
        self.train.len().div_ceil(self.batch_size)
    }

    pub fn position(&self) -> DataPosition {
        self.position
    }

    /// Continues from a checkpointed position. An index past the epoch's end (the data file
    /// changed) is rejected by the caller's data digest check; here it just starts the next
    /// epoch.
    pub fn seek(&mut self, position: DataPosition) {
        self.position = position;
        self.order = self.epoch_order(position.epoch);
        if self.position.index >= self.order.len() {
            self.position = DataPosition {
                epoch: position.epoch + 1,
                index: 0,
            };
            self.order = self.epoch_order(self.position.epoch);
        }
    }

    pub fn next_batch(&mut self, samples: &[Sample]) -> Batch {
        let DataPosition { epoch, index } = self.position;
        let end = (index + self.batch_size).min(self.order.len());
        let picked: Vec<&Sample> = self.order[index..end]
            .iter()
            .map(|&i| &samples[i])
            .collect();
        let batch = collate(&picked, self.pad_id, epoch);
        if end >= self.order.len() {
            self.seek(DataPosition {
                epoch: epoch + 1,
                index: 0,
            });
        } else {
            self.position.index = end;
        }
        batch
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn samples(n: usize) -> Vec<Sample> {
        (0..n)
            .map(|i| Sample {
                input_ids: vec![i as i64; 2 + i % 3],
                loss_mask: vec![1; 2 + i % 3],
            })
            .collect()
    }

    #[test]
    fn split_holds_out_exactly_the_requested_count() {
        for (n, k) in [(50, 5), (900, 48), (7, 1), (3, 2)] {
            let s = split_held_out(n, k, 1).unwrap();
            assert_eq!(s.eval.len(), k);
            let mut all: Vec<usize> = s.train.iter().chain(&s.eval).copied().collect();
            all.sort_unstable();
            assert_eq!(all, (0..n).collect::<Vec<_>>());
        }
        assert_eq!(
            split_held_out(50, 5, 1).unwrap(),
            split_held_out(50, 5, 1).unwrap()
        );
        assert!(split_held_out(5, 0, 1).unwrap().eval.is_empty());
        let err = split_held_out(3, 3, 1).unwrap_err().to_string();
        assert!(
            err.contains("held_out") && err.contains("no training sample"),
            "{err}"
        );
    }

    #[test]
    fn the_data_digest_changes_with_any_token_or_mask_bit() {
        let a = vec![Sample {
            input_ids: vec![1, 2],
            loss_mask: vec![1, 1],
        }];
        let mut b = a.clone();
        b[0].loss_mask[0] = 0;
        let mut c = a.clone();
        c[0].input_ids[1] = 3;
        assert_eq!(data_digest(&a), data_digest(&a.clone()));
        assert_ne!(data_digest(&a), data_digest(&b));
        assert_ne!(data_digest(&a), data_digest(&c));
    }

    #[test]
    fn each_epoch_visits_every_sample_once_in_a_new_order() {
        let data = samples(10);
        let mut loader = Loader::new((0..10).collect(), 4, 7, 0);
        assert_eq!(loader.batches_per_epoch(), 3);
        let mut per_epoch: Vec<Vec<i64>> = vec![Vec::new(); 2];
        for _ in 0..6 {
            let b = loader.next_batch(&data);
            for r in 0..b.batch {
                per_epoch[b.epoch as usize].push(b.rows().ids(r)[0]);
            }
        }
        assert_eq!(loader.position(), DataPosition { epoch: 2, index: 0 });
        for ids in &per_epoch {
            let mut sorted = ids.clone();
            sorted.sort_unstable();
            assert_eq!(sorted, (0..10).collect::<Vec<i64>>());
        }
        assert_ne!(per_epoch[0], per_epoch[1]);
    }

    #[test]
    fn seeking_reproduces_the_uninterrupted_sequence() {
        let data = samples(9);
        let mut straight = Loader::new((0..9).collect(), 2, 3, 0);
        let all: Vec<Batch> = (0..12).map(|_| straight.next_batch(&data)).collect();
        let mut first = Loader::new((0..9).collect(), 2, 3, 0);
        for _ in 0..7 {
            first.next_batch(&data);
        }
        let mut resumed = Loader::new((0..9).collect(), 2, 3, 0);
        resumed.seek(first.position());
        let rest: Vec<Batch> = (0..5).map(|_| resumed.next_batch(&data)).collect();
        assert_eq!(&all[7..], &rest[..]);
    }

    #[test]
    fn collate_right_pads_with_zero_mask() {
        let a = Sample {
            input_ids: vec![5, 6, 7],
            loss_mask: vec![0, 1, 1],
        };
        let b = Sample {
            input_ids: vec![8],
            loss_mask: vec![1],
        };
        let batch = collate(&[&a, &b], 0, 0);
        assert_eq!(batch.seq_len, 3);
        assert_eq!(batch.input_ids, vec![5, 6, 7, 8, 0, 0]);
        assert_eq!(batch.loss_mask, vec![0, 1, 1, 1, 0, 0]);
        assert_eq!(batch.tokens, 4);
    }
}
