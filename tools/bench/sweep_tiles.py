#!/usr/bin/env python3
"""Launch shapes timed against each other: the batched-decode launches (the grouped MoE,
tuning.MOE_GROUPED_TILES, with random routing over flint-40b's 256 experts; the W4A16 GEMM's
decoding tiles, tuning.FP4_GEMM_TILES, on the attention projections, NVFP4, at the token counts
of decode batches; the router, fp32 weight, by its tile; the MoE sort by the chunk count from
which its histograms take a launch of their own; decode attention's splits at that many
sequences) and prefill attention's tiles (tuning.PREFILL_ATTENTION_TILES) on a prefill chunk at
the start and at the end of a 100K-token prompt. moe_experts: the grouped MoE's default tiles with
each step's tokens routed over only N experts (--experts), so its gate/up programs with work (4
column tiles a block of an expert's 8 pairs, 8 a shared block) step past multiples of what the
GPU holds at once: whether its time follows those waves or the bytes. Weights rotate over sets
that read twice the L2 between two uses (bench_kernels.Rotation), as in a step. Each row is
checked against the torch twin.

    python tools/bench/sweep_tiles.py [--only moe,w4a16,router,sort,decode_attention,prefill_attention,moe_experts]
        [--tokens 64,256] [--experts 48,64,...] [--out FILE]

Prints a table per launch (the default shape first) and writes JSON (by default
benchmarks/<gpu>/<date>-<commit>-sweep-tiles.json).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
import triton

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root, run as a file

from flint_kernels import moe_sort, tuning  # noqa: E402
from flint_kernels.moe import fused_moe, fused_moe_torch  # noqa: E402
from flint_kernels.moe_sort import sort_pairs, sort_pairs_torch  # noqa: E402
from flint_kernels.nvfp4_linear import (GEMV_MAX_TOKENS, dequantizes, nvfp4_linear, nvfp4_linear_torch,  # noqa: E402
                                        nvfp4_logits, nvfp4_logits_torch)
from flint_kernels.router import router_topk, router_topk_torch  # noqa: E402
from tools.bench.bench_kernels import (FULL, PREFILL_TOKENS, Rotation, _cold_sets, _experts, _paged_kv,  # noqa: E402
                                       _routing, _visible, random_nvfp4)
from tools.bench.knobs import with_knob  # noqa: E402
from tools.bench.timing import copy_bandwidth, graph_us, nbytes, result_path, run_meta  # noqa: E402

# (BLOCK_M, BLOCK_N gate/up, BLOCK_N down, BLOCK_K, warps, stages[, registers a thread])
# (H100 2026-12-06: 16 x 32 or 64 columns, 8 warps and 32-row blocks were slower, 300-505 us at T=64
# against 222-240; the list varies weight rows a warp, and 8-token blocks, computed transposed.
# The default decode tiles hold 4 programs an SM, by their 116 registers (128 x 128 x 128, 3 stages,
# 45 KB of shared memory: 5 by it); the last five hold 5-8 (compile_kernels.py, sm_90): a cap of 96
# registers (64 B spilled), K steps of 64 (80 registers, 22.5 KB), 64 columns (72, 26.6 KB; 64 with
# the cap). H100 2026-12-07, 7d6a687, T=64: the default 176.1 us, these 209.9 / 201.3 / 178.5 /
# 198.3 / 192.6; dropped: (8, 128, 128, 128, 4, 2, 80) 217.8, (8, 128, 128, 64, 4, 3, 64) 231.0,
# (8, 128, 128, 64, 4, 4) 236.8)
MOE_TILES = [None, (16, 128, 128, 128, 2, 3), (8, 128, 128, 128, 2, 3), (8, 128, 128, 64, 2, 4),
             (8, 64, 64, 128, 2, 3), (8, 128, 128, 128, 4, 3, 96), (8, 128, 128, 64, 4, 3),
             (8, 64, 64, 128, 4, 3), (8, 64, 64, 128, 4, 3, 64), (8, 64, 64, 128, 4, 2, 64)]
# (BLOCK_M rows, BLOCK_N keys, warps, stages)
ATTENTION_TILES = [None, (128, 128, 8, 3), (128, 128, 8, 2), (128, 64, 8, 4), (128, 64, 8, 2), (64, 64, 4, 3)]
# ... at prefill sizes (--tokens 8192: a prefill chunk)
# (H100 2026-12-06, d223641: 64 x 64 gate/up 2222 us, 128-token blocks 2388-3252, against 1983;
# 4f7e8c3: two warpgroups on one 64-token block, 128 or 256 columns, 2283-2624 against 1886)
PREFILL_MOE_TILES = [None, (64, 128, 128, 64, 8, 3), (64, 256, 128, 64, 8, 3), (64, 256, 256, 64, 8, 3),
                     (128, 128, 128, 64, 8, 3)]
# decode attention's splits of each sequence's context (None: the launcher's)
DECODE_SPLITS = [None, 1, 3, 4, 6, 8, 12]
# (BLOCK_M, BLOCK_N, warps, stages, splits: 0 the launcher's)
# (H100 2026-12-06: 16-row tiles and 64 x 64 in one split were slower at T=64; the list varies warps and splits.
# 64 x 128 is the LM head's; for qkv and o_proj it and its 4 / 8 K splits measured slower, H100 2026-12-07,
# 41a0aec: docs/performance.md, "did not")
GEMM_TILES = [None, (64, 32, 2, 4, 0), (64, 32, 2, 4, 4), (64, 32, 4, 4, 4), (32, 64, 2, 4, 0), (32, 32, 2, 4, 0),
              (64, 128, 4, 3, 0), (64, 64, 4, 4, 4)]


# (BLOCK_M, BLOCK_N, warps, stages) of the GEMM over a decoded weight (prefill chunks; None:
# nvfp4_linear._gemm_tiles), timed with its tiles through tensor descriptors (tuning.FP4_DEQUANT_GEMM_TMA)
DEQUANT_GEMM_TILES = [None, (128, 128, 8, 3), (128, 128, 8, 4), (256, 128, 8, 3), (256, 128, 8, 4)]


# (tokens, experts[, H splits]) a program; H100 2026-12-06 at T=64: (16, 64) 27.5 us, (1, 2) 21.0, (1, 8) 20.1
ROUTER_TILES = [None, (16, 32), (16, 16, 8), (16, 16, 16), (16, 32, 16), (16, 64, 8)]
# ... at prefill sizes (--tokens 8192): wider token tiles (router.PREFILL_BLOCK_T)
PREFILL_ROUTER_TILES = [None, (16, 64), (32, 64), (64, 64), (64, 32), (32, 32)]
# the MoE sort's chunk count from which a histogram launch comes first (moe_sort.HIST_MIN_CHUNKS;
# 1 << 30: never)
SORT_HIST_MIN_CHUNKS = [None, 2, 4, 8, 1 << 30]


def time_rows(label: str, knob: str | None, shapes: list, run, reference, bytes_: float, bandwidth: float,
              flops: float = 0.0) -> list[dict]:
    """knob None: run and reference take the shape. flops: TFLOP/s in the table instead of % copy."""
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
        if flops:
            rows[-1]["tflop_s"] = round(flops / (us * 1e-6) / 1e12, 1)
        rate = f"{rows[-1]['tflop_s']} TFLOP/s" if flops else rows[-1]["pct_copy"]
        print(f"| {label} | {shape or 'default'} | {us:.1f} | {rate} | {err:.1e} |", flush=True)
    return rows


def prefill_attention_rows(shape: dict, device, bandwidth: float) -> list[dict]:
    """An 8192-token chunk of a 100K-token prompt, first (context 0) and last (context 92160),
    on a full layer (paged, causal) and a sliding one (ring, window 513); full layers also in
    pages of 128 rows (the engine's block_size 128: one page a 128-key tile, one dot each side)."""
    from flint_kernels.prefill_attention import prefill_attention, prefill_attention_torch
    hq, hk, d, n = shape["hq"], shape["hk"], shape["d"], PREFILL_TOKENS
    rows = []
    for ctx, window, block in [(0, 0, 64), (92160, 0, 64), (0, 0, 128), (92160, 0, 128),
                               (92160, shape["window"], 64)]:
        k_cache, v_cache, extra = _paged_kv([ctx + n], dict(shape, block_size=block), device, window)
        q = torch.randn(n, hq, d, device=device, dtype=torch.bfloat16)
        k, v = torch.randn(2, n, hk, d, device=device, dtype=torch.bfloat16)
        if not window:  # the step's keys in the cache too, as a full layer writes them before attention
            pos = torch.arange(ctx, ctx + n, device=device)
            slots = extra["block_tables"][0].long()[pos // block] * block + pos % block
            k_cache.view(-1, hk, d)[slots], v_cache.view(-1, hk, d)[slots] = k, v
        qsl = torch.tensor([0, n], dtype=torch.int32, device=device)
        lens = torch.tensor([ctx], dtype=torch.int32, device=device)
        args = (q, k, v, qsl, lens, k_cache, v_cache, torch.randn(hq, device=device), d ** -0.5, window, n)
        pairs = sum(_visible(ctx + i, window) + 1 for i in range(n))
        # tuning.PREFILL_ATTENTION_TMA (full layers); pages of 128 rows only by TMA in the default tile
        for tma in (True,) if block != 64 else (False, True) if not window else (False,):
            extra_in_cache = dict(extra, kv_in_cache=not window)
            rows += with_knob(tuning, "PREFILL_ATTENTION_TMA", tma, lambda: time_rows(
                f"prefill_attention {n} tok ctx={ctx} " + (f"window={window}" if window else "causal")
                + (" pages by TMA" if tma else "") + (f" of {block} rows" if block != 64 else ""),
                "PREFILL_ATTENTION_TILES", ATTENTION_TILES[:1 if block != 64 else None],
                lambda a=args, e=extra_in_cache: prefill_attention(*a, **e),
                lambda a=args, e=extra: prefill_attention_torch(*a, **e),
                nbytes(q, k, v) * 2 + 2 * 2 * _visible(ctx, window) * hk * d, bandwidth, flops=4 * pairs * hq * d))
    return rows


def decode_attention_rows(batch: int, shape: dict, device, bandwidth: float) -> list[dict]:
    """Split counts of decode attention (split + reduce) for `batch` sequences of 1280-1730 cached
    positions (a 1K-in / 512-out run's), on a full layer (paged) and a sliding one (ring)."""
    from flint_kernels.decode_attention import decode_attention, decode_attention_torch
    hq, hk, d = shape["hq"], shape["hk"], shape["d"]
    rows = []
    for window in (0, shape["window"]):
        contexts = [1280 + 7 * i for i in range(batch)]  # mixed lengths around 1.5K
        k_cache, v_cache, extra = _paged_kv(contexts, shape, device, window)
        q = torch.randn(batch, hq, d, device=device, dtype=torch.bfloat16)
        k, v = torch.randn(2, batch, hk, d, device=device, dtype=torch.bfloat16)
        lens = torch.tensor(contexts, dtype=torch.int32, device=device)
        args = (q, k, v, k_cache, v_cache, lens, torch.randn(hq, device=device), d ** -0.5, window)
        keys = sum(_visible(c, window) for c in contexts)
        rows += time_rows(
            f"decode_attention B={batch} " + (f"ring W={window}" if window else "paged"), None, DECODE_SPLITS,
            lambda splits, a=args, e=extra: decode_attention(*a, **e, num_splits=splits),
            lambda splits, a=args, e=extra: decode_attention_torch(*a, **e), 2 * 2 * keys * hk * d, bandwidth)
    return rows


def decode_rows(t: int, only: set, shape: dict, experts: tuple, device, bandwidth: float,
                touched: list[int] = ()) -> list[dict]:
    """The grouped MoE, the W4A16 GEMM's decoding tiles, the MoE sort and the router at t tokens;
    the grouped MoE over each of `touched` experts (moe_experts)."""
    h, e, k = shape["hidden"], shape["experts"], shape["top_k"]
    w13, w2, s13, s2 = experts
    rows = []
    if "moe_experts" in only:
        x = torch.randn(t, h, device=device, dtype=torch.bfloat16)
        for n in touched:
            # two sets in turn: experts [0, n) and [e - n, e), disjoint up to n = e / 2
            sets = [(x, *_routing_over(t, n, first, shape, device), w13, w2, s13, s2) for first in (0, e - n)]
            turns = Rotation(sets)
            programs = sum(gate_up_programs(s[1], t, shape) for s in sets) / len(sets)
            rows += time_rows(f"moe T={t} over {n} experts ({programs:g} gate/up programs)", "MOE_GROUPED_TILES",
                              [None], lambda turns=turns: fused_moe(*turns.next(), path="grouped"),
                              lambda s=sets, turns=turns: fused_moe_torch(*s[(turns.calls - 1) % len(s)]),
                              n * nbytes(w13, w2) / e + nbytes(s13, s2), bandwidth)
    if "moe" in only:
        x = torch.randn(t, h, device=device, dtype=torch.bfloat16)
        sets = [(x, *_routing(t, shape, device), w13, w2, s13, s2) for _ in range(2)]
        chosen = sum(len(torch.unique(s[1])) for s in sets) / len(sets)
        turns = Rotation(sets)
        flops = t * 6 * h * (k * shape["moe_inter"] + shape["shared_inter"]) if t >= 1024 else 0.0

        def moe_rows(tag: str, tiles: list) -> list[dict]:
            """The grouped MoE over the rotating sets in each of `tiles`, as the knobs now stand."""
            return time_rows(f"moe T={t} ({chosen:g}+1 experts){tag}", "MOE_GROUPED_TILES", tiles,
                             lambda: fused_moe(*turns.next(), path="grouped"),
                             lambda: fused_moe_torch(*sets[(turns.calls - 1) % len(sets)]),
                             chosen * nbytes(w13, w2) / e + nbytes(s13, s2), bandwidth, flops=flops)

        # every tile; then the default one with tuning.MOE_HALVES off, and at prefill sizes with
        # the shared expert the other way (tuning.MOE_SHARED_DENSE_MIN_TOKENS: apart or in the grid)
        apart = tuning.MOE_SHARED_DENSE_MIN_TOKENS is not None and t >= tuning.MOE_SHARED_DENSE_MIN_TOKENS
        other = (None, " shared expert in the grid") if apart else (t, " shared expert apart")
        for halves, shared_apart_from, tag in [(True, tuning.MOE_SHARED_DENSE_MIN_TOKENS, ""),
                                               (False, tuning.MOE_SHARED_DENSE_MIN_TOKENS, " halves off")] \
                + ([(True, *other)] if t >= 1024 else []):
            rows += with_knob(tuning, "MOE_HALVES", halves, lambda: with_knob(
                tuning, "MOE_SHARED_DENSE_MIN_TOKENS", shared_apart_from, lambda: moe_rows(
                    tag, (MOE_TILES if t < 1024 else PREFILL_MOE_TILES)[:None if not tag else 1])))
    if "w4a16" in only:
        # (name, N, K, x dtype): o_proj again with x in fp16 where its decoding tiles take it from
        # decode attention (tuning.FP4_GEMM_F16_ACTIVATIONS); the LM head of a decode batch
        cases = [("qkv", 5120, h, torch.bfloat16), ("o_proj", h, 4096, torch.bfloat16)]
        if GEMV_MAX_TOKENS < t and not dequantizes(t, head=False):
            cases.append(("o_proj x fp16", h, 4096, torch.float16))
        if t <= 256:
            cases.append(("lm_head", shape["vocab"], h, torch.bfloat16))
        for name, n, kk, x_dtype in cases:
            head = name == "lm_head"
            dequant = dequantizes(t, head)
            ws = [random_nvfp4(n, kk, device=device) for _ in range(_cold_sets(n * kk * 0.56, device, False))]
            xs = torch.randn(t, kk, device=device, dtype=torch.bfloat16).to(x_dtype)
            wturns = Rotation(ws)
            linear, linear_torch = (nvfp4_logits, nvfp4_logits_torch) if head else (
                lambda x, w: nvfp4_linear(x, w, out_dtype=torch.bfloat16), nvfp4_linear_torch)
            run = lambda wt=wturns, xs=xs, f=linear: f(xs, wt.next())
            reference = lambda wt=wturns, xs=xs, ws=ws, f=linear_torch: f(xs, ws[(wt.calls - 1) % len(ws)])
            for decode_tiles in (False, True) if dequant else (False,):  # the decoding tiles at this t
                rows += with_knob(tuning, "FP4_DEQUANT_MIN_TOKENS", None if decode_tiles else tuning.FP4_DEQUANT_MIN_TOKENS,
                                  lambda: with_knob(tuning, "FP4_DEQUANT_GEMM_TMA", False, lambda: time_rows(
                    f"w4a16 {name} T={t}" + (" (decoded weight, pointers)" if dequant and not decode_tiles else ""),
                    "FP4_GEMM_TILES", GEMM_TILES if not dequant else [None], run, reference,
                    nbytes(ws[0]), bandwidth, flops=2 * t * n * kk if dequant else 0.0)))
            if dequant:  # the decoded weight's GEMM through tensor descriptors (tuning.FP4_DEQUANT_GEMM_TMA)
                rows += with_knob(tuning, "FP4_DEQUANT_GEMM_TMA", True, lambda: time_rows(
                    f"w4a16 {name} T={t} (decoded weight, descriptors)", "FP4_DEQUANT_GEMM_TILES", DEQUANT_GEMM_TILES,
                    run, reference, nbytes(ws[0]), bandwidth, flops=2 * t * n * kk))
    if "sort" in only:
        ids, _ = _routing(t, shape, device)
        block_m = 8 if t * (k + 1) / (e + 1) <= 8 else 64  # moe_grouped's blocks at these sizes

        def sort(chunks):  # the block table (past the last run any id >= the expert count: clamped)
            return with_knob(moe_sort, "HIST_MIN_CHUNKS", chunks or moe_sort.HIST_MIN_CHUNKS,
                             lambda: sort_pairs(ids, e, True, block_m)[1].clamp(max=e + 1))
        rows += time_rows(f"moe sort T={t} ({triton.cdiv(t * (k + 1), moe_sort.BLOCK_P)} chunks)", None,
                          SORT_HIST_MIN_CHUNKS, sort,
                          lambda chunks: sort_pairs_torch(ids, e, True, block_m)[1].clamp(max=e + 1),
                          nbytes(ids), bandwidth)
    if "router" in only:
        router_w = torch.randn(e, h, device=device) / h ** 0.5  # fp32, as flint-40b's
        xr = torch.randn(t, h, device=device, dtype=torch.bfloat16)
        for parts in (False, True) if t >= 1024 else (False,):  # the prefill tiles from the weight's parts
            rows += with_knob(tuning, "ROUTER_WEIGHT_PARTS", parts, lambda: time_rows(
                f"router T={t} (fp32 weight{', its parts' if parts else ''})", None,
                ROUTER_TILES if t < 1024 else PREFILL_ROUTER_TILES,
                lambda tile: router_topk(xr, router_w, k, True, tile=tile)[1],
                lambda tile: router_topk_torch(xr, router_w, k, True)[1], nbytes(router_w), bandwidth))
    return rows


def _routing_over(t: int, n: int, first: int, shape: dict, device) -> tuple[torch.Tensor, torch.Tensor]:
    """bench_kernels._routing among experts [first, first + n) only."""
    ids, weights = _routing(t, {**shape, "experts": n}, device)
    return ids + first, weights


def gate_up_programs(ids: torch.Tensor, t: int, shape: dict, block_m: int = 8, block_n: int = 128) -> int:
    """The decode tiles' gate/up programs with work: a program a column tile of a block of an
    expert's block_m pairs (moe_grouped: 8 pairs, 128 columns), the shared expert's blocks in order."""
    counts = torch.bincount(ids.flatten().long(), minlength=shape["experts"])
    blocks = int(((counts + block_m - 1) // block_m).sum())
    return blocks * triton.cdiv(shape["moe_inter"], block_n) + \
        triton.cdiv(t, block_m) * triton.cdiv(shape["shared_inter"], block_n)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", default="moe,w4a16,router,sort,decode_attention,prefill_attention")
    parser.add_argument("--tokens", default="64,256")
    parser.add_argument("--experts", default="48,64,96,112,120,128,160,192,224,240,256",
                        help="moe_experts: the experts each step's tokens are routed over")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    only = set(args.only.split(","))
    device = torch.device("cuda")
    bandwidth = copy_bandwidth()
    print("| launch | shape | us | % copy or TFLOP/s | rel err |\n| --- | --- | ---: | ---: | ---: |")
    results = {"meta": run_meta(__file__, bandwidth / 1e12), "rows": []}
    if only & {"moe", "w4a16", "router", "sort", "moe_experts"}:
        experts = _experts(FULL, device, "nvfp4")
        touched = [int(n) for n in args.experts.split(",")]
        if not all(FULL["top_k"] <= n <= FULL["experts"] for n in touched):
            raise SystemExit(f"--experts: got {args.experts!r}, expected counts in [{FULL['top_k']}, {FULL['experts']}]")
        for t in [int(n) for n in args.tokens.split(",")]:
            results["rows"] += decode_rows(t, only, FULL, experts, device, bandwidth, touched)
    if "decode_attention" in only:
        for t in [int(n) for n in args.tokens.split(",")]:
            results["rows"] += decode_attention_rows(t, FULL, device, bandwidth)
    if "prefill_attention" in only:
        results["rows"] += prefill_attention_rows(FULL, device, bandwidth)
    out = args.out or result_path("sweep-tiles")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
