"""PyTorch reference of the DFlash drafter training step (spec: docs in ../shared, §1.5, §2.2–2.8).

Written independently of the Rust engine so that the two can be checked against each other:
same drafter weights (HF layout), same batch (a safetensors file the engine writes), same loss.
Two attention back-ends:
  * ``eager``: a dense additive mask over [Q, S+Q] with SDPA (the way SpecForge's eager path works);
  * ``flex``:  ``torch.nn.attention.flex_attention`` with a block mask (compiled; on CPU this needs
    a C++ compiler).
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import load_file


@dataclass
class DrafterConfig:
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    layer_types: list[str]
    sliding_window: int | None
    block_size: int
    mask_token_id: int

    @staticmethod
    def from_hf(path: Path) -> "DrafterConfig":
        cfg = json.loads(path.read_text())
        theta = cfg.get("rope_theta")
        if theta is None:
            theta = cfg["rope_parameters"]["rope_theta"]
        n = cfg["num_hidden_layers"]
        return DrafterConfig(
            hidden_size=cfg["hidden_size"],
            intermediate_size=cfg["intermediate_size"],
            num_layers=n,
            num_heads=cfg["num_attention_heads"],
            num_kv_heads=cfg["num_key_value_heads"],
            head_dim=cfg.get("head_dim", cfg["hidden_size"] // cfg["num_attention_heads"]),
            rms_norm_eps=cfg["rms_norm_eps"],
            rope_theta=float(theta),
            layer_types=cfg.get("layer_types", ["full_attention"] * n),
            sliding_window=cfg.get("sliding_window"),
            block_size=cfg["block_size"],
            mask_token_id=cfg["dflash_config"]["mask_token_id"],
        )


def rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    dtype = x.dtype
    x32 = x.float()
    x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return w * x32.to(dtype)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def rope_cos_sin(positions: torch.Tensor, head_dim: int, theta: float):
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
    angles = positions.float()[..., None] * inv_freq
    emb = torch.cat((angles, angles), dim=-1)
    return emb.cos(), emb.sin()


def visibility(anchors, keep, seq_len, block_size, sliding_window):
    """Boolean [B, Q, S+Q]: spec §2.5 (SpecForge semantics). Invalid blocks see their own block only,
    so their rows are never empty (they carry zero loss weight)."""
    bsz, n_blocks = anchors.shape
    q_len = n_blocks * block_size
    q_idx = torch.arange(q_len)
    blk = q_idx // block_size
    off = q_idx % block_size
    anchor_q = anchors[:, blk]  # [B,Q]
    keep_q = keep[:, blk]
    kv = torch.arange(seq_len + q_len)
    is_ctx = kv < seq_len
    ctx_ok = kv[None, None, :] < anchor_q[:, :, None]
    if sliding_window is not None:
        ctx_ok &= kv[None, None, :] >= (anchor_q + off[None, :] - (sliding_window - 1))[:, :, None]
    ctx_ok &= keep_q[:, :, None]
    kv_draft = (kv - seq_len).clamp(min=0)
    same_block = (kv_draft // block_size)[None, :] == blk[:, None]
    draft_ok = same_block
    if sliding_window is not None:
        draft_ok = draft_ok & ((kv_draft % block_size)[None, :] <= off[:, None])
    return torch.where(is_ctx[None, None, :], ctx_ok, draft_ok[None].expand(bsz, -1, -1))


class Drafter(torch.nn.Module):
    def __init__(self, cfg: DrafterConfig, weights: dict[str, torch.Tensor], dtype=torch.float32):
        super().__init__()
        self.cfg = cfg
        self.params = torch.nn.ParameterDict(
            {k.replace(".", "__"): torch.nn.Parameter(v.to(dtype)) for k, v in weights.items()}
        )

    def w(self, name: str) -> torch.Tensor:
        return self.params[name.replace(".", "__")]

    def forward(self, target_features, block_emb, anchors, keep, attention: str):
        cfg = self.cfg
        bsz, seq_len, _ = target_features.shape
        q_len = block_emb.shape[1]
        ctx = rms_norm(F.linear(target_features, self.w("fc.weight")), self.w("hidden_norm.weight"), cfg.rms_norm_eps)
        block_pos = (anchors[:, :, None] + torch.arange(cfg.block_size)).reshape(bsz, q_len)
        pos = torch.cat((torch.arange(seq_len).expand(bsz, -1), block_pos), dim=1)
        cos, sin = rope_cos_sin(pos, cfg.head_dim, cfg.rope_theta)
        cos, sin = cos[:, None].to(block_emb.dtype), sin[:, None].to(block_emb.dtype)  # [B,1,S+Q,D]
        masks = {}
        h = block_emb
        for i in range(cfg.num_layers):
            p = f"layers.{i}."
            sliding = cfg.layer_types[i] == "sliding_attention"
            window = cfg.sliding_window if sliding else None
            x = rms_norm(h, self.w(p + "input_layernorm.weight"), cfg.rms_norm_eps)
            q = F.linear(x, self.w(p + "self_attn.q_proj.weight")).view(bsz, q_len, cfg.num_heads, cfg.head_dim)
            q = rms_norm(q, self.w(p + "self_attn.q_norm.weight"), cfg.rms_norm_eps).transpose(1, 2)
            kv_in = torch.cat((ctx, x), dim=1)
            k = F.linear(kv_in, self.w(p + "self_attn.k_proj.weight")).view(bsz, seq_len + q_len, cfg.num_kv_heads, cfg.head_dim)
            k = rms_norm(k, self.w(p + "self_attn.k_norm.weight"), cfg.rms_norm_eps).transpose(1, 2)
            v = F.linear(kv_in, self.w(p + "self_attn.v_proj.weight")).view(bsz, seq_len + q_len, cfg.num_kv_heads, cfg.head_dim).transpose(1, 2)
            q = q * cos[:, :, seq_len:] + rotate_half(q) * sin[:, :, seq_len:]
            k = k * cos + rotate_half(k) * sin
            if attention == "eager":
                if window not in masks:
                    allowed = visibility(anchors, keep, seq_len, cfg.block_size, window)
                    masks[window] = torch.zeros(allowed.shape, dtype=q.dtype).masked_fill(~allowed, float("-inf"))[:, None]
                a = F.scaled_dot_product_attention(q, k, v, attn_mask=masks[window], enable_gqa=True)
            elif attention == "flex":
                from flex_backend import flex_attend

                a = flex_attend(q, k, v, anchors, keep, seq_len, cfg.block_size, window)
            else:
                raise ValueError(f"unknown attention back-end {attention!r}")
            a = a.transpose(1, 2).reshape(bsz, q_len, cfg.num_heads * cfg.head_dim)
            h = h + F.linear(a, self.w(p + "self_attn.o_proj.weight"))
            y = rms_norm(h, self.w(p + "post_attention_layernorm.weight"), cfg.rms_norm_eps)
            mlp = F.silu(F.linear(y, self.w(p + "mlp.gate_proj.weight"))) * F.linear(y, self.w(p + "mlp.up_proj.weight"))
            h = h + F.linear(mlp, self.w(p + "mlp.down_proj.weight"))
        return rms_norm(h, self.w("norm.weight"), cfg.rms_norm_eps)


def labels_and_weights(input_ids, loss_mask, anchors, keep, block_size, gamma):
    """Spec §2.6: same-position labels, weight keep·valid·(k>0)·loss_mask·exp(-(k-1)/γ)."""
    seq_len = input_ids.shape[1]
    k = torch.arange(block_size)
    label_idx = anchors[:, :, None] + k  # [B,N,bs]
    valid = label_idx < seq_len
    clamped = label_idx.clamp(max=seq_len - 1)
    targets = torch.gather(input_ids, 1, clamped.flatten(1)).view_as(label_idx)
    supervised = torch.gather(loss_mask, 1, clamped.flatten(1)).view_as(label_idx) > 0
    w = (keep[:, :, None] & valid & (k > 0) & supervised).float()
    if gamma:
        w = w * torch.exp(-(k - 1).clamp(min=0).float() / gamma)
    return targets.flatten(1), w.flatten(1)


def block_inputs(input_ids, anchors, keep, block_size, mask_token_id):
    bsz, n_blocks = anchors.shape
    ids = torch.full((bsz, n_blocks, block_size), mask_token_id, dtype=torch.long)
    first = torch.gather(input_ids, 1, anchors)
    ids[:, :, 0] = torch.where(keep, first, torch.full_like(first, mask_token_id))
    return ids.flatten(1)


def weighted_ce(hidden, lm_head, targets, weights, chunk: int = 2048):
    """Σ w·CE / Σ w, LM head applied in chunks of positions (logits never whole)."""
    total = hidden.new_zeros((), dtype=torch.float32)
    for start in range(0, hidden.shape[1], chunk):
        h = hidden[:, start : start + chunk]
        logits = F.linear(h, lm_head).float()
        ce = F.cross_entropy(logits.flatten(0, 1), targets[:, start : start + chunk].flatten(), reduction="none")
        total = total + (ce * weights[:, start : start + chunk].flatten()).sum()
    return total / weights.sum().clamp(min=1e-9)


def load_drafter(drafter_dir: Path, dtype=torch.float32) -> Drafter:
    cfg = DrafterConfig.from_hf(drafter_dir / "config.json")
    weights = load_file(str(drafter_dir / "model.safetensors"))
    return Drafter(cfg, weights, dtype)


def lr_at(step: int, base_lr: float, total_steps: int, warmup_ratio: float) -> float:
    warmup = max(1, math.ceil(total_steps * warmup_ratio))
    if step < warmup:
        return base_lr * (step + 1) / warmup
    progress = (step - warmup) / max(1, total_steps - warmup)
    return base_lr * 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))
