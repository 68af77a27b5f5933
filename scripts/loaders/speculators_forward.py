"""One draft block through vLLM speculators' own model class, for daemon/tests/daemon/loaders.rs.

usage: speculators_forward.py EXPORT INPUTS OUT ANCHOR

EXPORT is a `dflashd export --format speculators` directory. INPUTS (safetensors) holds
`features` [1, T, n*H] (the target's tap features, fc's input), `input_ids` [1, T] and
`verifier_last` [1, T, H]; the block is anchored at ANCHOR (T > ANCHOR + block_size: speculators'
sampler never anchors in the last block_size positions). The model
is loaded with speculators' `from_pretrained` (eager attention: CPU), and its training forward
runs unchanged over the one anchor; what it hands its loss is kept and written to OUT:
`logits` [block, V] (DSpark: with the Markov bias), DSpark's `confidence` [block], DFlash2's
`candidate_ids` / `candidate_scores` [block, K]. A JSON summary goes to stdout.
"""

import json
import sys
from importlib.metadata import version

import torch
from safetensors.torch import load_file, save_file

try:
    from speculators.models.dflash import core as dflash_core
    from speculators.models.dflash2 import core as dflash2_core
    from speculators.models.dspark import core as dspark_core
except ImportError as error:
    sys.exit(
        f"speculators is not installed ({error}): `make soak` syncs it, or "
        "`python3 -m uv sync --frozen --group loaders`"
    )

KINDS = {
    "dflash": (dflash_core, "DFlashDraftModel", "DFlashSpeculatorConfig"),
    "dspark": (dspark_core, "DSparkDraftModel", "DSparkSpeculatorConfig"),
    "dflash2": (dflash2_core, "DFlash2DraftModel", "DFlash2SpeculatorConfig"),
}


# What speculators takes from the verifier rather than from the drafter's file.
FROM_VERIFIER = {
    "embed_tokens.weight",
    "lm_head.weight",
    "verifier_lm_head.weight",
    "verifier_norm.weight",
}


def check_loaded(model, export: str) -> None:
    """Every tensor of the file is the model's, and the model's others come from the verifier."""
    state = model.state_dict()
    stored = load_file(f"{export}/model.safetensors")
    unused = sorted(set(stored) - set(state))
    missing = sorted(set(state) - set(stored) - FROM_VERIFIER)
    differ = sorted(k for k in stored if k in state and not torch.equal(state[k], stored[k].float()))
    nan = sorted(k for k in FROM_VERIFIER if k in state and state[k].isnan().any())
    if unused or missing or differ or nan:
        sys.exit(
            f"speculators did not load {export} exactly: unused {unused}, not in the file "
            f"{missing}, changed {differ}, NaN (not loaded from the verifier) {nan}"
        )


def main() -> None:
    export, inputs_path, out_path, anchor = sys.argv[1:5]
    anchor = int(anchor)
    with open(f"{export}/config.json") as f:
        kind = json.load(f)["speculators_model_type"]
    module, model_name, config_name = KINDS[kind]
    config = getattr(module, config_name).from_pretrained(export)
    config.transformer_layer_config._attn_implementation = "eager"
    model = getattr(module, model_name).from_pretrained(export, config=config)
    model = model.float().eval()
    check_loaded(model, export)

    inputs = load_file(inputs_path)
    features = inputs["features"].float()
    input_ids = inputs["input_ids"].long()
    total = input_ids.shape[1]
    loss_mask = torch.zeros_like(input_ids)
    loss_mask[0, anchor] = 1  # the one anchor speculators' sampler can pick
    seen = {}

    def keep(*args, **kwargs):
        seen["args"], seen["kwargs"] = args, kwargs
        return torch.zeros(()), {}

    module.compute_metrics = keep
    choose = dflash_core.select_anchors

    def one_anchor(*args, **kwargs):
        anchors, valid = choose(*args, **kwargs)
        if anchors.tolist() != [anchor] or not bool(valid.all()):
            sys.exit(f"speculators chose anchors {anchors.tolist()} (valid {valid.tolist()})")
        return anchors, valid

    dflash_core.select_anchors = one_anchor
    with torch.no_grad():
        model(
            hidden_states=features,
            input_ids=input_ids,
            loss_mask=loss_mask,
            verifier_last_hidden_states=inputs["verifier_last"].float(),
            document_ids=torch.zeros_like(input_ids),
            max_anchors=1,
        )
    args, kwargs = seen["args"], seen["kwargs"]
    out = {}
    if kind == "dflash2":
        out["logits"] = kwargs["unary_logits"][0]
        out["candidate_ids"] = kwargs["training_candidate_ids"][0]
        out["candidate_scores"] = kwargs["candidate_logits"][0]
    else:
        out["logits"] = args[0][0]
        if kind == "dspark" and args[2] is not None:
            out["confidence"] = args[2][0]
    out = {k: v.detach().contiguous() for k, v in out.items()}
    save_file(out, out_path)
    json.dump(
        {
            "speculators_version": version("speculators"),
            "model": type(model).__name__,
            "kind": kind,
            "total": total,
            "shapes": {k: list(v.shape) for k, v in out.items()},
        },
        sys.stdout,
    )


if __name__ == "__main__":
    main()
