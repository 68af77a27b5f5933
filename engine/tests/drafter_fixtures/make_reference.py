"""Regenerates the drafter parity fixture read by `engine/tests/engine/drafter_reference.rs`.

An independent transcription of spec §1.5 / §2.5 in float64 PyTorch: a dense mask filled by a
plain Python loop over (row, query, key), GQA by repeating kv heads, one softmax over all
keys. Nothing here is shared with the Rust code except the spec.

    uv run python engine/tests/drafter_fixtures/make_reference.py   # needs torch + safetensors
"""
from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file

OUT = Path(__file__).parent / "reference"

CONFIG = {
    "architectures": ["DFlashDraftModel"],
    "model_type": "qwen3",
    "auto_map": {"AutoModel": "dflash.DFlashDraftModel"},
    "hidden_size": 32,
    "intermediate_size": 48,
    "num_hidden_layers": 3,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 8,
    "rms_norm_eps": 1e-6,
    # transformers 5 form on purpose: no top-level rope_theta.
    "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
    "layer_types": ["sliding_attention", "full_attention", "sliding_attention"],
    "sliding_window": 5,
    "use_sliding_window": True,
    "block_size": 4,
    "dflash_config": {"mask_token_id": 3, "target_layer_ids": [1, 3]},
    "target_hidden_size": 24,
    "num_target_layers": 6,
    "vocab_size": 64,
    "max_position_embeddings": 256,
    "hidden_act": "silu",
    "attention_bias": False,
}
CONTEXT = 21


def weights(gen: torch.Generator) -> dict[str, torch.Tensor]:
    c = CONFIG
    h, hd, inter = c["hidden_size"], c["head_dim"], c["intermediate_size"]
    nq, nkv = c["num_attention_heads"], c["num_key_value_heads"]
    feat = len(c["dflash_config"]["target_layer_ids"]) * c["target_hidden_size"]

    def lin(out, inp):
        return torch.randn(out, inp, generator=gen, dtype=torch.float64) * 0.3

    def norm(n):
        return 1.0 + torch.randn(n, generator=gen, dtype=torch.float64) * 0.3

    w = {"fc.weight": lin(h, feat), "hidden_norm.weight": norm(h), "norm.weight": norm(h)}
    for i in range(c["num_hidden_layers"]):
        p = f"layers.{i}."
        w[p + "input_layernorm.weight"] = norm(h)
        w[p + "self_attn.q_proj.weight"] = lin(nq * hd, h)
        w[p + "self_attn.k_proj.weight"] = lin(nkv * hd, h)
        w[p + "self_attn.v_proj.weight"] = lin(nkv * hd, h)
        w[p + "self_attn.o_proj.weight"] = lin(h, nq * hd)
        w[p + "self_attn.q_norm.weight"] = norm(hd)
        w[p + "self_attn.k_norm.weight"] = norm(hd)
        w[p + "post_attention_layernorm.weight"] = norm(h)
        w[p + "mlp.gate_proj.weight"] = lin(inter, h)
        w[p + "mlp.up_proj.weight"] = lin(inter, h)
        w[p + "mlp.down_proj.weight"] = lin(h, inter)
    # Round to f32 first so that the Rust side (f32) and this reference use the same values.
    return {k: v.float().double() for k, v in w.items()}


def rms(x, w, eps):
    return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def rope(x, pos, theta):
    """x [..., T, heads, d]; pos [..., T]; neox rotate-half form."""
    d = x.shape[-1]
    inv = theta ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    ang = pos.double()[..., None] * inv
    cos, sin = torch.cat([ang, ang], -1).cos()[..., None, :], torch.cat([ang, ang], -1).sin()[..., None, :]
    half = d // 2
    rot = torch.cat([-x[..., half:], x[..., :half]], -1)
    return x * cos + rot * sin


def allowed(q, j, anchors, keep, bs, s, window):
    blk, off = divmod(q, bs)
    a = anchors[blk]
    if j < s:
        ok = keep[blk] and j < a
        if window is not None:
            ok = ok and j >= a + off - (window - 1)
        return ok
    jb, joff = divmod(j - s, bs)
    # Own block only; causal inside it on sliding layers. Invalid blocks still see their own
    # block (never an empty row; they carry loss weight 0).
    return jb == blk and (window is None or joff <= off)


def forward(w, feats, emb, anchors, keep):
    c = CONFIG
    eps, theta, bs = c["rms_norm_eps"], c["rope_parameters"]["rope_theta"], c["block_size"]
    nq, nkv, hd = c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"]
    b, s, _ = feats.shape
    qn = emb.shape[1]
    ctx = rms(feats @ w["fc.weight"].T, w["hidden_norm.weight"], eps)
    block_pos = (anchors[:, :, None] + torch.arange(bs)).reshape(b, qn)
    pos = torch.cat([torch.arange(s).expand(b, s), block_pos], 1)
    h = emb
    for i, kind in enumerate(c["layer_types"]):
        p = f"layers.{i}."
        window = c["sliding_window"] if kind == "sliding_attention" else None
        x = rms(h, w[p + "input_layernorm.weight"], eps)
        q = rms((x @ w[p + "self_attn.q_proj.weight"].T).view(b, qn, nq, hd), w[p + "self_attn.q_norm.weight"], eps)
        both = torch.cat([ctx, x], 1)
        k = rms((both @ w[p + "self_attn.k_proj.weight"].T).view(b, s + qn, nkv, hd), w[p + "self_attn.k_norm.weight"], eps)
        v = (both @ w[p + "self_attn.v_proj.weight"].T).view(b, s + qn, nkv, hd)
        q = rope(q, block_pos, theta)
        k = rope(k, pos, theta)
        k = k.repeat_interleave(nq // nkv, dim=2)
        v = v.repeat_interleave(nq // nkv, dim=2)
        mask = torch.zeros(b, qn, s + qn, dtype=torch.bool)
        for r in range(b):
            an, kp = anchors[r].tolist(), keep[r].tolist()
            for qi in range(qn):
                for j in range(s + qn):
                    mask[r, qi, j] = allowed(qi, j, an, kp, bs, s, window)
        scores = torch.einsum("bqhd,bkhd->bhqk", q, k) * hd**-0.5
        scores = scores.masked_fill(~mask[:, None], float("-inf"))
        a = torch.einsum("bhqk,bkhd->bqhd", scores.softmax(-1), v).reshape(b, qn, nq * hd)
        h = h + a @ w[p + "self_attn.o_proj.weight"].T
        y = rms(h, w[p + "post_attention_layernorm.weight"], eps)
        gate = torch.nn.functional.silu(y @ w[p + "mlp.gate_proj.weight"].T)
        h = h + (gate * (y @ w[p + "mlp.up_proj.weight"].T)) @ w[p + "mlp.down_proj.weight"].T
    return rms(h, w["norm.weight"], eps)


def main():
    gen = torch.Generator().manual_seed(20240611)
    w = weights(gen)
    c = CONFIG
    feat = len(c["dflash_config"]["target_layer_ids"]) * c["target_hidden_size"]
    # Unsorted, overlapping, one at 0, one invalid slot with a stale anchor, one at S-2.
    anchors = torch.tensor([[7, 2, 7, 8, 0, 19], [12, 3, 4, 15, 9, 1]])
    keep = torch.tensor([[True, True, True, False, True, True], [True, True, True, True, True, True]])
    n = anchors.shape[1]
    feats = torch.randn(2, CONTEXT, feat, generator=gen, dtype=torch.float64).float().double()
    emb = torch.randn(2, n * c["block_size"], c["hidden_size"], generator=gen, dtype=torch.float64).float().double()
    out = forward(w, feats, emb, anchors, keep)
    OUT.mkdir(exist_ok=True)
    (OUT / "config.json").write_text(json.dumps(c, indent=2) + "\n")
    save_file({k: v.float().contiguous() for k, v in w.items()}, str(OUT / "model.safetensors"))
    save_file(
        {
            "target_features": feats.float(),
            "block_embeddings": emb.float(),
            "anchors": anchors,
            "keep": keep.to(torch.uint8),
            "expected_output": out.float(),
        },
        str(OUT / "inputs.safetensors"),
    )
    print(f"wrote {OUT}: output {tuple(out.shape)}, |out| max {out.abs().max():.3f}")


if __name__ == "__main__":
    main()
