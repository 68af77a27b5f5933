//! Which keys a drafter query may attend to (spec §2.5), as pure scalar rules and as the
//! boolean tensors both attention back-ends build from them.
//!
//! Key layout per row: `[context 0..S-1 | block_0 (bs) | ... | block_{N-1}]`; query layout
//! `[block_0 | ... | block_{N-1}]`. A query at offset `off` of block `blk` (anchor `a`) sees:
//! - context key `j` iff the block is valid and `j < a` (strictly: the feature at the anchor
//!   itself is not known at inference), and for sliding layers also `j >= a + off - (W-1)`
//!   (the window counts the query's own absolute position `a + off`);
//! - block keys of its own block only: all of them on full layers, offsets `<= off` on
//!   sliding layers.
//!
//! Invalid blocks (`keep = false`, padding slots of anchor sampling) deviate from the spec's
//! `allowed &= keep`: that would leave their rows with no visible key, the softmax would
//! produce NaN, and `NaN · 0` in the loss still poisons gradients. Instead they see no context
//! and only their own block, which keeps every row finite; the training loss gives them weight
//! 0, so they never influence gradients, and they see nothing outside themselves.
use tch::{Device, Kind, Tensor};

/// The per-layer part of the rule.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LayerRule {
    /// Full-attention layer: whole context prefix, bidirectional inside the block.
    Full,
    /// Sliding-window layer of `window` tokens (the query's own position included),
    /// causal inside the block.
    Sliding { window: i64 },
}

/// Whether a query at `query_offset` of a block anchored at `anchor` sees context position
/// `key_pos`.
pub fn context_visible(
    rule: LayerRule,
    anchor: i64,
    keep: bool,
    query_offset: i64,
    key_pos: i64,
) -> bool {
    if !keep || key_pos >= anchor {
        return false;
    }
    match rule {
        LayerRule::Full => true,
        LayerRule::Sliding { window } => key_pos >= anchor + query_offset - (window - 1),
    }
}

/// Whether a query at `query_offset` sees the key at `key_offset` of its OWN block. Keys of
/// other blocks are never visible.
pub fn own_block_visible(rule: LayerRule, query_offset: i64, key_offset: i64) -> bool {
    match rule {
        LayerRule::Full => true,
        LayerRule::Sliding { .. } => key_offset <= query_offset,
    }
}

/// The rule in the spec's flat index form: query index `q` in `0..N·bs`, key index `key` in
/// `0..S+N·bs`, for one batch row.
pub fn visible(
    rule: LayerRule,
    block_size: i64,
    context_len: i64,
    anchors: &[i64],
    keep: &[bool],
    q: i64,
    key: i64,
) -> bool {
    let blk = (q / block_size) as usize;
    let off = q % block_size;
    if key < context_len {
        return context_visible(rule, anchors[blk], keep[blk], off, key);
    }
    let draft = key - context_len;
    draft / block_size == blk as i64 && own_block_visible(rule, off, draft % block_size)
}

/// Context visibility for the blocks `anchors`/`keep` (`[B, n]`) over the context positions
/// `key_start..key_end`: `[B, n·bs, key_end - key_start]` bool.
pub fn context_mask(
    rule: LayerRule,
    anchors: &Tensor,
    keep: &Tensor,
    block_size: i64,
    key_start: i64,
    key_end: i64,
) -> Tensor {
    let size = anchors.size();
    let (batch, blocks) = (size[0], size[1]);
    let device = anchors.device();
    let keys = Tensor::arange_start(key_start, key_end, (Kind::Int64, device)).view([1, 1, 1, -1]);
    let anchor = anchors.view([batch, blocks, 1, 1]);
    let mut allowed = keys
        .lt_tensor(&anchor)
        .logical_and(&keep.view([batch, blocks, 1, 1]));
    if let LayerRule::Sliding { window } = rule {
        let offsets = Tensor::arange(block_size, (Kind::Int64, device)).view([1, 1, -1, 1]);
        let lowest = anchor + offsets - (window - 1);
        allowed = allowed.logical_and(&keys.ge_tensor(&lowest));
    }
    let key_len = key_end - key_start;
    allowed
        .expand([batch, blocks, block_size, key_len], false)
        .reshape([batch, blocks * block_size, key_len])
}

/// Visibility inside one block: `[bs, bs]` bool (query offset × key offset).
pub fn own_block_mask(rule: LayerRule, block_size: i64, device: Device) -> Tensor {
    match rule {
        LayerRule::Full => Tensor::ones([block_size, block_size], (Kind::Bool, device)),
        LayerRule::Sliding { .. } => {
            Tensor::ones([block_size, block_size], (Kind::Bool, device)).tril(0)
        }
    }
}

/// The whole `[B, N·bs, S + N·bs]` mask. Only for the dense oracle and single-block inference:
/// at training sizes this grid is what the block-sparse back-end exists to avoid.
pub fn dense_mask(
    rule: LayerRule,
    anchors: &Tensor,
    keep: &Tensor,
    block_size: i64,
    context_len: i64,
) -> Tensor {
    let size = anchors.size();
    let (batch, blocks) = (size[0], size[1]);
    let queries = blocks * block_size;
    let device = anchors.device();
    let context = context_mask(rule, anchors, keep, block_size, 0, context_len);
    let index = Tensor::arange(queries, (Kind::Int64, device));
    let block_of = index.divide_scalar_mode(block_size, "floor");
    let same_block = block_of.view([-1, 1]).eq_tensor(&block_of.view([1, -1]));
    let inner = own_block_mask(rule, block_size, device).repeat([blocks, blocks]);
    let draft = same_block
        .logical_and(&inner)
        .unsqueeze(0)
        .expand([batch, queries, queries], false);
    Tensor::cat(&[context, draft], -1)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// §2.5 transcribed literally (like SF `_reference_dflash_mask`), with the one documented
    /// deviation for invalid blocks. Deliberately independent of the functions above.
    fn spec_reference(
        rule: LayerRule,
        bs: i64,
        s: i64,
        anchors: &[i64],
        keep: &[bool],
        q: i64,
        j: i64,
    ) -> bool {
        let blk = (q / bs) as usize;
        let off = q % bs;
        let a = anchors[blk];
        if j < s {
            let mut allowed = j < a;
            if let LayerRule::Sliding { window } = rule {
                allowed &= j >= a + off - (window - 1);
            }
            allowed && keep[blk]
        } else {
            let jb = (j - s) / bs;
            let joff = (j - s) % bs;
            let mut allowed = jb == blk as i64;
            if matches!(rule, LayerRule::Sliding { .. }) {
                allowed &= joff <= off;
            }
            allowed
        }
    }

    struct Case {
        rule: LayerRule,
        bs: i64,
        s: i64,
        anchors: Vec<Vec<i64>>,
        keep: Vec<Vec<bool>>,
    }

    fn cases() -> Vec<Case> {
        let overlapping = vec![vec![5, 6, 6, 0, 11, 2], vec![0, 3, 9, 9, 1, 7]];
        let keep = vec![
            vec![true, true, true, false, true, true],
            vec![true, true, false, true, true, false],
        ];
        let mut out = Vec::new();
        for rule in [
            LayerRule::Full,
            LayerRule::Sliding { window: 1 },
            LayerRule::Sliding { window: 3 },
            LayerRule::Sliding { window: 6 },
            LayerRule::Sliding { window: 100 },
        ] {
            for bs in [1, 4] {
                out.push(Case {
                    rule,
                    bs,
                    s: 13,
                    anchors: overlapping.clone(),
                    keep: keep.clone(),
                });
            }
        }
        out
    }

    fn tensors(case: &Case) -> (Tensor, Tensor) {
        let anchors: Vec<i64> = case.anchors.concat();
        let keep: Vec<bool> = case.keep.concat();
        let rows = case.anchors.len() as i64;
        (
            Tensor::from_slice(&anchors).view([rows, -1]),
            Tensor::from_slice(&keep).view([rows, -1]),
        )
    }

    #[test]
    fn scalar_rule_matches_the_spec_transcription() {
        for case in cases() {
            for (anchors, keep) in case.anchors.iter().zip(&case.keep) {
                let queries = anchors.len() as i64 * case.bs;
                for q in 0..queries {
                    for j in 0..case.s + queries {
                        assert_eq!(
                            visible(case.rule, case.bs, case.s, anchors, keep, q, j),
                            spec_reference(case.rule, case.bs, case.s, anchors, keep, q, j),
                            "{:?} bs {} anchors {anchors:?} q {q} key {j}",
                            case.rule,
                            case.bs
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn dense_mask_matches_the_brute_force_loop() {
        for case in cases() {
            let (anchors, keep) = tensors(&case);
            let mask = dense_mask(case.rule, &anchors, &keep, case.bs, case.s);
            let queries = case.anchors[0].len() as i64 * case.bs;
            assert_eq!(mask.size(), [2, queries, case.s + queries]);
            for (b, (row_anchors, row_keep)) in case.anchors.iter().zip(&case.keep).enumerate() {
                for q in 0..queries {
                    for j in 0..case.s + queries {
                        let got = mask.int64_value(&[b as i64, q, j]) != 0;
                        let want =
                            spec_reference(case.rule, case.bs, case.s, row_anchors, row_keep, q, j);
                        assert_eq!(
                            got, want,
                            "{:?} bs {} row {b} q {q} key {j}",
                            case.rule, case.bs
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn context_mask_over_a_key_range_is_the_matching_slice() {
        for case in cases() {
            let (anchors, keep) = tensors(&case);
            let full = context_mask(case.rule, &anchors, &keep, case.bs, 0, case.s);
            let part = context_mask(case.rule, &anchors, &keep, case.bs, 4, 9);
            assert!(
                part.equal(&full.narrow(-1, 4, 5)),
                "{:?} bs {}",
                case.rule,
                case.bs
            );
        }
    }

    #[test]
    fn anchor_itself_is_never_visible_and_window_boundaries_are_exact() {
        let full = LayerRule::Full;
        assert!(context_visible(full, 7, true, 0, 6));
        assert!(!context_visible(full, 7, true, 0, 7));
        assert!(!context_visible(full, 7, true, 3, 8));
        // Window 4 at query position 7 + 2 = 9: keys 6..=9 are in the window, context ends at 6.
        let sliding = LayerRule::Sliding { window: 4 };
        assert!(context_visible(sliding, 7, true, 2, 6));
        assert!(!context_visible(sliding, 7, true, 2, 5));
        assert!(context_visible(sliding, 7, true, 0, 4));
        assert!(!context_visible(sliding, 7, true, 0, 3));
        // Window 1: only the query itself, so no context at all.
        assert!(!context_visible(
            LayerRule::Sliding { window: 1 },
            7,
            true,
            0,
            6
        ));
    }

    #[test]
    fn invalid_blocks_see_only_their_own_block_and_every_row_sees_something() {
        for case in cases() {
            let (anchors, keep) = tensors(&case);
            let mask = dense_mask(case.rule, &anchors, &keep, case.bs, case.s);
            let per_row = mask.sum_dim_intlist(-1, false, Kind::Int64);
            assert!(
                per_row.min().int64_value(&[]) >= 1,
                "{:?}: a row with no visible key",
                case.rule
            );
            for (b, row_keep) in case.keep.iter().enumerate() {
                for (blk, kept) in row_keep.iter().enumerate() {
                    if *kept {
                        continue;
                    }
                    let rows = mask.get(b as i64).narrow(0, blk as i64 * case.bs, case.bs);
                    let context = rows.narrow(-1, 0, case.s);
                    assert_eq!(context.sum(Kind::Int64).int64_value(&[]), 0);
                    let own = rows.narrow(-1, case.s + blk as i64 * case.bs, case.bs);
                    let total = rows.sum(Kind::Int64).int64_value(&[]);
                    assert_eq!(own.sum(Kind::Int64).int64_value(&[]), total);
                }
            }
        }
    }
}
