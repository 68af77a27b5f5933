//! Anchor positions: where each draft block starts (spec §2.2).
//!
//! A position `p` is a valid anchor when both `p` and `p + 1` are supervised (`loss_mask` 1), so
//! the anchor token is a real response token and at least one label follows it. Training draws a
//! fresh uniform sample without replacement every time a row is seen; evaluation uses every
//! valid position, in order.
use tch::{Device, Kind, Tensor};

use super::rng::{streams, Rng};

/// Anchors of one batch, row-major `[batch, width]`. Valid anchors of a row come first, sorted
/// ascending; the remaining slots hold position 0 with `keep = false`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AnchorBatch {
    pub batch: usize,
    pub width: usize,
    pub positions: Vec<i64>,
    pub keep: Vec<bool>,
}

impl AnchorBatch {
    /// Packs per-row anchor lists (each sorted) into a padded batch of `width` columns.
    pub fn from_rows(rows: &[Vec<i64>], width: usize) -> Self {
        let mut positions = vec![0i64; rows.len() * width];
        let mut keep = vec![false; rows.len() * width];
        for (b, row) in rows.iter().enumerate() {
            for (j, &p) in row.iter().take(width).enumerate() {
                positions[b * width + j] = p;
                keep[b * width + j] = true;
            }
        }
        Self {
            batch: rows.len(),
            width,
            positions,
            keep,
        }
    }

    /// The same anchors in `width` columns (at least [`Self::width`]): the added slots are
    /// padding (position 0, `keep = false`), which gets no label weight and changes no kept
    /// block's output. Training pads to `num_anchors`, so every step has the same count.
    pub fn padded_to(&self, width: usize) -> Self {
        assert!(width >= self.width, "padding cannot drop anchors");
        let mut positions = vec![0i64; self.batch * width];
        let mut keep = vec![false; self.batch * width];
        for b in 0..self.batch {
            let (src, dst) = (b * self.width, b * width);
            positions[dst..dst + self.width]
                .copy_from_slice(&self.positions[src..src + self.width]);
            keep[dst..dst + self.width].copy_from_slice(&self.keep[src..src + self.width]);
        }
        Self {
            batch: self.batch,
            width,
            positions,
            keep,
        }
    }

    pub fn row(&self, b: usize) -> impl Iterator<Item = (i64, bool)> + '_ {
        let lo = b * self.width;
        self.positions[lo..lo + self.width]
            .iter()
            .copied()
            .zip(self.keep[lo..lo + self.width].iter().copied())
    }

    pub fn kept(&self) -> usize {
        self.keep.iter().filter(|k| **k).count()
    }

    /// `(anchors [B, N] int64, keep [B, N] bool)` on `device`.
    pub fn to_tensors(&self, device: Device) -> (Tensor, Tensor) {
        let shape = [self.batch as i64, self.width as i64];
        let anchors = Tensor::from_slice(&self.positions)
            .view(shape)
            .to_device(device);
        let keep = Tensor::from_slice(&self.keep)
            .view(shape)
            .to_kind(Kind::Bool)
            .to_device(device);
        (anchors, keep)
    }
}

/// Every valid anchor position of one row, ascending.
pub fn valid_anchor_positions(loss_mask: &[u8]) -> Vec<i64> {
    loss_mask
        .windows(2)
        .enumerate()
        .filter(|(_, w)| w[0] != 0 && w[1] != 0)
        .map(|(p, _)| p as i64)
        .collect()
}

/// Spec §2.2: per row, a uniform sample without replacement of `min(num_anchors, count)` valid
/// positions; the batch width is `min(num_anchors, max count over rows)`. Every row draws from
/// the one generator `rng`, in row order.
pub fn sample_anchors(loss_masks: &[&[u8]], num_anchors: usize, rng: &mut Rng) -> AnchorBatch {
    anchors_from(loss_masks, num_anchors, |_, valid, width| {
        rng.sample(valid, width)
    })
}

/// The anchor generator of one sample in one epoch: a pure function of `(seed, epoch, sample)`,
/// so the anchors a sample gets never depend on which worker handles it, which batch it lands
/// in or how many devices train. A new epoch draws new anchors (spec §2.2).
pub fn sample_rng(seed: u64, epoch: u32, sample: usize) -> Rng {
    // 40 bits of sample index (10^12 samples) and the epoch above them: distinct per pair.
    let index = (u64::from(epoch) << 40) ^ (sample as u64 & ((1 << 40) - 1));
    Rng::stream(seed, streams::ANCHORS, index)
}

/// As [`sample_anchors`], each row drawing from its own [`sample_rng`]: `samples[b]` is the
/// dataset index of row `b`, `epoch` the pass it belongs to.
pub fn sample_anchors_per_sample(
    loss_masks: &[&[u8]],
    num_anchors: usize,
    seed: u64,
    epoch: u32,
    samples: &[usize],
) -> AnchorBatch {
    assert_eq!(
        loss_masks.len(),
        samples.len(),
        "one dataset index per row is needed to seed its anchors"
    );
    anchors_from(loss_masks, num_anchors, |b, valid, width| {
        sample_rng(seed, epoch, samples[b]).sample(valid, width)
    })
}

fn anchors_from(
    loss_masks: &[&[u8]],
    num_anchors: usize,
    mut pick: impl FnMut(usize, &[i64], usize) -> Vec<i64>,
) -> AnchorBatch {
    let candidates: Vec<Vec<i64>> = loss_masks
        .iter()
        .map(|m| valid_anchor_positions(m))
        .collect();
    let width = candidates
        .iter()
        .map(Vec::len)
        .max()
        .unwrap_or(0)
        .min(num_anchors);
    let rows: Vec<Vec<i64>> = candidates
        .iter()
        .enumerate()
        .map(|(b, valid)| {
            let mut chosen = pick(b, valid, width);
            chosen.sort_unstable();
            chosen
        })
        .collect();
    AnchorBatch::from_rows(&rows, width)
}

/// Evaluation anchors: all valid positions of every row, split into batches of at most
/// `max_per_forward` anchors per row so a forward pass stays bounded in memory.
pub fn all_anchors_chunked(loss_masks: &[&[u8]], max_per_forward: usize) -> Vec<AnchorBatch> {
    let max_per_forward = max_per_forward.max(1);
    let candidates: Vec<Vec<i64>> = loss_masks
        .iter()
        .map(|m| valid_anchor_positions(m))
        .collect();
    let longest = candidates.iter().map(Vec::len).max().unwrap_or(0);
    let chunks = longest.div_ceil(max_per_forward);
    (0..chunks)
        .map(|c| {
            let rows: Vec<Vec<i64>> = candidates
                .iter()
                .map(|valid| {
                    valid
                        .iter()
                        .skip(c * max_per_forward)
                        .take(max_per_forward)
                        .copied()
                        .collect()
                })
                .collect();
            let width = rows.iter().map(Vec::len).max().unwrap_or(0);
            AnchorBatch::from_rows(&rows, width)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn valid_positions_need_two_supervised_tokens() {
        //           0  1  2  3  4  5  6  7
        let mask = [0, 1, 1, 1, 0, 1, 0, 1];
        assert_eq!(valid_anchor_positions(&mask), vec![1, 2]);
        assert!(valid_anchor_positions(&[1]).is_empty());
        assert!(valid_anchor_positions(&[]).is_empty());
    }

    #[test]
    fn sampled_anchors_are_valid_sorted_distinct_and_padded() {
        let a: Vec<u8> = vec![0, 0, 1, 1, 1, 1, 1, 1, 1, 0];
        let b: Vec<u8> = vec![0, 1, 1, 1, 0, 0, 0, 0, 0, 0];
        let mut rng = Rng::from_seed(5);
        let batch = sample_anchors(&[&a, &b], 4, &mut rng);
        assert_eq!((batch.batch, batch.width), (2, 4));
        let row_a: Vec<(i64, bool)> = batch.row(0).collect();
        assert!(row_a.iter().all(|(_, k)| *k));
        let pos_a: Vec<i64> = row_a.iter().map(|(p, _)| *p).collect();
        assert!(pos_a.windows(2).all(|w| w[0] < w[1]), "{pos_a:?}");
        assert!(pos_a.iter().all(|p| (2..=7).contains(p)), "{pos_a:?}");
        let row_b: Vec<(i64, bool)> = batch.row(1).collect();
        assert_eq!(row_b, vec![(1, true), (2, true), (0, false), (0, false)]);
    }

    #[test]
    fn width_is_capped_by_the_richest_row() {
        let a: Vec<u8> = vec![1, 1, 1, 0];
        let mut rng = Rng::from_seed(5);
        let batch = sample_anchors(&[&a], 16, &mut rng);
        assert_eq!(batch.width, 2);
        assert_eq!(batch.positions, vec![0, 1]);
    }

    #[test]
    fn sampling_is_uniform_over_valid_positions() {
        let mask: Vec<u8> = vec![1; 11]; // 10 valid anchors
        let mut rng = Rng::from_seed(11);
        let mut hits = [0usize; 10];
        for _ in 0..20_000 {
            for (p, k) in sample_anchors(&[&mask], 3, &mut rng).row(0) {
                assert!(k);
                hits[p as usize] += 1;
            }
        }
        // Each position is chosen with probability 3/10: 6000 expected.
        for h in hits {
            assert!((5_600..6_400).contains(&h), "{hits:?}");
        }
    }

    #[test]
    fn new_anchors_each_draw() {
        let mask: Vec<u8> = vec![1; 200];
        let mut rng = Rng::from_seed(2);
        let first = sample_anchors(&[&mask], 8, &mut rng);
        let second = sample_anchors(&[&mask], 8, &mut rng);
        assert_ne!(first.positions, second.positions);
    }

    #[test]
    fn per_sample_anchors_do_not_depend_on_the_batch_they_are_in() {
        let a: Vec<u8> = vec![1; 40];
        let b: Vec<u8> = vec![0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1];
        let together = sample_anchors_per_sample(&[&a, &b], 6, 9, 2, &[17, 4]);
        let alone = sample_anchors_per_sample(&[&a], 6, 9, 2, &[17]);
        let row = |batch: &AnchorBatch, r: usize| -> Vec<(i64, bool)> { batch.row(r).collect() };
        assert_eq!(row(&together, 0), row(&alone, 0));
        let swapped = sample_anchors_per_sample(&[&b, &a], 6, 9, 2, &[4, 17]);
        assert_eq!(row(&together, 0), row(&swapped, 1));
        assert_eq!(row(&together, 1), row(&swapped, 0));
        // Another epoch or another seed draws other anchors for the same sample.
        let next_epoch = sample_anchors_per_sample(&[&a], 6, 9, 3, &[17]);
        let other_seed = sample_anchors_per_sample(&[&a], 6, 10, 2, &[17]);
        assert_ne!(alone.positions, next_epoch.positions);
        assert_ne!(alone.positions, other_seed.positions);
    }

    #[test]
    fn eval_chunks_cover_every_valid_position_once() {
        let a: Vec<u8> = vec![1; 8]; // 7 valid
        let b: Vec<u8> = vec![0, 1, 1, 0, 0, 0, 0, 0]; // 1 valid
        let chunks = all_anchors_chunked(&[&a, &b], 3);
        assert_eq!(chunks.len(), 3);
        let mut seen_a = Vec::new();
        let mut seen_b = Vec::new();
        for c in &chunks {
            assert!(c.width <= 3);
            seen_a.extend(c.row(0).filter(|(_, k)| *k).map(|(p, _)| p));
            seen_b.extend(c.row(1).filter(|(_, k)| *k).map(|(p, _)| p));
        }
        assert_eq!(seen_a, (0..7).collect::<Vec<i64>>());
        assert_eq!(seen_b, vec![1]);
    }
}
