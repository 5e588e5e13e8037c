"""The engine's greedy tokens equal the reference model's, under continuous batching."""

import pytest

from flint_backend.engine.engine import RequestError
from flint_backend.engine.sampling_params import SamplingParams

from engine_cases import make_engine, run_to_completion

GREEDY = SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True)


def run_staggered(engine, prompts, params=GREEDY, every=2):
    """Add the prompts two at a time, a few steps apart, then run to the end."""
    seqs, pending = [], list(prompts)
    while pending or engine.has_work():
        for _ in range(min(every, len(pending))):
            seqs.append(engine.add_request(pending.pop(0), params))
        for _ in range(3):
            engine.step()
    return seqs


@pytest.mark.parametrize("overrides", [
    dict(),                                            # defaults of the test engine
    dict(block_size=1, max_num_batched_tokens=7),      # tiny blocks, tiny chunks
    dict(block_size=16, max_num_batched_tokens=5),     # chunks smaller than a block
    dict(num_kv_blocks=40, max_model_len=160, max_num_batched_tokens=64),  # preemption
], ids=["default", "block1-chunk7", "block16-chunk5", "preemption"])
def test_concurrent_greedy_equals_reference(overrides, greedy_oracle, fair_prompts):
    engine = make_engine(**overrides)
    seqs = run_staggered(engine, fair_prompts)
    assert len(seqs) >= 16
    for prompt, seq in zip(fair_prompts, seqs):
        assert seq.output_ids == greedy_oracle(prompt, 10), f"prompt of {len(prompt)} tokens"
        assert seq.finish_reason == "length"
    if "num_kv_blocks" in overrides:
        assert engine.metrics.preemptions > 0
    assert engine.blocks.usage == 0.0


def test_stop_tokens_end_the_request(greedy_oracle, fair_prompts):
    prompt = fair_prompts[0]
    expected = greedy_oracle(prompt, 10)
    engine = make_engine()
    seq = engine.add_request(prompt, SamplingParams(temperature=0.0, max_tokens=10, stop_token_ids=[expected[4]]))
    run_to_completion(engine)
    stop_at = expected.index(expected[4])
    assert seq.output_ids == expected[:stop_at + 1] and seq.finish_reason == "stop"


def test_min_tokens_suppresses_stop_tokens(greedy_oracle, fair_prompts):
    prompt = fair_prompts[1]
    first = greedy_oracle(prompt, 1)[0]
    engine = make_engine()
    seq = engine.add_request(prompt, SamplingParams(temperature=0.0, max_tokens=6, min_tokens=3,
                                                    stop_token_ids=[first]))
    run_to_completion(engine)
    assert seq.output_ids[0] != first and len(seq.output_ids) >= 3


def test_max_tokens_beyond_the_context_is_refused():
    engine = make_engine(max_model_len=40)
    with pytest.raises(RequestError, match=r"max_tokens: got 1000, expected at most 10"):
        engine.add_request(list(range(1, 31)), SamplingParams(temperature=0.0, max_tokens=1000, ignore_eos=True))
    assert not engine.has_work()


def test_max_tokens_none_runs_to_the_context_and_stops_with_length():
    engine = make_engine(max_model_len=40)
    seq = engine.add_request(list(range(1, 31)), SamplingParams(temperature=0.0, max_tokens=None, ignore_eos=True))
    run_to_completion(engine)
    assert seq.finish_reason == "length" and seq.num_tokens == 40 and len(seq.output_ids) == 10


def test_static_decode_buffers_equal_eager_decode(fair_prompts):
    """The CUDA-graph decode path (static buffers padded to batch buckets; on the CPU it runs
    uncaptured) gives the eager path's tokens, for batch sizes between buckets."""
    params = SamplingParams(temperature=0.8, top_p=0.9, seed=3, max_tokens=8, ignore_eos=True)
    outputs = {}
    for eager in (True, False):
        engine = make_engine(enforce_eager=eager, max_graph_batch=8)
        seqs = run_staggered(engine, fair_prompts[:11], params, every=3)  # decode batches of 3, 6, 9, 11
        outputs[eager] = [s.output_ids for s in seqs]
    assert outputs[True] == outputs[False]
