//! From samples to batches: the held-out split, the per-epoch shuffle and padding.
//!
//! Everything is a pure function of the run seed and the data position `(epoch, index)`, so a
//! run restarted from a checkpoint sees exactly the batches the uninterrupted run would have.
use serde::{Deserialize, Serialize};

use super::data::Sample;
use super::labels::Rows;
use super::rng::{streams, Rng};

/// Sample indices of the training and held-out parts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Split {
    pub train: Vec<usize>,
    pub held_out: Vec<usize>,
}

/// Holds out `held_out` samples chosen uniformly from the seed (both parts keep file order).
pub fn split_held_out(n_samples: usize, held_out: usize, seed: u64) -> Split {
    let mut order: Vec<usize> = (0..n_samples).collect();
    Rng::stream(seed, streams::SPLIT, 0).shuffle(&mut order);
    let k = held_out.min(n_samples.saturating_sub(1));
    let mut held: Vec<usize> = order[..k].to_vec();
    let mut train: Vec<usize> = order[k..].to_vec();
    held.sort_unstable();
    train.sort_unstable();
    Split {
        train,
        held_out: held,
    }
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
    let seq_len = samples.iter().map(|s| s.len()).max().unwrap_or(0);
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
        let mut order = self.train.clone();
        Rng::stream(self.seed, streams::SHUFFLE, epoch as u64).shuffle(&mut order);
        order
    }

    pub fn batches_per_epoch(&self) -> usize {
        self.train.len().div_ceil(self.batch_size)
    }

    pub fn position(&self) -> DataPosition {
        self.position
    }

    /// Continues from a checkpointed position. An index past the epoch's end (the data file
    /// changed) is rejected by the caller's fingerprint check; here it just starts the next epoch.
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
                line: i + 1,
            })
            .collect()
    }

    #[test]
    fn split_is_disjoint_complete_and_seeded() {
        let s = split_held_out(50, 5, 1);
        assert_eq!(s.held_out.len(), 5);
        let mut all: Vec<usize> = s.train.iter().chain(&s.held_out).copied().collect();
        all.sort_unstable();
        assert_eq!(all, (0..50).collect::<Vec<_>>());
        assert_eq!(s, split_held_out(50, 5, 1));
        assert_ne!(s.held_out, split_held_out(50, 5, 2).held_out);
        assert_eq!(split_held_out(3, 10, 1).train.len(), 1);
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
            line: 1,
        };
        let b = Sample {
            input_ids: vec![8],
            loss_mask: vec![1],
            line: 2,
        };
        let batch = collate(&[&a, &b], 0, 0);
        assert_eq!(batch.seq_len, 3);
        assert_eq!(batch.input_ids, vec![5, 6, 7, 8, 0, 0]);
        assert_eq!(batch.loss_mask, vec![0, 1, 1, 1, 0, 0]);
        assert_eq!(batch.tokens, 4);
    }
}
