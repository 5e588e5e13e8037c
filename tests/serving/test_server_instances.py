"""Two KIND_CPU instances of flint_model in one tritonserver (configure --instances 2):
Triton spreads the requests over both engines (seen per instance on /metrics), every text equals
the fp64 reference's, and aborts taken by either instance stop the owner's request."""

import json
import os
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from reference_texts import N_TOKENS
from triton_server import Streams, TritonServer, configured_repository

pytest.importorskip("tritonclient.grpc")
pytestmark = pytest.mark.server

MAX_MODEL_LEN = 512
INSTANCES = 2


@pytest.fixture(scope="module")
def server(tiny_checkpoint, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("triton-instances")
    repo = configured_repository(tmp, "--model", str(tiny_checkpoint), "--dtype", "float32", "--cpu-threads", "1",
                                 "--block-size", "16", "--num-kv-blocks", "512", "--max-model-len", str(MAX_MODEL_LEN),
                                 "--max-num-seqs", "32", "--instances", str(INSTANCES))
    with TritonServer(repo, tmp / "tritonserver.log") as s:
        yield s


def per_instance(server, name: str, **labels: str) -> Counter:
    """{instance: value} of a flint metric of flint_model."""
    values = Counter()
    for series, value in server.series(name):
        if series.get("model") == "flint_model" and all(series.get(k) == v for k, v in labels.items()):
            values[series["instance"]] += value
    return values


def wait_for(condition, timeout: float, what) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, what()
        time.sleep(0.25)


def test_each_instance_publishes_its_own_series(server):
    assert sorted(per_instance(server, "flint:kv_cache_usage_perc")) == [f"flint_model_0_{i}" for i in range(INSTANCES)]


def test_concurrent_streams_spread_over_both_instances_with_the_reference_text(server, reference_texts):
    before = per_instance(server, "flint:request_success_total", finished_reason="length")
    prompts, n = list(reference_texts), 24
    streams = Streams(server.grpc_url)
    try:
        for i in range(n):
            streams.send(f"r{i}", text_input=prompts[i % len(prompts)], max_tokens=N_TOKENS, temperature=0.0,
                         ignore_eos=True, stream=True)
        for i in range(n):
            text = "".join(r.as_numpy("text_output")[0, 0].decode() for r in streams.wait(f"r{i}"))
            assert text == reference_texts[prompts[i % len(prompts)]][1], f"request {i}"
    finally:
        streams.close()
    assert not streams.errors
    # published every 0.5 s: wait for all n to show, then check that both engines took some
    finished = lambda: per_instance(server, "flint:request_success_total", finished_reason="length") - before  # noqa: E731
    wait_for(lambda: sum(finished().values()) == n, 10, lambda: finished())
    assert len(finished()) == INSTANCES and min(finished().values()) >= 1, finished()
    tokens = per_instance(server, "flint:generation_tokens_total")
    assert len(tokens) == INSTANCES and min(tokens.values()) >= N_TOKENS, tokens


def test_stop_words_abort_the_request_in_whichever_instance_owns_it(server, reference_texts):
    # A stop string makes flint_postprocess send an abort control request to flint_model; Triton
    # hands it to either instance. Every request must end as an abort (none runs on to "length").
    prompt, (_, expected) = next(iter(reference_texts.items()))
    stop = expected[len(expected) // 2:len(expected) // 2 + 3]
    n = 8
    before = {r: sum(per_instance(server, "flint:request_success_total", finished_reason=r).values())
              for r in ("abort", "length")}
    streams = Streams(server.grpc_url)
    try:
        for i in range(n):
            streams.send(f"s{i}", text_input=prompt, max_tokens=MAX_MODEL_LEN - 32, temperature=0.0,
                         ignore_eos=True, stream=True, stop_words=[stop])
        for i in range(n):
            text = "".join(r.as_numpy("text_output")[0, 0].decode() for r in streams.wait(f"s{i}"))
            assert text == expected[:expected.index(stop)], f"request {i}"
    finally:
        streams.close()
    count = lambda reason: sum(per_instance(server, "flint:request_success_total",  # noqa: E731
                                            finished_reason=reason).values()) - before[reason]
    wait_for(lambda: count("abort") == n, 30, lambda: {r: count(r) for r in before})
    assert count("length") == 0
    wait_for(lambda: max(per_instance(server, "flint:kv_cache_usage_perc").values()) == 0, 10,
             lambda: per_instance(server, "flint:kv_cache_usage_perc"))


def test_multi_gpu_check_client_runs_against_two_instances(server, tmp_path):
    """tools/gpu/multi_gpu_check.py's load + report (its GPU run is tools/gpu/multi_gpu_check.sh), with a
    stand-in nvidia-smi. Triton hands each request to whichever instance waits, so 8 streams may all
    land on one (test_concurrent_streams_spread_over_both_instances... shows both serving under a burst of 24): this
    checks the client's per-instance accounting, not the spread."""
    fake = tmp_path / "bin" / "nvidia-smi"
    fake.parent.mkdir()
    fake.write_text("#!/bin/sh\necho '0, Stand-in GPU, 1000, 80000'\necho '1, Stand-in GPU, 900, 80000'\n")
    fake.chmod(0o755)
    env = dict(os.environ, PATH=f"{fake.parent}{os.pathsep}{os.environ['PATH']}")
    script = Path(__file__).resolve().parents[2] / "tools" / "gpu" / "multi_gpu_check.py"
    run = subprocess.run([sys.executable, str(script), "load", "--url", server.http_url, "--metrics-url",
                          f"127.0.0.1:{server.metrics_port}", "--streams", "8", "--tokens", "6", "--label", "two",
                          "--out", str(tmp_path / "two.json")], env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-3000:]
    result = json.loads((tmp_path / "two.json").read_text())
    assert result["output_tokens"] == 8 * 6 and 1 <= len(result["instance_tokens"]) <= INSTANCES
    assert set(result["instance_tokens"]) <= {f"flint_model_0_{i}" for i in range(INSTANCES)}
    assert all(n == 1 for n in result["texts_per_prompt"].values())  # greedy: one text per prompt
    run = subprocess.run([sys.executable, str(script), "report", str(tmp_path / "two.json"), "--out",
                          str(tmp_path / "report.json")], env=env, capture_output=True, text=True, timeout=60)
    assert run.returncode == 0 and "| two |" in run.stdout, run.stdout + run.stderr
