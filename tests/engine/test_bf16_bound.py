"""The bound the bf16 comparisons use (oracle.BF16_BOUND, oracle.logits_distance), shown tight
enough to catch a real bug: on flint-tiny the bf16 engine (torch ops) is within it of the fp32
oracle on the same weights, and each of four small mutations of the model the engine runs is not.
The GPU tests (test_engine_gpu.py) hold flint-small's bf16 kernels to the same bound."""

import dataclasses

import pytest
import torch

from flint_backend.config import FlintConfig
from flint_backend.engine.engine import LLMEngine
from flint_backend.engine.engine_args import EngineArgs
from flint_backend.weights.random_init import random_stacked_weights

from engine_cases import prefill_logits, random_prompts
from oracle import BF16_BOUND, logits_distance, oracle_model

CONFIG = FlintConfig.preset("flint-tiny")
PROMPTS = random_prompts(4, 40, 48, seed=3)


def past_the_window(length: int) -> range:
    return range(2 * CONFIG.sliding_window, length)


def _theta_x2(c: FlintConfig) -> FlintConfig:
    return dataclasses.replace(c, rope_parameters={**c.rope_parameters, "rope_theta": 2 * c.rope_theta})


def _scaled(weights: dict, suffix: str, factor: float) -> dict:
    return {k: v * factor if k.endswith(suffix) else v for k, v in weights.items()}


MUTATIONS = {
    "window one wider": lambda c, w: (dataclasses.replace(c, sliding_window=c.sliding_window + 1), w),
    "shared expert dropped": lambda c, w: (c, _scaled(w, "shared_expert.down_proj.weight", 0.0)),
    "rope_theta x 2": lambda c, w: (_theta_x2(c), w),
    "routed experts x 1.1": lambda c, w: (c, _scaled(w, "mlp.experts.down_proj.weight", 1.1)),
}


@pytest.fixture(scope="module")
def weights():
    return random_stacked_weights(CONFIG, 0, torch.bfloat16)


@pytest.fixture(scope="module")
def expected(weights):
    """The fp32 oracle on the bf16 weights: each prompt's logits past the window."""
    oracle = oracle_model(CONFIG, weights, torch.float32)
    with torch.no_grad():
        return [oracle(torch.tensor([p])).logits[0, past_the_window(len(p))] for p in PROMPTS]


def bf16_distance(config: FlintConfig, weights: dict, expected: list[torch.Tensor]) -> float:
    engine = LLMEngine(EngineArgs(dtype="bfloat16", device="cpu", block_size=4, max_num_batched_tokens=32,
                                  num_kv_blocks=256, max_model_len=128, cpu_threads=1),
                       config=config, weights=weights)
    return logits_distance(prefill_logits(engine, PROMPTS, past_the_window), expected)


def test_the_bf16_engine_is_within_the_bound(weights, expected):
    distance = bf16_distance(CONFIG, weights, expected)
    print(f"bf16 engine vs fp32 oracle: {distance:.4f} (bound {BF16_BOUND})")
    assert distance < BF16_BOUND


@pytest.mark.parametrize("mutation", MUTATIONS)
def test_each_mutation_exceeds_the_bound(weights, expected, mutation):
    config, mutated = MUTATIONS[mutation](CONFIG, weights)
    distance = bf16_distance(config, mutated, expected)
    print(f"{mutation}: {distance:.4f} (bound {BF16_BOUND})")
    assert distance > BF16_BOUND
