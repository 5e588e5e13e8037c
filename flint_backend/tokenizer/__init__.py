"""Flint's GLM-4.x-style tokenizer, shipped in this folder, and its GLM-4.7 chat template.

The files are written by `scripts/build_tokenizer.py`: a byte-level BPE of 8192 ids (the
real GLM-4.x vocabulary has 151552; ours is small so that test checkpoints stay small)
whose last 17 ids are the chat-format tags below, in this order.
`chat_template.jinja` is the template's source; transformers reads it from this folder.
"""

from __future__ import annotations

from pathlib import Path

TOKENIZER_DIR = Path(__file__).resolve().parent

# special=True: dropped by decode(..., skip_special_tokens=True).
SPECIAL_TOKENS = (
    "<|endoftext|>", "[gMASK]", "<sop>",
    "<|system|>", "<|user|>", "<|assistant|>", "<|observation|>",
)
# special=False, as in GLM-4.5/4.7: they survive skip_special_tokens, because the reasoning
# and tool-call parsers read them from the decoded text.
TAG_TOKENS = (
    "<think>", "</think>",
    "<tool_call>", "</tool_call>", "<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>",
    "<tool_response>", "</tool_response>",
)
VOCAB_SIZE = 8192
# ids VOCAB_SIZE - 17 .. VOCAB_SIZE - 1, in the order above
ADDED_TOKENS = SPECIAL_TOKENS + TAG_TOKENS

STOP_TOKENS = ("<|endoftext|>", "<|user|>", "<|observation|>")


def load_tokenizer(path: str | Path | None = None):
    from transformers import AutoTokenizer  # slow import; keep `import flint_backend.tokenizer` light

    return AutoTokenizer.from_pretrained(str(path or TOKENIZER_DIR))
