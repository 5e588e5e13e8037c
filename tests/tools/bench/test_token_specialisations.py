"""tools/bench/token_specialisations.py on flint-tiny (a subprocess: the tool needs the launchers'
GPU tiles, which the interpreter's process of the test suite does not choose)."""

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def test_the_cover_meets_each_gemm_tile_boundary(tmp_path):
    out = tmp_path / "specialisations.json"
    run = subprocess.run([sys.executable, str(ROOT / "tools/bench/token_specialisations.py"), "--preset", "flint-tiny",
                          "--layers", "2", "--tokens", "2-80", "--out", str(out)],
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-2000:]
    result = json.loads(out.read_text())
    # nvfp4_linear: the GEMV up to GEMV_MAX_TOKENS (4) tokens, then _gemm_tiles' 16-row tiles up
    # to 16, 64-row ones up to 64, 128 x 128 above (T not specialised); prefill attention's query
    # tile from 2, 5, 9 and 17 tokens
    assert result["cover"] == [2, 5, 9, 17, 65]
    assert result["specialisations"] == sum(result["per_kernel"].values())
    assert f"needs {len(result['cover'])} steps" in run.stdout
