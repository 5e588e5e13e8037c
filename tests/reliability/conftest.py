"""The reliability suite: soak, fuzz and fault injection against real tritonservers (CPU, flint-tiny).

`pytest -q` (CI) runs its short form; the long form runs with the option registered here, which
pytest only knows when the path names this folder:

    pytest tests/reliability --reliability-long
"""

import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

# tests/serving's tritonserver launcher and reference texts, tests/openai's server launcher
HERE = Path(__file__).parent
sys.path[:0] = [str(HERE), str(HERE.parent / "serving"), str(HERE.parent / "openai")]


def pytest_addoption(parser):
    parser.addoption("--reliability-long", action="store_true", default=False,
                     help="run tests/reliability's long form (256 concurrent soak requests, two rounds, "
                          "more fuzz cases) instead of CI's short form")


def pytest_collection_modifyitems(config, items):
    for item in items:
        if Path(item.fspath).parent == HERE:
            item.add_marker(pytest.mark.reliability)


@dataclass(frozen=True)
class Form:
    name: str
    soak_requests: int       # per round, all sent at once: at most this many concurrent requests
    soak_rounds: int         # resident memory is compared between the ends of the first and last round
    fuzz_examples: int       # hypothesis examples per fuzz test
    kv_pressure_prompts: int  # distinct long prompts (each sent twice) against the small KV pool


SHORT = Form("short", soak_requests=48, soak_rounds=2, fuzz_examples=40, kv_pressure_prompts=10)
LONG = Form("long", soak_requests=256, soak_rounds=2, fuzz_examples=300, kv_pressure_prompts=24)


@pytest.fixture(scope="session")
def form(request) -> Form:
    return LONG if request.config.getoption("--reliability-long", default=False) else SHORT  # unknown from the root


@pytest.fixture(scope="session")
def triton(tiny_checkpoint, tmp_path_factory):
    from servers import start_triton

    with start_triton(tiny_checkpoint, tmp_path_factory.mktemp("reliability_triton")) as server:
        yield server


@pytest.fixture(scope="session")
def openai_server(triton, tmp_path_factory):
    from servers import start_openai

    with start_openai(triton, tmp_path_factory.mktemp("reliability_openai")) as server:
        yield server
