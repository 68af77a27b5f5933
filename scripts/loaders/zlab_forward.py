"""One draft block through z-lab's own loader (PyPI `dflash` 0.1.0, `dflash/model.py`), for
daemon/tests/daemon/loaders.rs.

usage: zlab_forward.py EXPORT TARGET INPUTS OUT ANCHOR

EXPORT is a `dflashd export` directory in the published layout; TARGET the target's directory
(its embeddings and LM head, which z-lab's decoder takes from the target model). INPUTS holds
`features` [1, T, n*H] and `input_ids` [1, T]. The drafter is loaded with z-lab's
`DFlash2DraftModel.from_pretrained` (or `DFlashDraftModel`, by the config's architecture) and
runs one block at ANCHOR the way its `dflash_generate` does: the block's embeddings
[token at ANCHOR, MASK...], the context features of positions 0..ANCHOR-1, positions
0..ANCHOR+block-1, no mask given (the loader builds its own). OUT gets `logits` [block, V]
(`compute_logits`: DFlash2's multiplier and soft-cap applied) and, for DFlash2, `path`
[block-1] (`propose` at temperature 0: the selector's greedy walk from the anchor over slots
1..block-1). A JSON summary goes to stdout.
"""

import json
import sys
from importlib.metadata import version

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

try:
    from dflash.model import DFlash2DraftModel, DFlashDraftModel
except ImportError as error:
    sys.exit(
        f"z-lab's dflash is not installed ({error}): `make soak` syncs it, or "
        "`python3 -m uv sync --frozen --group loaders`"
    )


def target_tensor(target: str, suffix: str) -> torch.Tensor:
    with safe_open(f"{target}/model.safetensors", framework="pt") as f:
        names = [k for k in f.keys() if k.endswith(suffix)]
        return f.get_tensor(min(names, key=len)).float()


def main() -> None:
    export, target, inputs_path, out_path, anchor = sys.argv[1:6]
    anchor = int(anchor)
    with open(f"{export}/config.json") as f:
        architecture = json.load(f)["architectures"][0]
    cls = DFlash2DraftModel if architecture == "DFlash2DraftModel" else DFlashDraftModel
    model, info = cls.from_pretrained(export, dtype=torch.float32, output_loading_info=True)
    model = model.eval()
    # Every parameter from the file, every tensor of the file used.
    problems = {k: v for k, v in info.items() if v}
    if problems:
        sys.exit(f"z-lab's loader did not load {export} exactly: {problems}")

    inputs = load_file(inputs_path)
    features = inputs["features"].float()
    input_ids = inputs["input_ids"].long()
    block = model.block_size
    block_ids = torch.full((1, block), int(model.mask_token_id), dtype=torch.long)
    block_ids[0, 0] = input_ids[0, anchor]
    embed = target_tensor(target, "embed_tokens.weight")
    head = torch.nn.Linear(embed.shape[1], embed.shape[0], bias=False)
    head.weight.data = target_tensor(target, "lm_head.weight")
    with torch.no_grad():
        hidden = model(
            position_ids=torch.arange(anchor + block)[None],
            noise_embedding=torch.nn.functional.embedding(block_ids, embed),
            target_hidden=features[:, :anchor],
        )
        out = {"logits": model.compute_logits(hidden, head)[0]}
        if isinstance(model, DFlash2DraftModel):
            path, _, _ = model.propose(hidden[:, 1:], block_ids[:, 0], head, 0.0)
            out["path"] = path[0]
    out = {k: v.detach().contiguous() for k, v in out.items()}
    save_file(out, out_path)
    json.dump(
        {
            "dflash_version": version("dflash"),
            "model": type(model).__name__,
            "shapes": {k: list(v.shape) for k, v in out.items()},
        },
        sys.stdout,
    )


if __name__ == "__main__":
    main()
