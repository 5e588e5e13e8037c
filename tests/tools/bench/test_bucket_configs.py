"""tools/bench/bucket_configs.py: a decode batch of 3 rows launches every kernel of a layer (real
shapes, BF16 and NVFP4, 132 SMs) as its graph bucket of 4 does, so a replay gives the eager
step's bits; and the check sees a config sized by the batch itself (a subprocess each: the
script compiles for the GPU, not under this process's interpreter)."""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
# decode_attention's default splits from the batch itself, as before the buckets (22 at 3 rows, 17 at 4)
SPLITS_FROM_THE_BATCH = """
import sys, torch, triton
import tools.bench.bucket_configs as check
from flint_kernels import decode_attention as attention
from flint_kernels.split_k import num_sms
def from_the_batch(batch, hk, window, device):
    splits = triton.cdiv(attention.WAVES * num_sms(torch.device(device)), batch * hk)
    return max(1, min(attention.MAX_SPLITS, min(splits, triton.cdiv(window, attention.TILE_N)) if window else splits))
attention._default_num_splits = from_the_batch
sys.exit(check.main(["--rows", "3"]))
"""


def run(*args) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, env=env, cwd=ROOT, timeout=300)


def test_three_rows_launch_as_their_bucket_of_four():
    result = run(str(ROOT / "tools" / "bench" / "bucket_configs.py"), "--rows", "3")
    assert result.returncode == 0, result.stdout + result.stderr[-3000:]
    assert result.stdout.strip() == "every launch takes its bucket's config"


def test_splits_sized_by_the_batch_are_reported():
    result = run("-c", SPLITS_FROM_THE_BATCH)
    assert result.returncode == 1, result.stdout + result.stderr[-3000:]
    lines = result.stdout.strip().splitlines()
    assert lines == [f"{fmt} attention full: {kernel} at 3 rows vs 4: {{'num_splits': (22, 17)}} grid {grid}"
                     for fmt in ("bf16", "nvfp4")
                     for kernel, grid in (("_decode_split_kernel", "(4, 22) vs (4, 17)"),
                                          ("_decode_reduce_kernel", "(32,) vs (32,)"))]
