"""Times the reference's drafter attention on an attention case prepared by `dflash-bench`.

``--attention eager``: the dense additive mask over ``[Q, S+Q]`` with SDPA, forward + backward of
``Σ out·probe`` (what the engine's attention case runs). ``--attention flex``: flex_attention with a
block mask; with ``--forward-only`` (required on CPU: torch 2.11 has no flex_attention backward
there). The mask is built inside each timed step, as in a training step.
Prints one JSON object as the last line of stdout, with the difference of the first output from
the engine's block-sparse output when that file exists.
"""
from __future__ import annotations

import argparse
import json
import sys
import traceback
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import load_file

sys.path.insert(0, str(Path(__file__).parent))
import benchutil as bu  # noqa: E402
from dflash_ref import dense_additive_mask  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--case", required=True, type=Path)
    ap.add_argument("--attention", choices=["eager", "flex"], default="eager")
    ap.add_argument("--forward-only", action="store_true")
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=0)
    args = ap.parse_args()
    threads = bu.set_threads(args.threads)
    name = f"reference-{args.attention}" + ("-forward" if args.forward_only else "")
    result = {"impl": name, "device": "cpu", "dtype": "f32", "threads": threads, "torch": torch.__version__,
              "forward_only": args.forward_only}
    try:
        meta = json.loads((args.case / "attention.json").read_text())
        t = load_file(str(args.case / "attention.safetensors"))
        bs, seq_len, window = meta["block_size"], meta["context_len"], meta["window"]
        anchors, keep = t["anchors"], t["keep"].bool()
        # [B, T, H, D] -> [B, H, T, D]; keys/values are [context | blocks].
        q = t["query"].transpose(1, 2).contiguous().requires_grad_(not args.forward_only)
        k = torch.cat((t["context_key"], t["block_key"]), 1).transpose(1, 2).contiguous().requires_grad_(not args.forward_only)
        v = torch.cat((t["context_value"], t["block_value"]), 1).transpose(1, 2).contiguous().requires_grad_(not args.forward_only)
        probe = t["probe"]
        q_len, kv_len = q.shape[2], k.shape[2]
        first = {}

        def step(i):
            with torch.set_grad_enabled(not args.forward_only):
                if args.attention == "eager":
                    mask = dense_additive_mask(anchors, keep, seq_len, bs, window, q.dtype)
                    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
                else:
                    from flex_backend import block_mask, flex_attend

                    mask = block_mask(anchors, keep, seq_len, bs, window, q_len, kv_len)
                    out = flex_attend(q, k, v, mask)
                out = out.transpose(1, 2)  # [B, Q, H, D]
                if not args.forward_only:
                    (out * probe).sum().backward()
                    for x in (q, k, v):
                        x.grad = None
            if i == 0:
                first["out"] = out.detach()

        times, cpu = [], []
        result["baseline_rss_mb"] = bu.rss_mb()
        result["load_peak_rss_mb"] = bu.peak_rss_mb()
        result["peak_reset"] = bu.reset_peak_rss()
        for i in range(args.warmup + args.steps):
            with bu.Timer(torch.device("cpu")) as timer:
                step(i)
            if i >= args.warmup:
                times.append(timer.ms)
                cpu.append(timer.cpu_ms)
        result["step_peak_rss_mb"] = bu.peak_rss_mb()
        result.update(step_ms=times, median_step_ms=bu.median(times), cpu_ms=cpu, median_cpu_ms=bu.median(cpu), positions=q_len)
        engine_out = args.case / "out-engine-block_sparse.safetensors"
        if engine_out.is_file() and "out" in first:
            bu.compare_to(result, first["out"], load_file(str(engine_out))["out"])
    except Exception as e:  # reported in the JSON: the harness records why this run is missing
        result["error"] = f"{type(e).__name__}: {e}"
        traceback.print_exc(file=sys.stderr)
    return bu.finish(result)


if __name__ == "__main__":
    sys.exit(main())
