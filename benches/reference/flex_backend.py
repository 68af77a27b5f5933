"""flex_attention back-end of the reference: the same visibility rule as a mask_mod, turned into a
block mask so empty tiles are skipped (what SpecForge and speculators use on GPU).

The block mask is built once per training step and per window (layers with the same rule share
it). On CUDA ``create_block_mask`` is compiled so the mask is evaluated tile by tile instead of
over the dense ``[Q, S+Q]`` grid. torch 2.11 has no flex_attention backward on CPU: there, flex
is a forward-only comparison.
"""
from __future__ import annotations

import torch
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

_compiled_flex = torch.compile(flex_attention, dynamic=False)


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


def block_mask(anchors, keep, seq_len, block_size, window, q_len, kv_len):
    mod = _mask_mod(anchors, keep, seq_len, block_size, window)
    bsz = anchors.shape[0]
    return create_block_mask(mod, bsz, None, q_len, kv_len, device=anchors.device, _compile=anchors.is_cuda)


def flex_attend(q, k, v, mask):
    return _compiled_flex(q, k, v, block_mask=mask, enable_gqa=True)
