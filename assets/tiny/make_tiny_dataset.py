#!/usr/bin/env python3
"""Generates assets/tiny/train.jsonl, the dataset of dflashd's embedded default.

Synthetic two-role "conversations" over the 512-token vocabulary of the tiny target
(`TargetConfig::tiny_default()`), pre-tokenized with a loss mask: 1 on assistant response
tokens and the end-of-turn token that closes them, 0 on everything else. The assistant
spans follow rules a drafter can learn from the anchor token and the target's features of
the context before it, the way a real drafter learns the regularities of its target's output:

  count      a, a+1, a+2, ...           (mod 32)   from a start number in the prompt
  countdown  a, a-1, a-2, ...           (mod 32)
  arith      a, a+d, a+2d, ...          (mod 32)   step d given in the prompt
  repeat     p1 p2 [p3] p1 p2 [p3] ...             a 2- or 3-word pattern from the prompt
  copy       w1 w2 ... wm                          the words of the prompt, in order

Token layout (ids < 512; everything else is unused):
  0 PAD, 1 BOS, 2 END_OF_TURN, 3 USER, 4 ASSISTANT,
  6 COUNT, 7 COUNTDOWN, 8 ARITH, 9 REPEAT, 10 COPY,
  16..47   numbers n0..n31,
  64..103  words w0..w39,
  511      reserved as the drafter's mask token (never in the data).

It also writes assets/tiny/heldout_prompts.jsonl, the prompts the online evaluation decodes
during training: `{"input_ids": [...]}` per line, BOS + 0–1 complete earlier turns + a user
turn + the assistant header, i.e. everything up to where an assistant response starts. They come
from their own random stream (`--heldout-seed`), so train.jsonl is unchanged by them, and none
equals the prefix before any assistant response of train.jsonl.

Deterministic: the same seeds write the same bytes. Run from the repo root:
  python3 assets/tiny/make_tiny_dataset.py   # writes train.jsonl and heldout_prompts.jsonl
"""
import argparse
import json
import random

PAD, BOS, EOT, USER, ASSISTANT = 0, 1, 2, 3, 4
COUNT, COUNTDOWN, ARITH, REPEAT, COPY = 6, 7, 8, 9, 10
NUM0, NUMS = 16, 32
WORD0, WORDS = 64, 40
MASK_TOKEN = 511


def num(i):
    return NUM0 + (i % NUMS)


def word(i):
    return WORD0 + i


def turn(rng):
    kind = rng.choice(["count", "countdown", "arith", "repeat", "copy"])
    length = rng.randint(8, 20)
    if kind in ("count", "countdown", "arith"):
        a = rng.randrange(NUMS)
        d = {"count": 1, "countdown": -1}.get(kind) or rng.choice([2, 3, 5])
        cmd = {"count": COUNT, "countdown": COUNTDOWN, "arith": ARITH}[kind]
        prompt = [cmd, num(a)] + ([num(d)] if kind == "arith" else []) + [num(length)]
        response = [num(a + k * d) for k in range(length)]
    elif kind == "repeat":
        pattern = [word(rng.randrange(WORDS)) for _ in range(rng.choice([2, 3]))]
        prompt = [REPEAT] + pattern + [num(length)]
        response = [pattern[k % len(pattern)] for k in range(length)]
    else:
        words = [word(rng.randrange(WORDS)) for _ in range(rng.randint(6, 14))]
        prompt = [COPY] + words
        response = list(words)
    user = [USER] + prompt + [EOT]
    assistant_header = [ASSISTANT]
    ids = user + assistant_header + response + [EOT]
    mask = [0] * (len(user) + len(assistant_header)) + [1] * (len(response) + 1)
    return ids, mask


def conversation(rng):
    ids, mask = [BOS], [0]
    for _ in range(rng.choice([1, 1, 2, 2, 3])):
        t_ids, t_mask = turn(rng)
        ids += t_ids
        mask += t_mask
    return ids, mask


def training_prompts(conversations):
    """Every prefix of a conversation that ends with an assistant header (where a response starts)."""
    prompts = set()
    for ids, _ in conversations:
        for i, t in enumerate(ids):
            if t == ASSISTANT:
                prompts.add(tuple(ids[: i + 1]))
    return prompts


def heldout_prompt(rng):
    ids = [BOS]
    for _ in range(rng.choice([0, 1])):
        ids += turn(rng)[0]
    t_ids, t_mask = turn(rng)
    start = t_mask.index(1)  # the first response token; the header is just before it
    return ids + t_ids[:start]


def heldout_prompts(rng, count, exclude):
    prompts, seen = [], set(exclude)
    while len(prompts) < count:
        p = heldout_prompt(rng)
        if tuple(p) not in seen:
            seen.add(tuple(p))
            prompts.append(p)
    return prompts


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--samples", type=int, default=900)
    parser.add_argument("--seed", type=int, default=20260601)
    parser.add_argument("--out", default="assets/tiny/train.jsonl")
    parser.add_argument("--heldout-prompts", type=int, default=24)
    parser.add_argument("--heldout-seed", type=int, default=20260602)
    parser.add_argument("--heldout-out", default="assets/tiny/heldout_prompts.jsonl")
    args = parser.parse_args()
    rng = random.Random(args.seed)
    conversations = [conversation(rng) for _ in range(args.samples)]
    with open(args.out, "w") as f:
        for ids, mask in conversations:
            assert len(ids) == len(mask) and all(0 <= t < MASK_TOKEN for t in ids)
            f.write(json.dumps({"input_ids": ids, "loss_mask": mask}, separators=(",", ":")) + "\n")
    prompts = heldout_prompts(
        random.Random(args.heldout_seed), args.heldout_prompts, training_prompts(conversations)
    )
    with open(args.heldout_out, "w") as f:
        for ids in prompts:
            assert ids[-1] == ASSISTANT and all(0 <= t < MASK_TOKEN for t in ids)
            f.write(json.dumps({"input_ids": ids}, separators=(",", ":")) + "\n")


if __name__ == "__main__":
    main()
