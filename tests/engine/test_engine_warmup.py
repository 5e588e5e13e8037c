"""LLMEngine.warm_up: when the engine starts (EngineArgs.warmup; by default only on CUDA with the
triton backend, where kernels compile), a one-prompt prefill step of each warmup_step_tokens count
and two greedy requests beside each other; then nothing of them is left: the KV pool is free, the
metrics are zero, request ids start at req-0, and the engine generates what an engine that never
warmed up generates, greedy and seeded."""

import pytest

from flint_backend.engine.engine import WARMUP_PROMPTS, warmup_step_tokens
from flint_backend.engine.sampling_params import SamplingParams

from engine_cases import make_engine, random_prompts, run_to_completion


def test_warm_up_leaves_nothing_behind(monkeypatch):
    from flint_backend.engine import engine as engine_module
    prompts_seen, first_tokens = [], []
    add = engine_module.LLMEngine.add_request

    def spy(self, prompt_ids, params=None, request_id=None):
        prompts_seen.append((len(prompt_ids), request_id, params.max_tokens))
        first_tokens.append(prompt_ids[0])
        return add(self, prompt_ids, params, request_id)
    monkeypatch.setattr(engine_module.LLMEngine, "add_request", spy)
    warm = make_engine(warmup=True)
    monkeypatch.setattr(engine_module.LLMEngine, "add_request", add)
    cold = make_engine(warmup=False)
    # a step of each count, one token each; a full chunk (32) + 17 tokens, and 33 beside it, two each
    steps = [2, 3, 4, 5, 7, 8, 9, 15, 16, 17, 31, 32]
    assert prompts_seen == [(n, f"warmup-step-{n}", 1) for n in steps] + [
        (32 + WARMUP_PROMPTS[0], "warmup-0", 2), (WARMUP_PROMPTS[1], "warmup-1", 2)]
    assert len(set(first_tokens)) == len(first_tokens)  # no prompt a prefix of another's: a step of each count
    assert warm.warmup_s > 0 and cold.warmup_s is None
    assert not warm.has_work() and warm.blocks.usage == 0.0
    assert warm.blocks.num_free_rows == warm.blocks.num_ring_rows
    assert warm.metrics.prompt_tokens == 0 and warm.metrics.generation_tokens == 0 and not warm.metrics.finished
    outputs = {}
    for name, engine in (("warm", warm), ("cold", cold)):
        seqs = [engine.add_request(p, SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True))
                for p in random_prompts(2, 5, 40, seed=3)]
        seqs.append(engine.add_request([5, 6, 7], SamplingParams(temperature=1.0, seed=11, max_tokens=6,
                                                                  ignore_eos=True)))
        run_to_completion(engine)
        outputs[name] = [(s.request_id, s.output_ids) for s in seqs]
    assert outputs["warm"] == outputs["cold"]
    assert [rid for rid, _ in outputs["warm"]] == ["req-0", "req-1", "req-2"]


def test_warmup_step_tokens_straddle_each_power_of_two_up_to_the_cap():
    assert warmup_step_tokens(32) == [2, 3, 4, 5, 7, 8, 9, 15, 16, 17, 31, 32]
    assert warmup_step_tokens(80) == [2, 3, 4, 5, 7, 8, 9, 15, 16, 17, 31, 32, 33, 63, 64, 65, 80]
    assert warmup_step_tokens(2) == [2] and warmup_step_tokens(3) == [2, 3]


def test_warm_up_is_off_by_default_on_the_cpu_and_refused_with_requests():
    engine = make_engine()
    assert engine.warmup_s is None
    engine.add_request([1, 2, 3])
    with pytest.raises(RuntimeError, match="warm_up: the engine has requests"):
        engine.warm_up()
