import pytest
import torch

from flint_backend.config import FlintConfig
from flint_backend.reference import build_reference
from flint_backend.weights.random_init import random_weights

from engine_cases import TIE_MARGIN


@pytest.fixture(scope="session")
def tiny_reference():
    """The reference in fp64, on the weights the engine builds for flint-tiny (seed 0)."""
    config = FlintConfig.preset("flint-tiny")
    return build_reference(config, dict(random_weights(config, 0, torch.float32)), dtype=torch.float64)


@pytest.fixture(scope="session")
def greedy_oracle(tiny_reference):
    """(prompt, n) -> the reference's greedy continuation, memoised across tests.

    A continuation that passes through a near-tie (top-2 gap < TIE_MARGIN) is no fair test of an
    fp32 engine: the oracle raises NearTie and tests choose their prompts among the others."""
    cache = {}

    def oracle(prompt, n):
        key = (tuple(prompt), n)
        if key not in cache:
            ids, out = list(prompt), []
            with torch.no_grad():
                for _ in range(n):
                    top = tiny_reference(torch.tensor(ids)).logits[-1].topk(2)
                    if top.values[0] - top.values[1] < TIE_MARGIN:
                        cache[key] = NearTie(f"prompt {prompt[:8]}...: near-tie at output {len(out)}")
                        break
                    out.append(int(top.indices[0]))
                    ids.append(out[-1])
                else:
                    cache[key] = out
        if isinstance(cache[key], NearTie):
            raise cache[key]
        return cache[key]
    return oracle


class NearTie(Exception):
    pass


@pytest.fixture(scope="session")
def fair_prompts(greedy_oracle):
    """Prompts from 1 token to past the chunk size, across the window (9) and block boundaries,
    whose 10-token greedy continuation has no near-tie."""
    from engine_cases import random_prompts

    candidates = random_prompts(24, 1, 45, seed=1) + [[5] * 9, [6] * 10, [7] * 8, [1, 2, 3, 4]]
    fair = []
    for prompt in candidates:
        try:
            greedy_oracle(prompt, 10)
            fair.append(prompt)
        except NearTie:
            pass
    assert len(fair) >= 20, f"only {len(fair)} of {len(candidates)} prompts are free of near-ties"
    return fair
