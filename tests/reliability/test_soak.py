"""Soak: rounds of concurrent mixed requests through every door (Triton gRPC streaming, HTTP
generate / generate_stream, the OpenAI server's chat and completions), some cancelled by their
clients; then every request has a final response or a clean error, the engine is idle, the
server tree's resident memory has not grown past RSS_GROWTH_BOUND from the first round's end to
the last's, and the server still serves the oracle's greedy text.

Short form (CI): 2 rounds of 48; long form (--reliability-long): 2 rounds of 256.
"""

import asyncio
import random
import re
import time

import httpx
import pytest

from processes import resident_bytes
from server_state import (check_openai_serves_reference, check_serves_reference, summary, unclean,
                          wait_idle)
from servers import KEY
from soak_mix import Mix, pair_problems
from traffic import CANCELLED, LOST, Doors

pytest.importorskip("tritonclient.grpc.aio")
pytestmark = pytest.mark.server

# Resident memory of tritonserver + its three stubs (~1.1 GB on flint-tiny) may grow this much
# from the end of the first round to the end of the last: allocator pools and caches settle in
# the first round; a leak of a few KB a request over 256 requests would still show at the long form.
RSS_GROWTH_BOUND = 64 << 20
ROUND_TIMEOUT = 600  # s: every request has its own 180 s bound; this one bounds the gather


def run_round(triton, openai_server, planned) -> list:
    async def main():
        doors = Doors(triton, openai_server.url, KEY)
        try:
            return await asyncio.wait_for(asyncio.gather(*(doors.send(p.request) for p in planned)), ROUND_TIMEOUT)
        finally:
            await doors.close()

    return asyncio.run(main())


def openai_running(openai_server) -> float:
    text = httpx.get(f"{openai_server.url}/metrics", timeout=10).text
    match = re.search(r"^flint_openai:requests_running(\{[^}]*\})? (\S+)$", text, re.M)
    assert match, "flint_openai:requests_running not on the OpenAI server's /metrics"
    return float(match.group(2))


def test_soak_mixed_concurrent_requests_leave_nothing_behind(triton, openai_server, tokenizer, reference_texts,
                                                             form):
    failures, figures = [], {"form": form.name, "rounds": []}
    rss = [resident_bytes(triton.process.pid)]
    for round_index in range(form.soak_rounds):
        planned = Mix(random.Random(4400 + round_index), tokenizer, reference_texts,
                      pairs_from=100_000 * round_index).draw(form.soak_requests)
        start = time.monotonic()
        outcomes = run_round(triton, openai_server, planned)
        seconds = time.monotonic() - start
        for i, (p, outcome) in enumerate(zip(planned, outcomes)):
            problem = p.problem(outcome)
            if problem is None and outcome.error and unclean(outcome.error):
                problem = "an unclean error"
            if problem is not None:
                failures.append(f"round {round_index} request {i} {p.kind} via {p.request.door}"
                                f"{' (streamed)' if p.request.stream else ''}: {problem}; "
                                f"{outcome.status} {outcome.http_status} {outcome.error[:300]!r}")
        failures += [f"round {round_index} {problem}" for problem in pair_problems(planned, outcomes)]
        try:
            idle_after = wait_idle(triton)
        except AssertionError as error:
            failures.append(f"round {round_index}: {error}")
            idle_after = None
        deadline = time.monotonic() + 30
        while openai_running(openai_server) and time.monotonic() < deadline:
            time.sleep(0.25)
        if openai_running(openai_server):
            failures.append(f"round {round_index}: the OpenAI server still counts requests running")
        rss.append(resident_bytes(triton.process.pid))
        figures["rounds"].append({"requests": len(planned), "seconds": round(seconds, 1), "outcomes": summary(outcomes),
                                  "cancelled": sum(o.status == CANCELLED for o in outcomes),
                                  "lost": sum(o.status == LOST for o in outcomes),
                                  "idle_after_s": idle_after and round(idle_after, 1),
                                  "rss_mib": round(rss[-1] / 2**20, 1)})
    figures["rss_before_mib"] = round(rss[0] / 2**20, 1)
    print("soak figures:", figures)
    check_serves_reference(triton, reference_texts)
    check_openai_serves_reference(openai_server.url, KEY, reference_texts)
    wait_idle(triton)
    assert not failures, "\n".join(failures[:40]) + f"\n({len(failures)} problems) {figures}"
    growth = rss[-1] - rss[1]
    assert growth <= RSS_GROWTH_BOUND, f"resident memory grew {growth / 2**20:.1f} MiB after round 1: {figures}"
