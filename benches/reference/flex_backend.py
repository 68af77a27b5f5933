"""flex_attention back-end of the reference: the same visibility rule as a mask_mod, compiled into
a block mask so empty tiles are skipped (what SpecForge and speculators use on GPU)."""
from __future__ import annotations

import torch
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

_compiled_flex = torch.compile(flex_attention, dynamic=False)
_block_masks: dict = {}


def _mask_mod(anchors, keep, seq_len, block_size, window):
    def mod(b, h, q_idx, kv_idx):
        blk = q_idx // block_size
        off = q_idx % block_size
        anchor = anchors[b, blk]
        ctx_ok = (kv_idx < anchor) & keep[b, blk]
        if window is not None:
            ctx_ok = ctx_ok & (kv_idx >= anchor + off - (window - 1))
        draft = kv_idx - seq_len
        draft_ok = (draft // block_size) == blk
        if window is not None:
            draft_ok = draft_ok & ((draft % block_size) <= off)
        return torch.where(kv_idx < seq_len, ctx_ok, draft_ok & (draft >= 0))

    return mod


def flex_attend(q, k, v, anchors, keep, seq_len, block_size, window):
    bsz, _, q_len, _ = q.shape
    kv_len = k.shape[2]
    key = (anchors.data_ptr(), window, q_len, kv_len)
    if key not in _block_masks:
        _block_masks[key] = create_block_mask(
            _mask_mod(anchors, keep, seq_len, block_size, window), bsz, None, q_len, kv_len, device=q.device
        )
    return _compiled_flex(q, k, v, block_mask=_block_masks[key], enable_gqa=True)
