"""How fast a full layer's paged K/V can be read at batch 1 in each page layout (GPU).

    python tools/bench/bench_kv_layout.py [--context 100000] [--out FILE]

The decode split kernel (flint_kernels/decode_attention.py) streams a full layer's K/V at 100K
(205 MB) in ~50 us inside the step, ~4.1 TB/s, while the LM head's GEMV reads its 621 MB at
~4.26 TB/s. The cache's pages are [block, 64 positions, Hk, D] (NHD): program (KV head, split)
reads 256-byte rows 1 KB apart, and the four KV heads' programs share each page. This times pure
reads (int32 sums, nothing computed) of the same bytes, in CUDA graphs, with 264 programs:

  nhd           program (head, split) reads its head's rows of each page (the present split)
  hnd           pages [block, Hk, 64, D]: the same program reads one contiguous 16 KB a page
  nhd-pages     program (split) reads whole 64 KB pages, all heads, half a page a step (4x the splits)
  contiguous    each program one contiguous range of the same size (the read floor)

If hnd reads faster than nhd, a head-major page layout would shorten the 14 full layers' splits.
Prints a markdown table, writes JSON.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root, run as a file

from tools.bench.sweep_decode_attention import read_floor  # noqa: E402
from tools.bench.timing import command, copy_bandwidth, gpu_name, graph_us, utc_now  # noqa: E402

HK, D, ROWS = 4, 128, 64          # KV heads, head_dim, positions a page
WORDS = D // 2                    # int32 words of one head's row (bf16 pairs)


@triton.jit
def _paged_read_kernel(k_ptr, v_ptr, table_ptr, out_ptr, pages_per_split, n_pages,
                       HEAD_MAJOR: tl.constexpr, ALL_HEADS: tl.constexpr, HK: tl.constexpr,
                       ROWS: tl.constexpr, WORDS: tl.constexpr, STAGES: tl.constexpr):
    """Program (head, split) [or (split) with ALL_HEADS] sums the int32 words of its pages' K and V."""
    h = tl.program_id(0)
    s = tl.program_id(1)
    HALF: tl.constexpr = ROWS * HK // 2
    if ALL_HEADS:  # half a page an iteration (32 KB of K and of V: three stages fit shared memory)
        r = tl.arange(0, HALF)  # (position, head) rows, in memory order
        acc = tl.zeros([HALF, WORDS], tl.int32)
    else:
        r = tl.arange(0, ROWS)
        acc = tl.zeros([ROWS, WORDS], tl.int32)
    cols = tl.arange(0, WORDS)
    first = s * pages_per_split
    last = tl.minimum(first + pages_per_split, n_pages)
    for i in tl.range(first * (1 + ALL_HEADS), last * (1 + ALL_HEADS), num_stages=STAGES):
        p = i // 2 if ALL_HEADS else i
        block = tl.load(table_ptr + p).to(tl.int64)
        page = block * (ROWS * HK * WORDS)
        if ALL_HEADS:
            off = page + (i % 2) * (HALF * WORDS) + r[:, None] * WORDS + cols[None, :]
        elif HEAD_MAJOR:
            off = page + h * (ROWS * WORDS) + r[:, None] * WORDS + cols[None, :]
        else:
            off = page + r[:, None] * (HK * WORDS) + h * WORDS + cols[None, :]
        acc += tl.load(k_ptr + off) + tl.load(v_ptr + off)
    tl.store(out_ptr + h * tl.num_programs(1) + s, tl.sum(acc))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--context", type=int, default=100_000)
    parser.add_argument("--splits", type=int, default=66, help="splits a KV head (the split kernel's at batch 1)")
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    n_pages = triton.cdiv(args.context, ROWS)
    g = torch.Generator(device="cuda").manual_seed(0)
    k = torch.randint(-1000, 1000, (n_pages, ROWS * HK * WORDS), dtype=torch.int32, device="cuda", generator=g)
    v = torch.randint(-1000, 1000, k.shape, dtype=torch.int32, device="cuda", generator=g)
    table = torch.randperm(n_pages, device="cuda", generator=g).to(torch.int32)  # the engine's blocks: any order
    nbytes = 2 * k.nelement() * 4
    rows = []
    per_split = triton.cdiv(n_pages, args.splits)
    for stages in (3, 4):
        for name, grid, head_major, all_heads, pps, warps in (
                ("nhd", (HK, args.splits), False, False, per_split, 4),
                ("hnd", (HK, args.splits), True, False, per_split, 4),
                ("nhd-pages", (1, HK * args.splits), False, True, triton.cdiv(n_pages, HK * args.splits), 8)):
            out = torch.empty(grid[0] * grid[1], dtype=torch.int32, device="cuda")
            call = (lambda grid=grid, hm=head_major, ah=all_heads, pps=pps, warps=warps, out=out:
                    _paged_read_kernel[grid](k, v, table, out, pps, n_pages, HEAD_MAJOR=hm, ALL_HEADS=ah, HK=HK,
                                             ROWS=ROWS, WORDS=WORDS, STAGES=min(stages, 3) if ah else stages,
                                             num_warps=warps))
            us = graph_us(call)
            rows.append(dict(layout=name, stages=stages, programs=grid[0] * grid[1], us=round(us, 2),
                             tb_s=round(nbytes / us / 1e6, 3)))
        programs = HK * args.splits
        us, read = read_floor(k, v, programs, 2048, stages)  # sweep_decode_attention's read floor
        rows.append(dict(layout="contiguous", stages=stages, programs=programs, us=round(us, 2),
                         tb_s=round(read / us / 1e6, 3)))
    copy = copy_bandwidth()
    meta = dict(gpu=gpu_name(), date=utc_now(), command=command(__file__, argv or None),
                context=args.context, kv_bytes=nbytes, copy_tb_s=round(copy / 1e12, 3))
    print(f"K/V of one full layer at {args.context}: {nbytes / 1e6:.1f} MB; copy {copy / 1e12:.2f} TB/s "
          f"({meta['gpu']}, {meta['date']})\n")
    print("| layout | stages | programs | us | TB/s |\n| --- | ---: | ---: | ---: | ---: |")
    for r in rows:
        print(f"| {r['layout']} | {r['stages']} | {r['programs']} | {r['us']:.2f} | {r['tb_s']:.3f} |")
    if args.out:
        Path(args.out).write_text(json.dumps(dict(meta=meta, rows=rows), indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
