"""flint_model's response pacing without Triton: how many tokens a response carries once the
response thread would be too busy, which outputs never wait, and that every token still goes out
in order (a fake clock; then the host with a real engine and a slow consumer)."""

import json
import time

import numpy as np
import pytest

from flint_backend.engine.engine import LLMEngine, RequestOutput
from flint_backend.engine.engine_args import EngineArgs
from flint_backend.serving import response_pacing
from flint_backend.serving.engine_host import EngineHost
from flint_backend.serving.response_pacing import WINDOW_S, ResponsePacing, merge_outputs


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def output(key, n, finished=False):
    """The n-th token's output of request `key` (token id n)."""
    return RequestOutput(key, [n], [None], finished, "length" if finished else None, 8, n)


def one_window(pacing, clock, arrivals, seconds_each):
    """A window in which `arrivals` first outputs came (of new requests: none waits) and the
    consumer took `seconds_each` per response."""
    keys = [f"w{clock.now}-{i}" for i in range(arrivals)]
    for key in keys:
        pacing.add(key, output(key, 1))
    for _ in pacing.ready():
        pacing.sent(seconds_each)
    clock.now += WINDOW_S
    pacing.ready()  # the window ends: k from its rate and cost


def test_k_is_the_least_that_keeps_the_response_thread_under_its_busy_fraction():
    clock = Clock()
    pacing = ResponsePacing(0.25, clock)
    one_window(pacing, clock, arrivals=500, seconds_each=0.0006)  # 1000 outputs/s x 0.6 ms: busy 0.6 at k = 1
    assert pacing.tokens_per_response == 3  # 0.6 / 3 = 0.2 <= 0.25 < 0.6 / 2
    one_window(pacing, clock, arrivals=50, seconds_each=0.0006)   # 100 outputs/s: busy 0.06
    assert pacing.tokens_per_response == 1
    one_window(pacing, clock, arrivals=5000, seconds_each=0.001)  # busy 10 at k = 1: at most MAX_TOKENS
    assert pacing.tokens_per_response == response_pacing.MAX_TOKENS


def test_busy_fraction_zero_sends_every_output_at_once():
    clock = Clock()
    pacing = ResponsePacing(0.0, clock)
    one_window(pacing, clock, arrivals=500, seconds_each=0.01)
    assert pacing.tokens_per_response == 1
    for n in (1, 2):
        for key in ("a", "b"):
            pacing.add(key, output(key, n))
        assert [(key, out.new_token_ids) for key, out in pacing.ready()] == [("a", [n]), ("b", [n])]


def test_held_outputs_go_in_turns_each_with_k_tokens_first_and_last_at_once():
    clock, k, steps = Clock(), 4, 12
    pacing = ResponsePacing(0.25, clock)
    pacing.tokens_per_response = k  # as a window would set it
    keys = [f"r{i}" for i in range(8)]
    sent = {key: [] for key in keys}
    per_step = []
    for n in range(1, steps + 1):
        for key in keys:
            pacing.add(key, output(key, n, finished=n == steps))
        ready = pacing.ready()
        per_step.append(len(ready))
        for key, out in ready:
            sent[key].append(out.new_token_ids)
        clock.now += 0.01
    for key in keys:
        assert sent[key][0] == [1]  # the first token at once
        assert [t for tokens in sent[key] for t in tokens] == list(range(1, steps + 1))
        assert all(len(tokens) <= k for tokens in sent[key]) and max(len(t) for t in sent[key][1:-1]) == k
    assert per_step[0] == 8 and per_step[-1] == 8  # every first token, every last one
    assert all(count == 8 // k for count in per_step[1:-1])  # the requests' turns spread the sends


def test_an_output_waits_at_most_max_hold():
    clock = Clock()
    pacing = ResponsePacing(0.25, clock)
    pacing.tokens_per_response = 8
    pacing.add("a", output("a", 1))
    assert len(pacing.ready()) == 1 and pacing.wait_s() is None
    pacing.add("a", output("a", 2))
    assert pacing.ready() == [] and pacing.wait_s() == pytest.approx(response_pacing.MAX_HOLD_S)
    clock.now += response_pacing.MAX_HOLD_S
    ((key, out),) = pacing.ready()
    assert key == "a" and out.new_token_ids == [2] and pacing.wait_s() is None


def test_flush_sends_whatever_is_held():
    clock = Clock()
    pacing = ResponsePacing(0.25, clock)
    pacing.tokens_per_response = 8
    for n in (1, 2, 3):
        pacing.add("a", output("a", n))
        pacing.ready()
    assert [out.new_token_ids for _, out in pacing.ready(flush=True)] == [[2, 3]]


def test_merged_outputs_keep_tokens_logprobs_and_the_later_state():
    first = RequestOutput("a", [5], ["lp5"], False, None, 40, 1, prompt_logprobs=[(1, None)], num_cached_tokens=32)
    later = RequestOutput("a", [6, 7], ["lp6", "lp7"], True, "stop", 40, 3, num_cached_tokens=32)
    merged = merge_outputs(first, later)
    assert (merged.new_token_ids, merged.logprobs, merged.prompt_logprobs) == ([5, 6, 7], ["lp5", "lp6", "lp7"],
                                                                              [(1, None)])
    assert (merged.finished, merged.finish_reason, merged.num_output_tokens) == (True, "stop", 3)
    assert first.new_token_ids == [5] and later.new_token_ids == [6, 7]  # neither changed


@pytest.mark.parametrize("fraction", [-0.1, 1.0])
def test_a_busy_fraction_outside_zero_to_one_is_refused(fraction):
    with pytest.raises(ValueError, match="response_busy_fraction"):
        ResponsePacing(fraction)


def test_a_slow_consumer_gets_several_tokens_a_response_and_every_token(monkeypatch):
    """The host with a real engine: a consumer that takes 20 ms a response is too slow for one
    response a token; after the first window the responses carry several, and all arrive in order."""
    monkeypatch.setattr(response_pacing, "WINDOW_S", 0.1)
    engine = LLMEngine(EngineArgs(dtype="float32", device="cpu", block_size=4, num_kv_blocks=128, max_model_len=64,
                                  max_num_seqs=8, cpu_threads=1))
    host = EngineHost(engine, busy_fraction=0.25)
    try:
        sampling = json.dumps({"max_tokens": 40, "temperature": 0.0, "ignore_eos": True}).encode()
        requests = [host.submit(None, {"prompt_ids": np.array([[1, 2, 3 + i]], np.int32),
                                       "sampling_params": np.array([[sampling]], np.object_)}) for i in range(4)]
        chunks, finished = {}, 0
        for _, chunk in host.responses():
            chunks.setdefault(chunk.key, []).append(chunk)
            finished += chunk.finished
            if finished == len(requests):
                break
            time.sleep(0.02)
    finally:
        host.shutdown()
    for request in requests:
        got = chunks[request.key]
        assert [c.index for c in got] == list(range(len(got)))
        assert len(got[0].token_ids) == 1 and sum(len(c.token_ids) for c in got) == 40
        assert got[-1].finished and got[-1].num_output_tokens == 40
    assert host.pacing.tokens_per_response > 1 and sum(len(c) for c in chunks.values()) < 4 * 40 / 2
