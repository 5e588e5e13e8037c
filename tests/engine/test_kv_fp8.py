"""FP8 KV cache in the engine (kv_cache_dtype "fp8"): the Triton kernels give the torch path's
tokens, outputs do not depend on how prefills are chunked or on prefix-cache hits (every
reader sees the quantised K/V), and the pool holds twice the tokens."""

import random

import pytest
import torch

from flint_backend.config import FlintConfig
from flint_backend.engine.engine import LLMEngine
from flint_backend.engine.engine_args import EngineArgs, EngineArgsError
from flint_backend.engine.sampling_params import SamplingParams
from flint_backend.kv_cache import KVCacheSpec
from flint_backend.weights.random_init import random_stacked_weights
from flint_kernels.fp8_kv import FP8_DTYPE

from engine_cases import make_engine, random_prompts, run_to_completion

GREEDY = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)


def outputs(engine, prompts, params=GREEDY):
    seqs = [engine.add_request(p, params) for p in prompts]
    run_to_completion(engine)
    return [s.output_ids for s in seqs]


def shared_prompts(seed=0):
    rng = random.Random(seed)
    base = [rng.randrange(1, 8000) for _ in range(60)]
    return [base[:rng.randint(0, 60)] + [rng.randrange(1, 8000) for _ in range(rng.randint(1, 20))]
            for _ in range(12)]


def test_fp8_outputs_do_not_depend_on_chunks_or_prefix_hits():
    prompts = shared_prompts()
    whole = outputs(make_engine(kv_cache_dtype="fp8", enable_prefix_caching=False, max_num_batched_tokens=512),
                    prompts)
    chunked = make_engine(kv_cache_dtype="fp8", max_num_batched_tokens=7)
    assert outputs(chunked, prompts[:6]) + outputs(chunked, prompts[6:]) == whole  # hits in the second call
    assert chunked.prefix_cache.hits > 0
    assert chunked.runner.kv.ring_k.dtype == FP8_DTYPE and chunked.runner.kv.page_k.dtype == FP8_DTYPE


def test_fp8_changes_outputs_a_little():
    """The quantisation is real: greedy tokens of bf16 flint-tiny (random weights: nearly flat
    logits) differ from BF16 KV's somewhere, yet most stay (0.84 of 64 here)."""
    prompts = random_prompts(8, 20, 60, seed=4)
    fp8 = outputs(make_engine(kv_cache_dtype="fp8", dtype="bfloat16"), prompts)
    bf16 = outputs(make_engine(dtype="bfloat16"), prompts)
    agree = sum(a == b for x, y in zip(fp8, bf16) for a, b in zip(x, y)) / sum(map(len, bf16))
    assert 0.6 < agree < 1.0


def test_triton_kernels_give_the_torch_paths_tokens_with_fp8_kv():
    config = FlintConfig.preset("flint-tiny", num_hidden_layers=4)
    weights = random_stacked_weights(config, 0, torch.float32)
    args = dict(dtype="float32", device="cpu", block_size=4, max_num_batched_tokens=64, max_num_seqs=4,
                num_kv_blocks=64, max_model_len=64, kv_cache_dtype="fp8")
    prompts = random_prompts(2, 6, 14, seed=5)  # small: every kernel runs in the interpreter
    extended = [prompts[0] + [11, 12, 13, 14, 15]]  # a prefix hit after the first call
    params = SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True)
    got = []
    for backend in ("triton", "torch"):
        engine = LLMEngine(EngineArgs(kernel_backend=backend, **args), config=config, weights=weights)
        got.append(outputs(engine, prompts, params) + outputs(engine, extended, params))
        assert engine.prefix_cache.hits > 0
    assert got[0] == got[1]


def test_fp8_pool_holds_twice_the_tokens():
    config = FlintConfig.preset("flint-tiny")
    bf16 = KVCacheSpec.from_budget(config, 1 << 22, 16, 4, torch.bfloat16)
    fp8 = KVCacheSpec.from_budget(config, 1 << 22, 16, 4, FP8_DTYPE)
    assert fp8.num_blocks >= 2 * bf16.num_blocks


def test_kv_cache_dtype_is_checked():
    with pytest.raises(EngineArgsError, match="kv_cache_dtype: got 'fp16'"):
        EngineArgs(kv_cache_dtype="fp16")
    with pytest.raises(EngineArgsError, match="kv_cache_dtype: 'bfloat16' with dtype 'float32'"):
        EngineArgs(kv_cache_dtype="bfloat16", dtype="float32")
    assert EngineArgs(kv_cache_dtype="fp8_e4m3").kv_cache_dtype == "fp8_e4m3"
