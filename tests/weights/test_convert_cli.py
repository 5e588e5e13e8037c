"""scripts/convert_to_gguf.py: converts, refuses to overwrite without --force."""

import subprocess
import sys
from pathlib import Path

from flint_backend.weights.loader import load_checkpoint
from flint_backend.weights.nvfp4 import NVFP4Weight

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=120)


def test_convert_to_gguf_cli(bf16_dir, tmp_path):
    out = tmp_path / "tiny.gguf"
    done = run(str(SCRIPTS / "convert_to_gguf.py"), str(bf16_dir), str(out), "--outtype", "nvfp4")
    assert done.returncode == 0, done.stderr
    assert isinstance(load_checkpoint(out, progress=False).tensors["model.layers.0.mlp.up_proj.weight"], NVFP4Weight)
    again = run(str(SCRIPTS / "convert_to_gguf.py"), str(bf16_dir), str(out), "--outtype", "bf16")
    assert again.returncode == 1 and "--force" in again.stderr
    forced = run(str(SCRIPTS / "convert_to_gguf.py"), str(bf16_dir), str(out), "--outtype", "bf16", "--force")
    assert forced.returncode == 0, forced.stderr
    assert not any(isinstance(v, NVFP4Weight) for v in load_checkpoint(out, progress=False).tensors.values())
