#!/usr/bin/env python3
"""What one dependency between two launches costs in a CUDA graph (GPU): the PDL wait every
decode kernel uses now (flint_kernels/pdl.py) against a release/acquire counter.

    python tools/bench/bench_chain_latency.py [--links 256] [--out FILE]

A batch-1 decode step is ~395 launches, each waiting for the one before it (a launch with almost
no work, qk_norm_rope, cost ~1.2 us of the step's critical path on the H200, 2026-12-03).
Each link here is one launch of G programs; program p reads a value that program (7p + 1) % G of
the previous link wrote and writes it plus one, so every link depends on the one before it, and
the last link's values are checked against the epoch the host wrote before the replay. Variants:

  plain    launches without PDL: each starts when the previous one has completed (stream order)
  pdl      launch_pdl, then griddepcontrol.wait + launch_dependents before the read (pdl.py's prologue)
  pdl_early  the same with launch_dependents first: the next link launches before this one waits
           (so does every later one, resources allowing), as in the counter variant
  counter  launch_pdl, launch_dependents first; the read waits (ld.acquire.gpu polls) until every
           program of the previous link has incremented its counter (atom.add.release.gpu after
           its store); a memset node at the graph's start zeroes the counters. A later link
           launches only once every program of this one has started, so the programs it waits for
           are resident or done: the polls end.
  counter_late  the same with launch_dependents after the wait: at most two links' programs are
           resident at once (the counter variant lets every link launch at once, resources allowing)

Per link: the graph's replay time / links (median of 5 replays). Prints a markdown table, writes JSON.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root, run as a file

from flint_kernels.pdl import pdl_prologue  # noqa: E402
from tools.bench.timing import command, gpu_name, utc_now  # noqa: E402

GRIDS = (1, 40, 132, 264, 448)
VARIANTS = ("plain", "pdl", "pdl_early", "counter", "counter_late")
SPIN_LIMIT = tl.constexpr(1 << 22)  # polls before a program gives up (the check then fails)
_LD_ACQUIRE_PTX = tl.constexpr("ld.acquire.gpu.global.b32 $0, [$1];")


@triton.jit
def _pdl_link(data_ptr, i, G, PDL: tl.constexpr, EARLY: tl.constexpr):
    """Link i (>= 1) of a chain: row i of data [links + 1, G] from row i - 1, after the PDL wait
    (EARLY: the next link may launch before it)."""
    if EARLY:
        gdc_launch_dependents()
        gdc_wait()
    else:
        pdl_prologue(PDL)
    p = tl.program_id(0)
    v = tl.load(data_ptr + (i - 1) * G + (7 * p + 1) % G)
    tl.store(data_ptr + i * G + p, v + 1)


@triton.jit
def _counter_link(data_ptr, counters_ptr, i, G, LATE: tl.constexpr):
    """Link i (>= 1): lets the next link launch (LATE: after the wait), waits until
    counters[i - 1] == G (link 1: the host's row 0, no wait), reads, writes, then counts itself
    in counters[i] (release)."""
    if not LATE:
        gdc_launch_dependents()
    p = tl.program_id(0)
    if i > 1:
        one = tl.arange(0, 1)
        ptrs = (counters_ptr + i - 1 + one).to(tl.int64, bitcast=True)
        seen = tl.inline_asm_elementwise(_LD_ACQUIRE_PTX, "=r,l", [ptrs], dtype=tl.int32, is_pure=False, pack=1)
        spins = 0
        while (tl.max(seen) < G) & (spins < SPIN_LIMIT):
            seen = tl.inline_asm_elementwise(_LD_ACQUIRE_PTX, "=r,l", [ptrs], dtype=tl.int32, is_pure=False, pack=1)
            spins += 1
    if LATE:
        gdc_launch_dependents()
    v = tl.load(data_ptr + (i - 1) * G + (7 * p + 1) % G, cache_modifier=".cg")
    tl.store(data_ptr + i * G + p, v + 1)
    tl.debug_barrier()  # the store precedes the release (cumulative at gpu scope)
    tl.atomic_add(counters_ptr + i, 1, sem="release", scope="gpu")


def chain_us(variant: str, grid: int, links: int) -> float:
    """Median us per link of a graph of `links` launches of `grid` programs; checks the values."""
    data = torch.zeros(links + 1, grid, dtype=torch.int32, device="cuda")
    counters = torch.zeros(links + 1, dtype=torch.int32, device="cuda")

    def chain():
        counting = variant.startswith("counter")
        if counting:
            counters.zero_()
        for i in range(1, links + 1):
            if counting:
                _counter_link[(grid,)](data, counters, i, grid, LATE=variant == "counter_late", launch_pdl=True,
                                       num_warps=4)
            else:
                pdl = variant != "plain"
                _pdl_link[(grid,)](data, i, grid, PDL=pdl, EARLY=variant == "pdl_early",
                                   **({"launch_pdl": True} if pdl else {}), num_warps=4)

    chain()  # compiles
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        chain()
    times = []
    for epoch in range(1, 7):
        data[0].fill_(epoch * 1000)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / links)
        expected = epoch * 1000 + links
        if not bool((data[links] == expected).all()):
            raise AssertionError(f"{variant} G={grid}: last link read {data[links].unique().tolist()}, "
                                 f"expected {expected}: a link read before its producer wrote")
    return statistics.median(times[1:])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--links", type=int, default=256)
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    rows = [dict(programs=g, **{v: chain_us(v, g, args.links) for v in VARIANTS}) for g in GRIDS]
    print(f"\n{torch.cuda.get_device_name()}: us per link of a {args.links}-launch chain in one CUDA graph")
    print("| programs a launch | " + " | ".join(VARIANTS) + " |\n| ---: | " + " | ".join("---:" for _ in VARIANTS) + " |")
    for r in rows:
        print(f"| {r['programs']} | " + " | ".join(f"{r[v]:.2f}" for v in VARIANTS) + " |")
    if args.out:
        meta = dict(gpu=gpu_name(), date=utc_now(), command=command(__file__, argv),
                    torch=torch.__version__, triton=triton.__version__)
        Path(args.out).write_text(json.dumps(dict(meta=meta, rows=rows), indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
