#!/usr/bin/env python3
"""Launch-config sweep of batch-1 decode attention at full size, against the read floor of its
bytes (GPU).

    python tools/bench/sweep_decode_attention.py [--context 100000] [--out FILE]

A full layer reads the whole paged K/V (205 MB at 100K: 30% of a decode step's time, bound by
HBM); a sliding layer its 513-position ring window (1 MB, bound by latency). Each variant (splits,
K/V tiles in flight, tile length, warps) runs split + reduce replayed from a CUDA graph and is
checked against decode_attention_torch. The read floor rows are a Triton kernel that only sums
the same K and V tensors, contiguous, with several grid sizes: what a streaming kernel can read
on this GPU, next to the device-to-device copy. Prints a markdown table, writes JSON.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import torch
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root, run as a file

from flint_kernels import decode_attention as da  # noqa: E402
from tools.bench.bench_decode_ops import HK, HQ, D  # noqa: E402
from tools.bench.timing import command, copy_bandwidth, gpu_name, graph_us, utc_now  # noqa: E402

BLOCK_SIZE, WINDOW = 64, 513
# (splits, K/V tiles in flight, tile length, warps); splits None: the launcher's default
FULL_VARIANTS = [(None, 4, 64, 4), (33, 4, 64, 4), (44, 4, 64, 4), (88, 4, 64, 4), (128, 4, 64, 4),
                 (66, 3, 64, 4), (66, 2, 64, 4), (33, 3, 64, 4), (128, 2, 64, 4), (128, 3, 64, 4),
                 (66, 4, 64, 8), (33, 4, 64, 8), (33, 3, 128, 4), (33, 2, 128, 8), (66, 2, 128, 4),
                 (66, 3, 128, 8), (66, 6, 32, 4), (128, 4, 32, 4)]
RING_VARIANTS = [(None, 3, 64, 4), (None, 2, 64, 4), (None, 3, 32, 4), (None, 2, 32, 2), (None, 3, 64, 8),
                 (None, 2, 16, 2)]
READ_GRIDS = [(132, 4096, 4), (264, 4096, 4), (528, 4096, 3), (1056, 2048, 3), (264, 8192, 3)]


@triton.jit
def _read_kernel(a_ptr, b_ptr, out_ptr, n_per_program, BLOCK: tl.constexpr, STAGES: tl.constexpr):
    """Program p sums words [p n, (p + 1) n) of both tensors (int32): a pure read stream."""
    p = tl.program_id(0).to(tl.int64)
    acc = tl.zeros([BLOCK], tl.int32)
    for i in tl.range(0, n_per_program, BLOCK, num_stages=STAGES):
        offs = p * n_per_program + i + tl.arange(0, BLOCK)
        acc += tl.load(a_ptr + offs) + tl.load(b_ptr + offs)
    tl.store(out_ptr + p, tl.sum(acc))


def read_floor(k_cache, v_cache, programs, block, stages) -> float:
    a, b = k_cache.view(torch.int32).reshape(-1), v_cache.view(torch.int32).reshape(-1)
    per = a.numel() // programs // block * block
    out = torch.empty(programs, dtype=torch.int32, device=a.device)
    us = graph_us(lambda: _read_kernel[(programs,)](a, b, out, per, BLOCK=block, STAGES=stages, num_warps=4))
    return us, 2 * 4 * per * programs


def paged_case(context: int, device):
    blocks = triton.cdiv(context + 1, BLOCK_SIZE)
    perm = torch.randperm(blocks, device=device).to(torch.int32)  # the engine's blocks: any order
    k_cache = torch.randn(blocks, BLOCK_SIZE, HK, D, device=device, dtype=torch.bfloat16)
    return k_cache, torch.randn_like(k_cache), dict(block_tables=perm[None, :])


def ring_case(device):
    k_cache = torch.randn(1, WINDOW, HK, D, device=device, dtype=torch.bfloat16)
    return k_cache, torch.randn_like(k_cache), dict(ring_rows=torch.zeros(1, dtype=torch.int32, device=device))


def run_variant(args, extra, variant):
    splits, stages, tile, warps = variant
    saved = da.PAGED_STAGES, da.RING_STAGES, da.TILE_N, da.SPLIT_WARPS
    da.PAGED_STAGES = da.RING_STAGES = stages
    da.TILE_N, da.SPLIT_WARPS = tile, warps
    try:
        out = da.decode_attention(*args, **extra, num_splits=splits)
        ref = da.decode_attention_torch(*args, **extra)
        err = ((out.float() - ref.float()).abs().max() / ref.float().abs().max()).item()
        us = graph_us(lambda: da.decode_attention(*args, **extra, num_splits=splits))
    finally:
        da.PAGED_STAGES, da.RING_STAGES, da.TILE_N, da.SPLIT_WARPS = saved
    return us, err


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--context", type=int, default=100_000)
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    device = torch.device("cuda")
    torch.manual_seed(0)
    copy = copy_bandwidth()
    q = torch.randn(1, HQ, D, device=device, dtype=torch.bfloat16)
    k, v = torch.randn(2, 1, HK, D, device=device, dtype=torch.bfloat16)
    lens = torch.tensor([args.context], dtype=torch.int32, device=device)
    sinks = torch.randn(HQ, device=device)
    rows = []
    k_cache, v_cache, extra = paged_case(args.context, device)
    kv_bytes = (args.context + 1) * HK * D * 2 * 2
    for programs, block, stages in READ_GRIDS:
        us, nbytes = read_floor(k_cache, v_cache, programs, block, stages)
        rows.append(dict(case="read floor", variant=f"{programs} programs, {block} words, {stages} stages",
                         us=us, gbs=nbytes / us / 1e3, rel_err=None))
    call = (q, k, v, k_cache, v_cache, lens, sinks, 1 / math.sqrt(D), 0)
    for variant in FULL_VARIANTS:
        us, err = run_variant(call, extra, variant)
        rows.append(dict(case=f"full {args.context}", variant=_name(variant), us=us, gbs=kv_bytes / us / 1e3,
                         rel_err=err))
    del k_cache, v_cache
    k_cache, v_cache, extra = ring_case(device)
    call = (q, k, v, k_cache, v_cache, lens, sinks, 1 / math.sqrt(D), WINDOW)
    ring_bytes = (WINDOW - 1) * HK * D * 2 * 2
    for variant in RING_VARIANTS:
        us, err = run_variant(call, extra, variant)
        rows.append(dict(case="sliding", variant=_name(variant), us=us, gbs=ring_bytes / us / 1e3, rel_err=err))
    print(f"\n{torch.cuda.get_device_name()}, copy {copy / 1e12:.2f} TB/s, split + reduce per call in a CUDA graph")
    print("| case | variant | us | GB/s | % copy | rel err |\n| --- | --- | ---: | ---: | ---: | ---: |")
    for r in rows:
        err = "-" if r["rel_err"] is None else f"{r['rel_err']:.1e}"
        print(f"| {r['case']} | {r['variant']} | {r['us']:.1f} | {r['gbs']:.0f} | {100 * r['gbs'] * 1e9 / copy:.0f} "
              f"| {err} |")
    if args.out:
        meta = dict(gpu=gpu_name(), date=utc_now(), command=command(__file__, argv),
                    copy_tb_s=copy / 1e12, torch=torch.__version__)
        Path(args.out).write_text(json.dumps(dict(meta=meta, rows=rows), indent=1))
    return 0


def _name(variant) -> str:
    splits, stages, tile, warps = variant
    return f"splits {splits or 'default'}, {stages} stages, tile {tile}, {warps} warps"


if __name__ == "__main__":
    raise SystemExit(main())
