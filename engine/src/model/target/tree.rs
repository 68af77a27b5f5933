//! The shape of a tree of new tokens for one target forward (DDTree verification): each token's
//! parent among the forward's own tokens, or none for a token that directly follows the cached
//! sequence. A chain is the tree in which token `i`'s parent is `i − 1`.
//!
//! What the forward needs from the shape: the depth of each token (its position is the cache
//! length plus its depth), which earlier tokens it sees (its ancestors and itself), and, for a
//! Gated DeltaNet layer, the order in which states can be advanced (parents before children).
use tch::{Device, Kind, Tensor};

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TreeShape {
    parents: Vec<Option<usize>>,
    depths: Vec<i64>,
}

impl TreeShape {
    /// `parents[i]` is `None` (token `i` follows the cache) or `Some(p)` with `p < i`.
    pub fn new(parents: Vec<Option<usize>>) -> Result<Self, String> {
        if parents.is_empty() {
            return Err("a tree of new tokens needs at least one token".into());
        }
        let mut depths = Vec::with_capacity(parents.len());
        for (i, parent) in parents.iter().enumerate() {
            match *parent {
                None => depths.push(0),
                Some(p) if p < i => depths.push(depths[p] + 1),
                Some(p) => {
                    return Err(format!(
                        "token {i}'s parent {p} does not come before it (parents must precede their children)"
                    ))
                }
            }
        }
        Ok(Self { parents, depths })
    }

    /// `len` tokens, each after the one before.
    pub fn chain(len: usize) -> Self {
        let parents = (0..len).map(|i| i.checked_sub(1)).collect();
        Self::new(parents).expect("a chain of at least one token is a valid tree")
    }

    pub fn len(&self) -> usize {
        self.parents.len()
    }

    pub fn is_empty(&self) -> bool {
        self.parents.is_empty()
    }

    pub fn parents(&self) -> &[Option<usize>] {
        &self.parents
    }

    /// 0 for a token after the cache, its parent's depth + 1 otherwise.
    pub fn depths(&self) -> &[i64] {
        &self.depths
    }

    pub fn is_chain(&self) -> bool {
        self.parents
            .iter()
            .enumerate()
            .all(|(i, &p)| p == i.checked_sub(1))
    }

    /// Token `i` and its ancestors, nearest first.
    pub fn ancestors_and_self(&self, i: usize) -> impl Iterator<Item = usize> + '_ {
        std::iter::successors(Some(i), move |&n| self.parents[n])
    }

    /// True when `path` is a root-to-node path: its first token follows the cache and each later
    /// one is the child of the one before.
    pub fn is_path(&self, path: &[usize]) -> bool {
        path.iter().enumerate().all(|(k, &node)| {
            node < self.len()
                && self.parents[node]
                    == match k {
                        0 => None,
                        _ => Some(path[k - 1]),
                    }
        })
    }

    /// The tokens grouped by depth, each group in index order: a Gated DeltaNet layer advances
    /// one depth at a time, every token from its parent's state.
    pub fn levels(&self) -> Vec<Vec<usize>> {
        let deepest = self.depths.iter().copied().max().unwrap_or(0) as usize;
        let mut levels = vec![Vec::new(); deepest + 1];
        for (i, &d) in self.depths.iter().enumerate() {
            levels[d as usize].push(i);
        }
        levels
    }

    /// `[T, past + T]` bool (`true` = attend): every token sees the whole cache, its ancestors
    /// and itself. For a chain this is the causal offset mask.
    pub fn visibility(&self, past: i64, device: Device) -> Tensor {
        let t = self.len();
        let mut own = vec![false; t * t];
        for i in 0..t {
            for a in self.ancestors_and_self(i) {
                own[i * t + a] = true;
            }
        }
        let own = Tensor::from_slice(&own).view([t as i64, t as i64]);
        let cache = Tensor::ones([t as i64, past], (Kind::Bool, Device::Cpu));
        Tensor::cat(&[cache, own], 1).to_device(device)
    }

    /// Positions `past + depth`, int64 on `device`.
    pub fn positions(&self, past: i64, device: Device) -> Tensor {
        let positions: Vec<i64> = self.depths.iter().map(|d| past + d).collect();
        Tensor::from_slice(&positions).to_device(device)
    }

    /// For the causal conv of width `kernel`: per token, the `kernel` conv inputs it reads,
    /// oldest first, as indices into `[window (kernel−1 inputs before the forward) | the
    /// forward's own inputs]`. Along a chain this is the sliding window of a plain causal conv.
    pub fn conv_taps(&self, kernel: usize) -> Vec<i64> {
        let window = kernel - 1;
        let mut taps = Vec::with_capacity(self.len() * kernel);
        for i in 0..self.len() {
            let mut reads: Vec<i64> = self
                .ancestors_and_self(i)
                .take(kernel)
                .map(|n| (window + n) as i64)
                .collect();
            // past the forward's first token the conv reads the window, newest first
            let mut w = window;
            while reads.len() < kernel {
                w -= 1;
                reads.push(w as i64);
            }
            reads.reverse();
            taps.extend(reads);
        }
        taps
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tree() -> TreeShape {
        // 0 ─ 1 ─ 3
        //   └ 2 ─ 4 ─ 5
        TreeShape::new(vec![None, Some(0), Some(0), Some(1), Some(2), Some(4)]).unwrap()
    }

    #[test]
    fn depths_levels_and_paths_follow_the_parents() {
        let t = tree();
        assert_eq!(t.depths(), &[0, 1, 1, 2, 2, 3]);
        assert_eq!(t.levels(), vec![vec![0], vec![1, 2], vec![3, 4], vec![5]]);
        assert!(t.is_path(&[0, 2, 4, 5]));
        assert!(t.is_path(&[0]));
        assert!(t.is_path(&[]));
        assert!(!t.is_path(&[0, 1, 4]));
        assert!(!t.is_path(&[1]));
        assert!(!t.is_chain());
        assert!(TreeShape::chain(4).is_chain());
        assert_eq!(
            t.ancestors_and_self(5).collect::<Vec<_>>(),
            vec![5, 4, 2, 0]
        );
    }

    #[test]
    fn a_parent_after_its_child_is_refused() {
        assert!(TreeShape::new(vec![None, Some(2), Some(0)]).is_err());
        assert!(TreeShape::new(vec![Some(0)]).is_err());
        assert!(TreeShape::new(vec![]).is_err());
    }

    #[test]
    fn visibility_is_the_cache_then_ancestors_and_self() {
        let t = tree();
        let mask = t.visibility(2, Device::Cpu);
        assert_eq!(mask.size(), vec![6, 8]);
        let row = |i: i64| Vec::<bool>::try_from(mask.get(i)).unwrap();
        assert_eq!(
            row(0),
            vec![true, true, true, false, false, false, false, false]
        );
        assert_eq!(
            row(5),
            vec![true, true, true, false, true, false, true, true]
        );
        let chain = TreeShape::chain(3).visibility(1, Device::Cpu);
        let causal = crate::model::target::attention::causal_offset_mask(1, 3, Device::Cpu);
        assert!(chain.equal(&causal));
    }

    #[test]
    fn conv_taps_read_ancestors_then_the_window() {
        let t = tree();
        // kernel 4: window indices 0..3, token n at 3 + n
        let taps = t.conv_taps(4);
        assert_eq!(&taps[0..4], &[0, 1, 2, 3]); // token 0: window then itself
        assert_eq!(&taps[8..12], &[1, 2, 3, 5]); // token 2: w1 w2 | 0 2
        assert_eq!(&taps[20..24], &[3, 5, 7, 8]); // token 5: 0 2 4 5
        let chain = TreeShape::chain(5).conv_taps(3);
        assert_eq!(chain, vec![0, 1, 2, 1, 2, 3, 2, 3, 4, 3, 4, 5, 4, 5, 6]);
    }
}
