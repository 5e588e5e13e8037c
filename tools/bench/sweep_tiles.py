#!/usr/bin/env python3
"""Launch shapes of the batched-decode launches, timed against each other: the grouped MoE
(tuning.MOE_GROUPED_TILES) with random routing over flint-40b's 256 experts, and the W4A16
GEMM's decoding tiles (tuning.FP4_GEMM_TILES) on the attention projections, NVFP4, at the
token counts of decode batches. Weights rotate over sets that read twice the L2 between two uses
(bench_kernels.Rotation), as in a step; and the router (fp32 weight) by its tile. Each row is
checked against the torch twin.

    python tools/bench/sweep_tiles.py [--tokens 64,256] [--out FILE]

Prints a table per launch (the default shape first) and writes JSON (by default
benchmarks/<gpu>/<date>-<commit>-sweep-tiles.json).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root, run as a file

from flint_kernels import tuning  # noqa: E402
from flint_kernels.moe import fused_moe, fused_moe_torch  # noqa: E402
from flint_kernels.nvfp4_linear import nvfp4_linear, nvfp4_linear_torch  # noqa: E402
from flint_kernels.router import router_topk, router_topk_torch  # noqa: E402
from tools.bench.bench_kernels import FULL, Rotation, _cold_sets, _experts, _routing, random_nvfp4  # noqa: E402
from tools.bench.knobs import with_knob  # noqa: E402
from tools.bench.timing import copy_bandwidth, graph_us, nbytes, result_path, run_meta  # noqa: E402

# (BLOCK_M, BLOCK_N gate/up, BLOCK_N down, BLOCK_K, warps, stages)
MOE_TILES = [None, (16, 64, 64, 128, 4, 3), (16, 128, 128, 128, 4, 3), (16, 64, 128, 128, 4, 4),
             (16, 32, 64, 128, 4, 4), (16, 64, 64, 256, 4, 3), (16, 64, 64, 128, 8, 4), (32, 64, 128, 128, 4, 4)]
# (BLOCK_M, BLOCK_N, warps, stages, splits: 0 the launcher's)
GEMM_TILES = [None, (16, 64, 4, 4, 0), (16, 32, 4, 4, 0), (32, 64, 4, 4, 0), (64, 32, 4, 4, 0), (64, 64, 4, 4, 1),
              (64, 128, 4, 3, 0), (16, 64, 4, 4, 1)]


ROUTER_TILES = [None, (16, 32), (16, 64), (1, 2), (1, 8)]


def time_rows(label: str, knob: str | None, shapes: list, run, reference, bytes_: float, bandwidth: float) -> list[dict]:
    """knob None: run and reference take the shape."""
    rows = []
    for shape in shapes:
        call = (lambda: run(shape)) if knob is None else (lambda: with_knob(tuning, knob, shape, run))
        out = call()
        torch.cuda.synchronize()
        ref = reference(shape) if knob is None else reference()
        err = ((out.float() - ref.float()).abs().max() / ref.float().abs().max()).item()
        us = graph_us(call)
        rows.append({"launch": label, "shape": shape or "default", "us": round(us, 2), "rel_err": err,
                     "pct_copy": round(100 * bytes_ / (us * 1e-6) / bandwidth, 1)})
        print(f"| {label} | {shape or 'default'} | {us:.1f} | {rows[-1]['pct_copy']} | {err:.1e} |", flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", default="64,256")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    device = torch.device("cuda")
    bandwidth = copy_bandwidth()
    shape = FULL
    h, e, k = shape["hidden"], shape["experts"], shape["top_k"]
    print("| launch | shape | us | % copy | rel err |\n| --- | --- | ---: | ---: | ---: |")
    results = {"meta": run_meta(__file__, bandwidth / 1e12), "rows": []}
    w13, w2, s13, s2 = _experts(shape, device, "nvfp4")
    per_expert = nbytes(w13, w2) / e
    for t in [int(n) for n in args.tokens.split(",")]:
        x = torch.randn(t, h, device=device, dtype=torch.bfloat16)
        sets = [(x, *_routing(t, shape, device), w13, w2, s13, s2) for _ in range(2)]
        chosen = sum(len(torch.unique(s[1])) for s in sets) / len(sets)
        turns = Rotation(sets)
        results["rows"] += time_rows(
            f"moe T={t} ({chosen:g}+1 experts)", "MOE_GROUPED_TILES", MOE_TILES,
            lambda turns=turns: fused_moe(*turns.next(), path="grouped"),
            lambda s=sets: fused_moe_torch(*s[(turns.calls - 1) % len(s)]),
            chosen * per_expert + nbytes(s13, s2), bandwidth)
        for name, (n, kk) in {"qkv": (5120, h), "o_proj": (h, 4096)}.items():
            ws = [random_nvfp4(n, kk, device=device) for _ in range(_cold_sets(n * kk * 0.56, device, False))]
            xs = torch.randn(t, kk, device=device, dtype=torch.bfloat16)
            wturns = Rotation(ws)
            results["rows"] += time_rows(
                f"w4a16 {name} T={t}", "FP4_GEMM_TILES", GEMM_TILES,
                lambda wt=wturns, xs=xs: nvfp4_linear(xs, wt.next()),
                lambda wt=wturns, xs=xs, ws=ws: nvfp4_linear_torch(xs, ws[(wt.calls - 1) % len(ws)]),
                nbytes(ws[0]), bandwidth)
        router_w = torch.randn(e, h, device=device) / h ** 0.5  # fp32, as flint-40b's
        xr = torch.randn(t, h, device=device, dtype=torch.bfloat16)
        results["rows"] += time_rows(
            f"router T={t} (fp32 weight)", None, ROUTER_TILES,
            lambda tile: router_topk(xr, router_w, k, True, tile=tile)[1],
            lambda tile: router_topk_torch(xr, router_w, k, True)[1], nbytes(router_w), bandwidth)
    out = args.out or result_path("sweep-tiles")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
