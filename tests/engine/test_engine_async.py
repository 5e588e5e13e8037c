"""Async scheduling: all-decode steps launched before the host has read the previous step's tokens
give the synchronous engine's tokens (and the reference's), each delivered once and in order; the
token computed past a sequence's end is dropped and its blocks are freed. On the CPU the static
decode buffers run uncaptured, so the same launch-ahead path runs here as on a GPU."""

from collections import defaultdict

import pytest
import torch

from flint_backend.config import FlintConfig
from flint_backend.engine.engine import LLMEngine
from flint_backend.engine.engine_args import EngineArgs
from flint_backend.engine.sampling_params import SamplingParams
from flint_backend.weights.random_init import random_stacked_weights

from engine_cases import make_engine, random_prompts, run_to_completion


def greedy(max_tokens=10, **kw):
    return SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True, **kw)


def record_launches(engine) -> list[list[str]]:
    """The request ids of every step launched ahead, in order."""
    launches, launch = [], engine.runner.launch_decode

    def recording(seqs, previous):
        launches.append([s.request_id for s in seqs])
        return launch(seqs, previous)
    engine.runner.launch_decode = recording
    return launches


class ScriptedRun:
    """Steps an engine to the end, firing events once their condition on the delivered tokens holds
    (so both engines see them at the same point of each request, whatever the step count)."""

    def __init__(self, engine):
        self.engine, self.seqs, self.outputs = engine, {}, defaultdict(list)
        self.free_blocks = engine.blocks.num_free_blocks

    def add(self, name, prompt, params):
        self.seqs[name] = self.engine.add_request(prompt, params, request_id=name)

    def abort(self, name):
        self.outputs[name].append(self.engine.abort(name))

    def delivered(self, name) -> int:
        return sum(len(o.new_token_ids) for o in self.outputs[name])

    def finished(self, name) -> bool:
        return name in self.seqs and self.seqs[name].finished

    def run(self, events=(), max_steps=500):
        events = list(events)
        for _ in range(max_steps):
            if not self.engine.has_work() and not events:
                return self
            outputs = self.engine.step()
            assert len({o.request_id for o in outputs}) == len(outputs), "two outputs of a request in one step"
            for out in outputs:
                self.outputs[out.request_id].append(out)
            for event in [e for e in events if e[0](self)]:
                events.remove(event)
                event[1](self)
            for seq in self.seqs.values():  # a finished sequence holds nothing, a token in flight or not
                assert not seq.finished or (seq.block_table == [] and seq.ring_row is None)
        raise AssertionError("the run did not finish")

    def tokens(self) -> dict[str, list[int]]:
        return {name: [t for o in self.outputs[name] for t in o.new_token_ids] for name in self.seqs}

    def reasons(self) -> dict[str, str]:
        return {name: seq.finish_reason for name, seq in self.seqs.items()}

    def check_delivery(self):
        """Every token once, in order, counted; one final output per request, the last."""
        for name, seq in self.seqs.items():
            outs, count = self.outputs[name], 0
            for out in outs:
                count += len(out.new_token_ids)
                assert out.num_output_tokens == count, f"{name}: output counts {out.num_output_tokens}, not {count}"
            assert [o.finished for o in outs] == [False] * (len(outs) - 1) + [True], name
            assert self.tokens()[name] == seq.output_ids
        assert self.engine.blocks.num_free_blocks == self.free_blocks
        assert self.engine.blocks.num_free_rows == self.engine.blocks.num_ring_rows
        assert not self.engine.has_work()


def mixed_traffic(engine, prompts, oracle) -> ScriptedRun:
    """Different max_tokens and stop ids, arrivals mid-run, an abort mid-run, a stop on the first token."""
    run = ScriptedRun(engine)
    run.add("a", prompts[0], greedy(10))
    run.add("b", prompts[1], greedy(3))
    run.add("c", prompts[2], SamplingParams(temperature=0.0, max_tokens=10, stop_token_ids=[oracle(prompts[2])[4]]))
    run.add("f", prompts[5], greedy(10))
    return run.run([
        (lambda r: r.delivered("a") == 2, lambda r: r.add("d", prompts[3], greedy(7))),
        (lambda r: r.finished("b"), lambda r: r.add("e", prompts[4], greedy(5))),
        (lambda r: r.delivered("f") == 4, lambda r: r.abort("f")),
        (lambda r: r.delivered("d") == 3, lambda r: r.add(
            "g", prompts[6], SamplingParams(temperature=0.0, max_tokens=10, stop_token_ids=[oracle(prompts[6])[0]]))),
    ])


def test_async_equals_sync_and_the_reference(greedy_oracle, fair_prompts):
    oracle = lambda prompt: greedy_oracle(prompt, 10)  # noqa: E731
    runs = {}
    for flag in (True, False):
        engine = make_engine(async_scheduling=flag)
        launches = record_launches(engine)
        runs[flag] = mixed_traffic(engine, fair_prompts, oracle)
        runs[flag].check_delivery()
        assert bool(launches) == flag
    assert runs[True].tokens() == runs[False].tokens()
    assert runs[True].reasons() == runs[False].reasons() == dict(
        a="length", b="length", c="stop", d="length", e="length", f="abort", g="stop")
    p = fair_prompts
    stop_c = oracle(p[2]).index(oracle(p[2])[4])
    assert runs[True].tokens() == dict(
        a=oracle(p[0]), b=oracle(p[1])[:3], c=oracle(p[2])[:stop_c + 1], d=oracle(p[3])[:7],
        e=oracle(p[4])[:5], f=oracle(p[5])[:4], g=oracle(p[6])[:1])


def test_the_first_step_launched_ahead_returns_nothing(greedy_oracle, fair_prompts):
    engine = make_engine()
    seq = engine.add_request(fair_prompts[0], greedy(3))
    first = engine.step()  # the prefill: synchronous
    assert [o.new_token_ids for o in first] == [greedy_oracle(fair_prompts[0], 1)]
    assert engine.step() == [] and engine.has_work()  # token 2 sampled, still on the device
    assert seq.num_pending == 1 and seq.output_ids == greedy_oracle(fair_prompts[0], 1)
    assert [o.new_token_ids for o in engine.step()] == [greedy_oracle(fair_prompts[0], 2)[1:]]


def test_the_token_past_max_tokens_is_dropped_and_its_blocks_freed(greedy_oracle, fair_prompts):
    """x ends on its third token; the step for its fourth is launched before the third is read."""
    engine = make_engine(max_num_batched_tokens=128)  # one prefill step, then only decodes
    free = engine.blocks.num_free_blocks
    launches = record_launches(engine)
    x = engine.add_request(fair_prompts[0], greedy(3), request_id="x")
    y = engine.add_request(fair_prompts[1], greedy(8), request_id="y")
    delivered = defaultdict(list)
    while engine.has_work():
        for out in engine.step():
            delivered[out.request_id] += out.new_token_ids
            if out.request_id == "x" and out.finished:
                assert "x" in launches[-1]  # launched with the token that ended it unread
                assert x.block_table == [] and x.ring_row is None and x.num_pending == 0
    assert sum("x" in launch for launch in launches) == 3  # tokens 2 and 3, and the dropped 4th
    assert delivered == {"x": greedy_oracle(fair_prompts[0], 3), "y": greedy_oracle(fair_prompts[1], 8)}
    assert x.output_ids == delivered["x"] and x.finish_reason == "length" and y.finish_reason == "length"
    assert engine.blocks.num_free_blocks == free


def test_abort_with_a_token_in_flight_drops_it(greedy_oracle, fair_prompts):
    engine = make_engine(max_graph_batch=2)  # buckets 1 and 2: z alone after the abort
    run = ScriptedRun(engine)
    run.add("y", fair_prompts[0], greedy(6))
    run.add("z", fair_prompts[1], greedy(6))
    run.run([(lambda r: r.delivered("y") == 2, lambda r: r.abort("y"))])  # y's third token is in flight
    run.check_delivery()
    assert run.tokens() == {"y": greedy_oracle(fair_prompts[0], 2), "z": greedy_oracle(fair_prompts[1], 6)}


def test_fail_all_leaves_nothing_in_flight(fair_prompts):
    engine = make_engine()
    free = engine.blocks.num_free_blocks
    seqs = [engine.add_request(p, greedy(8)) for p in fair_prompts[:3]]
    while not all(s.num_pending for s in seqs):
        engine.step()
    outputs = engine.fail_all("boom")
    assert [(o.finish_reason, o.error) for o in outputs] == [("error", "boom")] * 3
    assert not engine.has_work() and engine.blocks.num_free_blocks == free
    assert engine.step() == []


def test_a_pool_too_small_to_grow_drains_before_preempting():
    """Three sequences outgrow a 16-block pool while decoding: steps launch ahead while every one can
    grow, and the preempting steps run synchronously once the step in flight is read."""
    prompts = random_prompts(3, 8, 12, seed=1)
    runs = {}
    for flag in (True, False):
        engine = make_engine(num_kv_blocks=16, max_model_len=64, async_scheduling=flag)
        launches = record_launches(engine)
        run = ScriptedRun(engine)
        for i, prompt in enumerate(prompts):
            run.add(f"r{i}", prompt, greedy(30))
        runs[flag] = run.run()
        run.check_delivery()
        assert engine.metrics.preemptions > 0 and bool(launches) == flag
    assert runs[True].tokens() == runs[False].tokens()
    assert set(runs[True].reasons().values()) == {"length"}


def test_logprobs_and_penalties_fall_back_to_synchronous_steps(fair_prompts):
    """Requests that need the host before or after the draw join a launch-ahead run: while they run
    no step launches ahead, before and after them steps do; tokens equal the sync engine's."""
    runs, marks = {}, {}
    for flag in (True, False):
        engine = make_engine(async_scheduling=flag)
        launches = record_launches(engine)
        mark = marks[flag] = []  # launches so far when lp joins, when pen finishes, at the end
        run = ScriptedRun(engine)
        run.add("a", fair_prompts[0], greedy(10))
        run.add("b", fair_prompts[1], greedy(10))
        runs[flag] = run.run([
            (lambda r: r.delivered("a") == 3, lambda r: (r.add("lp", fair_prompts[2], greedy(2, logprobs=2)),
                                                         mark.append(len(launches)))),
            (lambda r: r.finished("lp"), lambda r: r.add("pen", fair_prompts[3], greedy(2, repetition_penalty=1.3))),
            (lambda r: r.finished("pen"), lambda r: mark.append(len(launches))),
        ])
        run.check_delivery()
        mark.append(len(launches))
        assert all(set(ids) <= {"a", "b"} for ids in launches), launches
    assert runs[True].tokens() == runs[False].tokens()
    assert runs[True].reasons() == runs[False].reasons()
    assert marks[False] == [0, 0, 0]
    before, during, end = marks[True]
    assert before > 0 and during == before and end > during
    lp_sync, lp_async = ([lp for o in r.outputs["lp"] for lp in o.logprobs] for r in (runs[False], runs[True]))
    assert len(lp_async) == 2 and all(lp is not None for lp in lp_async)
    for a, b in zip(lp_async, lp_sync):
        assert [t for t, _ in a.top] == [t for t, _ in b.top]
        assert a.token_logprob == pytest.approx(b.token_logprob, abs=1e-4)


def test_seeded_fused_sampling_equals_sync():
    """The triton backend's fused sampler draws on the device: seeded requests (and a greedy row
    beside them) launch ahead and draw the synchronous engine's tokens, keyed by (seed, index)."""
    config = FlintConfig.preset("flint-tiny", num_hidden_layers=2)  # every kernel interpreted: two dense layers
    weights = random_stacked_weights(config, 0, torch.float32)
    params = [SamplingParams(temperature=0.8, top_p=0.9, seed=11, max_tokens=5, ignore_eos=True),
              SamplingParams(temperature=1.0, top_k=20, seed=12, max_tokens=3, ignore_eos=True),
              SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)]
    prompts = [[5, 17, 300, 2], [99, 7, 1234], [42] * 6]
    tokens, launched = {}, {}
    for flag in (True, False):
        args = EngineArgs(dtype="float32", device="cpu", kernel_backend="triton", block_size=4, max_num_seqs=4,
                          num_kv_blocks=64, max_model_len=64, async_scheduling=flag)
        engine = LLMEngine(args, config=config, weights=weights)
        launches = record_launches(engine)
        seqs = [engine.add_request(p, sp) for p, sp in zip(prompts, params)]
        run_to_completion(engine)
        tokens[flag], launched[flag] = [s.output_ids for s in seqs], len(launches)
    assert [len(t) for t in tokens[True]] == [5, 3, 4]
    assert tokens[True] == tokens[False]
    assert launched[True] == 5 and launched[False] == 0  # tokens 2-5 of the longest, and the dropped 6th
