"""tools/bench/token_specialisations.py on flint-tiny's first 3 layers (a dense MLP, a MoE, full
and sliding attention), in a subprocess: the tool needs the launchers' GPU tiles, which the
interpreter's process of the test suite does not choose."""

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def test_the_engine_warm_up_meets_every_specialisation_of_steps_up_to_its_cap(tmp_path):
    out = tmp_path / "specialisations.json"
    run = subprocess.run([sys.executable, str(ROOT / "tools/bench/token_specialisations.py"), "--preset", "flint-tiny",
                          "--layers", "3", "--tokens", "2-80", "--out", str(out)],
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-2000:]
    result = json.loads(out.read_text())
    # where the launchers change what they launch: the small MoE's tiles at 6, 9 and 11 tokens,
    # the grouped MoE's from 17 (blocks from the ids), 28 (sorted) and 55; nvfp4_linear's GEMM
    # from 5, 17 and 65; prefill attention's query tile at 3, 5, 9 and 17; the router's weight
    # parts (one specialisation) with its prefill tiles
    assert result["cover"] == [2, 6, 9, 11, 17, 28, 65]
    assert result["specialisations"] == sum(result["per_kernel"].values()) == 46
    assert result["per_kernel"]["_weight_parts_kernel"] == 1
    assert result["warmup_steps"] == [2, 3, 4, 5, 7, 8, 9, 15, 16, 17, 31, 32, 33, 63, 64, 65, 80]
    assert result["warmup_missed"] == []
    assert "warm-up steps (17: 2 3 4 5 7 8 9 15 16 17 31 32 33 63 64 65 80) miss 0" in run.stdout
