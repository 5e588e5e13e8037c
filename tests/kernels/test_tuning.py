"""flint_kernels/tuning.py: every switch declared once, set by its FLINT_<NAME> variable at import,
recorded whole by snapshot(); no other module of the packages reads the environment for them."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from flint_kernels import tuning

ROOT = Path(__file__).resolve().parents[2]


def imported_switches(env: dict) -> dict:
    """tuning.snapshot() of a fresh interpreter whose environment adds `env` (no other FLINT_*)."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("FLINT_")}
    out = subprocess.run([sys.executable, "-c", "import json; from flint_kernels import tuning; "
                          "print(json.dumps(tuning.snapshot()))"],
                         env={**base, **env}, capture_output=True, text=True, check=True).stdout
    return json.loads(out)


def test_the_environment_sets_its_switches():
    default = imported_switches({})
    assert default == json.loads(json.dumps(tuning.snapshot()))  # the test process holds the defaults
    changed = imported_switches({"FLINT_FP4_GEMV_WORDS": "0", "FLINT_HEAD_FOLD_NORM": "0", "FLINT_PDL": "0",
                                 "FLINT_FP4_DEQUANT_MIN_TOKENS": "0"})
    assert {k for k in default if default[k] != changed[k]} == {"FP4_GEMV_WORDS", "HEAD_FOLD_NORM", "PDL",
                                                                "FP4_DEQUANT_MIN_TOKENS"}
    assert changed["FP4_DEQUANT_MIN_TOKENS"] is None  # 0: the GEMM tiles decode the weight themselves
    assert imported_switches({"FLINT_FP4_DEQUANT_MIN_TOKENS": "512"})["FP4_DEQUANT_MIN_TOKENS"] == 512


@pytest.mark.parametrize("name,value,message", [
    ("FLINT_FP4_PTX", "yes", "FLINT_FP4_PTX: got 'yes', expected '0' or '1'"),
    ("FLINT_FP4_DEQUANT_MIN_TOKENS", "-1", "FLINT_FP4_DEQUANT_MIN_TOKENS: got '-1', expected a token count")])
def test_a_bad_value_names_the_variable(name, value, message):
    with pytest.raises(subprocess.CalledProcessError) as failed:
        subprocess.run([sys.executable, "-c", "import flint_kernels.tuning"], env={**os.environ, name: value},
                       capture_output=True, text=True, check=True)
    assert message in failed.value.stderr


def test_snapshot_is_every_switch():
    names = [line.split("=")[0].split(":")[0].strip() for line in (ROOT / "flint_kernels" / "tuning.py").read_text()
             .splitlines() if re.match(r"[A-Z][A-Z0-9_]*(, [A-Z][A-Z0-9_]*)*( *:| *=)", line)]
    declared = {n.strip() for line in names for n in line.split(",")}
    assert set(tuning.snapshot()) == declared
    json.dumps(tuning.snapshot())  # what bench.py writes into its JSON's meta


def test_only_the_tuning_module_reads_the_environment():
    """FLINT_* variables and TRITON_INTERPRET are read in flint_kernels/tuning.py alone (the OpenAI
    server's FLINT_API_KEY, a server setting, apart)."""
    readers = []
    for path in sorted([*(ROOT / "flint_kernels").rglob("*.py"), *(ROOT / "flint_backend").rglob("*.py")]):
        text = path.read_text()
        if path.name != "tuning.py" and re.search(r"environ|getenv", text) and (
                "TRITON_INTERPRET" in text or re.search(r"FLINT_(?!API_KEY)[A-Z_]+", text)):
            readers.append(str(path.relative_to(ROOT)))
    assert readers == []


def test_the_engine_guide_names_every_variable():
    """docs/engine.md lists the FLINT_<NAME> variables that tuning.py reads, no more, no fewer."""
    read = set(re.findall(r'_(?:flag|tokens)\("([A-Z0-9_]+)"', (ROOT / "flint_kernels" / "tuning.py").read_text()))
    guide = (ROOT / "docs" / "engine.md").read_text()
    listed = guide[guide.index("**Tuning switches**"):guide.index("## Numerics")]
    assert read and set(re.findall(r"`FLINT_([A-Z0-9_]+)`", listed)) == read
