"""Prompt logprobs: each prompt token's logprob and top N equal the oracle's, whatever the
chunking, block size or preemption, handed over once with the first generated token."""

import pytest

from flint_backend.engine.sampling_params import SamplingParams, SamplingParamsError

from engine_cases import make_engine, run_to_completion
from oracle import logits

TOL = 1e-4  # the fp32 engine against the float64 oracle


@pytest.mark.parametrize("overrides", [
    dict(),
    dict(block_size=1, max_num_batched_tokens=7),      # a prompt over many chunks
    dict(block_size=16, max_num_batched_tokens=5),
    dict(num_kv_blocks=40, max_model_len=160, max_num_batched_tokens=64),  # preemption: prompts recomputed
], ids=["default", "block1-chunk7", "block16-chunk5", "preemption"])
def test_prompt_logprobs_equal_the_oracles(overrides, tiny_oracle, fair_prompts):
    engine = make_engine(**overrides)
    seqs = [engine.add_request(p, SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True, prompt_logprobs=2))
            for p in fair_prompts]
    outputs = run_to_completion(engine)
    if "num_kv_blocks" in overrides:
        assert engine.metrics.preemptions > 0
    for prompt, seq in zip(fair_prompts, seqs):
        mine = [o for o in outputs if o.request_id == seq.request_id]
        carrying = [i for i, o in enumerate(mine) if o.prompt_logprobs is not None]
        assert carrying == [0] and mine[0].new_token_ids  # once, with the first token
        got = mine[0].prompt_logprobs
        assert [token for token, _ in got] == prompt and got[0][1] is None
        reference = logits(tiny_oracle, prompt)[:-1].log_softmax(-1)  # [len - 1, V]
        for p, (token, logprobs) in enumerate(got[1:]):
            assert logprobs.token_logprob == pytest.approx(float(reference[p, token]), abs=TOL)
            assert len(logprobs.top) == 2
            assert [v for _, v in logprobs.top] == pytest.approx(reference[p].topk(2).values.tolist(), abs=TOL)
            for i, v in logprobs.top:
                assert v == pytest.approx(float(reference[p, i]), abs=TOL)


def test_prompt_logprobs_only_when_asked_and_zero_gives_no_top(fair_prompts):
    engine = make_engine()
    prompt = max(fair_prompts, key=len)
    plain = engine.add_request(prompt, SamplingParams(temperature=0.0, max_tokens=2))
    bare = engine.add_request(prompt, SamplingParams(temperature=0.0, max_tokens=2, prompt_logprobs=0))
    outputs = run_to_completion(engine)
    assert all(o.prompt_logprobs is None for o in outputs if o.request_id == plain.request_id)
    (first, *_) = [o for o in outputs if o.request_id == bare.request_id]
    assert len(first.prompt_logprobs) == len(prompt) and all(lp.top == [] for _, lp in first.prompt_logprobs[1:])
    assert [o.new_token_ids for o in outputs if o.request_id == plain.request_id] == \
        [o.new_token_ids for o in outputs if o.request_id == bare.request_id]  # the same tokens either way


def test_prompt_logprobs_out_of_range_name_the_field():
    with pytest.raises(SamplingParamsError, match=r"^prompt_logprobs: got 21, expected an integer in \[0, 20\]"):
        SamplingParams(prompt_logprobs=21)
