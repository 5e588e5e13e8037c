"""Fault injection: the KV pool exhausted by long prompts (the engine queues and preempts; every
request still finishes with the text it has alone), and the engine's stub killed mid-stream
(Triton stops reporting the model ready within seconds, every client gets an error within a
bound, the server exits: engine_lease.py)."""

import asyncio
import json
import os
import random
import signal
import time

import pytest

from processes import alive, stub_processes
from server_state import model_ready, wait_idle
from servers import BLOCK_SIZE, KEY, MAX_MODEL_LEN, NUM_KV_BLOCKS, start_openai, start_triton
from traffic import ERROR, OK, Doors, Request

pytest.importorskip("tritonclient.grpc.aio")
pytestmark = pytest.mark.server

LONG_PROMPT_TOKENS = 440
LONG_OUTPUT_TOKENS = MAX_MODEL_LEN - LONG_PROMPT_TOKENS - 8
# s, from the stub's death: the lease watch polls every 0.5 s; tritonserver waits its exit
# timeout (10 s in these tests) for the requests in flight, then is killed 5 s later
NOT_READY_WITHIN = 5.0
ERROR_WITHIN = 30.0


def long_prompt(tokenizer, rng: random.Random) -> list[int]:
    words = "river stone lantern orbit copper meadow signal harbor velvet ember".split()
    ids = tokenizer(" ".join(rng.choices(words, k=LONG_PROMPT_TOKENS)), add_special_tokens=False).input_ids
    return ids[:LONG_PROMPT_TOKENS]


def run(triton, requests: list[Request], openai_url: str | None = None) -> list:
    async def main():
        doors = Doors(triton, openai_url, KEY)
        try:
            return await asyncio.gather(*(doors.send(r) for r in requests))
        finally:
            await doors.close()

    return asyncio.run(main())


def test_long_prompts_past_the_kv_pool_queue_and_preempt_without_error(triton, tokenizer, form):
    rng = random.Random(44)
    prompts = [long_prompt(tokenizer, rng) for _ in range(form.kv_pressure_prompts)]
    pool_tokens = NUM_KV_BLOCKS * BLOCK_SIZE
    demand = 2 * len(prompts) * (LONG_PROMPT_TOKENS + LONG_OUTPUT_TOKENS)
    assert demand > pool_tokens, (demand, pool_tokens)
    fields = {"max_tokens": LONG_OUTPUT_TOKENS, "temperature": 0.0, "ignore_eos": True}
    preempted = triton.metric("flint:num_preemptions_total")
    # a cache_salt a door: the two copies of a prompt share no prefix-cache blocks, so each needs its own KV
    salted = {door: {**fields, "sampling_parameters": json.dumps({"cache_salt": door})} for door in ("grpc", "http")}
    requests = [Request(door, inputs={"input_ids": ids, **salted[door], **({"stream": True} if door == "grpc" else {})},
                        stream=door == "grpc")
                for ids in prompts for door in ("grpc", "http")]
    outcomes = run(triton, requests)
    for request, outcome in zip(requests, outcomes):
        assert outcome.status == OK and outcome.finish_reason == "length", (request.door, outcome)
        assert outcome.num_output_tokens == LONG_OUTPUT_TOKENS, outcome
    for i in range(len(prompts)):  # both copies of a prompt (one preempted or not) and the prompt alone agree
        alone = run(triton, [Request("http", inputs={"input_ids": prompts[i], **fields})])[0]
        assert outcomes[2 * i].text == outcomes[2 * i + 1].text == alone.text, i
    preemptions = triton.metric("flint:num_preemptions_total") - preempted
    print(f"KV pressure: {len(requests)} requests of {LONG_PROMPT_TOKENS} + {LONG_OUTPUT_TOKENS} tokens, "
          f"{demand} tokens against a pool of {pool_tokens}: {preemptions:.0f} preemptions, 0 errors")
    assert preemptions > 0, "the pool was never short: nothing tested"
    wait_idle(triton)


def requests_running(triton) -> float:
    """flint:num_requests_running; the server's state and log when /metrics does not answer."""
    try:
        return triton.metric("flint:num_requests_running")
    except OSError as e:  # urllib's URLError included
        state = "running" if triton.process.poll() is None else f"exited with {triton.process.returncode}"
        pytest.fail(f"/metrics did not answer ({e}); tritonserver {state}:\n{triton.log_tail(4000)}")


@pytest.fixture
def doomed(tiny_checkpoint, tmp_path):
    """A tritonserver and OpenAI server of its own: the test kills its engine."""
    with start_triton(tiny_checkpoint, tmp_path) as triton, start_openai(triton, tmp_path) as openai_server:
        yield triton, openai_server


def test_engine_stub_killed_mid_stream_errors_every_client(doomed, tokenizer):
    triton, openai_server = doomed
    long = {"max_tokens": 400, "ignore_eos": True, "temperature": 0.0}
    requests = [Request("grpc", inputs={"text_input": "Hello", "stream": True, **long}, stream=True, timeout=40),
                Request("http_stream", inputs={"text_input": "Hello", "stream": True, **long}, stream=True,
                        timeout=40),
                Request("http", inputs={"text_input": "Hello", **long}, timeout=40),
                Request("chat", body={"model": "flint", "messages": [{"role": "user", "content": "Hi"}], **long},
                        stream=True, timeout=40),
                Request("completions", body={"model": "flint", "prompt": "Hi", **long}, timeout=40)]
    (pid,) = stub_processes(triton.process.pid, "flint_model")

    async def main():
        doors = Doors(triton, openai_server.url, KEY)
        try:
            tasks = [asyncio.ensure_future(doors.send(r)) for r in requests]
            deadline = time.monotonic() + 60
            while requests_running(triton) < len(requests):
                assert time.monotonic() < deadline, "the requests never all ran"
                await asyncio.sleep(0.1)
            os.kill(pid, signal.SIGKILL)
            killed = time.monotonic()
            while model_ready(triton, "flint_model") == 200:  # not ready: refused, or the server is gone
                assert time.monotonic() - killed < NOT_READY_WITHIN, "flint_model still ready"
                await asyncio.sleep(0.1)
            outcomes = await asyncio.gather(*tasks)
            return outcomes, time.monotonic() - killed
        finally:
            await doors.close()

    outcomes, seconds = asyncio.run(main())
    assert not alive(pid)
    wrong = [(request.door, outcome) for request, outcome in zip(requests, outcomes)
             if outcome.status != ERROR or not outcome.error]
    assert not wrong, f"{wrong}\n{triton.log_tail(3000)}"
    assert outcomes[-1].http_status == 503, outcomes[-1]  # the OpenAI server: Triton unavailable
    print(f"engine killed: {len(requests)} clients got errors {seconds:.1f} s after")
    assert seconds < ERROR_WITHIN, f"clients waited {seconds:.1f} s for their errors"
    assert triton.process.wait(ERROR_WITHIN) is not None, "tritonserver still running"
    assert "died without being stopped" in triton.log_tail(20000)
