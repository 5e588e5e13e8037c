"""The engine model's host without Triton: chunks per request, coalescing, refusals, cancellation."""

import json
import time

import numpy as np
import pytest

from flint_backend.engine.engine import LLMEngine, RequestOutput
from flint_backend.engine.engine_args import EngineArgs
from flint_backend.serving.abort_relay import AbortRelay
from flint_backend.serving.chunks import chunk_arrays, chunk_from_arrays
from flint_backend.serving.engine_host import EngineHost, HostedRequest, _coalesce
from flint_backend.serving.postprocess import Postprocessor, RequestText
from flint_backend.tokenizer import load_tokenizer


class Sender:
    def __init__(self, cancelled=False):
        self.cancelled = cancelled

    def is_cancelled(self):
        return self.cancelled


def inputs(prompt, **sampling):
    return {"prompt_ids": np.array([prompt], np.int32),
            "sampling_params": np.array([[json.dumps(sampling).encode()]], np.object_),
            "output_config": np.array([[b'{"stream": true}']], np.object_)}


def make_host(key_prefix=""):
    return EngineHost(LLMEngine(EngineArgs(dtype="float32", device="cpu", block_size=4, num_kv_blocks=128,
                                           max_model_len=64, max_num_seqs=8, cpu_threads=1)), key_prefix)


def collect(host, count):
    chunks, finished = {}, 0
    for request, chunk in host.responses():
        chunks.setdefault(chunk.key, []).append(chunk)
        finished += chunk.finished
        if finished == count:
            return chunks


def test_chunks_are_numbered_and_carry_every_token():
    host = make_host()
    try:
        requests = [host.submit(Sender(), inputs([1, 2, 3 + i], max_tokens=6, temperature=0.0, ignore_eos=True))
                    for i in range(3)]
        time.sleep(0.3)  # let outputs pile up: the reader then coalesces them
        chunks = collect(host, 3)
    finally:
        host.shutdown()
    for request in requests:
        got = chunks[request.key]
        assert [c.index for c in got] == list(range(len(got)))
        assert sum(len(c.token_ids) for c in got) == 6 and got[-1].num_output_tokens == 6
        assert got[0].config == '{"stream": true}' and all(c.config == "" for c in got[1:])
        assert got[-1].finished and got[-1].finish_reason == "length"
        assert chunk_from_arrays(chunk_arrays(got[-1])) == got[-1]


def test_chunks_carry_the_prompt_tokens_the_prefix_cache_held():
    """Every output of a request carries the engine's num_cached_tokens; coalesced outputs keep it."""
    host = make_host()
    try:
        request = HostedRequest(Sender(), "k", '{"stream": true}')
        outs = [RequestOutput("k", [5], [None], False, None, 40, 1, num_cached_tokens=32),
                RequestOutput("k", [6, 7], [None, None], True, "length", 40, 3, num_cached_tokens=32)]
        ((_, merged),) = _coalesce([(request, out) for out in outs])
        chunk = host._chunk(request, merged)
    finally:
        host.shutdown()
    assert (chunk.token_ids, chunk.num_input_tokens, chunk.num_output_tokens, chunk.num_cached_tokens) == (
        [5, 6, 7], 40, 3, 32)
    arrays = chunk_arrays(chunk)  # flint_model's output tensor, read back by flint_postprocess
    assert arrays["num_cached_tokens"].dtype == np.uint32 and arrays["num_cached_tokens"].tolist() == [[32]]
    assert chunk_from_arrays(arrays) == chunk


def test_refused_request_answers_with_an_error_chunk():
    host = make_host()
    try:
        request = host.submit(Sender(), inputs(list(range(1, 80)), max_tokens=2))
        (chunk,) = collect(host, 1)[request.key]
    finally:
        host.shutdown()
    assert chunk.finished and chunk.finish_reason == "rejected" and "64 tokens" in chunk.error


@pytest.mark.parametrize("sampling, field", [
    (dict(max_tokens=0), "max_tokens"), (dict(top_p=1.5), "top_p"), (dict(temperature=-1.0), "temperature"),
    (dict(logprobs=21), "logprobs"), (dict(nucleus=0.5), "nucleus"),
])
def test_bad_sampling_values_refuse_that_request_only(sampling, field):
    host = make_host()
    try:
        running = host.submit(Sender(), inputs([1, 2, 3], max_tokens=6, temperature=0.0, ignore_eos=True))
        bad = host.submit(Sender(), inputs([4, 5, 6], **sampling))
        chunks = collect(host, 2)
    finally:
        host.shutdown()
    (refused,) = chunks[bad.key]
    assert refused.finish_reason == "rejected" and refused.error.startswith(f"{field}: ")
    done = [c for c in chunks[running.key] if c.finished]
    assert done and done[-1].finish_reason == "length"


def test_cancelled_sender_aborts_the_request_once():
    host = make_host()
    try:
        sender = Sender()
        request = host.submit(sender, inputs([1, 2, 3], max_tokens=50, ignore_eos=True))
        for got, chunk in host.responses():
            sender.cancelled = True
            assert host.poll_cancelled(got)
            if chunk.finished:
                break
    finally:
        host.shutdown()
    assert chunk.finish_reason == "abort" and chunk.num_output_tokens < 50
    assert host.engine.blocks.usage == 0.0 and request.cancelled


def test_a_postprocess_error_aborts_the_engine_request(monkeypatch):
    """flint_postprocess's loop without Triton: each chunk through the Postprocessor, whose outcome's
    abort reaches the engine (there through a control request to flint_model). Issue 44: an error
    there left the engine generating to max_tokens."""
    real_apply = RequestText.apply

    def apply(self, chunk):
        if chunk.index == 1:
            raise AttributeError("'int' object has no attribute 'items'")
        return real_apply(self, chunk)

    monkeypatch.setattr(RequestText, "apply", apply)
    host, post = make_host(), Postprocessor(load_tokenizer())
    errors = []
    try:
        host.submit(Sender(), inputs([1, 2, 3], max_tokens=50, ignore_eos=True))
        for _, chunk in host.responses():
            outcome = post.process(chunk)
            errors += [d.error for d in outcome.outputs if d.error]
            if outcome.abort_engine:
                host.abort(chunk.key)
            if chunk.finished:
                break
    finally:
        host.shutdown()
    assert errors == ["postprocess: AttributeError: 'int' object has no attribute 'items'"]
    assert chunk.finish_reason == "abort" and chunk.num_output_tokens < 50
    assert host.engine.metrics.num_running == 0 and host.engine.blocks.usage == 0.0 and post.num_open == 0


def test_an_abort_taken_by_another_instance_stops_the_owners_request():
    hosts = []
    relays = [AbortRelay(f"flint_model_0_{i}", lambda key, i=i: hosts[i].abort(key)) for i in range(2)]
    hosts += [make_host(relay.key_prefix) for relay in relays]
    try:
        request = hosts[1].submit(Sender(), inputs([1, 2, 3], max_tokens=50, ignore_eos=True))
        assert request.key.startswith(relays[1].key_prefix)
        for _, chunk in hosts[1].responses():
            relays[0].route(chunk.key)  # Triton gave the control request to instance 0
            if chunk.finished:
                break
    finally:
        for relay in relays:
            relay.close()
        for host in hosts:
            host.shutdown()
    assert chunk.finish_reason == "abort" and chunk.num_output_tokens < 50


def test_chunks_carry_each_tokens_logprobs_through_their_tensors():
    host = make_host()
    try:
        request = host.submit(Sender(), inputs([1, 2, 3], max_tokens=5, temperature=0.0, ignore_eos=True,
                                               logprobs=3))
        plain = host.submit(Sender(), inputs([1, 2, 3], max_tokens=5, temperature=0.0, ignore_eos=True))
        chunks = collect(host, 2)
    finally:
        host.shutdown()
    got = chunks[request.key]
    tokens = [t for c in got for t in c.token_ids]
    assert tokens == [t for c in chunks[plain.key] for t in c.token_ids]
    assert all(c.logprobs == [] for c in chunks[plain.key])
    for chunk in got:
        assert len(chunk.logprobs) == len(chunk.token_ids)
        for token, (logprob, top) in zip(chunk.token_ids, chunk.logprobs):
            assert len(top) == 3 and top[0] == [token, logprob] and logprob <= 0.0  # greedy: the best token
            assert [lp for _, lp in top] == sorted((lp for _, lp in top), reverse=True)
        assert chunk_from_arrays(chunk_arrays(chunk)) == chunk  # floats survive the JSON tensor exactly
