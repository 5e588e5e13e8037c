"""tools/bench/bench_load.py runs end to end at flint-tiny on the CPU (the lead runs flint-40b on a GPU)."""

import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[3] / "tools" / "bench" / "bench_load.py"


def test_bench_load_on_tiny(tmp_path):
    args = [sys.executable, str(SCRIPT), "--preset", "flint-tiny", "--out", str(tmp_path), "--device", "cpu"]
    done = subprocess.run(args, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    result = json.loads((tmp_path / "bench_load-flint-tiny.json").read_text())
    assert result["preset"] == "flint-tiny" and result["load_s"] > 0 and result["write_s"] > 0
    assert result["nvfp4_tensors"] == 65  # every attention, dense-MLP and expert linear of flint-tiny, and the LM head
    assert not list(tmp_path.glob("*.gguf"))  # deleted without --keep
