"""Sampling: seeds reproducible whatever the batch, filters, penalties, logprobs, validation."""

import math

import pytest
import torch

from flint_backend.engine.sampler import Sampler
from flint_backend.engine.sampling_params import SamplingParams, SamplingParamsError
from flint_backend.engine.sequence import Sequence

from engine_cases import make_engine, random_prompts, run_to_completion


def test_seeded_sampling_is_the_same_alone_and_in_a_batch():
    prompts = random_prompts(6, 3, 30, seed=3)
    params = SamplingParams(temperature=0.9, top_p=0.95, top_k=50, seed=1234, max_tokens=12, ignore_eos=True)
    alone = make_engine()
    seq = alone.add_request(prompts[0], params)
    run_to_completion(alone)

    crowded = make_engine(max_num_batched_tokens=7)  # different chunking and batch mix too
    others = [crowded.add_request(p, SamplingParams(temperature=1.0, max_tokens=9, ignore_eos=True))
              for p in prompts[1:3]]
    again = crowded.add_request(prompts[0], params)
    others += [crowded.add_request(p, SamplingParams(temperature=1.0, max_tokens=9, ignore_eos=True))
               for p in prompts[3:]]
    run_to_completion(crowded)
    assert again.output_ids == seq.output_ids
    other_seed = make_engine()
    diff = other_seed.add_request(prompts[0], SamplingParams(**{**params.__dict__, "seed": 99}))
    run_to_completion(other_seed)
    assert diff.output_ids != seq.output_ids


def _seq(token_ids, params, n_prompt=None):
    n_prompt = len(token_ids) if n_prompt is None else n_prompt
    return Sequence("r", list(token_ids), n_prompt, params, 100, frozenset({0}))


def _draws(logits, params, n, start=0):
    sampler = Sampler(torch.device("cpu"), seed=0)
    out = []
    for i in range(n):
        seq = _seq([1] * (start + i + 1), params, n_prompt=1)  # num_output_tokens = start + i
        out.append(sampler(logits[None].clone(), [seq]).tokens[0])
    return out


def test_sampling_matches_the_distribution():
    logits = torch.tensor([2.0, 1.0, 0.0, -1.0, 0.5])
    params = SamplingParams(temperature=0.7, seed=5)
    counts = torch.bincount(torch.tensor(_draws(logits, params, 4000)), minlength=5).float()
    expected = torch.softmax(logits / 0.7, -1) * 4000
    chi2 = float(((counts - expected) ** 2 / expected).sum())
    assert chi2 < 18.5  # 4 degrees of freedom, p = 0.001


def test_filters_keep_only_allowed_tokens():
    logits = torch.tensor([3.0, 2.9, 2.0, 1.0, 0.0, -1.0])
    assert set(_draws(logits, SamplingParams(temperature=1.0, top_k=2, seed=1), 300)) == {0, 1}
    # softmax mass: 0.37, 0.34, 0.14, ...: top_p 0.6 keeps the two tokens whose prefix reaches 0.6
    assert set(_draws(logits, SamplingParams(temperature=1.0, top_p=0.6, seed=1), 300)) == {0, 1}
    # min_p 0.3: p >= 0.3 * 0.37 keeps tokens 0, 1 and 2 (0.14)
    assert set(_draws(logits, SamplingParams(temperature=1.0, min_p=0.3, seed=1), 600)) == {0, 1, 2}
    assert set(_draws(logits, SamplingParams(temperature=0.0), 5)) == {0}


def test_penalties_and_bias():
    sampler = Sampler(torch.device("cpu"), seed=0)
    logits = torch.tensor([[1.0, 0.9, 0.8, -0.5]])
    greedy = dict(temperature=0.0)
    out = lambda params, tokens, n_prompt: sampler(logits.clone(), [_seq(tokens, params, n_prompt)]).tokens[0]
    assert out(SamplingParams(**greedy), [3], 1) == 0
    assert out(SamplingParams(**greedy, presence_penalty=0.5), [3, 0], 1) == 1          # 1.0 - 0.5 < 0.9
    assert out(SamplingParams(**greedy, frequency_penalty=0.1), [3, 0, 0], 1) == 1       # 1.0 - 0.2 < 0.9
    assert out(SamplingParams(**greedy, repetition_penalty=1.2), [0, 3], 2) == 1         # prompt counts too
    assert out(SamplingParams(**greedy, logit_bias={3: 5.0}), [3], 1) == 3


def test_logprobs_are_the_raw_distribution():
    sampler = Sampler(torch.device("cpu"), seed=0)
    logits = torch.tensor([[1.0, 2.0, 0.5]])
    result = sampler(logits.clone(), [_seq([2], SamplingParams(temperature=0.0, logprobs=2))])
    lp = result.logprobs[0]
    ref = torch.log_softmax(logits[0], -1)
    assert result.tokens == [1] and math.isclose(lp.token_logprob, float(ref[1]), rel_tol=1e-6)
    assert [t for t, _ in lp.top] == [1, 0]


@pytest.mark.parametrize("field, value", [
    ("temperature", -0.1), ("top_p", 0.0), ("top_p", 1.5), ("top_k", -2), ("min_p", 1.5),
    ("repetition_penalty", 0.0), ("presence_penalty", 3.0), ("frequency_penalty", -2.5),
    ("max_tokens", 0), ("max_tokens", -1), ("min_tokens", -1), ("logprobs", 21), ("seed", 1.5),
    ("stop_token_ids", [-1]), ("ignore_eos", "yes"),
])
def test_invalid_values_name_the_field(field, value):
    with pytest.raises(SamplingParamsError, match=field):
        SamplingParams(**{field: value})


def test_from_dict_rejects_unknown_fields():
    with pytest.raises(SamplingParamsError, match="top_q"):
        SamplingParams.from_dict({"top_q": 0.5})
    assert SamplingParams.from_dict({"temperature": None, "top_k": 5}).top_k == 5


def test_fused_sampler_keys_draws_by_seed_and_token_index():
    """The triton backend's path: penalties and bias in torch, then one fused kernel call whose
    draw depends on (seed, number of tokens generated so far) only."""
    from flint_kernels.sampling import sample

    g = torch.Generator().manual_seed(4)
    row = torch.randn(1, 300, generator=g)
    seeded = SamplingParams(temperature=0.9, top_p=0.9, top_k=50, seed=21)
    target = _seq([3] * 5, seeded, n_prompt=2)  # 3 tokens generated: offset 3
    alone = Sampler(torch.device("cpu"), seed=0, fused_sample=sample)(row.clone(), [target]).tokens[0]
    others = [_seq([1, 2], SamplingParams(temperature=1.0)), _seq([4], SamplingParams(temperature=0.0))]
    batch = torch.cat([torch.randn(1, 300, generator=g), row, torch.randn(1, 300, generator=g)])
    result = Sampler(torch.device("cpu"), seed=7, fused_sample=sample)(batch, [others[0], target, others[1]])
    assert result.tokens[1] == alone
    assert result.tokens[2] == int(batch[2].argmax())
    forced = Sampler(torch.device("cpu"), seed=0, fused_sample=sample)(
        row.clone(), [_seq([3], SamplingParams(temperature=0.0, logit_bias={17: 100.0}))])
    assert forced.tokens == [17]
