"""The fp64 reference's greedy continuations of a few prompts: what every server test expects."""

from __future__ import annotations

import torch

from flint_backend.chat.request import encode_text_input

N_TOKENS = 12
TIE_MARGIN = 1e-4
CANDIDATE_PROMPTS = ["Hello world", "The quick brown fox", "def main():", "Triton serves models",
                     "Once upon a time", "1 2 3 4 5", "Flint is a mixture of experts", "naïve café ünïcode"]


def reference_model(checkpoint):
    import flint_backend.reference  # noqa: F401  registers the model with transformers
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.float64).eval()


def greedy_reference_texts(checkpoint, tokenizer) -> dict[str, tuple[list[int], str]]:
    """prompt -> (greedy ids, their text) of the fp64 reference, for prompts whose first N_TOKENS
    greedy steps have no near-tie (an fp32 engine may rightly break those the other way)."""
    model = reference_model(checkpoint)
    texts = {}
    for prompt in CANDIDATE_PROMPTS:
        ids, out = encode_text_input(tokenizer, prompt), []
        with torch.no_grad():
            for _ in range(N_TOKENS):
                top = model(torch.tensor([ids + out])).logits[0, -1].topk(2)
                if top.values[0] - top.values[1] < TIE_MARGIN:
                    break
                out.append(int(top.indices[0]))
        if len(out) == N_TOKENS:
            texts[prompt] = (out, tokenizer.decode(out, skip_special_tokens=True))
    assert len(texts) >= 4, f"only {len(texts)} near-tie-free prompts"
    return texts


def reference_logprobs(checkpoint, ids: list[int]) -> torch.Tensor:
    """[len(ids) - 1, vocab] fp64: the reference's log-softmax before each of ids[1:]."""
    with torch.no_grad():
        logits = reference_model(checkpoint)(torch.tensor([ids])).logits[0]
    return logits[:-1].log_softmax(-1)
