#!/usr/bin/env python3
"""How fast can a kernel with the batch-1 MoE launch geometry merely read its NVFP4 bytes? The
read floor of each structure, on the GPU, L2-cold (12 expert choices taken in turn).

    python tools/bench/bench_read_floor.py [--out FILE] [--only layer]

Each row is a Triton kernel that loads exactly the words a moe_gemv launch loads (int32 words of
the 7 chosen experts: 6 routed + 1 more standing for the shared one), adds them up (one integer
add a word: no decode) and stores one sum a program. Its time against moe_gemv's launch (printed
by tools/bench/sweep_fp4_decode.py) splits that launch into reading and the rest (decode, FMAs,
epilogue). Prints a markdown table and writes JSON (--out; by default
benchmarks/<gpu>/<date>-<commit>-read-floor[-layer].json).

The "layer" rows bound the whole batch-1 NVFP4 MoE layer (issue 9's 60% target: 12.4 MB of the
chosen experts' words and block scales, gate/up and down) from below: one launch that reads all
of it at once and nothing else, chained with PDL in a CUDA graph, each launch taking its expert
ids from the launch before (as the MoE takes its routing from the router), after its wait. No
decode, no arithmetic, no dependency of the down rows on the gate/up outputs: any MoE layer that
reads those bytes after its routing is known takes at least this long. The "ahead" rows read
their ids from a table no kernel writes, before the wait: the bound if the routing were known a
kernel early, which no decode step has. "ids only": the launch and the ids' round trip, no weights.
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

from flint_kernels.pdl import pdl_prologue  # noqa: E402
from tools.bench.timing import command, copy_bandwidth, cycled, gpu_name, graph_us, result_path, utc_now  # noqa: E402

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


@triton.jit
def _read_layer_kernel(w13_ptr, s13_ptr, w2_ptr, s2_ptr, ids_ptr, next_src_ptr, next_ids_ptr, out_ptr,
                       stride13_e, stride13_n, strides13_e, strides13_n, stride2_e, stride2_n, strides2_e, strides2_n,
                       UP_PROGRAMS, ROWS13: tl.constexpr, KW13: tl.constexpr, KS13: tl.constexpr,
                       ROWS2: tl.constexpr, KW2: tl.constexpr, KS2: tl.constexpr, SLOTS: tl.constexpr,
                       READ: tl.constexpr, AHEAD: tl.constexpr, PDL: tl.constexpr):
    """One launch reading a batch-1 MoE layer's chosen weights (module docstring, "layer" rows):
    programs < UP_PROGRAMS read ROWS13 gate/up rows (KW13 words + KS13 words of block scales) of
    one slot's expert, the others ROWS2 down rows of every slot's expert (KW2 + KS2 words a row),
    all in one round of loads; each stores its sum. Ids: ids_ptr [8] int32, after the PDL wait
    (written by the launch before), or (AHEAD) before it, with the loads. Program 0 then copies
    next_src_ptr[0:8] (the successor's choice, a table row) to next_ids_ptr[0:8], its ids."""
    p = tl.program_id(0)
    if not AHEAD:
        pdl_prologue(PDL)
    slots = tl.arange(0, 8)
    if p < UP_PROGRAMS:
        e = tl.load(ids_ptr + p % SLOTS).to(tl.int64)
        total = e.to(tl.int32)
        if READ:
            rows = (p // SLOTS) * ROWS13 + tl.arange(0, ROWS13)
            words = tl.load(w13_ptr + e * stride13_e + rows[:, None] * stride13_n + tl.arange(0, KW13)[None, :])
            scales = tl.load(s13_ptr + e * strides13_e + rows[:, None] * strides13_n + tl.arange(0, KS13)[None, :])
            total = tl.sum(words) + tl.sum(scales)
    else:  # (names of their own: a variable both branches assign must keep its type)
        e8 = tl.load(ids_ptr + slots, mask=slots < SLOTS, other=0).to(tl.int64)
        total = tl.sum(e8).to(tl.int32)
        if READ:
            rows2 = (p - UP_PROGRAMS) * ROWS2 + tl.arange(0, ROWS2)
            live = (slots < SLOTS)[:, None, None]
            words2 = tl.load(w2_ptr + e8[:, None, None] * stride2_e + rows2[None, :, None] * stride2_n
                             + tl.arange(0, KW2)[None, None, :], mask=live, other=0)
            scales2 = tl.load(s2_ptr + e8[:, None, None] * strides2_e + rows2[None, :, None] * strides2_n
                              + tl.arange(0, KS2)[None, None, :], mask=live, other=0)
            total = tl.sum(words2) + tl.sum(scales2)
    if AHEAD:
        pdl_prologue(PDL)
    tl.store(out_ptr + p, total)
    if p == 0:
        tl.store(next_ids_ptr + slots, tl.load(next_src_ptr + slots))


def layer_launches(w13, s13, w2, s2, choices: list, out, rows13: int, rows2: int, warps: int, read: bool = True,
                   ahead: bool = False, pdl: bool = True) -> list:
    """Callables for _read_layer_kernel's chain over `choices` (int32 [SLOTS] each, in turn):
    call i reads its ids from a buffer call i - 1 wrote (or, ahead, from choices[i] itself) and
    writes call i + 1's. The first call's buffer is seeded here."""
    n = len(choices)
    bufs = torch.zeros(n, 8, dtype=torch.int32, device=w13.device)  # call i's ids: bufs[i]
    table = torch.zeros(n, 8, dtype=torch.int32, device=w13.device)
    for i, c in enumerate(choices):
        table[i, :len(c)] = c
    up_programs = SLOTS * triton.cdiv(w13.shape[1], rows13)
    grid = (up_programs + triton.cdiv(w2.shape[1], rows2),)

    def launch(i: int):
        _read_layer_kernel[grid](
            w13, s13, w2, s2, table[i] if ahead else bufs[i], table[(i + 1) % n], bufs[(i + 1) % n], out,
            w13.stride(0), w13.stride(1), s13.stride(0), s13.stride(1), w2.stride(0), w2.stride(1),
            s2.stride(0), s2.stride(1), up_programs, ROWS13=rows13, KW13=w13.shape[2], KS13=s13.shape[2],
            ROWS2=rows2, KW2=w2.shape[2], KS2=s2.shape[2], SLOTS=SLOTS, READ=read, AHEAD=ahead, PDL=pdl,
            **({"launch_pdl": True} if pdl else {}), num_warps=warps)
    bufs[0].copy_(table[0])
    return [lambda i=i: launch(i) for i in range(n)]


def layer_cases(w13, w2, choices, out) -> list:
    """The "layer" rows: (name, bytes, callables) of _read_layer_kernel's chains, with block
    scales (one E4M3 byte a 16 weights: H/16 bytes a gate/up row, I/16 a down row) as int32 words."""
    dev = w13.device
    s13 = torch.randint(-2**31, 2**31 - 1, (E, 2 * I, H // 64), dtype=torch.int32, device=dev)
    s2 = torch.randint(-2**31, 2**31 - 1, (E, H, I // 64), dtype=torch.int32, device=dev)
    moved = SLOTS * (w13[0].nbytes + s13[0].nbytes + w2[0].nbytes + s2[0].nbytes)
    cases = []
    configs = [(rows13, rows2, warps) for rows13 in (8, 16, 32) for rows2 in (4, 8, 16) for warps in (4, 8)]
    for rows13, rows2, warps, read, ahead in ([c + (True, False) for c in configs] + [c + (True, True) for c in configs]
                                              + [(16, 8, 4, False, False)]):
        programs = SLOTS * 2 * I // rows13 + H // rows2
        what = ("ids only" if not read else "ids ahead" if ahead else "ids from the launch before")
        cases.append((f"layer in one launch, {what}: gate/up rows={rows13} down rows={rows2} w={warps} "
                      f"programs={programs}", moved if read else 0,
                      layer_launches(w13, s13, w2, s2, choices, out, rows13, rows2, warps, read, ahead)))
    return cases


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
    parser.add_argument("--out", type=Path, help="default: benchmarks/<gpu>/<date>-<commit>-read-floor[-layer].json")
    parser.add_argument("--only", choices=["layer"], help="only the layer rows")
    args = parser.parse_args()
    args.out = args.out or result_path("read-floor" + (f"-{args.only}" if args.only else ""))
    dev = "cuda"
    bandwidth = copy_bandwidth()
    # NVFP4 weights as int32 words: gate/up [E, 2I, H/8], down [E, H, I/8]
    w13 = torch.randint(-2**31, 2**31 - 1, (E, 2 * I, H // 8), dtype=torch.int32, device=dev)
    w2 = torch.randint(-2**31, 2**31 - 1, (E, H, I // 8), dtype=torch.int32, device=dev)
    choices = [torch.randperm(E, device=dev)[:SLOTS].to(torch.int32) for _ in range(COPIES)]
    out = torch.zeros(1 << 16, dtype=torch.int32, device=dev)
    up_bytes, down_bytes = SLOTS * w13[0].nbytes, SLOTS * w2[0].nbytes
    cases = layer_cases(w13, w2, choices, out) if args.only == "layer" else []
    gate_up_configs = [(16, 128, 3, 4), (16, 256, 1, 4), (16, 64, 4, 4), (32, 128, 3, 4), (64, 128, 3, 8),
                       (8, 128, 3, 2), (16, 128, 3, 8)]
    down_configs = [(4, 3, 4, False), (4, 3, 1, False), (8, 4, 2, False), (16, 3, 4, False), (4, 1, 4, True),
                    (8, 1, 4, True), (16, 1, 4, True), (16, 1, 8, True)]
    for rows, kw, stages, warps in [] if args.only else gate_up_configs:
        cases.append((f"gate/up read rows={rows} kw={kw} st={stages} w={warps} programs="
                      f"{SLOTS * 2 * I // rows}", up_bytes,
                      [lambda c=c, a=(rows, kw, stages, warps): gate_up(w13, c, out, *a) for c in choices]))
    for rows, stages, warps, once in [] if args.only else down_configs:
        cases.append((f"down read rows={rows} st={stages} w={warps} {'all-at-once' if once else 'in-turn'} "
                       f"programs={H // rows}", down_bytes,
                       [lambda c=c, a=(rows, stages, warps, once): down(w2, c, out, *a) for c in choices]))
    if not args.only:
        cases.append(("empty-ish: gate/up read of 1 row a program, 448 programs", SLOTS * 448 * 512,
                      [lambda c=c: gate_up(w13[:, :448], c, out, 1, 128, 1, 4) for c in choices]))
        cases += layer_cases(w13, w2, choices, out)
    rows_out = []
    for name, moved, fns in cases:
        try:
            us = graph_us(cycled(fns))
            row = {"case": name, "us": round(us, 2), "bytes": moved,
                   "pct_copy": round(100 * moved / (us * 1e-6) / bandwidth, 1)}
            if name.startswith("layer"):  # the layer's time at 60% of copy, for comparison
                row["us_at_60pct"] = round(moved / (0.6 * bandwidth) * 1e6, 2) if moved else None
        except Exception as e:
            row = {"case": name, "error": f"{type(e).__name__}: {str(e)[:160]}"}
        rows_out.append(row)
        print(json.dumps(row), flush=True)
    meta = {"gpu": gpu_name(), "date": utc_now(),
            "command": command(__file__, ["--only", args.only] if args.only else []),
            "copy_tb_s": round(bandwidth / 1e12, 3)}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"meta": meta, "rows": rows_out}, indent=2) + "\n")
    print(f"\n{meta['command']} -- {meta['gpu']}, {meta['date']}, copy {meta['copy_tb_s']} TB/s\n")
    print("| structure (L2-cold) | us | % copy |\n|---|---:|---:|")
    for row in rows_out:
        print(f"| {row['case']} | {row.get('us', row.get('error'))} | {row.get('pct_copy', '')} |")


if __name__ == "__main__":
    main()
