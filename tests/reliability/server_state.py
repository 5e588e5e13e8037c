"""What the suite checks on a server after traffic: the engine idle (no request running or
waiting, no KV in use), the oracle's greedy text still served, the process tree's resident
memory, and whether an error message is a clean one."""

from __future__ import annotations

import re
import time

IDLE_TIMEOUT = 60.0  # s: cancelled requests abort within a step; a leaked one runs to its max_tokens
# What Triton's own HTTP front end answers with status 500, before any model runs, when a JSON
# value does not convert to the input's declared type (a non-integer max_tokens, a string
# temperature, a negative seed, an object as text_input), or the body is not a JSON object.
# tritonserver 2.51's http_server.cc; not ours to change: README.md documents it.
TRITON_HTTP_PARSER_500 = re.compile(r"^(Unable to parse 'data'|Unable to parse JSON bytes array"
                                    r"|failed to parse the request JSON buffer|attempt to get members for non-object)")
# Python's words for a bug (an exception that was not a request error) and the Python
# backend's for a dead stub: never part of a clean error
UNCLEAN = re.compile(r"Traceback|object has no attribute|object is not (subscriptable|iterable|callable)"
                     r"|unhashable type|NoneType|unexpected keyword argument|positional argument"
                     r"|Stub process .* is not healthy|list index out of range")


def unclean(message: str) -> bool:
    return bool(UNCLEAN.search(message))


def engine_gauges(server) -> dict[str, float]:
    return {name: server.metric(f"flint:{name}")
            for name in ("num_requests_running", "num_requests_waiting", "kv_cache_usage_perc")}


def wait_idle(server, timeout: float = IDLE_TIMEOUT) -> float:
    """Seconds until the engine has nothing running or waiting and no KV in use; fails after timeout."""
    start = time.monotonic()
    while any(engine_gauges(server).values()):
        assert time.monotonic() - start < timeout, f"engine not idle after {timeout:.0f} s: {engine_gauges(server)}"
        time.sleep(0.25)
    return time.monotonic() - start


def check_serves_reference(server, reference_texts: dict) -> None:
    """Every reference prompt, greedy through HTTP generate, gives the oracle's text."""
    from reference_texts import N_TOKENS

    for prompt, (_, expected) in reference_texts.items():
        status, body = server.generate({"text_input": prompt, "max_tokens": N_TOKENS, "temperature": 0.0,
                                        "ignore_eos": True})
        assert status == 200 and body["text_output"] == expected, (prompt, status, body)


def check_openai_serves_reference(openai_url: str, api_key: str, reference_texts: dict) -> None:
    import httpx

    from reference_texts import N_TOKENS

    prompt, (_, expected) = next(iter(reference_texts.items()))
    response = httpx.post(f"{openai_url}/v1/completions", headers={"Authorization": f"Bearer {api_key}"}, timeout=60,
                          json={"prompt": prompt, "max_tokens": N_TOKENS, "temperature": 0, "ignore_eos": True})
    assert response.status_code == 200 and response.json()["choices"][0]["text"] == expected, response.text


def model_ready(server, model: str) -> int:
    """HTTP status of Triton's readiness of one model (200 ready, 400 not)."""
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(f"http://{server.http_url}/v2/models/{model}/ready", timeout=5) as r:
            return r.status
    except urllib.error.HTTPError as error:
        return error.code
    except OSError:  # the server is gone
        return 0


def summary(outcomes) -> dict:
    counts: dict[str, int] = {}
    for outcome in outcomes:
        counts[outcome.status] = counts.get(outcome.status, 0) + 1
    return counts
