"""A real tritonserver (the nvidia-pytriton one, or the system's) on the tiny checkpoint, through
tritonclient gRPC streaming, HTTP generate / generate_stream and perf_analyzer."""

import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from flint_backend.chat.request import encode_text_input
from reference_texts import N_TOKENS, reference_logprobs
from triton_server import Streams, TritonServer, configured_repository

pytest.importorskip("tritonclient.grpc")
pytestmark = pytest.mark.server

MAX_MODEL_LEN = 512
OUTPUT_TYPES = {"text_output": "BYTES", "reasoning_output": "BYTES", "tool_calls": "BYTES", "finish_reason": "BYTES",
                "num_input_tokens": "UINT32", "num_output_tokens": "UINT32", "num_cached_tokens": "UINT32"}
LOGPROB_TOL = 1e-4  # the fp32 engine against the fp64 reference


@pytest.fixture(scope="module")
def server(tiny_checkpoint, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("triton")
    repo = configured_repository(tmp, "--model", str(tiny_checkpoint), "--device", "cpu", "--dtype", "float32",
                                 "--cpu-threads", "1", "--block-size", "16", "--num-kv-blocks", "2048",
                                 "--max-model-len", str(MAX_MODEL_LEN), "--max-num-seqs", "64",
                                 "--enable-auto-tool-choice", "--tool-call-parser", "glm47",
                                 "--reasoning-parser", "glm47")
    with TritonServer(repo, tmp / "tritonserver.log") as s:
        yield s


def check_outputs(outputs: list, num_input_tokens: int, final_reason: str, num_output_tokens: int | None):
    """Every output tensor of every response: present, [1, 1], typed, with sensible contents."""
    texts, last_count = [], 0
    for i, result in enumerate(outputs):
        final = i == len(outputs) - 1
        for name, kind in OUTPUT_TYPES.items():
            array = result.as_numpy(name)
            assert array is not None and array.shape == (1, 1), (name, None if array is None else array.shape)
            assert result.get_output(name).datatype == kind
        texts.append(result.as_numpy("text_output")[0, 0].decode())
        assert result.as_numpy("reasoning_output")[0, 0] == b""
        assert json.loads(result.as_numpy("tool_calls")[0, 0]) == []
        assert result.as_numpy("logprobs") is None and result.as_numpy("prompt_logprobs") is None  # not asked
        assert result.as_numpy("finish_reason")[0, 0].decode() == (final_reason if final else "")
        assert int(result.as_numpy("num_input_tokens")[0, 0]) == num_input_tokens
        count = int(result.as_numpy("num_output_tokens")[0, 0])
        assert count >= last_count and count >= 1
        last_count = count
    if num_output_tokens is not None:
        assert last_count == num_output_tokens
    return "".join(texts)


def request_body(prompt: str, **extra) -> dict:
    return {"text_input": prompt, "max_tokens": N_TOKENS, "temperature": 0.0, "ignore_eos": True, **extra}


def test_streamed_and_generated_text_equal_the_reference(server, tokenizer, reference_texts):
    prompt, (ids, expected) = next(iter(reference_texts.items()))
    n_prompt = len(encode_text_input(tokenizer, prompt))
    streams = Streams(server.grpc_url)
    try:
        streams.send("grpc", **request_body(prompt, stream=True))
        grpc_outputs = streams.wait("grpc")
    finally:
        streams.close()
    assert len(grpc_outputs) >= 2  # streamed: one response per step (or a few tokens each)
    grpc_text = check_outputs(grpc_outputs, n_prompt, "length", N_TOKENS)

    status, body = server.generate(request_body(prompt))
    assert status == 200, body
    assert body["finish_reason"] == "length" and body["num_output_tokens"] == N_TOKENS
    assert body["num_input_tokens"] == n_prompt and body["reasoning_output"] == "" and body["tool_calls"] == "[]"

    events = server.generate_stream(request_body(prompt, stream=True))
    assert len(events) >= 2 and events[-1]["finish_reason"] == "length"
    assert all(e["finish_reason"] == "" for e in events[:-1])
    sse_text = "".join(e["text_output"] for e in events)

    assert grpc_text == body["text_output"] == sse_text == expected
    assert tokenizer.decode(ids, skip_special_tokens=True) == expected


def test_exclude_input_in_output_false_echoes_the_prompt_in_both_modes(server, reference_texts):
    prompt, (_, expected) = next(iter(reference_texts.items()))
    status, body = server.generate(request_body(prompt, exclude_input_in_output=False))
    assert status == 200 and body["text_output"] == prompt + expected
    events = server.generate_stream(request_body(prompt, exclude_input_in_output=False, stream=True))
    assert "".join(e["text_output"] for e in events) == prompt + expected


def test_token_id_prompts_give_the_reference_text(server, tokenizer, reference_texts):
    prompt, (_, expected) = next(iter(reference_texts.items()))
    prompt_ids = encode_text_input(tokenizer, prompt)
    streams = Streams(server.grpc_url)
    try:
        body = {k: v for k, v in request_body(prompt, stream=True).items() if k != "text_input"}
        streams.send("ids", **body, input_ids=prompt_ids)
        text = check_outputs(streams.wait("ids"), len(prompt_ids), "length", N_TOKENS)
    finally:
        streams.close()
    assert text == expected
    body = {k: v for k, v in request_body(prompt, exclude_input_in_output=False).items() if k != "text_input"}
    status, out = server.generate({**body, "input_ids": prompt_ids})
    assert status == 200 and out["text_output"] == prompt + expected, out
    status, out = server.generate({**body, "input_ids": [1, 10**6]})
    assert status == 400 and "prompt: token id 1000000 is outside the vocabulary" in out["error"], out


def test_32_concurrent_streams_complete_with_the_reference_text(server, tokenizer, reference_texts):
    prompts = list(reference_texts)
    streams = Streams(server.grpc_url)
    try:
        for i in range(32):
            streams.send(f"r{i}", **request_body(prompts[i % len(prompts)], stream=True))
        for i in range(32):
            prompt = prompts[i % len(prompts)]
            outputs = streams.wait(f"r{i}")
            text = check_outputs(outputs, len(encode_text_input(tokenizer, prompt)), "length", N_TOKENS)
            assert text == reference_texts[prompt][1], f"request {i}"
    finally:
        streams.close()
    assert not streams.errors


def test_stop_words_end_the_output_and_the_engine_request(server, reference_texts):
    prompt, (_, expected) = next(iter(reference_texts.items()))
    stop = expected[len(expected) // 2:len(expected) // 2 + 3]
    cut = expected[:expected.index(stop)]
    before = server.metric("flint:request_success_total", finished_reason="abort")
    body = request_body(prompt, max_tokens=400, stop_words=[stop, "never-seen"])
    status, out = server.generate(body)
    assert status == 200, out
    assert out["text_output"] == cut and out["finish_reason"] == "stop"
    events = server.generate_stream({**body, "stream": True})
    assert "".join(e["text_output"] for e in events) == cut and events[-1]["finish_reason"] == "stop"
    assert out["num_output_tokens"] < 400
    deadline = time.monotonic() + 10  # both requests were aborted in the engine
    while server.metric("flint:request_success_total", finished_reason="abort") < before + 2:
        assert time.monotonic() < deadline
        time.sleep(0.2)


def test_sampling_parameters_json_as_vllm_backend_clients_send_it(server, reference_texts):
    prompt, (_, expected) = next(iter(reference_texts.items()))
    params = json.dumps({"temperature": "0", "max_tokens": str(N_TOKENS), "ignore_eos": "true"})
    status, body = server.generate({"text_input": prompt, "sampling_parameters": params})
    assert status == 200 and body["text_output"] == expected
    status, body = server.generate({"text_input": prompt, "sampling_parameters": params, "max_tokens": 3})
    assert status == 200 and body["num_output_tokens"] == 3  # the tensor wins over the JSON


def check_logprob_entries(entries: list[dict], ids: list[int], reference, tokenizer, top_n: int):
    """Entries of tokens ids, each row of reference [len(ids), vocab] the log-softmax before it."""
    assert [e["token_id"] for e in entries] == ids
    for step, entry in enumerate(entries):
        assert entry["logprob"] == pytest.approx(float(reference[step, ids[step]]), abs=LOGPROB_TOL)
        assert entry["token"] == tokenizer.decode([ids[step]], skip_special_tokens=False)
        top = entry["top_logprobs"]
        assert len(top) == top_n
        for t in top:
            assert t["logprob"] == pytest.approx(float(reference[step, t["token_id"]]), abs=LOGPROB_TOL)
        best = reference[step].topk(top_n).values.tolist()
        assert [t["logprob"] for t in top] == pytest.approx(best, abs=LOGPROB_TOL)  # the top N, not any N


def test_logprobs_are_the_references_streamed_or_not(server, tiny_checkpoint, tokenizer, reference_texts):
    prompt, (ids, expected) = next(iter(reference_texts.items()))
    prompt_ids = encode_text_input(tokenizer, prompt)
    reference = reference_logprobs(tiny_checkpoint, prompt_ids + ids)  # [prompt + N_TOKENS - 1, vocab]
    body = request_body(prompt, sampling_parameters=json.dumps({"logprobs": 3, "prompt_logprobs": 2}))
    status, out = server.generate(body)
    assert status == 200 and out["text_output"] == expected, out
    entries = json.loads(out["logprobs"])
    check_logprob_entries(entries, ids, reference[len(prompt_ids) - 1:], tokenizer, 3)
    assert all(e["top_logprobs"][0]["token_id"] == e["token_id"] for e in entries)  # greedy
    first, *rest = json.loads(out["prompt_logprobs"])
    assert (first["token_id"], first["logprob"], first["top_logprobs"]) == (prompt_ids[0], None, [])
    check_logprob_entries(rest, prompt_ids[1:], reference, tokenizer, 2)
    events = server.generate_stream({**body, "stream": True})
    streamed = [e for event in events for e in json.loads(event.get("logprobs", "[]"))]
    assert [e["token_id"] for e in streamed] == ids
    assert [e["logprob"] for e in streamed] == pytest.approx([e["logprob"] for e in entries], abs=1e-6)
    assert ["prompt_logprobs" in event for event in events] == [True] + [False] * (len(events) - 1)
    status, out = server.generate(request_body(prompt, sampling_parameters=json.dumps({"logprobs": 21})))
    assert status == 400 and "logprobs" in out["error"], out


@pytest.mark.parametrize("body, field", [
    ({"max_tokens": 4}, "text_input"),
    ({"messages": "[{\"role\": \"user\"", "max_tokens": 4}, "messages"),
    ({"messages": "[{\"role\": \"user\", \"content\": \"hi\"}]", "tools": "[{", "max_tokens": 4}, "tools"),
    ({"text_input": "hi", "sampling_parameters": "{\"temperature\": ", "max_tokens": 4}, "sampling_parameters"),
    ({"text_input": "hi", "sampling_parameters": "{\"temprature\": 1}"}, "sampling_parameters.temprature"),
    ({"text_input": "hi", "sampling_parameters": json.dumps({"cache_salt": ""})},
     "sampling_parameters.cache_salt: expected a non-empty string"),
    ({"text_input": "hi", "max_tokens": -5}, "max_tokens"),
    ({"text_input": "hello " * 600, "max_tokens": 4}, f"context of {MAX_MODEL_LEN} tokens"),
    ({"messages": "[{\"role\": \"user\", \"content\": \"hi\"}]", "max_tokens": 4, "tools": json.dumps([
        {"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": 5}}}])},
     "tools[0].function.parameters.properties: expected an object of property schemas, got 5"),
    ({"text_input": "hi", "max_tokens": 10**9}, f"max_tokens: got 1000000000, expected at most {MAX_MODEL_LEN - 1} "
     f"(the prompt's 1 tokens plus max_tokens must fit the context of {MAX_MODEL_LEN} tokens)"),
    ({"text_input": "hi", "sampling_parameters": json.dumps({"max_tokens": MAX_MODEL_LEN})},
     f"max_tokens: got {MAX_MODEL_LEN}, expected at most {MAX_MODEL_LEN - 1}"),
])
def test_bad_requests_get_an_error_naming_the_problem_and_the_server_goes_on(server, body, field):
    status, out = server.generate(body)
    assert status == 400 and field in out["error"], out
    status, out = server.generate({"text_input": "Hello world", "max_tokens": 2})
    assert status == 200 and out["num_output_tokens"] == 2


def test_grpc_stream_errors_reach_the_client(server):
    streams = Streams(server.grpc_url)
    try:
        streams.send("bad", text_input="hi", max_tokens=-1)
        deadline = time.monotonic() + 30
        while not streams.errors and time.monotonic() < deadline:
            time.sleep(0.1)
        assert streams.errors and "max_tokens" in str(streams.errors[0])
        streams.send("good", text_input="hi", max_tokens=2, stream=True)
        assert streams.wait("good")
    finally:
        streams.close()


def test_chat_request_runs_the_template_and_parsers(server):
    messages = json.dumps([{"role": "user", "content": "What is the weather in Paris?"}])
    tools = json.dumps([{"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}}}}])
    status, body = server.generate({"messages": messages, "tools": tools, "max_tokens": 8, "temperature": 0.0})
    assert status == 200, body
    assert body["num_input_tokens"] > 20 and 1 <= body["num_output_tokens"] <= 8
    assert isinstance(json.loads(body["tool_calls"]), list)
    status, body = server.generate({"messages": messages, "tools": tools, "tool_choice": "\"sometimes\""})
    assert status == 400 and "tool_choice" in body["error"]


def chat_turns() -> tuple[list[dict], list[dict]]:
    """A conversation's first turn (a ~190-token prompt that no other test sends: its first KV
    block is its own) and its second, whose prompt extends the first's."""
    rules = " ".join(f"Rule {i}: answer in short sentences about topic {i}." for i in range(8))
    first = [{"role": "system", "content": f"Session {uuid.uuid4().hex}. {rules}"},
             {"role": "user", "content": "What is rule 3?"}]
    return first, first + [{"role": "assistant", "content": "Short sentences about topic 3."},
                           {"role": "user", "content": "And rule 7?"}]


def chat_body(messages: list[dict], cache_salt: str | None = None) -> dict:
    salt = {"sampling_parameters": json.dumps({"cache_salt": cache_salt})} if cache_salt else {}
    return {"messages": json.dumps(messages), "max_tokens": 2, "temperature": 0.0, **salt}


def test_a_second_turn_reuses_the_first_turns_prefix_and_another_salt_does_not(server):
    """Issue 45 through tritonserver: every response of the second turn (gRPC stream, HTTP) carries
    the prompt tokens the prefix cache held, the hit counter moves by them, and a request with
    another cache_salt finds nothing cached."""
    first, second = chat_turns()
    hits = server.metric("flint:prefix_cache_hits_total")
    status, turn1 = server.generate(chat_body(first))
    assert status == 200 and turn1["num_input_tokens"] > 150 and turn1["num_cached_tokens"] == 0, turn1
    streams = Streams(server.grpc_url)
    try:
        streams.send("turn2", **chat_body(second), stream=True)
        outputs = streams.wait("turn2")
    finally:
        streams.close()
    assert all(r.get_output("num_cached_tokens").datatype == "UINT32" for r in outputs)
    counts = {(int(r.as_numpy("num_input_tokens")[0, 0]), int(r.as_numpy("num_cached_tokens")[0, 0]))
              for r in outputs}
    assert len(counts) == 1, counts  # the same on every response
    ((prompt, cached),) = counts
    salted = server.generate_stream({**chat_body(second, cache_salt="tenant-b"), "stream": True})
    assert salted and all(e["num_cached_tokens"] == 0 for e in salted), salted  # nothing under this salt yet
    status, salted_again = server.generate(chat_body(second, cache_salt="tenant-b"))
    assert status == 200 and salted_again["num_input_tokens"] == prompt
    # the rest needs the engine's prefix cache (issue 45)
    assert 0 < cached < prompt and 0 < salted_again["num_cached_tokens"] < prompt
    deadline = time.monotonic() + 5  # the engine's metrics are published every 0.5 s
    while server.metric("flint:prefix_cache_hits_total") < hits + cached + salted_again["num_cached_tokens"]:
        assert time.monotonic() < deadline, (hits, server.metric("flint:prefix_cache_hits_total"))
        time.sleep(0.2)
    assert server.metric("flint:prefix_cache_queries_total") >= server.metric("flint:prefix_cache_hits_total")


def test_cancelled_streams_free_the_kv_cache(server):
    before_aborts = server.metric("flint:request_success_total", finished_reason="abort")
    before_tokens = server.metric("flint:generation_tokens_total")
    clients = [Streams(server.grpc_url) for _ in range(50)]
    try:
        for i, streams in enumerate(clients):
            streams.send(f"c{i}", text_input=f"Cancel me {i}", max_tokens=400, ignore_eos=True, stream=True,
                         temperature=1.0, seed=i)
        deadline = time.monotonic() + 60
        # once every stream has a token, all 50 run in the engine: cancel at once (however fast the CPU)
        while not all(s.results.get(f"c{i}") for i, s in enumerate(clients)):
            assert time.monotonic() < deadline, "streams did not start"
            time.sleep(0.05)
    finally:
        for streams in clients:
            streams.close(cancel=True)
    deadline = time.monotonic() + 30
    while (server.metric("flint:kv_cache_usage_perc") > 0 or server.metric("flint:num_requests_running") > 0
           or server.metric("flint:request_success_total", finished_reason="abort") < before_aborts + 50):
        assert time.monotonic() < deadline, [l for l in server.metrics().splitlines()
                                             if l.startswith(("flint:kv", "flint:num_req", "flint:request_success"))]
        time.sleep(0.25)
    assert 50 <= server.metric("flint:generation_tokens_total") - before_tokens < 50 * 400 / 2  # stopped mid-way
    status, out = server.generate({"text_input": "Hello world", "max_tokens": 2})
    assert status == 200 and out["num_output_tokens"] == 2


def test_metrics_are_published(server):
    text = server.metrics()
    for name in ("flint:prompt_tokens_total", "flint:generation_tokens_total", "flint:num_requests_running",
                 "flint:prefix_cache_queries_total", "flint:prefix_cache_hits_total",
                 "flint:num_requests_waiting", "flint:kv_cache_usage_perc",
                 "flint:time_to_first_token_seconds_bucket", "flint:time_per_output_token_seconds_bucket",
                 "flint:e2e_request_latency_seconds_bucket"):
        assert name in text, name
    assert server.metric("flint:time_to_first_token_seconds_count") > 0


def test_perf_analyzer_streaming_run_has_no_errors(server, tmp_path):
    script = Path(__file__).resolve().parents[2] / "scripts" / "loadtest.sh"
    env = dict(os.environ, PYTHON=os.sys.executable)
    run = subprocess.run(["bash", str(script), "--url", server.grpc_url, "--concurrency", "2", "--max-tokens", "8",
                          "--requests", "8", "--out", str(tmp_path), "--no-genai-perf"],
                         env=env, capture_output=True, text=True, timeout=180)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert "Concurrency: 2" in run.stdout
    rows = (tmp_path / "perf_analyzer_c2.csv").read_text().splitlines()
    assert len(rows) >= 2
    # tokens/s, TTFT and ITL from perf_analyzer's profile export (scripts/loadtest_report.py)
    assert "| concurrency | requests | output tok/s | TTFT p50 / p90 / p99 ms |" in run.stdout
    (summary,) = json.loads((tmp_path / "loadtest_summary.json").read_text())
    assert summary["value"] == 2 and summary["output_tokens"] == 8 * summary["streams"] > 0
    assert summary["output_tok_s"] > 0 and summary["ttft_ms"]["p50"] > 0 and summary["itl_ms"]["p50"] > 0


def gpu_tool_phases(name: str):
    """-> phase(*args): runs tools/gpu/<name>.py with those arguments, asserts it exits 0, -> its stdout."""
    script = Path(__file__).resolve().parents[2] / "tools" / "gpu" / f"{name}.py"

    def phase(*args):
        run = subprocess.run([sys.executable, str(script), *args], capture_output=True, text=True, timeout=300)
        assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
        return run.stdout

    return phase


def test_gpu_serve_check_phases_agree_with_the_server(server, tmp_path):
    """tools/gpu/gpu_serve_check.py on the CPU (its GPU run is tools/gpu/gpu_serve_check.sh): the engine
    phase on the server's own repository, the client phase's flint_model and flint streams, and the
    report, which finds the served tokens and text equal to the in-process engine's."""
    phase = gpu_tool_phases("gpu_serve_check")
    files = {name: str(tmp_path / f"{name}.json") for name in ("engine", "client", "all")}

    phase("engine", "--repository", str(server.repository), "--prompt-tokens", "40", "--tokens", "6",
          "--runs", "2", "--out", files["engine"])
    phase("client", "--url", server.http_url, "--metrics-url", f"127.0.0.1:{server.metrics_port}",
          "--engine", files["engine"], "--runs", "2", "--out", files["client"])
    out = phase("report", files["engine"], files["client"], "--case", "tiny", "--into", files["all"])
    assert "served tokens == engine tokens; ensemble text == engine text" in out
    (case,) = json.loads(Path(files["all"]).read_text())["cases"]
    engine, client = json.loads(Path(files["engine"]).read_text()), case["client"]
    assert 30 < len(engine["prompt_ids"]) <= 40 and len(engine["tokens"]) == 6
    assert client["flint_model"]["num_output_tokens"] == client["flint"]["num_output_tokens"] == 6
    assert case["checks"] == {"tokens_equal": True, "first_token_difference": None, "text_equal": True,
                              "prompt_tokens_equal": True, "repeatable": True, "ok": True}
    assert engine["ms_per_token_unsynced"] > 0  # as bench.py times it: steps unsynced, over their tokens
    assert case["itl_over_ms_per_token"] == client["flint_model"]["itl"]["median_ms"] / engine["ms_per_token_unsynced"]
    assert "| tiny |" in phase("summary", files["all"])


def test_serve_concurrency_phases_run_against_the_server(server, tmp_path):
    """tools/gpu/serve_concurrency.py on the CPU (its GPU run is gpu_serve_check.sh --concurrency N): the
    same 4 requests in-process and as 4 concurrent streams to flint_model and to the ensemble; every
    stream gets its tokens, and the report puts the runs side by side with each process's CPU a token."""
    phase = gpu_tool_phases("serve_concurrency")
    files = {name: str(tmp_path / f"{name}.json") for name in ("engine", "client", "all")}

    phase("engine", "--repository", str(server.repository), "--streams", "4", "--prompt-tokens", "32",
          "--tokens", "6", "--out", files["engine"])
    phase("client", "--url", server.http_url, "--engine", files["engine"], "--server-pid", str(server.process.pid),
          "--out", files["client"])
    out = phase("report", files["engine"], files["client"], "--case", "tiny", "--into", files["all"], "--target", "0")
    assert "| measure | in-process | served flint_model | served flint |" in out
    (case,) = json.loads(Path(files["all"]).read_text())["cases"]
    assert case["streams"] == 4 and case["ok"] and case["engine"]["stats"]["output_tokens"] == 24
    for model, served in case["served"].items():
        assert served["stats"]["output_tokens"] == 24 and served["ratio"] > 0, model
        cpu = served["cpu_ms_per_token"]  # clock ticks of 10 ms: a short run's stage may read 0
        assert {"tritonserver", "flint_model", "flint_postprocess", "client"} <= set(cpu) and sum(cpu.values()) > 0
    assert case["served"]["flint"]["models"]["flint_postprocess"]["requests_per_token"] > 0
    assert "| tiny | 4 |" in phase("summary", files["all"])
