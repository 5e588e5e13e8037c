"""Shared engine builders for the engine tests."""

import random

from flint_backend.engine.engine import LLMEngine
from flint_backend.engine.engine_args import EngineArgs

TIE_MARGIN = 1e-4  # top-2 logit gaps below this are decided by rounding order, not by the model


def make_engine(**overrides) -> LLMEngine:
    args = dict(dtype="float32", device="cpu", block_size=4, max_num_batched_tokens=32, max_num_seqs=32,
                num_kv_blocks=512, max_model_len=512)
    args.update(overrides)
    return LLMEngine(EngineArgs(**args))


def random_prompts(count, lo, hi, seed=0, vocab=8000):
    rng = random.Random(seed)
    return [[rng.randrange(vocab) for _ in range(rng.randint(lo, hi))] for _ in range(count)]


def run_to_completion(engine, max_steps=100_000):
    outputs = []
    for _ in range(max_steps):
        if not engine.has_work():
            return outputs
        outputs.extend(engine.step())
    raise AssertionError("engine did not finish")
