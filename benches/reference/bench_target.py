"""Times the Qwen3.5 target feature pass in `transformers` on a case prepared by `dflash-bench`.

The case holds ``target/`` (a Qwen3_5ForConditionalGeneration checkpoint written by the engine)
and ``input_ids.safetensors`` (``input_ids``, ``layer_ids``). The text model is built from
``text_config`` and loaded with the checkpoint's ``model.language_model.*`` weights (the vision
tower is not needed for text). Features are the residual stream after each tap layer, read with
forward hooks; the forward stops after the last tap, as the engine's does, so both run the same
layers. transformers runs its plain-PyTorch paths here (chunked gated delta rule, torch causal
conv) because the CUDA kernels (flash-linear-attention, causal-conv1d) do not exist on CPU.
Prints one JSON object as the last line of stdout, with the difference from the engine's
features (``features-engine.safetensors``) when that file exists.
"""
from __future__ import annotations

import argparse
import json
import sys
import traceback
from pathlib import Path

import torch
from safetensors.torch import load_file

sys.path.insert(0, str(Path(__file__).parent))
import benchutil as bu  # noqa: E402

PREFIX = "model.language_model."


class _Stop(Exception):
    pass


def load_text_model(target_dir: Path):
    from transformers import Qwen3_5TextConfig
    from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5TextModel

    cfg = json.loads((target_dir / "config.json").read_text())
    text = dict(cfg.get("text_config", cfg))
    config = Qwen3_5TextConfig(**{k: v for k, v in text.items() if k not in ("model_type", "architectures")})
    config._attn_implementation = "sdpa"
    model = Qwen3_5TextModel(config).eval().float()
    raw = load_file(str(target_dir / "model.safetensors"))
    state = {k[len(PREFIX):]: v for k, v in raw.items() if k.startswith(PREFIX)}
    missing, unexpected = model.load_state_dict(state, strict=False)
    missing = [m for m in missing if "rotary_emb" not in m]
    if missing or unexpected:
        raise RuntimeError(f"checkpoint does not fit the text model: missing {missing[:5]}, unexpected {unexpected[:5]}")
    return model


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--case", required=True, type=Path)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=0)
    args = ap.parse_args()
    threads = bu.set_threads(args.threads)
    result = {"impl": "transformers", "device": "cpu", "dtype": "f32", "threads": threads, "torch": torch.__version__}
    try:
        import transformers

        result["transformers"] = transformers.__version__
        model = load_text_model(args.case / "target")
        ids_file = load_file(str(args.case / "input_ids.safetensors"))
        ids, layer_ids = ids_file["input_ids"], ids_file["layer_ids"].tolist()
        last = max(layer_ids)
        taps = {}

        def hook(index):
            def fn(_module, _inputs, output):
                taps[index] = (output[0] if isinstance(output, tuple) else output).detach()
                if index == last:
                    raise _Stop

            return fn

        for i in set(layer_ids):
            model.layers[i].register_forward_hook(hook(i))

        def features():
            taps.clear()
            with torch.no_grad():
                try:
                    model(input_ids=ids, use_cache=False)
                except _Stop:
                    pass
            return torch.cat([taps[i] for i in layer_ids], dim=-1)

        first, times, cpu = None, [], []
        result["baseline_rss_mb"] = bu.rss_mb()
        result["load_peak_rss_mb"] = bu.peak_rss_mb()
        result["peak_reset"] = bu.reset_peak_rss()
        for i in range(args.warmup + args.steps):
            with bu.Timer(torch.device("cpu")) as t:
                out = features()
            if first is None:
                first = out
            if i >= args.warmup:
                times.append(t.ms)
                cpu.append(t.cpu_ms)
        result["step_peak_rss_mb"] = bu.peak_rss_mb()
        result.update(step_ms=times, median_step_ms=bu.median(times), cpu_ms=cpu, median_cpu_ms=bu.median(cpu), tokens=int(ids.numel()))
        engine_file = args.case / "features-engine.safetensors"
        if engine_file.is_file():
            bu.compare_to(result, first, load_file(str(engine_file))["hidden_states"])
    except Exception as e:  # reported in the JSON: the harness records why this run is missing
        result["error"] = f"{type(e).__name__}: {e}"
        traceback.print_exc(file=sys.stderr)
    return bu.finish(result)


if __name__ == "__main__":
    sys.exit(main())
