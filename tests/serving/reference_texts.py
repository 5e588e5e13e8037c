"""The oracle's greedy continuations of a few prompts: what every server test expects.

The oracle is transformers' FlintForCausalLM loaded from the served checkpoint with
AutoModelForCausalLM.from_pretrained (tests/oracle.py), in float64.
"""

from __future__ import annotations

import functools

import torch

from flint_backend.chat.request import encode_text_input

from oracle import TIE_MARGIN, NearTie, checkpoint_oracle, greedy, logits

N_TOKENS = 12
CANDIDATE_PROMPTS = ["Hello world", "The quick brown fox", "def main():", "Triton serves models",
                     "Once upon a time", "1 2 3 4 5", "Flint is a mixture of experts", "naïve café ünïcode"]


@functools.lru_cache(maxsize=2)
def reference_model(checkpoint):
    return checkpoint_oracle(checkpoint, torch.float64)


def greedy_reference_texts(checkpoint, tokenizer) -> dict[str, tuple[list[int], str]]:
    """prompt -> (greedy ids, their text) of the oracle, for prompts whose first N_TOKENS greedy
    steps have no near-tie (an fp32 engine may rightly break those the other way)."""
    model = reference_model(checkpoint)
    texts = {}
    for prompt in CANDIDATE_PROMPTS:
        try:
            out = greedy(model, encode_text_input(tokenizer, prompt), N_TOKENS, tie_margin=TIE_MARGIN)
        except NearTie:
            continue
        texts[prompt] = (out, tokenizer.decode(out, skip_special_tokens=True))
    assert len(texts) >= 4, f"only {len(texts)} near-tie-free prompts"
    return texts


def reference_logprobs(checkpoint, ids: list[int]) -> torch.Tensor:
    """[len(ids) - 1, vocab] float64: the oracle's log-softmax before each of ids[1:]."""
    return logits(reference_model(checkpoint), ids)[:-1].log_softmax(-1)
