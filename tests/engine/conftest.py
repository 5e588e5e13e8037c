import pytest
import torch

from flint_backend.config import FlintConfig

from oracle import TIE_MARGIN, NearTie, greedy, random_oracle


@pytest.fixture(scope="session")
def tiny_oracle():
    """transformers' FlintForCausalLM (float64) on the weights the engine builds for flint-tiny (seed 0)."""
    return random_oracle(FlintConfig.preset("flint-tiny"), 0, torch.float64)


@pytest.fixture(scope="session")
def greedy_oracle(tiny_oracle):
    """(prompt, n) -> the oracle's greedy continuation, memoised across tests.

    A continuation that passes through a near-tie (top-2 gap < TIE_MARGIN) is no fair test of an
    fp32 engine: the oracle raises NearTie and tests choose their prompts among the others."""
    cache = {}

    def oracle(prompt, n):
        key = (tuple(prompt), n)
        if key not in cache:
            try:
                cache[key] = greedy(tiny_oracle, prompt, n, tie_margin=TIE_MARGIN)
            except NearTie as tie:
                cache[key] = tie
        if isinstance(cache[key], NearTie):
            raise cache[key]
        return cache[key]
    return oracle


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
