"""Self-check: the eager (dense mask) and flex back-ends of the reference agree in forward.

torch 2.11 has no flex_attention backward on CPU, so on CPU only the forward is comparable; on a
CUDA machine (``--device cuda``) the gradients are compared too.
"""
import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from dflash_ref import Drafter, DrafterConfig  # noqa: E402


def random_drafter(device) -> Drafter:
    cfg = DrafterConfig(64, 128, 2, 4, 2, 16, 1e-6, 1e4, ["sliding_attention", "full_attention"], 24, 8, 0)
    weights = {}
    names = {"fc.weight": (64, 128), "hidden_norm.weight": (64,), "norm.weight": (64,)}
    for i in range(2):
        p = f"layers.{i}."
        names.update({p + "input_layernorm.weight": (64,), p + "post_attention_layernorm.weight": (64,),
                      p + "self_attn.q_proj.weight": (64, 64), p + "self_attn.k_proj.weight": (32, 64),
                      p + "self_attn.v_proj.weight": (32, 64), p + "self_attn.o_proj.weight": (64, 64),
                      p + "self_attn.q_norm.weight": (16,), p + "self_attn.k_norm.weight": (16,),
                      p + "mlp.gate_proj.weight": (128, 64), p + "mlp.up_proj.weight": (128, 64),
                      p + "mlp.down_proj.weight": (64, 128)})
    for n, s in names.items():
        weights[n] = torch.randn(s) * (0.1 if len(s) == 2 else 1.0) + (1.0 if len(s) == 1 else 0.0)
    return Drafter(cfg, weights, device=device)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cpu")
    args = ap.parse_args()
    device = torch.device(args.device)
    torch.manual_seed(0)
    model = random_drafter(device)
    seq_len, n_blocks = 128, 16
    feats = torch.randn(1, seq_len, 128, device=device)
    emb = torch.randn(1, n_blocks * 8, 64, device=device)
    anchors = torch.sort(torch.randperm(seq_len - 2)[:n_blocks] + 1).values[None].to(device)
    keep = torch.ones(1, n_blocks, dtype=torch.bool, device=device)
    keep[0, -2:] = False
    backward = device.type == "cuda"
    outs, grads = {}, {}
    for attention in ("eager", "flex"):
        model.zero_grad(set_to_none=True)
        with torch.set_grad_enabled(backward):
            out = model(feats, emb, anchors, keep, attention)
            if backward:
                (out * torch.linspace(-1, 1, out.numel(), device=device).view_as(out)).sum().backward()
                grads[attention] = torch.cat([p.grad.flatten() for p in model.parameters()])
        outs[attention] = out.detach()
    fwd = (outs["eager"] - outs["flex"]).abs().max().item()
    print(f"max |eager - flex| forward: {fwd:.2e}")
    assert fwd < 1e-4, "back-ends disagree in forward"
    if backward:
        bwd = (grads["eager"] - grads["flex"]).abs().max().item()
        print(f"max |eager - flex| parameter gradients: {bwd:.2e}")
        assert bwd < 1e-3, "back-ends disagree in backward"
    else:
        print("backward not compared: torch 2.11 has no flex_attention backward on CPU")


if __name__ == "__main__":
    main()
