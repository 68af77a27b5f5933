#!/usr/bin/env python3
"""Regenerate the target-model parity fixtures in tests/fixtures/target/.

Builds TINY randomly initialised targets with Hugging Face `transformers` (the ground truth),
saves them in the real checkpoint layouts, and records reference hidden states at tap layers:

* `qwen3_5/`: `Qwen3_5ForConditionalGeneration` (multimodal layout: `model.language_model.*`,
  a tiny `model.visual.*` tower, nested `text_config`), both layer kinds, plus one `mtp.*` tensor
  appended to the checkpoint the way published Qwen3.5 checkpoints carry it (loaders ignore it).
* `qwen3/`: `Qwen3ForCausalLM` dense, tied embeddings, saved in several shards with
  `model.safetensors.index.json`.

Each directory also gets `parity.safetensors` with `input_ids` [B,S] (int64), `layer_ids` (int64),
`hidden_states` [B,S,len(layer_ids)*hidden] = concat of HF `hidden_states[L+1]` (f32), and
`hidden_states_bf16`, the same with the model cast to bf16. Note that HF's `hidden_states[-1]` is
the final-normed `last_hidden_state`, so the last layer id yields a normed state (qwen3_5 taps 3,
qwen3 taps 2: both the last layer).

Norm weights get random values (the defaults 0/1 would hide a wrong norm convention), weights
use a larger init range than HF's 0.02 so that every layer moves the residual stream visibly,
and S = 100 > 64 so the chunked delta rule runs over two chunks with padding.

Each directory also gets `decode.safetensors`, the reference for incremental decoding (KV cache,
Gated DeltaNet conv and recurrent state, rollback), all from transformers' cached paths, batch 1:
`decode_prompt` [P] (P = 70 > 64: the prefill's delta rule spans two chunks);
`greedy_ids` [N] and `greedy_logits` [N,V] from `generate(do_sample=False, use_cache=True)`;
`round_blocks` [R,K], `round_logits` [R,K,V] and `round_accepted` [R]: verification rounds of a
K-token block `[known token, drafts…]` whose first `round_accepted[r]` drafts are the greedy
continuation and the next one is wrong, each block's logits computed by a forward over the block
with a cache prefilled on the committed tokens. After round r the committed sequence grows by
`round_accepted[r] + 1` tokens (a decoder must roll its caches back over the rejected rest), and
the next block starts with the target's greedy token after the last accepted one.
`--decode-only` writes just `decode.safetensors` from the checkpoints already in `--out`, leaving
every other fixture file as it is.

Run: `uv run --group fixtures python scripts/make_fixtures.py` (or any Python with torch 2.11 and
transformers>=5). Output is deterministic for a given torch/transformers version.
"""
from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

SEQ_LEN = 100
BATCH = 2
DECODE_PROMPT_LEN = 70
DECODE_NEW_TOKENS = 24
DECODE_BLOCK = 5
# Leading drafts that agree with the greedy continuation, per round (0 = the first draft is wrong,
# K-1 = the whole block is accepted).
DECODE_ACCEPTS = [2, 0, 4, 1, 3, 0, 2]


def randomize_norms_and_gates(model: torch.nn.Module, gen: torch.Generator) -> None:
    """Give every norm and GDN gate parameter non-trivial values, keeping their sign conventions."""
    with torch.no_grad():
        for name, param in model.named_parameters():
            leaf = name.rsplit(".", 2)
            if name.endswith("norm.weight"):
                # zero-centred norms (x̂·(1+w)) start at 0, plain/gated norms (w·x̂) at 1
                noise = torch.randn(param.shape, generator=gen) * 0.3
                param.copy_(param + noise)
            elif leaf[-1] == "A_log":
                param.copy_(torch.empty(param.shape).uniform_(0.5, 8.0, generator=gen).log())
            elif leaf[-1] == "dt_bias":
                param.copy_(torch.randn(param.shape, generator=gen) * 0.5 + 1.0)


def reference_hidden_states(model, input_ids: torch.Tensor, layer_ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        out = model(input_ids=input_ids, output_hidden_states=True, use_cache=False)
    hs = out.hidden_states
    return torch.cat([hs[layer + 1] for layer in layer_ids], dim=-1).contiguous()


def write_parity(out_dir: Path, model, input_ids: torch.Tensor, layer_ids: list[int]):
    hidden = reference_hidden_states(model, input_ids, layer_ids)
    # The saved checkpoint loaded in bf16, as `--dtype bf16` does. (Not `model.to(bf16)`: that
    # also rounds the RoPE `inv_freq` buffer, which `from_pretrained(dtype=bf16)` keeps in fp32.)
    bf16_model = type(model).from_pretrained(str(out_dir), dtype=torch.bfloat16).eval()
    hidden_bf16 = reference_hidden_states(bf16_model, input_ids, layer_ids)
    save_file(
        {
            "input_ids": input_ids.contiguous(),
            "layer_ids": torch.tensor(layer_ids, dtype=torch.int64),
            "hidden_states": hidden.float().contiguous(),
            "hidden_states_bf16": hidden_bf16.contiguous(),
        },
        str(out_dir / "parity.safetensors"),
        metadata={"format": "pt"},
    )
    # the same first row as a token file, for `dflashd features --input-ids`
    (out_dir / "input_ids.txt").write_text(", ".join(str(t) for t in input_ids[0].tolist()) + "\n")


def cached_block_logits(model, committed: torch.Tensor, block: torch.Tensor) -> torch.Tensor:
    """Logits of `block` [1,K] after `committed` [1,L], through transformers' own cache."""
    with torch.no_grad():
        prefill = model(input_ids=committed, use_cache=True)
        out = model(input_ids=block, cache=prefill.past_key_values, use_cache=True)
        full = model(input_ids=torch.cat([committed, block], dim=1), use_cache=False)
    cached = out.logits[0].float()
    # the cached path must agree with the plain forward, or the fixture would test transformers
    assert torch.allclose(cached, full.logits[0, -block.shape[1]:].float(), atol=1e-4), "cache != full"
    return cached


def write_decode_parity(out_dir: Path, model, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed + 2)
    vocab = model.config.get_text_config().vocab_size
    prompt = torch.randint(0, vocab, (1, DECODE_PROMPT_LEN), generator=gen)
    with torch.no_grad():
        out = model.generate(
            input_ids=prompt,
            attention_mask=torch.ones_like(prompt),
            max_new_tokens=DECODE_NEW_TOKENS,
            min_new_tokens=DECODE_NEW_TOKENS,
            do_sample=False,
            use_cache=True,
            output_logits=True,
            return_dict_in_generate=True,
            pad_token_id=0,
        )
    greedy = out.sequences[0, DECODE_PROMPT_LEN:].clone()
    greedy_logits = torch.stack([step[0].float() for step in out.logits])

    committed, done = prompt, 0  # `done`: greedy tokens committed so far
    blocks, logits, accepted = [], [], []
    for accept in DECODE_ACCEPTS:
        drafts = greedy[done + 1 : done + 1 + accept]
        wrong = ((greedy[done + 1 + accept] + 1) % vocab).view(1)
        filler = torch.randint(0, vocab, (max(0, DECODE_BLOCK - 2 - accept),), generator=gen)
        block = torch.cat([greedy[done : done + 1], drafts, wrong, filler])[:DECODE_BLOCK]
        block_logits = cached_block_logits(model, committed, block.view(1, -1))
        argmax = block_logits.argmax(-1)
        got = 0
        while got < DECODE_BLOCK - 1 and argmax[got] == block[got + 1]:
            got += 1
        assert got == accept, f"round accepted {got}, planned {accept}"
        assert argmax[got] == greedy[done + got + 1], "bonus token is not the greedy continuation"
        blocks.append(block)
        logits.append(block_logits)
        accepted.append(got)
        committed = torch.cat([committed, block[: got + 1].view(1, -1)], dim=1)
        done += got + 1
    save_file(
        {
            "decode_prompt": prompt[0].contiguous(),
            "greedy_ids": greedy.contiguous(),
            "greedy_logits": greedy_logits.contiguous(),
            "round_blocks": torch.stack(blocks).contiguous(),
            "round_logits": torch.stack(logits).contiguous(),
            "round_accepted": torch.tensor(accepted, dtype=torch.int64),
        },
        str(out_dir / "decode.safetensors"),
        metadata={"format": "pt"},
    )


def make_qwen3_5(out_dir: Path, seed: int) -> None:
    from transformers import Qwen3_5Config, Qwen3_5ForConditionalGeneration

    torch.manual_seed(seed)
    text_config = dict(
        vocab_size=160,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        linear_conv_kernel_dim=4,
        linear_key_head_dim=8,
        linear_value_head_dim=8,
        linear_num_key_heads=2,
        linear_num_value_heads=4,
        layer_types=["linear_attention", "linear_attention", "full_attention", "linear_attention"],
        rms_norm_eps=1e-6,
        initializer_range=0.15,
        tie_word_embeddings=False,
        max_position_embeddings=512,
        rope_parameters={
            "rope_type": "default",
            "rope_theta": 10000.0,
            "partial_rotary_factor": 0.25,
            "mrope_section": [1, 1, 0],
            "mrope_interleaved": True,
        },
    )
    vision_config = dict(
        depth=1,
        hidden_size=16,
        intermediate_size=16,
        num_heads=2,
        patch_size=4,
        spatial_merge_size=2,
        temporal_patch_size=2,
        out_hidden_size=32,
        num_position_embeddings=16,
    )
    config = Qwen3_5Config(text_config=text_config, vision_config=vision_config, tie_word_embeddings=False)
    config._attn_implementation = "sdpa"  # the transformers default
    model = Qwen3_5ForConditionalGeneration(config).eval().float()
    gen = torch.Generator().manual_seed(seed + 1)
    randomize_norms_and_gates(model, gen)

    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(out_dir), safe_serialization=True)
    append_mtp_tensor(out_dir / "model.safetensors")

    input_ids = torch.randint(0, text_config["vocab_size"], (BATCH, SEQ_LEN), generator=gen)
    layer_ids = [0, 2, 3]
    write_parity(out_dir, model, input_ids, layer_ids)
    write_decode_parity(out_dir, model, seed)


def append_mtp_tensor(path: Path) -> None:
    """Published Qwen3.5 checkpoints carry `mtp.*` weights that transformers ignores; so must we."""
    with safe_open(str(path), framework="pt") as f:
        tensors = {k: f.get_tensor(k) for k in f.keys()}
        metadata = f.metadata() or {"format": "pt"}
    tensors["mtp.fc.weight"] = torch.zeros(4, 4)
    save_file(tensors, str(path), metadata=metadata)


def make_qwen3(out_dir: Path, seed: int) -> None:
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(seed)
    config = Qwen3Config(
        vocab_size=160,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        rms_norm_eps=1e-6,
        initializer_range=0.15,
        tie_word_embeddings=True,
        max_position_embeddings=512,
        rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
    )
    config._attn_implementation = "sdpa"  # the transformers default
    model = Qwen3ForCausalLM(config).eval().float()
    gen = torch.Generator().manual_seed(seed + 1)
    randomize_norms_and_gates(model, gen)

    out_dir.mkdir(parents=True, exist_ok=True)
    # small shards so the fixture exercises model.safetensors.index.json
    model.save_pretrained(str(out_dir), safe_serialization=True, max_shard_size="40KB")

    input_ids = torch.randint(0, config.vocab_size, (BATCH, SEQ_LEN), generator=gen)
    layer_ids = [2, 0]  # deliberately out of order: features concatenate in the requested order
    write_parity(out_dir, model, input_ids, layer_ids)
    write_decode_parity(out_dir, model, seed)


def clean(out_dir: Path) -> None:
    if out_dir.exists():
        for p in out_dir.iterdir():
            if p.is_file():
                p.unlink()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    repo = Path(__file__).resolve().parent.parent
    ap.add_argument("--out", type=Path, default=repo / "tests" / "fixtures" / "target")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument(
        "--decode-only",
        action="store_true",
        help="only (re)write decode.safetensors from the checkpoints already in --out",
    )
    args = ap.parse_args()
    torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))

    if args.decode_only:
        from transformers import Qwen3_5ForConditionalGeneration, Qwen3ForCausalLM

        for name, cls in (("qwen3_5", Qwen3_5ForConditionalGeneration), ("qwen3", Qwen3ForCausalLM)):
            out_dir = args.out / name
            model = cls.from_pretrained(str(out_dir), dtype=torch.float32).eval()
            write_decode_parity(out_dir, model, args.seed)
            print(f"{out_dir / 'decode.safetensors'}: {(out_dir / 'decode.safetensors').stat().st_size / 1024:.1f} KiB")
        return

    for name, build in (("qwen3_5", make_qwen3_5), ("qwen3", make_qwen3)):
        out_dir = args.out / name
        clean(out_dir)
        build(out_dir, args.seed)
        files = sorted(p.name for p in out_dir.iterdir())
        size = sum(p.stat().st_size for p in out_dir.iterdir())
        print(f"{out_dir}: {size / 1024:.1f} KiB {json.dumps(files)}")


if __name__ == "__main__":
    main()
