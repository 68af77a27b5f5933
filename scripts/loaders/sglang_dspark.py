"""SGLang's own DSpark model reads a `--format sglang` export, for daemon/tests/daemon/loaders.rs.

usage: sglang_dspark.py EXPORT INPUTS OUT

EXPORT is a `dflashd export --format sglang` directory. SGLang 0.5.23's `Qwen3DSparkModel`
(`sglang/srt/models/dspark.py`) is built on CPU from its `config.json` (read with transformers'
AutoConfig, as SGLang's model config does) after SGLang's own single-process setup for layer
tests (`sglang.test.layer_ut_utils.init_single_process_dist`: gloo, world size 1, TP 1), and
its weights go through SGLang's own loader (`DefaultModelLoader.load_weights_and_postprocess`
over `safetensors_weights_iterator`, i.e. the model's `load_weights`).

Every parameter starts as NaN, so one SGLang leaves unloaded shows; each of SGLang's parameters
is then compared bit for bit with the export's tensors it should hold (the fused `qkv_proj` and
`gate_up_proj` with ours concatenated in SGLang's order), and an export tensor no parameter
holds is reported as not consumed.

SGLang builds the confidence head only when SGLANG_RAGGED_VERIFY_MODE is not `static` (its
default; `build_confidence_head`), and then requires its weights. So the model is built twice:
with the default (the confidence head's tensors must be the only ones it skips) and with
`cap-accept` (every tensor consumed), and the heads run from the second.

INPUTS (safetensors) holds `hidden` [1, bs, H] (a drafter's final-normed hidden states) and
`prev_tokens` [1, bs] (the token each slot reads: the anchor's for slot 0). SGLang's Markov head
steps over the slots as its drafting loop does (`step_bias`, the state carried), and its
confidence head's `predict` runs on the same block; OUT gets `markov_bias` [bs, V],
`confidence_logit` [bs] (the raw logit) and `confidence` [bs] (SGLang's sigmoid). A JSON summary
goes to stdout.

Not run: the full draft forward. It needs SGLang's attention backends and a ForwardBatch over a
KV pool (CUDA/Triton kernels); its rotary embedding's non-CUDA fallback kernel is vLLM's
`rotary_embedding` op, so an empty `vllm._custom_ops` is registered that only raises if called
(construction does not call it; SGLang's CPU engine, SGLANG_USE_CPU_ENGINE=1, would instead
need the CPU build of sgl_kernel, which is not on PyPI).
"""

import json
import math
import os
import sys
import types
from importlib.metadata import version

import torch
from safetensors.torch import load_file, save_file

# The default (non-CPU-engine) platform's rotary embedding binds vLLM's op at construction.
if "vllm" not in sys.modules:
    _ops = types.ModuleType("vllm._custom_ops")

    def _no_rotary(*args, **kwargs):
        raise NotImplementedError("the draft forward is not run on CPU (vllm's rotary op)")

    _ops.rotary_embedding = _no_rotary
    _vllm = types.ModuleType("vllm")
    _vllm._custom_ops = _ops
    sys.modules["vllm"], sys.modules["vllm._custom_ops"] = _vllm, _ops

try:
    from sglang.srt.environ import envs
    from sglang.srt.model_loader.loader import DefaultModelLoader
    from sglang.srt.model_loader.weight_utils import safetensors_weights_iterator
    from sglang.srt.models.dspark import Qwen3DSparkModel
    from sglang.test.layer_ut_utils import init_single_process_dist
    from transformers import AutoConfig
except ImportError as error:
    sys.exit(
        f"sglang is not installed ({error}): `make soak` syncs it, or "
        "`python3 -m uv sync --frozen --group loaders`"
    )

# Where SGLang fuses the decoder layers' projections: its parameter and the checkpoint's, in
# the order it stacks them.
FUSED = {
    "qkv_proj": ("q_proj", "k_proj", "v_proj"),
    "gate_up_proj": ("gate_proj", "up_proj"),
}


def sglang_place(name: str) -> tuple:
    """The SGLang parameter our tensor `name` should be in, and its place among the fused."""
    name = name.removeprefix("model.")
    if name.startswith("layers."):
        for fused, parts in FUSED.items():
            for place, part in enumerate(parts):
                if f".{part}." in name:
                    return name.replace(f".{part}.", f".{fused}."), place
    return name, 0


def expected_parameters(stored: dict) -> dict:
    """SGLang's parameter name -> [(our tensor name, its tensor)] in the order it holds them."""
    expected = {}
    for name, tensor in stored.items():
        target, place = sglang_place(name)
        expected.setdefault(target, []).append((place, name, tensor))
    return {
        target: [(name, tensor) for _, name, tensor in sorted(parts, key=lambda p: p[0])]
        for target, parts in expected.items()
    }


def build_and_load(config, export: str) -> tuple:
    """Builds SGLang's model, loads the export through SGLang's loader, compares."""
    with torch.device("cpu"):
        model = Qwen3DSparkModel(config).float()
    params = dict(model.named_parameters())
    with torch.no_grad():
        for p in params.values():
            p.fill_(math.nan)
    files = [os.path.join(export, "model.safetensors")]
    DefaultModelLoader.load_weights_and_postprocess(
        model, safetensors_weights_iterator(files), torch.device("cpu")
    )
    stored = load_file(files[0])
    expected = expected_parameters(stored)
    consumed, differ = set(), []
    for target, parts in expected.items():
        if target not in params:
            continue
        want = torch.cat([t for _, t in parts], 0) if len(parts) > 1 else parts[0][1]
        have = params[target].detach()
        if have.shape == want.shape and torch.equal(have, want.to(have.dtype)):
            consumed.update(n for n, _ in parts)
        else:
            differ.append(target)
    unloaded = sorted(n for n, p in params.items() if p.detach().isnan().any())
    report = {
        "parameters": len(params),
        "tensors": len(stored),
        "consumed": len(consumed),
        "unconsumed": sorted(set(stored) - consumed),
        "unloaded": unloaded,
        "differ": sorted(differ),
        "confidence_head_built": model.confidence_head is not None,
        "markov_head": type(model.markov_head).__name__,
    }
    return model, report


def run_heads(model, inputs: dict) -> dict:
    """SGLang's Markov head stepped over the block, and its confidence head's predict."""
    hidden = inputs["hidden"].float()  # [1, bs, H]
    prev = inputs["prev_tokens"].long()  # [1, bs]
    bs = prev.shape[1]
    markov = model.markov_head
    state = markov.init_state(hidden[:, 0])
    biases = []
    for k in range(bs):
        bias, state = markov.step_bias(prev[:, k], hidden_states=hidden[:, k], state=state)
        biases.append(bias)
    out = {"markov_bias": torch.stack(biases, 1)[0]}
    # predict reads the previous tokens as [anchor, drafts[:-1]]; the last draft is unread.
    drafts = torch.cat([prev[:, 1:], prev[:, -1:]], 1)
    confidence, raw = model.compute_confidence(
        anchor_tokens=prev[:, 0],
        draft_tokens=drafts,
        confidence_features=hidden.reshape(bs, -1),
    )
    out["confidence"] = confidence[0]
    out["confidence_logit"] = raw[0]
    return out


def main() -> None:
    export, inputs_path, out_path = sys.argv[1:4]
    init_single_process_dist()
    config = AutoConfig.from_pretrained(export)
    summary = {"sglang_version": version("sglang"), "architectures": config.architectures}
    default_mode = envs.SGLANG_RAGGED_VERIFY_MODE.get()
    _, summary[f"ragged_verify_{default_mode}"] = build_and_load(config, export)
    with envs.SGLANG_RAGGED_VERIFY_MODE.override("cap-accept"):
        model, summary["ragged_verify_cap-accept"] = build_and_load(config, export)
    summary["model"] = type(model).__name__
    model.eval()
    with torch.no_grad():
        out = run_heads(model, load_file(inputs_path))
    out = {k: v.detach().float().contiguous() for k, v in out.items()}
    save_file(out, out_path)
    summary["shapes"] = {k: list(v.shape) for k, v in out.items()}
    json.dump(summary, sys.stdout)


if __name__ == "__main__":
    main()
