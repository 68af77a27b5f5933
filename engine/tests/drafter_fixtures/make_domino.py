"""Regenerates the Domino head fixture read by `engine/src/model/drafter/domino_tests.rs`.

The head as PyTorch modules, the way SpecForge's `DominoDraftModel` declares it: `prefix_gru`,
a one-layer `torch.nn.GRU(bias=False, batch_first=True)`, and `embed_proj`, an
`nn.Sequential(Linear(no bias), SiLU, Linear(no bias))`. Its `state_dict()` is written as it
is (so the keys are PyTorch's own), with inputs and what the modules compute on them:

- `inputs` `[N, T, H]` -> `states`, the GRU's output from a zero state (`[N, T, G]`);
- `z` `[N, T, H]` with those states -> `correction`, `embed_proj(cat(z, states))` (`[N, T, V]`).

    uv run python engine/tests/drafter_fixtures/make_domino.py   # needs torch + safetensors
"""
from __future__ import annotations

from pathlib import Path

import torch
from safetensors.torch import save_file

OUT = Path(__file__).parent / "domino"
HIDDEN, GRU, EMB, VOCAB = 8, 6, 5, 11
SEQUENCES, STEPS = 3, 5


class Head(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.prefix_gru = torch.nn.GRU(
            input_size=HIDDEN, hidden_size=GRU, num_layers=1, batch_first=True, bias=False
        )
        self.embed_proj = torch.nn.Sequential(
            torch.nn.Linear(HIDDEN + GRU, EMB, bias=False),
            torch.nn.SiLU(),
            torch.nn.Linear(EMB, VOCAB, bias=False),
        )


def main() -> None:
    torch.manual_seed(2605)
    head = Head()
    inputs = torch.randn(SEQUENCES, STEPS, HIDDEN)
    z = torch.randn(SEQUENCES, STEPS, HIDDEN)
    with torch.no_grad():
        states, _ = head.prefix_gru(inputs)
        correction = head.embed_proj(torch.cat([z, states], dim=-1))
    OUT.mkdir(exist_ok=True)
    save_file(
        {k: v.contiguous() for k, v in head.state_dict().items()},
        OUT / "head.safetensors",
        metadata={"format": "pt"},
    )
    save_file(
        {
            "inputs": inputs,
            "states": states.contiguous(),
            "z": z,
            "correction": correction.contiguous(),
        },
        OUT / "io.safetensors",
    )


if __name__ == "__main__":
    main()
