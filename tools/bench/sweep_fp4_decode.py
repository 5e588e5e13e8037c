#!/usr/bin/env python3
"""Launch configurations of the NVFP4 batch-1 decode kernels, swept on the GPU at full size with
L2-cold weights: the W4A16 GEMV (qkv 5120x2048, o_proj 2048x4096) and the small-batch MoE
(gate/up and down launches).

    python tools/bench/sweep_fp4_decode.py [--out FILE] [--only gemv|moe]

Each variant changes module knobs (nvfp4_linear.GEMV_*, moe_gemv.*, tuning.*) from their present
values (the defaults, which the base rows record), is checked against the plain-torch
dequantise-then-matmul reference (relative L2), then timed as a CUDA graph of 20 calls over 12
weight sets taken in turn (timing.graph_us over timing.cycled). MoE rows also give each launch's
own GPU time (torch.profiler, eager). Prints a markdown table and writes JSON (--out; by default
benchmarks/<gpu>/<date>-<commit>-sweep-fp4-decode.json); the defaults in the kernels come from
these rows (docs/performance.md).
"""

from __future__ import annotations

import argparse
import json
import sys
from contextlib import contextmanager
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root, run as a file

from flint_backend.weights.nvfp4 import concat_rows  # noqa: E402
from flint_backend.weights.nvfp4_quantize import quantize_nvfp4  # noqa: E402
from flint_kernels import moe, moe_gemv, nvfp4_linear, router, tuning  # noqa: E402
from tools.bench.timing import (command, copy_bandwidth, cycled, gpu_name, graph_us, nbytes,  # noqa: E402
                                result_path, utc_now)

H, HQ, HK, D, E, I, K = 2048, 32, 4, 128, 256, 512, 6
COPIES = 12
MODULES = {"tuning": tuning, "nvfp4_linear": nvfp4_linear, "moe_gemv": moe_gemv}


def present(*keys: str) -> dict:
    """{"module.NAME": its present value}: the defaults (tuning.py's, or the environment's FLINT_*)."""
    return {key: getattr(MODULES[key.split(".")[0]], key.split(".")[1]) for key in keys}


# GEMV variants: changes to GEMV_BASE (the batch-1 launch knobs of nvfp4_linear and tuning as they
# are; "splits": K splits, None = the launcher's choice: for qkv and o_proj, whose K is at most
# GEMV_PREFETCH_STEPS word steps, one split of FP4_GEMV_UNSPLIT_ROWS rows)
GEMV_BASE = {**present("tuning.FP4_GEMV_WORDS", "tuning.FP4_PTX", "tuning.FP4_GEMV_F16", "tuning.FP4_GEMV_UNSPLIT_ROWS",
                       "tuning.GEMV_PREFETCH_STEPS", "nvfp4_linear.GEMV_BLOCK_N", "nvfp4_linear.GEMV_WORDS_BLOCK_K",
                       "nvfp4_linear.GEMV_STAGES", "nvfp4_linear.GEMV_WARPS"), "splits": None}
GEMV = [
    {},
    {"tuning.FP4_PTX": False},
    {"tuning.FP4_GEMV_F16": False},
    {"tuning.FP4_GEMV_UNSPLIT_ROWS": None},  # the launcher's K splits of GEMV_BLOCK_N rows
    {"tuning.FP4_GEMV_UNSPLIT_ROWS": 8},
    {"nvfp4_linear.GEMV_WORDS_BLOCK_K": 2048},
    {"nvfp4_linear.GEMV_WORDS_BLOCK_K": 512},
    {"nvfp4_linear.GEMV_WARPS": 2},
    {"nvfp4_linear.GEMV_WARPS": 2, "nvfp4_linear.GEMV_WORDS_BLOCK_K": 2048},
    {"nvfp4_linear.GEMV_STAGES": 2},
    {"splits": 2},
    {"tuning.FP4_GEMV_WORDS": False},
]
MOE_BASE = present("tuning.FP4_MOE_WORDS", "tuning.FP4_MOE_DOWN_WORDS", "tuning.FP4_PTX", "tuning.MOE_GATE_UP_ROWS",
                   "tuning.MOE_DOWN_ROWS", "moe_gemv.TILE", "moe_gemv.MAX_BLOCK_K", "moe_gemv.NUM_STAGES",
                   "moe_gemv.WARPS", "moe_gemv.WORDS_TILE", "moe_gemv.DOWN_WORDS_ROWS", "moe_gemv.DOWN_WORDS_WARPS")
MOE = [
    {},  # the defaults: gate/up words (8 rows, 1024-weight steps), down words (8 rows, all experts at once)
    {"tuning.FP4_MOE_WORDS": False},
    {"tuning.FP4_PTX": False},
    {"tuning.FP4_MOE_DOWN_WORDS": False},
    {"tuning.MOE_GATE_UP_ROWS": 4},
    {"tuning.MOE_GATE_UP_ROWS": 16},
    {"moe_gemv.DOWN_WORDS_ROWS": 16},
    {"moe_gemv.DOWN_WORDS_ROWS": 4, "moe_gemv.DOWN_WORDS_WARPS": 4},
    {"moe_gemv.WORDS_TILE": 1 << 15},
]


@contextmanager
def knobs(settings: dict):
    saved = {}
    try:
        for key, value in settings.items():
            module, name = key.split(".")
            saved[key] = getattr(MODULES[module], name)
            setattr(MODULES[module], name, value)
        yield
    finally:
        for key, value in saved.items():
            module, name = key.split(".")
            setattr(MODULES[module], name, value)


def rel_l2(got: torch.Tensor, want: torch.Tensor) -> float:
    return ((got.float() - want.float()).norm() / want.float().norm()).item()


def launch_us(fn, calls: int = COPIES) -> dict[str, float]:
    """GPU time per call of each kernel fn launches (eager, torch.profiler), by kernel name."""
    fn()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    times: dict[str, float] = {}
    for event in prof.key_averages():
        if event.device_type == torch.autograd.DeviceType.CUDA and event.count >= calls:
            times[event.key[:40]] = round(event.device_time_total / calls, 2)
    return times


def gemv_rows(bandwidth: float):
    dev, bf16 = "cuda", torch.bfloat16
    r = lambda *s, scale=1.0: (torch.randn(*s, device=dev) * scale).to(bf16)
    shapes = {"qkv": ((HQ + 2 * HK) * D, H), "o_proj": (H, HQ * D)}
    for op, (n, k) in shapes.items():
        if op == "qkv":
            sets = [concat_rows([quantize_nvfp4(p) for p in r(n, k, scale=k ** -0.5).split([HQ * D, HK * D, HK * D])])
                    for _ in range(COPIES)]
        else:
            sets = [quantize_nvfp4(r(n, k, scale=k ** -0.5)) for _ in range(COPIES)]
        x = r(1, k)
        want = nvfp4_linear.nvfp4_linear_torch(x, sets[0])
        for change in GEMV:
            settings = {**GEMV_BASE, **change}
            splits = settings.pop("splits")
            name = f"{op} " + (" ".join(f"{k.split('.')[-1]}={v}" for k, v in change.items()) or "default")
            yield name, settings, lambda: rel_l2(nvfp4_linear.nvfp4_linear(x, sets[0], splits), want), \
                cycled([lambda w=w: nvfp4_linear.nvfp4_linear(x, w, splits) for w in sets]), nbytes(sets[0]), None


def moe_rows(bandwidth: float):
    dev, bf16 = "cuda", torch.bfloat16
    r = lambda *s, scale=1.0: (torch.randn(*s, device=dev) * scale).to(bf16)
    w13 = quantize_nvfp4(r(E, 2 * I, H, scale=H ** -0.5))
    w2 = quantize_nvfp4(r(E, H, I, scale=I ** -0.5))
    s13, s2 = quantize_nvfp4(r(2 * I, H, scale=H ** -0.5)), quantize_nvfp4(r(H, I, scale=I ** -0.5))
    router_w = r(E, H, scale=H ** -0.5)
    x = r(1, H)
    choices = [router.router_topk(r(1, H), router_w, K, True) for _ in range(COPIES)]
    ids, wts = choices[0]
    want = moe.fused_moe_torch(x, ids, wts, w13, w2, s13, s2)
    moved = int(K / E * nbytes(w13, w2)) + nbytes(s13, s2)
    calls = [lambda c=c: moe.fused_moe(x, c[0], c[1], w13, w2, s13, s2) for c in choices]
    for change in MOE:
        settings = {**MOE_BASE, **change}
        name = "moe " + (" ".join(f"{k.split('.')[1]}={v}" for k, v in change.items()) or "default")
        yield name, settings, lambda: rel_l2(moe.fused_moe(x, ids, wts, w13, w2, s13, s2), want), \
            cycled(calls), moved, cycled(calls)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, help="default: benchmarks/<gpu>/<date>-<commit>-sweep-fp4-decode.json")
    parser.add_argument("--only", choices=["gemv", "moe"])
    args = parser.parse_args()
    args.out = args.out or result_path("sweep-fp4-decode")
    bandwidth = copy_bandwidth()
    groups = [g for g in (("gemv", gemv_rows), ("moe", moe_rows)) if args.only in (None, g[0])]
    rows = []
    for _, make in groups:
        for name, settings, check, fn, moved, profiled in make(bandwidth):
            row = {"variant": name, "knobs": {k: v for k, v in settings.items()}}
            try:
                with knobs(settings):
                    row["rel_l2"] = round(check(), 5)
                    row["us"] = round(graph_us(fn), 2)
                    if profiled is not None:
                        row["launch_us"] = launch_us(profiled)
            except Exception as e:  # report and go on: one variant that fails to compile must not hide the rest
                row["error"] = f"{type(e).__name__}: {str(e)[:160]}"
            if "us" in row:
                row["pct_copy"] = round(100 * moved / (row["us"] * 1e-6) / bandwidth, 1)
            rows.append(row)
            print(json.dumps(row), flush=True)
    meta = {"gpu": gpu_name(), "date": utc_now(),
            "command": command(__file__, ["--only", args.only] if args.only else []),
            "copy_tb_s": round(bandwidth / 1e12, 3), "weight_sets": COPIES}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"meta": meta, "rows": rows}, indent=2) + "\n")
    print(f"\n{meta['command']} -- {meta['gpu']}, {meta['date']}, copy {meta['copy_tb_s']} TB/s\n")
    print("| variant (batch 1, L2-cold) | us | % copy | rel L2 | launches (us) |\n|---|---:|---:|---:|---|")
    for row in rows:
        launches = ", ".join(f"{k.split('_kernel')[0]} {v}" for k, v in row.get("launch_us", {}).items())
        print(f"| {row['variant']} | {row.get('us', row.get('error'))} | {row.get('pct_copy', '')} | "
              f"{row.get('rel_l2', '')} | {launches} |")


if __name__ == "__main__":
    main()
