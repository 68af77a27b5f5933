"""PyTorch reference of the DFlash drafter training step (spec: ../shared/docs, §1.5, §2.2–2.8).

Written independently of the Rust engine so that the two can be checked against each other:
same drafter weights (HF layout), same batch (a safetensors file the engine writes), same loss.
It is the step a competent PyTorch user would write, SpecForge style:

* attention back-ends:
  - ``eager``: a dense additive mask over ``[Q, S+Q]`` with SDPA (SpecForge's eager/SDPA path);
  - ``flex``: ``torch.nn.attention.flex_attention`` with a block mask built once per step
    (SpecForge's default on GPU). torch 2.11 has no flex_attention backward on CPU, so on CPU
    flex can only be timed and compared in forward.
* loss: weighted CE through the frozen LM head in chunks, each chunk backpropagated at once
  (SpecForge checkpoints the chunked objective for the same reason: logits never exist whole);
  only positions with a positive weight are projected, exactly the work the engine does;
* optimizer: ``torch.optim.AdamW`` on fp32 master weights (bf16 parameters on GPU), global-norm
  clipping with ``torch.nn.utils.clip_grad_norm_``.
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
        projector = cfg.get("dflash_config", {}).get("projector_type")
        if projector == "domino" or "DominoDraftModel" in cfg.get("architectures", []):
            # Training a Domino head changes the loss (its GRU and embed_proj correct the
            # logits); run as DFlash, the step would not be the engine's.
            raise ValueError("the reference implements DFlash's head only; this drafter has a Domino head")
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
            head_dim=cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"],
            rms_norm_eps=cfg["rms_norm_eps"],
            rope_theta=float(theta),
            layer_types=cfg.get("layer_types") or ["full_attention"] * n,
            sliding_window=cfg.get("sliding_window"),
            block_size=cfg["block_size"],
            mask_token_id=cfg["dflash_config"]["mask_token_id"],
        )

    def window(self, layer: int) -> int | None:
        return self.sliding_window if self.layer_types[layer] == "sliding_attention" else None


def rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    dtype = x.dtype
    x32 = x.float()
    x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return w * x32.to(dtype)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def rope_cos_sin(positions: torch.Tensor, head_dim: int, theta: float):
    exps = torch.arange(0, head_dim, 2, dtype=torch.float32, device=positions.device) / head_dim
    inv_freq = 1.0 / (theta**exps)
    angles = positions.float()[..., None] * inv_freq
    emb = torch.cat((angles, angles), dim=-1)
    return emb.cos(), emb.sin()


def visibility(anchors, keep, seq_len, block_size, sliding_window):
    """Boolean [B, Q, S+Q]: spec §2.5 (SpecForge semantics). Invalid blocks see their own block only,
    so their rows are never empty (they carry zero loss weight)."""
    device = anchors.device
    bsz, n_blocks = anchors.shape
    q_len = n_blocks * block_size
    q_idx = torch.arange(q_len, device=device)
    blk = q_idx // block_size
    off = q_idx % block_size
    anchor_q = anchors[:, blk]  # [B,Q]
    keep_q = keep[:, blk]
    kv = torch.arange(seq_len + q_len, device=device)
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


def dense_additive_mask(anchors, keep, seq_len, block_size, window, dtype):
    allowed = visibility(anchors, keep, seq_len, block_size, window)
    mask = torch.zeros(allowed.shape, dtype=dtype, device=anchors.device)
    return mask.masked_fill_(~allowed, float("-inf"))[:, None]  # [B,1,Q,S+Q]


class Drafter(torch.nn.Module):
    def __init__(self, cfg: DrafterConfig, weights: dict[str, torch.Tensor], dtype=torch.float32, device="cpu"):
        super().__init__()
        self.cfg = cfg
        self.params = torch.nn.ParameterDict(
            {k.replace(".", "__"): torch.nn.Parameter(v.to(device=device, dtype=dtype)) for k, v in weights.items()}
        )
        self.compiled_layer = None

    def w(self, name: str) -> torch.Tensor:
        return self.params[name.replace(".", "__")]

    def attention_masks(self, anchors, keep, seq_len, attention: str, dtype):
        """One mask per distinct window, built once per step and shared by the layers."""
        cfg = self.cfg
        masks = {}
        for i in range(cfg.num_layers):
            window = cfg.window(i)
            if window in masks:
                continue
            if attention == "eager":
                masks[window] = dense_additive_mask(anchors, keep, seq_len, cfg.block_size, window, dtype)
            elif attention == "flex":
                from flex_backend import block_mask

                q_len = anchors.shape[1] * cfg.block_size
                masks[window] = block_mask(anchors, keep, seq_len, cfg.block_size, window, q_len, seq_len + q_len)
            else:
                raise ValueError(f"unknown attention back-end {attention!r}")
        return masks

    LAYER_WEIGHTS = (
        "input_layernorm", "self_attn.q_proj", "self_attn.q_norm", "self_attn.k_proj", "self_attn.k_norm",
        "self_attn.v_proj", "self_attn.o_proj", "post_attention_layernorm", "mlp.gate_proj", "mlp.up_proj",
        "mlp.down_proj",
    )

    def layer_weights(self, i: int):
        return tuple(self.w(f"layers.{i}.{name}.weight") for name in self.LAYER_WEIGHTS)

    def layer(self, w, h, ctx, cos, sin, mask, attention: str):
        """One decoder layer; its weights come in as arguments (``layer_weights``) so that a
        compiled layer is one graph shared by every layer of the same shape."""
        cfg = self.cfg
        ln_in, wq, q_norm, wk, k_norm, wv, wo, ln_post, w_gate, w_up, w_down = w
        bsz, q_len, _ = h.shape
        seq_len = ctx.shape[1]
        x = rms_norm(h, ln_in, cfg.rms_norm_eps)
        q = F.linear(x, wq).view(bsz, q_len, cfg.num_heads, cfg.head_dim)
        q = rms_norm(q, q_norm, cfg.rms_norm_eps).transpose(1, 2)
        kv_in = torch.cat((ctx, x), dim=1)
        k = F.linear(kv_in, wk).view(bsz, seq_len + q_len, cfg.num_kv_heads, cfg.head_dim)
        k = rms_norm(k, k_norm, cfg.rms_norm_eps).transpose(1, 2)
        v = F.linear(kv_in, wv).view(bsz, seq_len + q_len, cfg.num_kv_heads, cfg.head_dim).transpose(1, 2)
        q = q * cos[:, :, seq_len:] + rotate_half(q) * sin[:, :, seq_len:]
        k = k * cos + rotate_half(k) * sin
        if attention == "eager":
            a = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
        else:
            from flex_backend import flex_attend

            a = flex_attend(q, k, v, mask)
        a = a.transpose(1, 2).reshape(bsz, q_len, cfg.num_heads * cfg.head_dim)
        h = h + F.linear(a, wo)
        y = rms_norm(h, ln_post, cfg.rms_norm_eps)
        return h + F.linear(F.silu(F.linear(y, w_gate)) * F.linear(y, w_up), w_down)

    def forward(self, target_features, block_emb, anchors, keep, attention: str):
        cfg = self.cfg
        device = block_emb.device
        bsz, seq_len, _ = target_features.shape
        q_len = block_emb.shape[1]
        ctx = rms_norm(F.linear(target_features, self.w("fc.weight")), self.w("hidden_norm.weight"), cfg.rms_norm_eps)
        block_pos = (anchors[:, :, None] + torch.arange(cfg.block_size, device=device)).reshape(bsz, q_len)
        pos = torch.cat((torch.arange(seq_len, device=device).expand(bsz, -1), block_pos), dim=1)
        cos, sin = rope_cos_sin(pos, cfg.head_dim, cfg.rope_theta)
        cos, sin = cos[:, None].to(block_emb.dtype), sin[:, None].to(block_emb.dtype)  # [B,1,S+Q,D]
        masks = self.attention_masks(anchors, keep, seq_len, attention, block_emb.dtype)
        layer = self.compiled_layer or self.layer
        h = block_emb
        for i in range(cfg.num_layers):
            h = layer(self.layer_weights(i), h, ctx, cos, sin, masks[cfg.window(i)], attention)
        return rms_norm(h, self.w("norm.weight"), cfg.rms_norm_eps)

    def compile(self):
        """torch.compile the decoder layer (static shapes); mask building and the loss stay eager."""
        self.compiled_layer = torch.compile(self.layer, dynamic=False)


def labels_and_weights(input_ids, loss_mask, anchors, keep, block_size, gamma):
    """Spec §2.6 (SpecForge, per-label mask): weight keep·valid·(k>0)·loss_mask·exp(-(k-1)/γ)."""
    seq_len = input_ids.shape[1]
    k = torch.arange(block_size, device=input_ids.device)
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
    ids = torch.full((bsz, n_blocks, block_size), mask_token_id, dtype=torch.long, device=input_ids.device)
    first = torch.gather(input_ids, 1, anchors)
    ids[:, :, 0] = torch.where(keep, first, torch.full_like(first, mask_token_id))
    return ids.flatten(1)


def weighted_ce_backward(out, lm_head, targets, weights, denominator: float, chunk: int):
    """Backpropagates Σ w·CE / denominator into ``out``'s graph; LM head applied chunk by chunk over
    the positions with w > 0, each chunk's logits freed after its own backward.
    Returns (Σ w·CE, Σ w, correct, counted) as Python numbers."""
    hidden = out.detach().requires_grad_(True)
    flat = hidden.reshape(-1, hidden.shape[-1])
    w = weights.reshape(-1)
    idx = (w > 0).nonzero().squeeze(1)
    tgt = targets.reshape(-1)[idx]
    w = w[idx].float()
    weighted, correct = 0.0, 0
    for start in range(0, idx.numel(), chunk):
        rows = idx[start : start + chunk]
        logits = F.linear(flat[rows], lm_head).float()
        t = tgt[start : start + chunk]
        ce = F.cross_entropy(logits, t, reduction="none")
        numerator = (ce * w[start : start + chunk]).sum()
        (numerator / denominator).backward()
        with torch.no_grad():
            correct += int((logits.argmax(-1) == t).sum())
        weighted += float(numerator.detach())
    if hidden.grad is not None:
        out.backward(hidden.grad)
    return weighted, float(w.sum()), correct, int(idx.numel())


class MasterAdamW:
    """AdamW on fp32 master weights; with fp32 parameters the parameter is its own master."""

    def __init__(self, params, lr, betas, eps, weight_decay, max_grad_norm):
        self.params = list(params)
        self.mixed = any(p.dtype != torch.float32 for p in self.params)
        if self.mixed:
            self.masters = [p.detach().float().clone().requires_grad_(True) for p in self.params]
        else:
            self.masters = self.params
        self.max_grad_norm = max_grad_norm
        self.opt = torch.optim.AdamW(self.masters, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay)
        # torch allocates the moments lazily at the first step; the engine allocates them when
        # the optimizer is built. Allocate them here too, so that the memory of the timed steps
        # measures the same things on both sides (the state is exactly torch's own initial one).
        for m in self.masters:
            self.opt.state[m] = {
                "step": torch.tensor(0.0, dtype=torch.float32),
                "exp_avg": torch.zeros_like(m, memory_format=torch.preserve_format),
                "exp_avg_sq": torch.zeros_like(m, memory_format=torch.preserve_format),
            }

    def step(self) -> float:
        if self.mixed:
            for p, m in zip(self.params, self.masters):
                m.grad = None if p.grad is None else p.grad.float()
        if self.max_grad_norm is not None:
            norm = float(torch.nn.utils.clip_grad_norm_(self.masters, self.max_grad_norm))
        else:
            norm = float(torch.linalg.vector_norm(torch.stack([m.grad.norm() for m in self.masters if m.grad is not None])))
        if math.isfinite(norm):
            self.opt.step()
            if self.mixed:
                with torch.no_grad():
                    for p, m in zip(self.params, self.masters):
                        p.copy_(m)
        return norm

    def zero_grad(self):
        for p in self.params:
            p.grad = None
        if self.mixed:
            for m in self.masters:
                m.grad = None


def load_drafter(drafter_dir: Path, dtype=torch.float32, device="cpu") -> Drafter:
    cfg = DrafterConfig.from_hf(drafter_dir / "config.json")
    weights = load_file(str(drafter_dir / "model.safetensors"))
    return Drafter(cfg, weights, dtype, device)


def lr_at(step: int, base_lr: float, total_steps: int, warmup_ratio: float) -> float:
    warmup = max(1, math.ceil(total_steps * warmup_ratio))
    if step < warmup:
        return base_lr * (step + 1) / warmup
    progress = (step - warmup) / max(1, total_steps - warmup)
    return base_lr * 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))
