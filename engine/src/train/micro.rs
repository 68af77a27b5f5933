//! Micro-batches addressed by their global index.
//!
//! Micro-batch `seq` is a pure function of the run seed and `seq`: it is batch `seq mod E` of
//! epoch `seq / E` (E batches per epoch, in the seeded epoch order of [`Loader`]), with anchors
//! drawn from each sample's own generator ([`sample_anchors_per_sample`]). Any worker can build
//! any micro-batch, in any order, and get the same rows, anchors and labels: the data position
//! of a run is just the number of micro-batches consumed, and resume stays exact whatever the
//! topology.
use std::sync::{Arc, Mutex};

use super::anchors::{sample_anchors_per_sample, AnchorBatch};
use super::config::TrainConfig;
use super::labels::{
    block_labels, next_token_block_labels, next_token_prev_ids, BlockLabels, LabelAlignment,
    LabelMaskRule,
};
use super::loader::{bucketed_len, collate_to, longest, Batch, DataPosition, Loader};
use crate::data::Sample;
use crate::model::drafter::DrafterConfig;

/// What decides anchors and labels, besides the rows.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MicroSpec {
    pub seed: u64,
    pub batch_size: usize,
    pub num_anchors: usize,
    pub block_size: usize,
    pub gamma: f64,
    /// Read by [`LabelAlignment::SamePosition`] only: DSpark's next-token labels are always
    /// prefix-cumulative.
    pub rule: LabelMaskRule,
    /// Which token each slot is trained on: set by the drafter's head.
    pub alignment: LabelAlignment,
    pub pad_id: i64,
    /// Rows are right-padded to a multiple of this (`training.seq_len_multiple`; 1: to the
    /// longest row only).
    pub seq_len_multiple: usize,
}

impl MicroSpec {
    /// What a training run of `cfg` builds its micro-batches with, for `drafter` (its block
    /// size, and its head's label alignment); rows are padded with `pad_id`.
    pub fn for_training(cfg: &TrainConfig, drafter: &DrafterConfig, pad_id: i64) -> Self {
        let block_size = drafter.block_size as usize;
        MicroSpec {
            seed: cfg.seed,
            batch_size: cfg.training.batch_size,
            num_anchors: cfg.training.num_anchors,
            block_size,
            gamma: cfg.gamma_for(block_size),
            rule: cfg.label_mask_rule(),
            alignment: LabelAlignment::for_head(&drafter.head),
            pad_id,
            seq_len_multiple: cfg.training.seq_len_multiple,
        }
    }
}

/// One micro-batch, ready for the target (rows) and the drafter (anchors, labels).
#[derive(Debug, Clone, PartialEq)]
pub struct PreparedMicro {
    /// Global micro-batch index.
    pub seq: u64,
    /// Dataset index of each row.
    pub samples: Vec<usize>,
    pub batch: Batch,
    pub anchors: AnchorBatch,
    pub labels: BlockLabels,
}

impl PreparedMicro {
    /// Σ w of this micro-batch.
    pub fn weight_sum(&self) -> f64 {
        self.labels.weight_sum()
    }

    /// The token before each slot, `[B, N*bs]`: what DSpark's Markov head reads
    /// ([`next_token_prev_ids`]), for blocks of `block_size`.
    pub fn prev_token_ids(&self, block_size: usize) -> Vec<i64> {
        next_token_prev_ids(self.batch.rows(), &self.anchors, block_size)
    }

    /// Host memory held by the rows, anchors and labels.
    pub fn host_bytes(&self) -> u64 {
        let b = &self.batch;
        let l = &self.labels;
        (b.input_ids.len() * 8
            + b.loss_mask.len()
            + self.anchors.positions.len() * 9
            + l.targets.len() * 8
            + l.weights.len() * 4
            + l.valid.len()
            + self.samples.len() * 8) as u64
    }
}

/// Builds micro-batches by index; shared by every target worker.
pub struct MicroSource {
    samples: Arc<Vec<Sample>>,
    loader: Loader,
    spec: MicroSpec,
    per_epoch: u64,
    train_len: usize,
    /// The two most recent epoch orders (workers straddle at most one epoch boundary).
    orders: Mutex<Vec<(u32, Arc<Vec<usize>>)>>,
}

impl MicroSource {
    /// `train`: dataset indices of the training split, in file order (as [`Loader::new`]).
    pub fn new(samples: Arc<Vec<Sample>>, train: Vec<usize>, spec: MicroSpec) -> Self {
        let train_len = train.len();
        let loader = Loader::new(train, spec.batch_size, spec.seed, spec.pad_id);
        let per_epoch = loader.batches_per_epoch().max(1) as u64;
        Self {
            samples,
            loader,
            spec,
            per_epoch,
            train_len,
            orders: Mutex::new(Vec::new()),
        }
    }

    pub fn spec(&self) -> &MicroSpec {
        &self.spec
    }

    pub fn samples(&self) -> &Arc<Vec<Sample>> {
        &self.samples
    }

    pub fn batches_per_epoch(&self) -> u64 {
        self.per_epoch
    }

    /// The data position after `consumed` micro-batches (what [`Loader::position`] reports
    /// after as many `next_batch` calls).
    pub fn position_of(&self, consumed: u64) -> DataPosition {
        let epoch = consumed / self.per_epoch;
        let index = (consumed % self.per_epoch) as usize * self.spec.batch_size;
        DataPosition {
            epoch: u32::try_from(epoch).unwrap_or(u32::MAX),
            index,
        }
    }

    /// Micro-batches consumed before `position`; the inverse of [`Self::position_of`]. A
    /// position past its epoch's end means the start of the next epoch, as in [`Loader::seek`].
    pub fn consumed_at(&self, position: DataPosition) -> Result<u64, String> {
        let epoch = u64::from(position.epoch);
        if position.index >= self.train_len {
            return Ok((epoch + 1) * self.per_epoch);
        }
        if position.index % self.spec.batch_size != 0 {
            return Err(format!(
                "data position {}:{} does not start a batch of {} sequences",
                position.epoch, position.index, self.spec.batch_size
            ));
        }
        Ok(epoch * self.per_epoch + (position.index / self.spec.batch_size) as u64)
    }

    fn order(&self, epoch: u32) -> Arc<Vec<usize>> {
        let mut orders = self.orders.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((_, order)) = orders.iter().find(|(e, _)| *e == epoch) {
            return Arc::clone(order);
        }
        let order = Arc::new(self.loader.epoch_order(epoch));
        if orders.len() >= 2 {
            orders.remove(0);
        }
        orders.push((epoch, Arc::clone(&order)));
        order
    }

    /// Micro-batch `seq`: its rows, anchors and labels.
    pub fn prepare(&self, seq: u64) -> PreparedMicro {
        let epoch = u32::try_from(seq / self.per_epoch).unwrap_or(u32::MAX);
        let order = self.order(epoch);
        let start = (seq % self.per_epoch) as usize * self.spec.batch_size;
        let end = (start + self.spec.batch_size).min(order.len());
        let ids: Vec<usize> = order[start..end].to_vec();
        let rows: Vec<&Sample> = ids.iter().map(|&i| &self.samples[i]).collect();
        // Fixed shapes (a bounded set of row lengths, always `num_anchors` blocks), so the
        // device allocator and the kernels see the same shapes step after step.
        let seq_len = bucketed_len(longest(&rows), self.spec.seq_len_multiple);
        let batch = collate_to(&rows, self.spec.pad_id, epoch, seq_len);
        let anchors = sample_anchors_per_sample(
            &batch.masks(),
            self.spec.num_anchors,
            self.spec.seed,
            epoch,
            &ids,
        )
        .padded_to(self.spec.num_anchors);
        let gamma = Some(self.spec.gamma);
        let labels = match self.spec.alignment {
            LabelAlignment::SamePosition => block_labels(
                batch.rows(),
                &anchors,
                self.spec.block_size,
                gamma,
                self.spec.rule,
            ),
            LabelAlignment::NextToken => {
                next_token_block_labels(batch.rows(), &anchors, self.spec.block_size, gamma)
            }
        };
        PreparedMicro {
            seq,
            samples: ids,
            batch,
            anchors,
            labels,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn samples(n: usize) -> Arc<Vec<Sample>> {
        Arc::new(
            (0..n)
                .map(|i| Sample {
                    input_ids: (0..(6 + i % 5) as i64).map(|t| t + i as i64).collect(),
                    loss_mask: vec![1; 6 + i % 5],
                })
                .collect(),
        )
    }

    fn spec(batch_size: usize) -> MicroSpec {
        MicroSpec {
            seed: 3,
            batch_size,
            num_anchors: 4,
            block_size: 4,
            gamma: 4.0,
            rule: LabelMaskRule::Independent,
            alignment: LabelAlignment::SamePosition,
            pad_id: 0,
            seq_len_multiple: 1,
        }
    }

    #[test]
    fn micro_batches_are_the_loader_sequence_and_positions_match() {
        let data = samples(11);
        let train: Vec<usize> = (0..11).filter(|i| i % 4 != 3).collect();
        let source = MicroSource::new(Arc::clone(&data), train.clone(), spec(3));
        let mut loader = Loader::new(train, 3, 3, 0);
        for seq in 0..10u64 {
            assert_eq!(source.position_of(seq), loader.position(), "before {seq}");
            assert_eq!(source.consumed_at(loader.position()), Ok(seq));
            let expected = loader.next_batch(&data);
            assert_eq!(source.prepare(seq).batch, expected, "micro-batch {seq}");
        }
    }

    #[test]
    fn any_order_and_any_worker_build_the_same_micro_batch() {
        let source = MicroSource::new(samples(9), (0..9).collect(), spec(2));
        let forward: Vec<PreparedMicro> = (0..12).map(|s| source.prepare(s)).collect();
        let other = MicroSource::new(samples(9), (0..9).collect(), spec(2));
        for seq in (0..12u64).rev() {
            assert_eq!(other.prepare(seq), forward[seq as usize]);
        }
        // Epoch 1 revisits the samples with fresh anchors.
        let first: Vec<usize> = (0..5).flat_map(|s| forward[s].samples.clone()).collect();
        assert_eq!(first.len(), 9);
        assert!(forward[5].batch.epoch == 1);
    }

    #[test]
    fn a_dspark_spec_builds_next_token_labels_over_the_same_rows_and_anchors() {
        let data = samples(7);
        let same = MicroSource::new(Arc::clone(&data), (0..7).collect(), spec(2));
        let next_spec = MicroSpec {
            alignment: LabelAlignment::NextToken,
            ..spec(2)
        };
        let next = MicroSource::new(data, (0..7).collect(), next_spec);
        for seq in 0..4u64 {
            let (a, b) = (same.prepare(seq), next.prepare(seq));
            assert_eq!((&a.batch, &a.anchors), (&b.batch, &b.anchors));
            let expected = next_token_block_labels(b.batch.rows(), &b.anchors, 4, Some(4.0));
            assert_eq!(b.labels, expected);
            assert_ne!(a.labels, b.labels);
            assert_eq!(
                b.prev_token_ids(4),
                next_token_prev_ids(b.batch.rows(), &b.anchors, 4)
            );
        }
    }

    #[test]
    fn a_position_inside_a_batch_is_refused() {
        let source = MicroSource::new(samples(9), (0..9).collect(), spec(2));
        let err = source
            .consumed_at(DataPosition { epoch: 0, index: 3 })
            .unwrap_err();
        assert!(err.contains("0:3") && err.contains("2 sequences"), "{err}");
        assert_eq!(
            source.consumed_at(DataPosition { epoch: 1, index: 9 }),
            Ok(10)
        );
    }
}
