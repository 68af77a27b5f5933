//! A small deterministic RNG whose whole state is four `u64`s, so a checkpoint can store it and
//! a resumed run draws exactly the numbers the uninterrupted run would have drawn.
//!
//! xoshiro256++ (Blackman & Vigna), seeded through splitmix64. Independent streams (anchor
//! sampling, the per-epoch shuffle, the held-out split) are derived from one run seed plus a
//! stream id, so changing how many numbers one stream draws never shifts another.
use serde::{Deserialize, Serialize};

/// Stream ids for [`Rng::stream`]; fixed constants so a checkpoint stays valid across builds.
pub mod streams {
    pub const ANCHORS: u64 = 0x414e_4348;
    pub const SHUFFLE: u64 = 0x5348_5546;
    pub const SPLIT: u64 = 0x5350_4c54;
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Rng {
    s: [u64; 4],
}

fn splitmix64(x: &mut u64) -> u64 {
    *x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = *x;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

impl Rng {
    pub fn from_seed(seed: u64) -> Self {
        let mut x = seed;
        let s = [
            splitmix64(&mut x),
            splitmix64(&mut x),
            splitmix64(&mut x),
            splitmix64(&mut x),
        ];
        Self { s }
    }

    /// An independent generator for `(seed, stream, index)`, e.g. the shuffle of epoch 3.
    pub fn stream(seed: u64, stream: u64, index: u64) -> Self {
        let mut x = seed ^ stream.wrapping_mul(0xd1b5_4a32_d192_ed03);
        let mixed = splitmix64(&mut x) ^ index.wrapping_mul(0x8cb9_2ba7_2f3d_8dd7);
        Self::from_seed(mixed)
    }

    pub fn from_state(s: [u64; 4]) -> Self {
        Self { s }
    }

    pub fn state(&self) -> [u64; 4] {
        self.s
    }

    pub fn next_u64(&mut self) -> u64 {
        let result = self.s[0]
            .wrapping_add(self.s[3])
            .rotate_left(23)
            .wrapping_add(self.s[0]);
        let t = self.s[1] << 17;
        self.s[2] ^= self.s[0];
        self.s[3] ^= self.s[1];
        self.s[1] ^= self.s[2];
        self.s[0] ^= self.s[3];
        self.s[2] ^= t;
        self.s[3] = self.s[3].rotate_left(45);
        result
    }

    /// Uniform in `[0, 1)` with 53 random bits.
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// Uniform in `[0, n)`; `n` must be positive. Rejection sampling keeps it unbiased.
    pub fn below(&mut self, n: u64) -> u64 {
        assert!(n > 0, "Rng::below needs a positive bound");
        let zone = u64::MAX - (u64::MAX % n);
        loop {
            let x = self.next_u64();
            if x < zone {
                return x % n;
            }
        }
    }

    /// Fisher–Yates shuffle.
    pub fn shuffle<T>(&mut self, items: &mut [T]) {
        for i in (1..items.len()).rev() {
            let j = self.below(i as u64 + 1) as usize;
            items.swap(i, j);
        }
    }

    /// `k` distinct elements of `items`, uniformly (partial Fisher–Yates); order is random.
    pub fn sample<T: Copy>(&mut self, items: &[T], k: usize) -> Vec<T> {
        let mut pool = items.to_vec();
        let k = k.min(pool.len());
        for i in 0..k {
            let j = i + self.below((pool.len() - i) as u64) as usize;
            pool.swap(i, j);
        }
        pool.truncate(k);
        pool
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn state_round_trip_continues_the_same_sequence() {
        let mut a = Rng::from_seed(42);
        for _ in 0..10 {
            a.next_u64();
        }
        let mut b = Rng::from_state(a.state());
        let xs: Vec<u64> = (0..5).map(|_| a.next_u64()).collect();
        let ys: Vec<u64> = (0..5).map(|_| b.next_u64()).collect();
        assert_eq!(xs, ys);
    }

    #[test]
    fn streams_differ_and_are_reproducible() {
        let x = Rng::stream(7, streams::SHUFFLE, 0).next_u64();
        let y = Rng::stream(7, streams::SHUFFLE, 1).next_u64();
        let z = Rng::stream(7, streams::ANCHORS, 0).next_u64();
        assert_ne!(x, y);
        assert_ne!(x, z);
        assert_eq!(x, Rng::stream(7, streams::SHUFFLE, 0).next_u64());
    }

    #[test]
    fn below_is_roughly_uniform_and_in_range() {
        let mut r = Rng::from_seed(1);
        let mut counts = [0usize; 5];
        for _ in 0..50_000 {
            counts[r.below(5) as usize] += 1;
        }
        for c in counts {
            assert!((9_000..11_000).contains(&c), "{counts:?}");
        }
    }

    #[test]
    fn sample_returns_distinct_members() {
        let mut r = Rng::from_seed(3);
        let items: Vec<i64> = (10..30).collect();
        let mut s = r.sample(&items, 7);
        assert_eq!(s.len(), 7);
        s.sort_unstable();
        s.dedup();
        assert_eq!(s.len(), 7);
        assert!(s.iter().all(|x| items.contains(x)));
        assert_eq!(r.sample(&items, 100).len(), 20);
    }

    #[test]
    fn next_f64_in_unit_interval() {
        let mut r = Rng::from_seed(9);
        for _ in 0..1000 {
            let x = r.next_f64();
            assert!((0.0..1.0).contains(&x));
        }
    }
}
