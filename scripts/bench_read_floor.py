#!/usr/bin/env python3
"""How fast can a kernel with the batch-1 MoE launch geometry merely read its NVFP4 bytes? The
read floor of each structure, on the GPU, L2-cold (12 expert choices taken in turn).

    python scripts/bench_read_floor.py [--out benchmarks/read-floor.json]

Each row is a Triton kernel that loads exactly the words a moe_gemv launch loads (int32 words of
the 7 chosen experts: 6 routed + 1 more standing for the shared one), adds them up (one integer
add a word: no decode) and stores one sum a program. Its time against moe_gemv's launch (printed
by scripts/sweep_fp4_decode.py) splits that launch into reading and the rest (decode, FMAs,
epilogue). Prints a markdown table and writes JSON.
"""

from __future__ import annotations

import argparse
import json
from datetime import datetime, timezone
from pathlib import Path

import torch
import triton
import triton.language as tl

from scripts.bench_decode_ops import copy_bandwidth, cycled, graph_us

E, H, I, SLOTS = 256, 2048, 512, 7
COPIES = 12


@triton.jit
def _read_rows_kernel(w_ptr, ids_ptr, out_ptr, stride_e, stride_n, n_rows,
                      ROWS: tl.constexpr, KW: tl.constexpr, STEPS: tl.constexpr, STAGES: tl.constexpr):
    """Program (slot, row block): ROWS rows x STEPS * KW words of expert ids[slot] (gate/up)."""
    slot = tl.program_id(0)
    rows = tl.program_id(1) * ROWS + tl.arange(0, ROWS)
    e = tl.load(ids_ptr + slot).to(tl.int64)
    base = w_ptr + e * stride_e + rows[:, None] * stride_n
    acc = tl.zeros([ROWS, KW], tl.int32)
    for s in tl.range(0, STEPS, num_stages=STAGES):
        acc += tl.load(base + s * KW + tl.arange(0, KW)[None, :], mask=rows[:, None] < n_rows, other=0)
    tl.store(out_ptr + slot * tl.num_programs(1) + tl.program_id(1), tl.sum(acc))


@triton.jit
def _read_experts_kernel(w_ptr, ids_ptr, out_ptr, stride_e, stride_n,
                         ROWS: tl.constexpr, KW: tl.constexpr, SLOTS: tl.constexpr, STAGES: tl.constexpr,
                         ALL_AT_ONCE: tl.constexpr):
    """Program (row block): ROWS rows x KW words of each of the SLOTS experts (down)."""
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    if ALL_AT_ONCE:  # one [SLOTS, ROWS, KW] load
        slots = tl.arange(0, 8)
        e = tl.load(ids_ptr + slots, mask=slots < SLOTS, other=0).to(tl.int64)
        words = tl.load(w_ptr + e[:, None, None] * stride_e + rows[None, :, None] * stride_n
                        + tl.arange(0, KW)[None, None, :], mask=(slots < SLOTS)[:, None, None], other=0)
        total = tl.sum(words)
    else:  # the experts in turn, pipelined
        acc = tl.zeros([ROWS, KW], tl.int32)
        for j in tl.range(0, SLOTS, num_stages=STAGES):
            e = tl.load(ids_ptr + j).to(tl.int64)
            acc += tl.load(w_ptr + e * stride_e + rows[:, None] * stride_n + tl.arange(0, KW)[None, :])
        total = tl.sum(acc)
    tl.store(out_ptr + tl.program_id(0), total)


def gate_up(w13, ids, out, rows: int, kw: int, stages: int, warps: int):
    steps = w13.shape[2] // kw
    _read_rows_kernel[(SLOTS, triton.cdiv(w13.shape[1], rows))](
        w13, ids, out, w13.stride(0), w13.stride(1), w13.shape[1], ROWS=rows, KW=kw, STEPS=steps, STAGES=stages,
        num_warps=warps)


def down(w2, ids, out, rows: int, stages: int, warps: int, all_at_once: bool):
    _read_experts_kernel[(triton.cdiv(w2.shape[1], rows),)](
        w2, ids, out, w2.stride(0), w2.stride(1), ROWS=rows, KW=w2.shape[2], SLOTS=SLOTS, STAGES=stages,
        ALL_AT_ONCE=all_at_once, num_warps=warps)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/read-floor.json"))
    args = parser.parse_args()
    dev = "cuda"
    bandwidth = copy_bandwidth()
    # NVFP4 weights as int32 words: gate/up [E, 2I, H/8], down [E, H, I/8]
    w13 = torch.randint(-2**31, 2**31 - 1, (E, 2 * I, H // 8), dtype=torch.int32, device=dev)
    w2 = torch.randint(-2**31, 2**31 - 1, (E, H, I // 8), dtype=torch.int32, device=dev)
    choices = [torch.randperm(E, device=dev)[:SLOTS].to(torch.int32) for _ in range(COPIES)]
    out = torch.zeros(1 << 16, dtype=torch.int32, device=dev)
    up_bytes, down_bytes = SLOTS * w13[0].nbytes, SLOTS * w2[0].nbytes
    cases = []
    for rows, kw, stages, warps in [(16, 128, 3, 4), (16, 256, 1, 4), (16, 64, 4, 4), (32, 128, 3, 4),
                                    (64, 128, 3, 8), (8, 128, 3, 2), (16, 128, 3, 8)]:
        cases.append((f"gate/up read rows={rows} kw={kw} st={stages} w={warps} programs="
                      f"{SLOTS * 2 * I // rows}", up_bytes,
                      [lambda c=c, a=(rows, kw, stages, warps): gate_up(w13, c, out, *a) for c in choices]))
    for rows, stages, warps, once in [(4, 3, 4, False), (4, 3, 1, False), (8, 4, 2, False), (16, 3, 4, False),
                                      (4, 1, 4, True), (8, 1, 4, True), (16, 1, 4, True), (16, 1, 8, True)]:
        cases.append((f"down read rows={rows} st={stages} w={warps} {'all-at-once' if once else 'in-turn'} "
                       f"programs={H // rows}", down_bytes,
                       [lambda c=c, a=(rows, stages, warps, once): down(w2, c, out, *a) for c in choices]))
    cases.append(("empty-ish: gate/up read of 1 row a program, 448 programs", SLOTS * 448 * 512,
                  [lambda c=c: gate_up(w13[:, :448], c, out, 1, 128, 1, 4) for c in choices]))
    rows_out = []
    for name, moved, fns in cases:
        try:
            us = graph_us(cycled(fns))
            row = {"case": name, "us": round(us, 2), "bytes": moved,
                   "pct_copy": round(100 * moved / (us * 1e-6) / bandwidth, 1)}
        except Exception as e:
            row = {"case": name, "error": f"{type(e).__name__}: {str(e)[:160]}"}
        rows_out.append(row)
        print(json.dumps(row), flush=True)
    meta = {"gpu": torch.cuda.get_device_name(), "date": datetime.now(timezone.utc).isoformat(timespec="minutes"),
            "command": "python scripts/bench_read_floor.py", "copy_tb_s": round(bandwidth / 1e12, 3)}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"meta": meta, "rows": rows_out}, indent=2) + "\n")
    print(f"\n{meta['command']} -- {meta['gpu']}, {meta['date']}, copy {meta['copy_tb_s']} TB/s\n")
    print("| structure (L2-cold) | us | % copy |\n|---|---:|---:|")
    for row in rows_out:
        print(f"| {row['case']} | {row.get('us', row.get('error'))} | {row.get('pct_copy', '')} |")


if __name__ == "__main__":
    main()
