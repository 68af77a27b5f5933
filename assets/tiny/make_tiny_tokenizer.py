#!/usr/bin/env python3
"""Writes the tiny target's tokenizer and chat template: assets/tiny/target/tokenizer.json and
assets/tiny/target/tokenizer_config.json.

With them the tiny target is a complete chat model, so everything dflash does with a real
target's chat data (`dflashd regenerate`, `data.format = "chat"`, chat prompt files) runs on
the embedded default too. The tokenizer spells the tiny language of make_tiny_dataset.py
exactly: rendering a conversation of train.jsonl with the chat template and tokenizing it gives
back its `input_ids`, and the qwen3.5 assistant spans give back its `loss_mask`
(`engine/tests/engine/embedded_chat.rs` holds every line of train.jsonl to that).

The layout (ids as make_tiny_dataset.py's docstring lists them):
  0  <|pad|>   1  <|bos|>   511  <|mask|>   5  <|unk|>        special, or never rendered
  2  "<|im_end|>\\n"                                          one special token: a turn's end
  3  "<|im_start|>user\\n"                                    one special token: a user header
  4  "<|im_start|>assistant\\n<think>\\n\\n</think>\\n\\n"       one special token: the assistant
     header with Qwen3.5's empty think block, as its templates render a non-thinking turn, so
     the qwen3.5 span rule (header "<|im_start|>assistant\\n<think>\\n") supervises what follows
  6 count, 7 countdown, 8 arith, 9 repeat, 10 copy, 16..47 n0..n31, 64..103 w0..w39
  every other id below 511: u<id>, so any id the target generates decodes to a word that
  encodes back to the same id.
Words are separated by single spaces (a WordLevel model over whitespace-split text, decoded by
joining with spaces), so a reply's text is its words and nothing else.

Deterministic, standard library only. Run from the repo root:
  python3 assets/tiny/make_tiny_tokenizer.py
"""
import argparse
import json

VOCAB_SIZE = 512
SPECIAL = {
    0: "<|pad|>",
    1: "<|bos|>",
    2: "<|im_end|>\n",
    3: "<|im_start|>user\n",
    4: "<|im_start|>assistant\n<think>\n\n</think>\n\n",
    5: "<|unk|>",
    511: "<|mask|>",
}
COMMANDS = {6: "count", 7: "countdown", 8: "arith", 9: "repeat", 10: "copy"}
NUM0, NUMS = 16, 32
WORD0, WORDS = 64, 40

# A miniature of Qwen3.5's template in non-thinking mode: BOS, then each turn between its header
# and "<|im_end|>\n", every assistant turn with the empty think block.
CHAT_TEMPLATE = """{{- bos_token }}
{%- for message in messages %}
    {%- if message.role == 'user' %}
        {{- '<|im_start|>user\\n' + message.content + '<|im_end|>\\n' }}
    {%- elif message.role == 'assistant' %}
        {%- if message.reasoning_content %}
            {{- raise_exception('the tiny language has no reasoning: drop reasoning_content') }}
        {%- endif %}
        {{- '<|im_start|>assistant\\n<think>\\n\\n</think>\\n\\n' + message.content + '<|im_end|>\\n' }}
    {%- else %}
        {{- raise_exception('the tiny language has user and assistant turns only, not ' + message.role) }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n<think>\\n\\n</think>\\n\\n' }}
{%- endif %}"""


def token(i):
    if i in SPECIAL:
        return SPECIAL[i]
    if i in COMMANDS:
        return COMMANDS[i]
    if NUM0 <= i < NUM0 + NUMS:
        return f"n{i - NUM0}"
    if WORD0 <= i < WORD0 + WORDS:
        return f"w{i - WORD0}"
    return f"u{i}"


def tokenizer_json():
    vocab = {token(i): i for i in range(VOCAB_SIZE)}
    assert len(vocab) == VOCAB_SIZE, "two ids share a token"
    added = [
        {
            "id": i,
            "content": content,
            "single_word": False,
            "lstrip": False,
            "rstrip": False,
            "normalized": False,
            "special": True,
        }
        for i, content in sorted(SPECIAL.items())
    ]
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": None,
        "pre_tokenizer": {"type": "WhitespaceSplit"},
        "post_processor": None,
        "decoder": None,
        "model": {"type": "WordLevel", "vocab": vocab, "unk_token": SPECIAL[5]},
    }


def tokenizer_config():
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "model_max_length": 512,
        "bos_token": SPECIAL[1],
        "eos_token": SPECIAL[2],
        "pad_token": SPECIAL[0],
        "unk_token": SPECIAL[5],
        "add_bos_token": False,
        "chat_template": CHAT_TEMPLATE,
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out-dir", default="assets/tiny/target")
    args = parser.parse_args()
    for name, value in [("tokenizer.json", tokenizer_json()), ("tokenizer_config.json", tokenizer_config())]:
        with open(f"{args.out_dir}/{name}", "w") as f:
            json.dump(value, f, indent=2, ensure_ascii=False)
            f.write("\n")


if __name__ == "__main__":
    main()
