#!/usr/bin/env python3
"""Pre-trains the tiny target of dflashd's embedded default on the synthetic language.

Writes assets/tiny/target/{config.json,generation_config.json,model.safetensors}: a Qwen3.5
hybrid with exactly `TargetConfig::tiny_default()`'s architecture (vocab 512, hidden 128,
6 layers: Gated DeltaNet ×2 then gated full attention, twice), in the HF
`Qwen3_5ForConditionalGeneration` layout dflash's loader reads, weights in bf16.

Why: a random target's greedy continuations have nothing to do with the rules of the embedded
data (assets/tiny/make_tiny_dataset.py), so speculative decoding against it accepts almost
nothing whatever the drafter learns. This target speaks the synthetic language: its greedy
responses count, step, repeat and copy as the data does, and stop with the end-of-turn token.

The model is written in plain torch, not transformers (which the offline machine that made the
shipped weights could not install). `--check-fixture tests/fixtures/target/qwen3_5` compares this
implementation with the hidden states transformers recorded for that fixture (parity.safetensors).

Training data: fresh conversations drawn from make_tiny_dataset's generator with their own seed
(TRAIN_SEED), so assets/tiny/train.jsonl is held out from the target's training. Loss: next-token
cross-entropy on every token, weight 1 on supervised (assistant) tokens and PROMPT_WEIGHT on the
rest (the prompts' numbers and words are random; their structure is not).

Reproducible: fixed seeds, CPU, one thread, deterministic algorithms; the same torch version
writes the same bytes. Run from the repository root (torch and safetensors only), e.g.
  /work/main/.venv/bin/python assets/tiny/make_tiny_target.py
It prints the greedy next-token accuracy on the supervised tokens of train.jsonl.
"""
from __future__ import annotations

import argparse
import json
import math
import random
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors import safe_open
from safetensors.torch import save_file

sys.path.insert(0, str(Path(__file__).resolve().parent))
import make_tiny_dataset as language  # noqa: E402

# `TargetConfig::tiny_default()` (engine/src/model/target/config.rs), field for field.
TINY = dict(
    vocab_size=512,
    hidden_size=128,
    intermediate_size=384,
    num_hidden_layers=6,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=32,
    linear_conv_kernel_dim=4,
    linear_key_head_dim=32,
    linear_value_head_dim=32,
    linear_num_key_heads=2,
    linear_num_value_heads=4,
    layer_types=["linear_attention", "linear_attention", "full_attention"] * 2,
    rms_norm_eps=1e-6,
    rope_theta=10_000_000.0,
    partial_rotary_factor=0.25,
    attention_bias=False,
    tie_word_embeddings=False,
    max_position_embeddings=4096,
)
PREFIX = "model.language_model."
INIT_SEED = 20260601
TRAIN_SEED = 20260603
PROMPT_WEIGHT = 0.1
CHUNK = 64
# batches are cut from windows of this many batches' worth of conversations sorted by length
BUCKET_WINDOW = 16
# the samples of train.jsonl the engine's test measures the accuracy on
TEST_SAMPLES = 300


# ---------------------------------------------------------------- the model (HF Qwen3.5 text)


def rms_normalized(x, eps):
    x = x.float()
    return x * torch.rsqrt(x.square().mean(-1, keepdim=True) + eps)


def zero_centred_norm(x, w, eps):
    """Qwen3.5's RMSNorm: x̂·(1+w)."""
    return (rms_normalized(x, eps) * (1.0 + w.float())).to(x.dtype)


def gated_norm(x, z, w, eps):
    """The Gated DeltaNet output norm: w·x̂·silu(z)."""
    return (w * rms_normalized(x, eps).to(x.dtype)).float().mul(F.silu(z.float())).to(x.dtype)


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat([-x[..., half:], x[..., :half]], -1)


def rotary(x, cos, sin):
    """Partial RoPE on the first `cos.shape[-1]` dims of each head; x: [B,T,H,D]."""
    r = cos.shape[-1]
    cos, sin = cos[None, :, None, :], sin[None, :, None, :]
    head, rest = x[..., :r], x[..., r:]
    return torch.cat([head * cos + rotate_half(head) * sin, rest], -1)


def l2_normalize(x):
    return x * torch.rsqrt(x.square().sum(-1, keepdim=True) + 1e-6)


def chunk_delta_rule(q, k, v, g, beta, chunk=CHUNK):
    """Chunked gated delta rule (the WY/UT form dflash's engine and transformers use).

    q, k [B,H,T,Dk] (normalised, q scaled), v [B,H,T,Dv], g (log decay) and beta [B,H,T], fp32."""
    b, h, t, dk = q.shape
    dv = v.shape[-1]
    pad = (chunk - t % chunk) % chunk
    q, k, v = (F.pad(x, (0, 0, 0, pad)) for x in (q, k, v))
    g, beta = F.pad(g, (0, pad)), F.pad(beta, (0, pad))
    n = (t + pad) // chunk
    k_beta = (k * beta[..., None]).view(b, h, n, chunk, dk)
    v_beta = (v * beta[..., None]).view(b, h, n, chunk, dv)
    q, k = q.view(b, h, n, chunk, dk), k.view(b, h, n, chunk, dk)
    c = g.view(b, h, n, chunk).cumsum(-1)
    upper = torch.ones(chunk, chunk, dtype=torch.bool).triu(1)
    decay = (c[..., :, None] - c[..., None, :]).masked_fill(upper, float("-inf")).exp()
    kt = k.transpose(-1, -2)
    system = (k_beta @ kt) * decay
    intra = (q @ kt) * decay
    c_exp = c.exp()[..., None]
    solve = lambda rhs: torch.linalg.solve_triangular(system, rhs, upper=False, unitriangular=True)  # noqa: E731
    new_values, decayed_keys = solve(v_beta), solve(k_beta * c_exp)
    c_last = c[..., -1:]
    q_decayed = q * c_exp
    k_to_end = k * (c_last - c).exp()[..., None]
    chunk_decay = c_last.exp()[..., None]
    state = q.new_zeros(b, h, dk, dv)
    outs = []
    for i in range(n):
        corrected = new_values[:, :, i] - decayed_keys[:, :, i] @ state
        outs.append(q_decayed[:, :, i] @ state + intra[:, :, i] @ corrected)
        state = state * chunk_decay[:, :, i] + k_to_end[:, :, i].transpose(-1, -2) @ corrected
    return torch.cat(outs, 2)[:, :, :t]


def recurrent_delta_rule(q, k, v, g, beta):
    """The definition, token by token (the oracle for the chunked form)."""
    b, h, t, dk = q.shape
    state = q.new_zeros(b, h, dk, v.shape[-1])
    outs = []
    for i in range(t):
        state = state * g[:, :, i].exp()[..., None, None]
        delta = (v[:, :, i] - (k[:, :, i, :, None] * state).sum(-2)) * beta[:, :, i, None]
        state = state + k[:, :, i, :, None] * delta[..., None, :]
        outs.append((q[:, :, i, :, None] * state).sum(-2))
    return torch.stack(outs, 2)


class Model:
    """Parameters by their HF names (without the layout prefix); a pure function forward."""

    def __init__(self, cfg, params):
        self.cfg, self.p = cfg, params
        c = cfg
        rotary_dim = int(c["head_dim"] * c["partial_rotary_factor"])
        exponents = torch.arange(0, rotary_dim, 2, dtype=torch.float32) / rotary_dim
        self.inv_freq = 1.0 / (c["rope_theta"] ** exponents)

    def cos_sin(self, t):
        angles = torch.arange(t, dtype=torch.float32)[:, None] * self.inv_freq
        emb = torch.cat([angles, angles], -1)
        return emb.cos(), emb.sin()

    def attention(self, pre, x, cos, sin):
        c, p = self.cfg, self.p
        b, t, _ = x.shape
        hq, hkv, d = c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"]
        eps = c["rms_norm_eps"]
        rows = F.linear(x, p[f"{pre}.q_proj.weight"]).view(b, t, hq, 2 * d)
        q, gate = rows[..., :d], rows[..., d:].reshape(b, t, hq * d)
        k = F.linear(x, p[f"{pre}.k_proj.weight"]).view(b, t, hkv, d)
        v = F.linear(x, p[f"{pre}.v_proj.weight"]).view(b, t, hkv, d)
        q = rotary(zero_centred_norm(q, p[f"{pre}.q_norm.weight"], eps), cos, sin)
        k = rotary(zero_centred_norm(k, p[f"{pre}.k_norm.weight"], eps), cos, sin)
        q, k, v = (y.transpose(1, 2) for y in (q, k, v))
        k, v = (y.repeat_interleave(hq // hkv, 1) for y in (k, v))
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=d**-0.5)
        o = o.transpose(1, 2).reshape(b, t, hq * d) * torch.sigmoid(gate)
        return F.linear(o, p[f"{pre}.o_proj.weight"])

    def deltanet(self, pre, x, oracle=False):
        c, p = self.cfg, self.p
        b, t, _ = x.shape
        hk, hv = c["linear_num_key_heads"], c["linear_num_value_heads"]
        dk, dv = c["linear_key_head_dim"], c["linear_value_head_dim"]
        kernel = c["linear_conv_kernel_dim"]
        mixed = F.linear(x, p[f"{pre}.in_proj_qkv.weight"]).transpose(1, 2)
        conv_w = p[f"{pre}.conv1d.weight"]
        mixed = F.conv1d(mixed, conv_w, padding=kernel - 1, groups=conv_w.shape[0])[..., :t]
        mixed = F.silu(mixed).transpose(1, 2)
        z = F.linear(x, p[f"{pre}.in_proj_z.weight"]).view(b, t, hv, dv)
        beta = torch.sigmoid(F.linear(x, p[f"{pre}.in_proj_b.weight"]))
        a = F.linear(x, p[f"{pre}.in_proj_a.weight"]).float() + p[f"{pre}.dt_bias"].float()
        g = -p[f"{pre}.A_log"].float().exp() * F.softplus(a)
        q = mixed[..., : hk * dk].reshape(b, t, hk, dk)
        k = mixed[..., hk * dk : 2 * hk * dk].reshape(b, t, hk, dk)
        v = mixed[..., 2 * hk * dk :].reshape(b, t, hv, dv)
        heads = lambda y: y.transpose(1, 2).float()  # noqa: E731
        q, k = (l2_normalize(heads(y.repeat_interleave(hv // hk, 2))) for y in (q, k))
        q = q * dk**-0.5
        rule = recurrent_delta_rule if oracle else chunk_delta_rule
        core = rule(q, k, heads(v), g.transpose(1, 2), beta.transpose(1, 2).float())
        core = core.transpose(1, 2).to(x.dtype)
        normed = gated_norm(core, z, p[f"{pre}.norm.weight"], c["rms_norm_eps"])
        return F.linear(normed.reshape(b, t, hv * dv), p[f"{pre}.out_proj.weight"])

    def hidden_states(self, ids, oracle=False):
        """Residual stream after every layer (HF `hidden_states[1:]`, the last one final-normed)."""
        c, p = self.cfg, self.p
        eps = c["rms_norm_eps"]
        cos, sin = self.cos_sin(ids.shape[1])
        h = F.embedding(ids, p["embed_tokens.weight"])
        states = []
        for i, kind in enumerate(c["layer_types"]):
            pre = f"layers.{i}"
            x = zero_centred_norm(h, p[f"{pre}.input_layernorm.weight"], eps)
            if kind == "linear_attention":
                h = h + self.deltanet(f"{pre}.linear_attn", x, oracle)
            else:
                h = h + self.attention(f"{pre}.self_attn", x, cos, sin)
            x = zero_centred_norm(h, p[f"{pre}.post_attention_layernorm.weight"], eps)
            up = F.silu(F.linear(x, p[f"{pre}.mlp.gate_proj.weight"])) * F.linear(x, p[f"{pre}.mlp.up_proj.weight"])
            h = h + F.linear(up, p[f"{pre}.mlp.down_proj.weight"])
            states.append(h)
        states[-1] = zero_centred_norm(h, p["norm.weight"], eps)
        return states

    def logits(self, ids, oracle=False):
        return F.linear(self.hidden_states(ids, oracle)[-1], self.p["lm_head.weight"]).float()


def init_params(c, seed):
    """HF-like init: normal(0.02) projections and embeddings, zero-centred norms at 0, the GDN
    output norm at 1, A = U(1,16), dt_bias 1, the depthwise conv as nn.Conv1d initialises it."""
    gen = torch.Generator().manual_seed(seed)
    normal = lambda *s: torch.randn(*s, generator=gen) * 0.02  # noqa: E731
    h, i, v = c["hidden_size"], c["intermediate_size"], c["vocab_size"]
    hq, hkv, d = c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"]
    hk, hv = c["linear_num_key_heads"], c["linear_num_value_heads"]
    dk, dv, kernel = c["linear_key_head_dim"], c["linear_value_head_dim"], c["linear_conv_kernel_dim"]
    conv_dim = 2 * hk * dk + hv * dv
    p = {"embed_tokens.weight": normal(v, h)}
    for layer, kind in enumerate(c["layer_types"]):
        pre = f"layers.{layer}"
        p[f"{pre}.input_layernorm.weight"] = torch.zeros(h)
        p[f"{pre}.post_attention_layernorm.weight"] = torch.zeros(h)
        if kind == "linear_attention":
            m = f"{pre}.linear_attn"
            p[f"{m}.in_proj_qkv.weight"] = normal(conv_dim, h)
            p[f"{m}.in_proj_z.weight"] = normal(hv * dv, h)
            p[f"{m}.in_proj_b.weight"] = normal(hv, h)
            p[f"{m}.in_proj_a.weight"] = normal(hv, h)
            bound = 1.0 / math.sqrt(kernel)
            p[f"{m}.conv1d.weight"] = (torch.rand(conv_dim, 1, kernel, generator=gen) * 2 - 1) * bound
            p[f"{m}.dt_bias"] = torch.ones(hv)
            p[f"{m}.A_log"] = (torch.rand(hv, generator=gen) * 15 + 1).log()
            p[f"{m}.norm.weight"] = torch.ones(dv)
            p[f"{m}.out_proj.weight"] = normal(h, hv * dv)
        else:
            m = f"{pre}.self_attn"
            p[f"{m}.q_proj.weight"] = normal(hq * 2 * d, h)
            p[f"{m}.k_proj.weight"] = normal(hkv * d, h)
            p[f"{m}.v_proj.weight"] = normal(hkv * d, h)
            p[f"{m}.o_proj.weight"] = normal(h, hq * d)
            p[f"{m}.q_norm.weight"] = torch.zeros(d)
            p[f"{m}.k_norm.weight"] = torch.zeros(d)
        p[f"{pre}.mlp.gate_proj.weight"] = normal(i, h)
        p[f"{pre}.mlp.up_proj.weight"] = normal(i, h)
        p[f"{pre}.mlp.down_proj.weight"] = normal(h, i)
    p["norm.weight"] = torch.zeros(h)
    p["lm_head.weight"] = normal(v, h)
    return p


# ---------------------------------------------------------------- data, training, evaluation


def batch_tensors(rows):
    """Right-padded ids, next-token targets and their loss weights (0 past each row's end)."""
    width = max(len(ids) for ids, _ in rows)
    ids = torch.zeros(len(rows), width, dtype=torch.int64)
    weights = torch.zeros(len(rows), width - 1)
    for r, (row, mask) in enumerate(rows):
        ids[r, : len(row)] = torch.tensor(row)
        weights[r, : len(row) - 1] = torch.tensor([1.0 if m else PROMPT_WEIGHT for m in mask[1:]])
    return ids, ids[:, 1:], weights


def length_bucketed_batches(rows, batch, rng, window=None):
    """Shuffled batches of similar lengths (less padding: the step cost is the padded tokens'),
    in shuffled order."""
    window = window or BUCKET_WINDOW
    order = list(range(len(rows)))
    rng.shuffle(order)
    batches = []
    for w in range(0, len(order) - batch * window + 1, batch * window):
        group = sorted(order[w : w + batch * window], key=lambda j: (len(rows[j][0]), j))
        batches += [[rows[j] for j in group[b : b + batch]] for b in range(0, len(group), batch)]
    rng.shuffle(batches)
    return batches


def train(model, params, args):
    rng = random.Random(TRAIN_SEED)
    conversations = [language.conversation(rng) for _ in range(args.conversations)]
    trainable = list(params.values())
    for t in trainable:
        t.requires_grad_(True)
    opt = torch.optim.AdamW(trainable, lr=args.lr, betas=(0.9, 0.98), weight_decay=0.01)
    steps = args.epochs * (len(conversations) // (args.batch * BUCKET_WINDOW) * BUCKET_WINDOW)
    warmup = max(1, steps // 20)
    # linear warmup, then cosine down to a tenth of the peak
    schedule = lambda s: min(1.0, (s + 1) / warmup) * (0.1 + 0.45 * (1 + math.cos(math.pi * min(1.0, s / steps))))  # noqa: E731
    sched = torch.optim.lr_scheduler.LambdaLR(opt, schedule)
    order_rng = random.Random(TRAIN_SEED + 1)
    step, start = 0, time.time()
    for epoch in range(args.epochs):
        for batch in length_bucketed_batches(conversations, args.batch, order_rng):
            ids, targets, weights = batch_tensors(batch)
            logits = model.logits(ids[:, :-1])
            ce = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), reduction="none")
            loss = (ce * weights.reshape(-1)).sum() / weights.sum()
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(trainable, 1.0)
            opt.step()
            sched.step()
            step += 1
            if step % 50 == 0 or step == steps:
                print(f"step {step}/{steps} epoch {epoch} loss {loss.item():.4f} ({time.time() - start:.0f} s)", flush=True)
    for t in trainable:
        t.requires_grad_(False)


def supervised_accuracy(model, samples, batch=64):
    """Greedy next-token accuracy on the supervised tokens (teacher forcing): how often the argmax
    of the logits at position i-1 is token i, over every i with loss_mask[i] = 1."""
    hits = total = 0
    with torch.no_grad():
        for s in range(0, len(samples), batch):
            rows = samples[s : s + batch]
            ids, targets, _ = batch_tensors(rows)
            pred = model.logits(ids[:, :-1]).argmax(-1)
            for r, (row, mask) in enumerate(rows):
                sup = torch.tensor(mask[1:], dtype=torch.bool)
                n = len(row) - 1
                hits += int((pred[r, :n][sup] == targets[r, :n][sup]).sum())
                total += int(sup.sum())
    return hits, total


def greedy_response(model, prompt, limit=40):
    ids = list(prompt)
    with torch.no_grad():
        for _ in range(limit):
            nxt = int(model.logits(torch.tensor([ids]))[0, -1].argmax())
            ids.append(nxt)
            if nxt == language.EOT:
                break
    return ids[len(prompt) :]


# ---------------------------------------------------------------- files


def config_json(c, dtype):
    """What `TargetConfig::to_hf_json(Qwen3_5Multimodal, dtype)` writes for this config."""
    text = dict(
        model_type="qwen3_5_text",
        dtype=dtype,
        hidden_act="silu",
        **{k: v for k, v in c.items() if k not in ("rope_theta", "partial_rotary_factor")},
        rope_parameters=dict(
            rope_type="default",
            rope_theta=c["rope_theta"],
            partial_rotary_factor=c["partial_rotary_factor"],
            mrope_section=[11, 11, 10],
            mrope_interleaved=True,
        ),
    )
    return dict(
        architectures=["Qwen3_5ForConditionalGeneration"],
        model_type="qwen3_5",
        dtype=dtype,
        tie_word_embeddings=c["tie_word_embeddings"],
        text_config=text,
        vision_config=dict(
            model_type="qwen3_5_vision", depth=1, hidden_size=16, intermediate_size=16, num_heads=2,
            patch_size=4, spatial_merge_size=2, temporal_patch_size=2,
            out_hidden_size=c["hidden_size"], num_position_embeddings=16,
        ),
    )


def write_target(out: Path, c, params):
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(config_json(c, "bfloat16"), indent=2, sort_keys=True) + "\n")
    generation = {"bos_token_id": language.BOS, "eos_token_id": [language.EOT], "pad_token_id": language.PAD}
    (out / "generation_config.json").write_text(json.dumps(generation, indent=2, sort_keys=True) + "\n")
    tensors = {(k if k == "lm_head.weight" else PREFIX + k): v.detach().to(torch.bfloat16).contiguous() for k, v in params.items()}
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})


def read_samples(path):
    rows = []
    for line in Path(path).read_text().splitlines():
        if line.strip():
            o = json.loads(line)
            rows.append((o["input_ids"], o["loss_mask"]))
    return rows


def check_fixture(directory: Path):
    """This implementation against transformers' own hidden states for the Qwen3.5 fixture."""
    raw = json.loads((directory / "config.json").read_text())["text_config"]
    c = {k: raw[k] for k in TINY if k in raw}
    c["rope_theta"] = raw["rope_parameters"]["rope_theta"]
    c["partial_rotary_factor"] = raw["rope_parameters"]["partial_rotary_factor"]
    params = {}
    with safe_open(str(directory / "model.safetensors"), framework="pt") as f:
        for key in f.keys():
            if key.startswith(PREFIX):
                params[key[len(PREFIX) :]] = f.get_tensor(key).float()
            elif key == "lm_head.weight":
                params[key] = f.get_tensor(key).float()
    with safe_open(str(directory / "parity.safetensors"), framework="pt") as f:
        ids, layer_ids, want = (f.get_tensor(k) for k in ("input_ids", "layer_ids", "hidden_states"))
    model = Model(c, params)
    for oracle in (False, True):
        with torch.no_grad():
            states = model.hidden_states(ids, oracle)
        got = torch.cat([states[int(l)] for l in layer_ids], -1)
        err = (got - want).abs().max().item()
        form = "recurrent" if oracle else "chunked"
        print(f"{directory}: max |this - transformers| over layers {layer_ids.tolist()} ({form} delta rule) = {err:.2e}")
        if err > 1e-4:
            raise SystemExit("this model does not match transformers' Qwen3.5")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    here = Path(__file__).resolve().parent
    ap.add_argument("--out", type=Path, default=here / "target")
    ap.add_argument("--data", type=Path, default=here / "train.jsonl", help="the embedded data (accuracy is measured on it)")
    ap.add_argument("--conversations", type=int, default=16384)
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--check-fixture", type=Path, help="only compare with transformers on this fixture directory")
    args = ap.parse_args()
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    if args.check_fixture:
        check_fixture(args.check_fixture)
        return

    torch.manual_seed(INIT_SEED)
    start = time.time()
    params = init_params(TINY, INIT_SEED)
    model = Model(TINY, params)
    train(model, params, args)
    trained = time.time() - start
    # Measure what the loader will see: the weights rounded to bf16, computed in fp32.
    rounded = {k: v.to(torch.bfloat16).float() for k, v in params.items()}
    shipped = Model(TINY, rounded)
    samples = read_samples(args.data)
    write_target(args.out, TINY, params)
    print(f"trained in {trained:.0f} s; greedy next-token accuracy on the supervised tokens of {args.data.name}:")
    first_hits, first_total = supervised_accuracy(shipped, samples[:TEST_SAMPLES])
    print(f"  first {TEST_SAMPLES} samples (engine/tests/engine/embedded_target.rs): "
          f"{first_hits}/{first_total} = {first_hits / first_total:.4f}")
    rest_hits, rest_total = supervised_accuracy(shipped, samples[TEST_SAMPLES:])
    hits, total = first_hits + rest_hits, first_total + rest_total
    print(f"  all {len(samples)} samples: {hits}/{total} = {hits / total:.4f}")
    first = samples[0][0]
    prompt = first[: first.index(language.ASSISTANT) + 1]
    print(f"greedy response to {prompt}: {greedy_response(shipped, prompt)}")


if __name__ == "__main__":
    main()
