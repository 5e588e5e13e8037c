"""Prompt logprobs (SamplingParams.prompt_logprobs, vLLM's): each prompt token's logprob given the
tokens before it, with the top N, from the raw distribution as the sampler's logprobs are.

A prefill chunk's row at position p predicts token p + 1, so the rows of a chunk give the
logprobs of the prompt tokens after them; the head runs on those rows in slices of
HEAD_ROWS (a slice's [rows, vocab] fp32 logits: 151552 x 4 B a row at full size). A sequence
keeps what it has (`Sequence.prompt_logprobs`, tokens 1, 2, ... in order), so a prompt
recomputed after a preemption adds nothing twice; the engine hands them over with the first
generated token.
"""

from __future__ import annotations

import torch

from flint_backend.engine.sampler import TokenLogprobs
from flint_backend.engine.sequence import Sequence

HEAD_ROWS = 256


def wanted(entries: list[tuple[Sequence, int]]) -> bool:
    """Whether a step of these (sequence, new tokens) entries computes prompt logprobs."""
    return any(seq.params.prompt_logprobs is not None and _positions(seq, n) for seq, n in entries)


def _positions(seq: Sequence, n: int) -> range:
    """Positions of this step's n tokens whose row gives a prompt token's logprob not yet known."""
    start = max(seq.num_computed, len(seq.prompt_logprobs))  # token p + 1 follows row p
    return range(start, min(seq.num_computed + n, seq.num_prompt_tokens - 1))


def add_prompt_logprobs(entries: list[tuple[Sequence, int]], x: torch.Tensor, residual: torch.Tensor,
                        logits_of_rows) -> None:
    """Appends to each asking sequence's prompt_logprobs those its rows of this step give.
    x, residual [N, H]: the step's hidden states, rows in `entries` order (build_step_batch);
    logits_of_rows(x, residual, rows [R]) -> [R, V] fp32."""
    row0 = 0
    for seq, n in entries:
        n_logprobs = seq.params.prompt_logprobs
        positions = _positions(seq, n) if n_logprobs is not None else range(0)
        for first in range(positions.start, positions.stop, HEAD_ROWS):
            chunk = range(first, min(first + HEAD_ROWS, positions.stop))
            rows = torch.arange(row0 + chunk.start - seq.num_computed, row0 + chunk.stop - seq.num_computed,
                                device=x.device)
            targets = torch.tensor(seq.token_ids[chunk.start + 1:chunk.stop + 1], device=x.device)
            logprobs = logits_of_rows(x, residual, rows).log_softmax(-1)  # [R, V]
            chosen = logprobs.gather(1, targets[:, None])[:, 0].tolist()
            top = logprobs.topk(n_logprobs, dim=-1) if n_logprobs > 0 else None
            ids = top.indices.tolist() if top is not None else [[] for _ in chosen]
            values = top.values.tolist() if top is not None else [[] for _ in chosen]
            seq.prompt_logprobs += [TokenLogprobs(c, list(zip(i, v))) for c, i, v in zip(chosen, ids, values)]
        row0 += n
