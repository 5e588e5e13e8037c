"""Request lifecycle: aborts free the KV pool, bad input is refused, logits match the oracle."""

import random

import pytest

from flint_backend.config import FlintConfig
from flint_backend.engine.engine import RequestError
from flint_backend.engine.engine_args import EngineArgs, EngineArgsError
from flint_backend.engine.engine_thread import EngineThread
from flint_backend.engine.sampling_params import SamplingParams
from flint_backend.engine.step_batch import build_step_batch
from engine_cases import make_engine, random_prompts
from oracle import logits


def test_hundreds_of_aborts_return_the_pool_to_free():
    engine = make_engine(num_kv_blocks=300, block_size=4, max_num_seqs=16)
    rng = random.Random(0)
    live = []
    for i, prompt in enumerate(random_prompts(300, 1, 40, seed=7)):
        seq = engine.add_request(prompt, SamplingParams(temperature=1.0, max_tokens=50, seed=i, ignore_eos=True))
        live.append(seq)
        for _ in range(rng.randint(0, 2)):
            engine.step()
        while live and rng.random() < 0.6:
            victim = live.pop(rng.randrange(len(live)))
            out = engine.abort(victim.request_id)
            assert out is None or (out.finished and out.finish_reason == "abort")
    for seq in live:
        engine.abort(seq.request_id)
    assert engine.metrics.finished["abort"] >= 250
    assert engine.blocks.usage == 0.0 and engine.blocks.num_free_rows == engine.blocks.num_ring_rows
    assert not engine.has_work()


def test_bad_requests_are_refused_with_the_field_named():
    engine = make_engine(max_model_len=64)
    with pytest.raises(RequestError, match="64 tokens"):
        engine.add_request(list(range(1, 65)))
    with pytest.raises(RequestError, match="vocabulary"):
        engine.add_request([1, 2, 99999])
    with pytest.raises(RequestError, match="non-empty"):
        engine.add_request([])
    engine.add_request([1, 2], request_id="x")
    with pytest.raises(RequestError, match="request_id"):
        engine.add_request([3], request_id="x")


def test_max_tokens_beyond_the_context_is_refused_with_the_numbers():
    """vLLM's and OpenAI's 400 (issue 44: it was clamped to the context); a server's default is clamped."""
    engine = make_engine(max_model_len=64)
    prompt = list(range(1, 11))
    with pytest.raises(RequestError, match=r"^max_tokens: got 55, expected at most 54 \(the prompt's 10 tokens "
                                           r"plus max_tokens must fit the context of 64 tokens\)$"):
        engine.add_request(prompt, SamplingParams(max_tokens=55))
    with pytest.raises(RequestError, match=r"^max_tokens: got 1000000000, expected at most 54"):
        engine.add_request(prompt, SamplingParams(max_tokens=10**9))
    assert engine.add_request(prompt, SamplingParams(max_tokens=54)).max_tokens == 54
    assert engine.add_request(prompt).max_tokens == 54  # none: until the context is full
    assert engine.add_request(prompt, SamplingParams(default_max_tokens=100)).max_tokens == 54
    assert engine.add_request(prompt, SamplingParams(default_max_tokens=16)).max_tokens == 16
    assert engine.add_request(prompt, SamplingParams(max_tokens=5, default_max_tokens=16)).max_tokens == 5


def test_requests_past_max_request_seconds_end_as_aborted_with_their_tokens():
    engine = make_engine(max_model_len=64, max_request_seconds=30.0, max_num_seqs=2, async_scheduling=False)
    params = SamplingParams(max_tokens=50, temperature=0.0, ignore_eos=True)
    old, young = engine.add_request([1, 2, 3], params), engine.add_request([4, 5, 6], params)
    waiting = engine.add_request([7, 8, 9], params)  # max_num_seqs 2: it waits
    tokens = {seq.request_id: 0 for seq in (old, young, waiting)}
    for _ in range(3):
        for out in engine.step():
            tokens[out.request_id] += len(out.new_token_ids)
    assert tokens[old.request_id] == 3 and not tokens[waiting.request_id]
    old.arrival -= 31.0  # 31 s later for it (a clock that moves on its own would make this a wait)
    waiting.arrival -= 31.0
    outputs = {out.request_id: out for out in engine.step()}
    for seq in (old, waiting):
        out = outputs[seq.request_id]
        assert out.finished and out.finish_reason == "abort" and out.new_token_ids == [] and not out.error
    assert outputs[old.request_id].num_output_tokens == 3 and outputs[young.request_id].new_token_ids
    assert engine.metrics.finished["abort"] == 2 and engine.metrics.num_running == 1
    while engine.has_work():
        engine.step()
    assert young.finish_reason == "length" and engine.blocks.usage == 0.0


@pytest.mark.parametrize("field, value", [("dtype", "float16"), ("kernel_backend", "cuda"), ("block_size", 0),
                                          ("kv_cache_memory_fraction", 1.5), ("preset", "flint-1t"),
                                          ("seed", -1), ("quantization", "int4"), ("async_scheduling", "yes"),
                                          ("warmup", "yes"), ("max_request_seconds", 0),
                                          ("max_request_seconds", "60"),
                                          ("max_num_batched_tokens_with_decodes", 0)])
def test_bad_engine_args_name_the_field(field, value):
    with pytest.raises(EngineArgsError, match=field):
        EngineArgs(**{field: value})
    with pytest.raises(EngineArgsError, match="quantization: 'nvfp4' applies to random weights"):
        EngineArgs(model="checkpoints/flint-tiny", quantization="nvfp4")
    with pytest.raises(EngineArgsError, match="unknown"):
        EngineArgs.from_dict({"max_num_seq": 4})


def test_kv_pool_smaller_than_the_context_is_refused():
    with pytest.raises(ValueError, match="max_model_len"):
        make_engine(num_kv_blocks=4, block_size=4, max_model_len=64)


def test_engine_logits_match_the_oracle(tiny_oracle):
    """Last-token logits (~N(0, 1)) of prompts prefilled together, one chunked over two steps: the
    fp32 engine against the float64 oracle differs by rounding only."""
    config = FlintConfig.preset("flint-tiny")
    engine = make_engine(max_num_batched_tokens=64)
    for p in random_prompts(5, 2, 30, seed=11):
        engine.add_request(p, SamplingParams(temperature=0.0, max_tokens=1))
    scheduled = engine.scheduler.schedule()
    batch = build_step_batch(scheduled.entries, engine.runner.kv_spec.block_size, config.sliding_window, engine.device)
    got = engine.runner.model.forward(batch, engine.runner.kv)
    for row, seq in enumerate(batch.sample_seqs):
        expected = logits(tiny_oracle, seq.token_ids)[-1]
        err = (got[row].double() - expected).abs().max().item()
        assert err < 2e-4, f"max |logit error| {err}"


def test_engine_thread_streams_and_aborts():
    engine = make_engine()
    thread = EngineThread(engine)
    try:
        streams = [thread.add_request(p, SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True))
                   for p in random_prompts(6, 2, 20, seed=4)]
        long = thread.add_request([1, 2, 3], SamplingParams(max_tokens=400, ignore_eos=True))
        results = [s.tokens() for s in streams]
        assert all(len(r) == 8 for r in results)
        thread.abort(long.request_id)
        final = list(long)[-1]
        assert final.finished and final.finish_reason in ("abort", "length")
        with pytest.raises(RequestError):
            thread.add_request([], SamplingParams())
    finally:
        thread.shutdown()
    assert engine.blocks.usage == 0.0
