"""The README's examples against a real tritonserver: the gRPC client, run as it is written
(only the address, prompt and max_tokens replaced), prints the oracle's greedy text, all of it,
and the finish reason; scripts/loadtest.sh runs from a shell without the venv activated."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from flint_backend.serving.launch import PROJECT_ROOT
from reference_texts import N_TOKENS
from triton_server import TritonServer, configured_repository

pytest.importorskip("tritonclient.grpc")
pytestmark = pytest.mark.server


def grpc_example(document: Path) -> str:
    blocks = [b for b in re.findall(r"```python\n(.*?)```", document.read_text(), re.S) if "tritonclient.grpc" in b]
    assert len(blocks) == 1, f"{document}: expected one gRPC example, found {len(blocks)}"
    return blocks[0]


def substituted(code: str, replacements: dict[str, str]) -> str:
    for old, new in replacements.items():
        assert code.count(old) == 1, f"the example no longer has {old!r} once"
        code = code.replace(old, new)
    return code


@pytest.fixture(scope="module")
def server(tiny_checkpoint, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("readme")
    repo = configured_repository(tmp, "--model", str(tiny_checkpoint), "--device", "cpu", "--dtype", "float32",
                                 "--cpu-threads", "1", "--max-model-len", "512")
    with TritonServer(repo, tmp / "tritonserver.log") as s:
        yield s


def test_docs_show_the_readme_grpc_example():
    assert grpc_example(PROJECT_ROOT / "docs" / "serving.md") == grpc_example(PROJECT_ROOT / "README.md")


def test_readme_grpc_example_prints_the_whole_greedy_text_and_the_finish_reason(server, tiny_checkpoint,
                                                                               reference_texts):
    eos = json.loads((Path(tiny_checkpoint) / "config.json").read_text())["eos_token_id"]
    eos = set(eos if isinstance(eos, list) else [eos])
    prompt, (_, expected) = next((p, r) for p, r in reference_texts.items() if not eos & set(r[0]))
    code = substituted(grpc_example(PROJECT_ROOT / "README.md"), {
        '"localhost:8001"': repr(server.grpc_url), 'b"Hello"': repr(prompt.encode()),
        'tensor("max_tokens", 32,': f'tensor("max_tokens", {N_TOKENS},'})
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert run.stdout == expected + "\nfinish_reason: length\n"


def test_readme_loadtest_runs_from_a_shell_without_the_venv(server, tmp_path):
    """No venv activated, no PYTHON, no LD_LIBRARY_PATH, another working folder: the script finds
    the checkout's .venv, its perf_analyzer and the libcudart that perf_analyzer needs."""
    if not (PROJECT_ROOT / ".venv" / "bin" / "perf_analyzer").exists():
        pytest.skip("no perf_analyzer in the checkout's .venv (`make serve` installs it: the client extra)")
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": os.environ.get("HOME", "/tmp")}
    run = subprocess.run([str(PROJECT_ROOT / "scripts" / "loadtest.sh"), "--url", server.grpc_url,
                          "--concurrency", "1", "--max-tokens", "4", "--requests", "4", "--out", str(tmp_path / "out"),
                          "--no-genai-perf"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=180)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert (tmp_path / "out" / "perf_analyzer_c1.csv").read_text().count("\n") >= 2
