"""Times the reference drafter training step on a case prepared by `dflash-bench`.

The case directory holds ``drafter/`` (HF layout, written by the engine's export code),
``batch.safetensors`` (input_ids, loss_mask, anchors, keep, target features, the frozen
embedding and LM head, and the engine's own block inputs/labels/weights for cross-checking) and
``meta.json`` (γ, lr, AdamW settings, loss chunk size).

Each step: embedding lookup, drafter forward, chunked weighted CE backward, clip + AdamW.
The same batch is used for every step, as in the engine run, so losses can be compared step by
step. Prints one JSON object as the last line of stdout.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
import traceback
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import load_file

sys.path.insert(0, str(Path(__file__).parent))
import benchutil as bu  # noqa: E402
from dflash_ref import MasterAdamW, block_inputs, labels_and_weights, load_drafter, weighted_ce_backward  # noqa: E402

DTYPES = {"f32": torch.float32, "bf16": torch.bfloat16}


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--case", required=True, type=Path)
    ap.add_argument("--attention", choices=["eager", "flex"], default="eager")
    ap.add_argument("--compile", action="store_true", help="torch.compile the decoder layer")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", choices=sorted(DTYPES), default="f32")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--threads", type=int, default=0, help="intra-op threads (0: torch default)")
    ap.add_argument("--forward-only", action="store_true", help="time forward + loss without gradients")
    ap.add_argument(
        "--memory-steps",
        type=int,
        default=0,
        help="a memory pass (CPU): RSS follows live allocations from the start, and this many steps after the others measure a step's live memory; its times are not a timing result",
    )
    return ap.parse_args()


def load_case(case: Path, device: torch.device, dtype: torch.dtype):
    meta = json.loads((case / "meta.json").read_text())
    raw = load_file(str(case / "batch.safetensors"))
    b = {k: v.to(device) for k, v in raw.items()}
    b["loss_mask"] = b["loss_mask"].to(torch.int64)
    b["keep"] = b["keep"].to(torch.bool)
    for k in ("target_features", "embed_tokens", "lm_head"):
        b[k] = b[k].to(dtype)
    return meta, b


def check_labels(model, meta, b) -> dict:
    """Recomputes block inputs, labels and weights independently and compares with the engine's."""
    cfg = model.cfg
    ids = block_inputs(b["input_ids"], b["anchors"], b["keep"], cfg.block_size, cfg.mask_token_id)
    targets, weights = labels_and_weights(b["input_ids"], b["loss_mask"], b["anchors"], b["keep"], cfg.block_size, meta["gamma"])
    return {
        "block_ids_match": bool(torch.equal(ids, b["block_input_ids"])),
        "weights_max_abs_diff": float((weights - b["weights"].float()).abs().max()),
        "targets_match": bool(torch.equal(targets[weights > 0], b["targets"][weights > 0])),
    }, ids, targets, weights


def main():
    args = parse_args()
    device = torch.device(args.device)
    dtype = DTYPES[args.dtype]
    threads = bu.set_threads(args.threads)
    impl = f"reference-{args.attention}" + ("-compile" if args.compile else "")
    result = {"impl": impl, "device": str(device), "dtype": args.dtype, "threads": threads, "torch": torch.__version__}
    memory_pass = args.memory_steps > 0 and device.type == "cpu"
    if memory_pass:
        bu.follow_live_allocations()
    try:
        meta, b = load_case(args.case, device, dtype)
        model = load_drafter(args.case / "drafter", dtype, device)
        if args.compile:
            from torch import _dynamo

            _dynamo.config.cache_size_limit = max(64, model.cfg.num_layers * 4)
            model.compile()
        labels, block_ids, targets, weights = check_labels(model, meta, b)
        result.update(labels)
        adamw = meta["adamw"]
        opt = MasterAdamW(
            model.parameters(), meta["lr"], (adamw["beta1"], adamw["beta2"]), adamw["eps"], adamw["weight_decay"], adamw["max_grad_norm"]
        )
        denominator = float(weights.sum())
        chunk = int(meta["loss_chunk_positions"])
        features, anchors, keep = b["target_features"], b["anchors"], b["keep"]
        embed, lm_head = b["embed_tokens"], b["lm_head"]

        def step():
            with torch.no_grad():
                emb = F.embedding(block_ids, embed)
            if args.forward_only:
                with torch.no_grad():
                    out = model(features, emb, anchors, keep, args.attention)
                    h = out.reshape(-1, out.shape[-1])
                    w = weights.reshape(-1)
                    idx = (w > 0).nonzero().squeeze(1)
                    num = 0.0
                    for s in range(0, idx.numel(), chunk):
                        rows = idx[s : s + chunk]
                        ce = F.cross_entropy(F.linear(h[rows], lm_head).float(), targets.reshape(-1)[rows], reduction="none")
                        num += float((ce * w[rows]).sum())
                return num / denominator, None
            t0 = time.perf_counter()
            out = model(features, emb, anchors, keep, args.attention)
            bu.sync(device)
            t1 = time.perf_counter()
            weighted, wsum, _, _ = weighted_ce_backward(out, lm_head, targets, weights, denominator, chunk)
            bu.sync(device)
            t2 = time.perf_counter()
            norm = opt.step()
            opt.zero_grad()
            bu.sync(device)
            t3 = time.perf_counter()
            phases.append(((t1 - t0) * 1e3, (t2 - t1) * 1e3, (t3 - t2) * 1e3))
            return weighted / wsum, norm

        losses, norms, times, phases, cpu = [], [], [], [], []
        result["baseline_rss_mb"] = bu.rss_mb()
        result["load_peak_rss_mb"] = bu.peak_rss_mb()
        result["peak_reset"] = bu.reset_peak_rss()
        for i in range(args.warmup + args.steps):
            with bu.Timer(device) as t:
                loss, norm = step()
            losses.append(loss)
            norms.append(norm)
            if i >= args.warmup:
                times.append(t.ms)
                cpu.append(t.cpu_ms)
        result["step_peak_rss_mb"] = bu.peak_rss_mb()
        result.update(
            step_ms=times,
            median_step_ms=bu.median(times),
            cpu_ms=cpu,
            median_cpu_ms=bu.median(cpu),
            losses=[bu.finite_or_none(x) for x in losses],
            grad_norms=[bu.finite_or_none(x) for x in norms],
            forward_only=args.forward_only,
            forward_ms=bu.median([p[0] for p in phases[args.warmup:]]),
            backward_ms=bu.median([p[1] for p in phases[args.warmup:]]),
            optimizer_ms=bu.median([p[2] for p in phases[args.warmup:]]),
            tokens=meta["tokens"],
            positions=int(block_ids.numel()),
            weighted_positions=int((weights > 0).sum()),
        )
        result.update(bu.cuda_memory(device))
        if memory_pass:
            result["live_step_mb"] = bu.live_step_mb(step, args.memory_steps)
    except Exception as e:  # reported, not raised: the harness records why the reference is void
        result["error"] = f"{type(e).__name__}: {e}"
        traceback.print_exc(file=sys.stderr)
    return bu.finish(result)


if __name__ == "__main__":
    sys.exit(main())
