"""No request outlives its client or an error (issue 44): a real tritonserver whose engine has
max_request_seconds, and whose flint_postprocess fails on demand (a test-only fault appended to
the repository copy's model.py: validation catches every real trigger this test could send).

These tests read time where time is the point: a request that Triton cannot cancel still runs
seconds after its client left, and ends at its deadline, not much later."""

import http.client
import json
import threading
import time

import pytest

from flint_backend.serving.launch import PROJECT_ROOT
from triton_server import TritonServer, configured_repository

pytest.importorskip("tritonclient.grpc")
pytestmark = pytest.mark.server

MAX_MODEL_LEN = 4096
DEADLINE_S = 10.0  # max_request_seconds
LONG_TOKENS = 4000  # ~40 s of the tiny model on one CPU thread: far past the deadline
FAULT_MARKER = "«inject a postprocess fault»"
FAULT = f'''

# --- test-only (tests/serving/test_server_request_bounds.py): requests with the stop string
# {FAULT_MARKER!r} fail in this step on their second chunk, while the engine still runs them.
from flint_backend.serving.postprocess import RequestText as _RequestText  # noqa: E402

_apply = _RequestText.apply


def _apply_or_fail(self, chunk):
    if {FAULT_MARKER!r} in self.config.stop and chunk.index >= 1:
        raise RuntimeError("injected fault")
    return _apply(self, chunk)


_RequestText.apply = _apply_or_fail
'''


@pytest.fixture(scope="module")
def server(tiny_checkpoint, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("triton_bounds")
    repo = configured_repository(tmp, "--model", str(tiny_checkpoint), "--device", "cpu", "--dtype", "float32",
                                 "--cpu-threads", "1", "--block-size", "16", "--num-kv-blocks", "1024",
                                 "--max-model-len", str(MAX_MODEL_LEN), "--max-num-seqs", "8",
                                 "--max-request-seconds", str(DEADLINE_S))
    model = repo / "flint_postprocess" / "1" / "model.py"
    model.write_text((PROJECT_ROOT / "model_repository" / "flint_postprocess" / "1" / "model.py").read_text() + FAULT)
    with TritonServer(repo, tmp / "tritonserver.log") as s:
        yield s


def long_request(**extra) -> dict:
    return {"text_input": "Tell me everything", "max_tokens": LONG_TOKENS, "ignore_eos": True, "temperature": 0.0,
            **extra}


def wait_until(condition, timeout: float, what: str) -> float:
    """Polls condition() every 0.1 s -> the time it became true (time.monotonic())."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.1)
    return time.monotonic()


def aborted(server) -> float:
    return server.metric("flint:request_success_total", finished_reason="abort")


def idle_after_aborts(server, count: float) -> bool:
    """`count` requests aborted in all, none running, no KV in use (the metrics of one publication)."""
    return (aborted(server) >= count and server.metric("flint:num_requests_running") == 0
            and server.metric("flint:kv_cache_usage_perc") == 0)


def test_a_postprocess_error_aborts_the_engine_request(server):
    """Issue 44: the client got the error at once while the engine generated to max_tokens."""
    aborts = aborted(server)
    start = time.monotonic()
    status, body = server.generate(long_request(stop_words=[FAULT_MARKER]))
    assert status != 200 and body["error"] == "in ensemble 'flint', postprocess: RuntimeError: injected fault", body
    idle = wait_until(lambda: idle_after_aborts(server, aborts + 1), DEADLINE_S, "the failed request still runs")
    assert idle - start < DEADLINE_S / 2  # the abort, not the deadline
    assert aborted(server) == aborts + 1
    status, body = server.generate({"text_input": "Hello world", "max_tokens": 2})
    assert status == 200 and body["num_output_tokens"] == 2


def test_a_non_streamed_generate_whose_client_left_runs_until_the_deadline(server):
    """Triton's HTTP `generate` does not tell the model that its client closed the connection: the
    engine goes on for nobody, until max_request_seconds aborts it. A client that stays gets what
    was generated, with finish_reason "abort"."""
    aborts = aborted(server)
    stayed: dict = {}
    start = time.monotonic()
    stayer = threading.Thread(target=lambda: stayed.update(zip(("status", "body"), server.generate(long_request()))))
    stayer.start()
    connection = http.client.HTTPConnection("127.0.0.1", server.http_port, timeout=60)
    try:
        connection.request("POST", "/v2/models/flint/generate", json.dumps(long_request(seed=1, temperature=1.0)))
        wait_until(lambda: server.metric("flint:num_requests_running") == 2, DEADLINE_S / 2, "requests not running")
    finally:
        connection.close()  # unread: the client leaves
    left = time.monotonic()
    tokens = server.metric("flint:generation_tokens_total")
    time.sleep(2.0)  # a cancellation would have landed by now (the metrics are published every 0.5 s)
    assert time.monotonic() - start < DEADLINE_S - 1, "too slow to tell a cancellation from the deadline"
    assert server.metric("flint:num_requests_running") == 2, "Triton cancelled the request after all: fix the docs"
    assert server.metric("flint:generation_tokens_total") > tokens  # generating for nobody

    idle = wait_until(lambda: idle_after_aborts(server, aborts + 2), DEADLINE_S + 15, "the deadline did not end them")
    assert DEADLINE_S - 1 <= idle - start <= DEADLINE_S + 10 and idle - left > 2
    assert aborted(server) == aborts + 2
    stayer.join(30)
    assert stayed["status"] == 200, stayed
    body = stayed["body"]
    assert body["finish_reason"] == "abort" and 0 < body["num_output_tokens"] < LONG_TOKENS and body["text_output"]


def test_a_non_integer_max_tokens_is_a_500_from_tritons_own_parser(server):
    """Documented in docs/serving.md: Triton's HTTP front end cannot read 1.5 as the INT32 max_tokens
    and answers 500, before any model runs, with a message that names no field; the server goes on."""
    status, body = server.generate({"text_input": "hi", "max_tokens": 1.5})
    assert status == 500 and body["error"] == ("Unable to parse 'data': attempt to access JSON non-signed-integer "
                                               "as signed-integer"), body
    status, body = server.generate({"text_input": "Hello world", "max_tokens": 2})
    assert status == 200 and body["num_output_tokens"] == 2
