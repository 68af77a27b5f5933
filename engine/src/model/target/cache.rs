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
use tch::{Device, Kind, Tensor};

use super::delta_rule::{recurrent_gated_delta_rule, DeltaRuleInputs};
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

    fn truncate(&mut self, len: i64) {
        for t in [&mut self.keys, &mut self.values].into_iter().flatten() {
            *t = t.narrow(1, 0, len);
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

    fn prefix(&self, n: i64) -> Self {
        let cut = |t: &Tensor| t.narrow(1, 0, n);
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
/// `[B,Hv,Dk,Dv]` (fp32), both after every token the cache holds.
#[derive(Default)]
pub struct DeltaNetCache {
    window: Option<Tensor>,
    state: Option<Tensor>,
    last: Option<LastForward>,
}

impl DeltaNetCache {
    /// The conv window (zeros before the first token, as the causal conv's left padding).
    pub fn window(&mut self, shape: [i64; 3], options: (Kind, Device)) -> Tensor {
        self.window
            .get_or_insert_with(|| Tensor::zeros(shape, options))
            .shallow_clone()
    }

    /// The recurrent state (zeros before the first token).
    pub fn state(&mut self, shape: [i64; 4], device: Device) -> Tensor {
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

    /// Tokens of the last forward held now.
    fn last_len(&self) -> i64 {
        self.last.as_ref().map_or(0, |l| l.pre_conv.size()[1])
    }

    /// Keeps the first `keep` tokens of the last forward (`keep ≤` its length).
    fn crop_last(&mut self, keep: i64) {
        if keep == self.last_len() {
            return;
        }
        let last = self
            .last
            .take()
            .expect("a crop inside a forward needs that forward");
        let pre_conv = last.pre_conv.narrow(1, 0, keep);
        let rule = last.rule.prefix(keep);
        let state = if keep == 0 {
            last.state_before.shallow_clone()
        } else {
            recurrent_gated_delta_rule(&rule.as_inputs(), Some(&last.state_before)).1
        };
        self.window = Some(last_window(&last.window_before, &pre_conv));
        self.state = Some(state);
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
}

impl TargetCache {
    pub(super) fn new(layers: Vec<LayerCache>) -> Self {
        Self {
            layers,
            len: 0,
            last_start: 0,
        }
    }

    /// Tokens held.
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

    pub(super) fn appended(&mut self, tokens: i64) {
        self.last_start = self.len;
        self.len += tokens;
    }

    /// Keeps the first `len` tokens (a rollback after a verification that accepted fewer
    /// tokens than it ran), for `earliest_crop() ≤ len ≤ self.len()`.
    pub fn crop(&mut self, len: i64) -> Result<(), ModelError> {
        if len < self.last_start || len > self.len {
            return Err(ModelError::CacheCrop {
                requested: len,
                earliest: self.last_start,
                held: self.len,
            });
        }
        let keep = len - self.last_start;
        for layer in &mut self.layers {
            match layer {
                LayerCache::Attention(kv) => kv.truncate(len),
                LayerCache::DeltaNet(gdn) => gdn.crop_last(keep),
            }
        }
        self.len = len;
        Ok(())
    }
}
