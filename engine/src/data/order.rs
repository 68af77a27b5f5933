//! Deterministic sample order: a per-epoch shuffle and a held-out evaluation split.
//!
//! The generator is SplitMix64, written out here rather than taken from `rand`, because resume
//! continues "from the exact data position": the order for (seed, epoch) must never change with
//! a dependency upgrade. `golden_order_is_pinned` guards that.
use super::error::DataError;

/// Domain tags keep the split's random stream unrelated to any epoch's stream.
const EPOCH_STREAM: u64 = 0x6570_6f63_6800_0000; // "epoch"
const HOLDOUT_STREAM: u64 = 0x686f_6c64_6f75_7400; // "holdout"

struct SplitMix64(u64);

impl SplitMix64 {
    fn new(seed: u64, stream: u64, index: u64) -> Self {
        // Mixing each input separately makes (seed, index) pairs that differ in any bit diverge.
        let mut s = SplitMix64(seed ^ stream);
        let a = s.next_u64();
        SplitMix64(a ^ mix(index.wrapping_add(stream)))
    }

    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        mix(self.0)
    }

    /// Uniform in `0..bound` without modulo bias (Lemire's multiply-and-reject).
    fn below(&mut self, bound: u64) -> u64 {
        debug_assert!(bound > 0);
        let threshold = bound.wrapping_neg() % bound;
        loop {
            let product = u128::from(self.next_u64()) * u128::from(bound);
            if (product as u64) >= threshold {
                return (product >> 64) as u64;
            }
        }
    }

    fn shuffle(&mut self, items: &mut [usize]) {
        for i in (1..items.len()).rev() {
            let j = self.below(i as u64 + 1) as usize;
            items.swap(i, j);
        }
    }
}

fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The visiting order of `n` samples in `epoch`: a permutation of `0..n`, the same for the same
/// (n, seed, epoch) on every machine and every build.
pub fn epoch_order(n: usize, seed: u64, epoch: u64) -> Vec<usize> {
    let mut order: Vec<usize> = (0..n).collect();
    SplitMix64::new(seed, EPOCH_STREAM, epoch).shuffle(&mut order);
    order
}

/// Indices (into the loaded samples) for training and for evaluation; disjoint, together
/// `0..n`, each ascending.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HoldoutSplit {
    pub train: Vec<usize>,
    pub eval: Vec<usize>,
}

/// Holds out `round(n * fraction)` samples for evaluation (at least one when `fraction > 0`,
/// never all of them), chosen deterministically from `seed`.
pub fn holdout_split(n: usize, seed: u64, fraction: f64) -> Result<HoldoutSplit, DataError> {
    if !(0.0..1.0).contains(&fraction) {
        return Err(DataError::BadOption {
            key: "data.eval_fraction",
            expected: "a fraction in [0, 1)",
            found: fraction.to_string(),
        });
    }
    let wanted = (n as f64 * fraction).round() as usize;
    let eval_count = if fraction > 0.0 { wanted.max(1) } else { 0 };
    if eval_count > 0 && eval_count >= n {
        return Err(DataError::BadOption {
            key: "data.eval_fraction",
            expected: "a fraction that leaves at least one training sample",
            found: format!("{fraction} of {n} samples"),
        });
    }
    let mut order: Vec<usize> = (0..n).collect();
    SplitMix64::new(seed, HOLDOUT_STREAM, 0).shuffle(&mut order);
    let mut eval = order[..eval_count].to_vec();
    let mut train = order[eval_count..].to_vec();
    eval.sort_unstable();
    train.sort_unstable();
    Ok(HoldoutSplit { train, eval })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn is_permutation(order: &[usize], n: usize) -> bool {
        let mut sorted = order.to_vec();
        sorted.sort_unstable();
        sorted == (0..n).collect::<Vec<_>>()
    }

    #[test]
    fn epoch_order_is_a_deterministic_permutation_that_changes_per_epoch_and_seed() {
        let a = epoch_order(1000, 7, 0);
        assert!(is_permutation(&a, 1000));
        assert_eq!(a, epoch_order(1000, 7, 0));
        assert_ne!(a, epoch_order(1000, 7, 1));
        assert_ne!(a, epoch_order(1000, 8, 0));
        assert_ne!(a, (0..1000).collect::<Vec<_>>());
        assert!(epoch_order(0, 1, 0).is_empty());
        assert_eq!(epoch_order(1, 1, 5), vec![0]);
    }

    #[test]
    fn golden_order_is_pinned() {
        // If this changes, every resumed run would continue from a different data position.
        // The expected order was computed by an independent Python transcription of SplitMix64
        // + Lemire + Fisher-Yates.
        assert_eq!(epoch_order(10, 42, 3), vec![8, 7, 5, 0, 4, 9, 3, 2, 6, 1]);
    }

    #[test]
    fn shuffle_positions_are_roughly_uniform() {
        // Where sample 0 lands over many epochs: each of 8 slots should get ~1/8.
        let mut hits = [0u32; 8];
        for epoch in 0..8000 {
            let order = epoch_order(8, 1, epoch);
            hits[order.iter().position(|&i| i == 0).unwrap()] += 1;
        }
        for h in hits {
            assert!((850..1150).contains(&h), "{hits:?}");
        }
    }

    #[test]
    fn holdout_is_disjoint_complete_and_deterministic() {
        let s = holdout_split(101, 3, 0.1).unwrap();
        assert_eq!(s.eval.len(), 10);
        assert_eq!(s.train.len(), 91);
        assert!(s.eval.iter().all(|i| s.train.binary_search(i).is_err()));
        let mut all = [s.train.clone(), s.eval.clone()].concat();
        all.sort_unstable();
        assert_eq!(all, (0..101).collect::<Vec<_>>());
        assert_eq!(s, holdout_split(101, 3, 0.1).unwrap());
        assert_ne!(s.eval, holdout_split(101, 4, 0.1).unwrap().eval);
    }

    #[test]
    fn holdout_edge_cases() {
        assert!(holdout_split(10, 0, 0.0).unwrap().eval.is_empty());
        assert_eq!(holdout_split(10, 0, 0.01).unwrap().eval.len(), 1);
        assert!(holdout_split(1, 0, 0.5).is_err());
        assert!(holdout_split(10, 0, 1.0).is_err());
        assert!(holdout_split(10, 0, -0.1).is_err());
        assert!(holdout_split(10, 0, f64::NAN).is_err());
    }
}
