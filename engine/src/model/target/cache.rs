//! The target's decoding cache: per attention layer its keys and values, per Gated DeltaNet
//! layer its conv window and recurrent state, and the rollback a speculative verification needs.
//!
//! A verification runs the target over a block of tokens and keeps only a prefix of them. So a
//! cache can be cropped back to any length between the start of the LAST forward and its end:
//! - attention layers by truncation (a view of the first `len` positions);
//! - Gated DeltaNet layers from what they kept of the last forward: the conv window and state
//!   before it, and the block's own conv inputs and delta-rule inputs. Cropping to `n` of the
//!   block's tokens re-advances the old state over those `n` tokens with the recurrent rule
//!   (a few rank-1 updates per head, no layer re-run), instead of keeping a state snapshot per
//!   position (`T` copies of `[Hv,Dk,Dv]` fp32 per layer).
//!
//! Cropping to before the last forward's start is refused: the Gated DeltaNet state there is
//! gone.
//!
//! A tree verification (DDTree) runs the target over a tree of tokens in one forward; what is
//! kept afterwards is one root-to-node path of it ([`TargetCache::keep_path`]): the attention
//! layers keep that path's keys and values (compacted after the cached prefix), the Gated
//! DeltaNet layers re-advance their state over the path's tokens, as for a chain prefix. Until
//! then the cache holds no single sequence, and a further forward is refused.
use tch::{Device, Kind, Tensor};

use super::delta_rule::{recurrent_gated_delta_rule, DeltaRuleInputs};
use super::tree::TreeShape;
use crate::model::error::ModelError;

/// Keys and values `[B, L, Hkv, D]` of one attention layer.
#[derive(Default)]
pub struct KvCache {
    keys: Option<Tensor>,
    values: Option<Tensor>,
}

impl KvCache {
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn len(&self) -> i64 {
        self.keys.as_ref().map_or(0, |k| k.size()[1])
    }

    /// Appends `[B,T,Hkv,D]` keys and values; returns all of them, old then new.
    pub fn append(&mut self, keys: &Tensor, values: &Tensor) -> (Tensor, Tensor) {
        let join = |old: &Option<Tensor>, new: &Tensor| match old {
            Some(old) => Tensor::cat(&[old, new], 1),
            None => new.shallow_clone(),
        };
        let (k, v) = (join(&self.keys, keys), join(&self.values, values));
        self.keys = Some(k.shallow_clone());
        self.values = Some(v.shallow_clone());
        (k, v)
    }

    /// Keeps the `start` positions before the last forward and, of that forward's, those at
    /// `kept` (a view when they are a prefix, a compacting copy otherwise).
    fn keep(&mut self, start: i64, kept: &Selection) {
        for t in [&mut self.keys, &mut self.values].into_iter().flatten() {
            *t = match kept {
                Selection::Prefix(n) => t.narrow(1, 0, start + n),
                Selection::Indices(index) => Tensor::cat(
                    &[
                        t.narrow(1, 0, start),
                        t.index_select(1, &(index.to_device(t.device()) + start)),
                    ],
                    1,
                ),
            };
        }
    }
}

/// Which tokens of the last forward a rollback keeps.
enum Selection {
    /// The first `n`.
    Prefix(i64),
    /// These, in order (int64 indices, not a prefix).
    Indices(Tensor),
}

impl Selection {
    fn of(path: &[usize]) -> Self {
        if path.iter().enumerate().all(|(k, &i)| k == i) {
            Self::Prefix(path.len() as i64)
        } else {
            let index: Vec<i64> = path.iter().map(|&i| i as i64).collect();
            Self::Indices(Tensor::from_slice(&index))
        }
    }

    fn len(&self) -> i64 {
        match self {
            Self::Prefix(n) => *n,
            Self::Indices(index) => index.size()[0],
        }
    }

    /// The kept tokens of `t` (`[B, T, ..]`, tokens on dim 1).
    fn apply(&self, t: &Tensor) -> Tensor {
        match self {
            Self::Prefix(n) => t.narrow(1, 0, *n),
            Self::Indices(index) => t.index_select(1, &index.to_device(t.device())),
        }
    }
}

/// The delta rule's per-token inputs, as [`DeltaRuleInputs`] but owned: q, k `[B,T,Hk,Dk]`,
/// v `[B,T,Hv,Dv]`, g, beta `[B,T,Hv]`.
pub struct RuleInputs {
    pub q: Tensor,
    pub k: Tensor,
    pub v: Tensor,
    pub g: Tensor,
    pub beta: Tensor,
}

impl RuleInputs {
    pub fn as_inputs(&self) -> DeltaRuleInputs<'_> {
        DeltaRuleInputs {
            q: &self.q,
            k: &self.k,
            v: &self.v,
            g: &self.g,
            beta: &self.beta,
        }
    }

    fn select(&self, kept: &Selection) -> Self {
        let cut = |t: &Tensor| kept.apply(t);
        Self {
            q: cut(&self.q),
            k: cut(&self.k),
            v: cut(&self.v),
            g: cut(&self.g),
            beta: cut(&self.beta),
        }
    }
}

/// What a Gated DeltaNet layer kept of its last forward, for a crop inside it.
struct LastForward {
    window_before: Tensor,
    state_before: Tensor,
    /// The block's conv inputs `[B,T,C]`.
    pre_conv: Tensor,
    rule: RuleInputs,
}

/// One Gated DeltaNet layer: the last K−1 conv inputs `[B,K−1,C]` and the recurrent state
/// `[B,Hv,Dk,Dv]` (fp32), both after every token the cache holds. After a tree forward both
/// are unset until [`TargetCache::keep_path`] picks the path they follow.
#[derive(Default)]
pub struct DeltaNetCache {
    window: Option<Tensor>,
    state: Option<Tensor>,
    last: Option<LastForward>,
    after_tree: bool,
}

impl DeltaNetCache {
    /// The conv window (zeros before the first token, as the causal conv's left padding).
    pub fn window(&mut self, shape: [i64; 3], options: (Kind, Device)) -> Tensor {
        assert!(
            !self.after_tree,
            "a tree forward is resolved by keep_path first"
        );
        self.window
            .get_or_insert_with(|| Tensor::zeros(shape, options))
            .shallow_clone()
    }

    /// The recurrent state (zeros before the first token).
    pub fn state(&mut self, shape: [i64; 4], device: Device) -> Tensor {
        assert!(
            !self.after_tree,
            "a tree forward is resolved by keep_path first"
        );
        self.state
            .get_or_insert_with(|| Tensor::zeros(shape, (Kind::Float, device)))
            .shallow_clone()
    }

    /// Records a forward over `pre_conv`'s tokens that ended in `final_state`.
    pub fn advance(&mut self, pre_conv: Tensor, rule: RuleInputs, final_state: Tensor) {
        let window_before = self.window.take().expect("window() was called first");
        let state_before = self.state.take().expect("state() was called first");
        self.window = Some(last_window(&window_before, &pre_conv));
        self.state = Some(final_state);
        self.last = Some(LastForward {
            window_before,
            state_before,
            pre_conv,
            rule,
        });
    }

    /// Records a tree forward over `pre_conv`'s tokens: no state or window is the cache's
    /// until [`Self::keep`] picks a path.
    pub fn advance_tree(&mut self, pre_conv: Tensor, rule: RuleInputs) {
        let window_before = self.window.take().expect("window() was called first");
        let state_before = self.state.take().expect("state() was called first");
        self.after_tree = true;
        self.last = Some(LastForward {
            window_before,
            state_before,
            pre_conv,
            rule,
        });
    }

    /// Tokens of the last forward held now.
    fn last_len(&self) -> i64 {
        self.last.as_ref().map_or(0, |l| l.pre_conv.size()[1])
    }

    /// Keeps the tokens `kept` of the last forward (a path of it).
    fn keep(&mut self, kept: &Selection) {
        if !self.after_tree && matches!(kept, Selection::Prefix(n) if *n == self.last_len()) {
            return;
        }
        let last = self
            .last
            .take()
            .expect("a crop inside a forward needs that forward");
        let pre_conv = kept.apply(&last.pre_conv);
        let rule = last.rule.select(kept);
        let state = if kept.len() == 0 {
            last.state_before.shallow_clone()
        } else {
            recurrent_gated_delta_rule(&rule.as_inputs(), Some(&last.state_before)).1
        };
        self.window = Some(last_window(&last.window_before, &pre_conv));
        self.state = Some(state);
        self.after_tree = false;
        self.last = Some(LastForward {
            window_before: last.window_before,
            state_before: last.state_before,
            pre_conv,
            rule,
        });
    }
}

/// The last `window.size(1)` conv inputs of `window` followed by `new`.
fn last_window(window: &Tensor, new: &Tensor) -> Tensor {
    let width = window.size()[1];
    let joined = Tensor::cat(&[window, &new.to_kind(window.kind())], 1);
    let len = joined.size()[1];
    joined.narrow(1, len - width, width)
}

pub enum LayerCache {
    Attention(KvCache),
    DeltaNet(DeltaNetCache),
}

/// The cache of every decoder layer of one target, for a batch of sequences of equal length.
pub struct TargetCache {
    pub(super) layers: Vec<LayerCache>,
    len: i64,
    /// Where the last forward started: the earliest length a crop can return to.
    last_start: i64,
    /// The last forward's tree while it is unresolved (no path kept yet); `None` after a chain.
    pending_tree: Option<TreeShape>,
}

impl TargetCache {
    pub(super) fn new(layers: Vec<LayerCache>) -> Self {
        Self {
            layers,
            len: 0,
            last_start: 0,
            pending_tree: None,
        }
    }

    /// Tokens held (after a tree forward: the cached prefix and every tree token).
    pub fn len(&self) -> i64 {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The shortest length [`Self::crop`] can return to: the start of the last forward.
    pub fn earliest_crop(&self) -> i64 {
        self.last_start
    }

    /// Refuses a forward while a tree forward awaits [`Self::keep_path`].
    pub(super) fn check_resolved(&self) -> Result<(), ModelError> {
        match &self.pending_tree {
            Some(tree) => Err(ModelError::TreeUnresolved { tokens: tree.len() }),
            None => Ok(()),
        }
    }

    pub(super) fn appended(&mut self, tokens: i64, tree: Option<TreeShape>) {
        self.last_start = self.len;
        self.len += tokens;
        self.pending_tree = tree;
    }

    /// Keeps the first `len` tokens (a rollback after a verification that accepted fewer
    /// tokens than it ran), for `earliest_crop() ≤ len ≤ self.len()`, after a chain forward.
    pub fn crop(&mut self, len: i64) -> Result<(), ModelError> {
        let refused = || ModelError::CacheCrop {
            requested: len,
            earliest: self.last_start,
            held: self.len,
        };
        if len < self.last_start || len > self.len {
            return Err(refused());
        }
        if let Some(tree) = &self.pending_tree {
            return Err(ModelError::TreeUnresolved { tokens: tree.len() });
        }
        let path: Vec<usize> = (0..(len - self.last_start) as usize).collect();
        self.keep(&Selection::of(&path));
        self.len = len;
        Ok(())
    }

    /// After a forward over a tree (or a chain) of new tokens, keeps the cached prefix and the
    /// tokens of `path`, a root-to-node path of that forward (indices into its tokens; empty
    /// keeps none). The kept tokens are then the sequence's next ones, in path order.
    pub fn keep_path(&mut self, path: &[usize]) -> Result<(), ModelError> {
        let tokens = (self.len - self.last_start) as usize;
        let tree = self
            .pending_tree
            .clone()
            .unwrap_or_else(|| TreeShape::chain(tokens.max(1)));
        if tokens == 0 && !path.is_empty() || !tree.is_path(path) {
            return Err(ModelError::NotATreePath {
                path: path.to_vec(),
                tokens,
            });
        }
        self.keep(&Selection::of(path));
        self.len = self.last_start + path.len() as i64;
        self.pending_tree = None;
        Ok(())
    }

    fn keep(&mut self, kept: &Selection) {
        for layer in &mut self.layers {
            match layer {
                LayerCache::Attention(kv) => kv.keep(self.last_start, kept),
                LayerCache::DeltaNet(gdn) => gdn.keep(kept),
            }
        }
    }
}
