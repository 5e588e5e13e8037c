"""transformers' FlintForCausalLM, the oracle the engine is compared with.

Built from transformers alone (`transformers.FlintConfig` from our config.json fields, the
weights under transformers' own names: weights.hf_state), or loaded from a checkpoint with
`AutoModelForCausalLM.from_pretrained`. Eager attention and eager experts (the plain loops
transformers' Flint is written as; its grouped_mm experts take no float64). float64 by default: transformers keeps the norms, router and
attention scores in fp32, so the oracle is fp32-accurate there and fp64 elsewhere.
"""

from __future__ import annotations

import torch
import transformers

from flint_backend.config import FlintConfig
from flint_backend.weights.hf_state import transformers_state_dict
from flint_backend.weights.random_init import random_stacked_weights

TIE_MARGIN = 1e-4  # top-2 logit gaps below this are decided by rounding order, not by the model


class NearTie(Exception):
    pass


def oracle_model(config: FlintConfig, tensors: dict, dtype: torch.dtype = torch.float64):
    """FlintForCausalLM holding `tensors` (the engine's naming: weights.loader) in `dtype`, on
    their device."""
    hf_config = transformers.FlintConfig(**config.to_dict())
    with torch.device(tensors["model.embed_tokens.weight"].device):
        model = transformers.FlintForCausalLM._from_config(hf_config, attn_implementation="eager",
                                                              experts_implementation="eager", dtype=dtype)
    model.load_state_dict(transformers_state_dict(tensors, config, dtype), strict=True)
    return model.eval().requires_grad_(False)


def random_oracle(config: FlintConfig, seed: int = 0, dtype: torch.dtype = torch.float64):
    """The oracle on the random weights an engine builds for (config, seed)."""
    return oracle_model(config, random_stacked_weights(config, seed, torch.float32), dtype)


def checkpoint_oracle(path, dtype: torch.dtype = torch.float64):
    """AutoModelForCausalLM.from_pretrained(path): the official loading path, no project code."""
    model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=dtype, attn_implementation="eager",
                                                               experts_implementation="eager")
    assert type(model) is transformers.FlintForCausalLM
    return model.eval().requires_grad_(False)


@torch.no_grad()
def logits(model, ids: list[int]) -> torch.Tensor:
    """[len(ids), V] in the model's dtype."""
    return model(torch.tensor([ids])).logits[0]


@torch.no_grad()
def greedy(model, prompt: list[int], n: int, stop_ids=frozenset(), tie_margin: float | None = None) -> list[int]:
    """n greedy tokens (fewer after a stop token), recomputing the whole sequence every step.
    With tie_margin, a step whose top-2 logits are closer than it raises NearTie."""
    ids, out = list(prompt), []
    for _ in range(n):
        top = logits(model, ids)[-1].topk(2)
        if tie_margin is not None and top.values[0] - top.values[1] < tie_margin:
            raise NearTie(f"prompt {prompt[:8]}...: near-tie at output {len(out)}")
        out.append(int(top.indices[0]))
        ids.append(out[-1])
        if out[-1] in stop_ids:
            break
    return out


# The bf16 comparison: the median over rows of each row's relative L2 error of the logits (the
# median: a row whose rounding flipped a router choice is off by much more than bf16, and a few
# such rows must not decide), rows taken past the sliding window (a window error shows there
# only). A bf16 engine against the fp32 oracle on the same weights stays under the bound; each of
# four small model mutations (window one wider, shared expert dropped, rope_theta x 2, routed
# experts x 1.1) exceeds it on flint-tiny (tests/engine/test_bf16_bound.py: there the bf16 engine
# measures ~0.011, rope_theta x 2, the closest, ~0.019); the GPU tests hold flint-small to it.
BF16_BOUND = 0.015


def logits_distance(got: list[torch.Tensor], want: list[torch.Tensor]) -> float:
    """Row-matched [R_i, V] logits -> the median over all rows of ||got_r - want_r|| / ||want_r||."""
    got, want = torch.cat(got).double(), torch.cat(want).double()
    return ((got - want).norm(dim=-1) / want.norm(dim=-1)).median().item()
