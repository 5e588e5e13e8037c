"""Every tuning switch of the kernels and of the op table, declared once: its default and what
measured it. Figures are batch-1 decode of flint-40b at 100K context (graph replay, ms a token)
unless a line says otherwise; docs/performance.md holds the tables.

A switch turns a variant on or off, or overrides a launch shape (None: the launcher's own
choice). Launchers read them at each launch (`tuning.X`, never a copy taken at import), so a
benchmark can flip one around a call (tools/bench/knobs.py `with_knob(tuning, "X", value, call)`)
or between graph captures (`bench_step_timeline.py --variant flint_kernels.tuning.X=value`).
The environment sets the ones named FLINT_<X>, read here once, at import. Fixed launch sizes
(block sizes, warps, stages) stay beside their launchers.
"""

from __future__ import annotations

import os

# Kernels run in Triton's CPU interpreter (tests/conftest.py sets it without a GPU): fp32 dots,
# fewer and larger programs, no inline PTX, no PDL. The one place the variable is read.
INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"


def _flag(name: str, default: bool) -> bool:
    text = os.environ.get(f"FLINT_{name}", "1" if default else "0")
    if text not in ("0", "1"):
        raise ValueError(f"FLINT_{name}: got {text!r}, expected '0' or '1'")
    return text == "1"


def _tokens(name: str, default: int) -> int | None:
    text = os.environ.get(f"FLINT_{name}", str(default))
    if not text.isdigit():
        raise ValueError(f"FLINT_{name}: got {text!r}, expected a token count (0: off)")
    return int(text) or None


# --- every kernel ---
# Programmatic dependent launch (pdl.py): each launch loads its weights while the one before
# finishes. H200 2026-12-03: NVFP4 3.035 ms without, 2.645 with. Off: every launch waits for its
# predecessor, as on pre-sm_90 GPUs and in the interpreter (compile_kernels.py --no-pdl).
PDL = _flag("PDL", True)

# --- NVFP4 decode of the batch-1 kernels (nvfp4.py); tools/bench/sweep_fp4_decode.py and
# bench_decode_ops.py time both ways of each. H200 2026-12-02, L2-cold weights, batch 1:
# 32-bit words of 8 weights in the W4A16 GEMV: qkv 6.64 us, 7.75 as bytes.
FP4_GEMV_WORDS = _flag("FP4_GEMV_WORDS", True)
# words in the MoE gate/up launch: 6.9 us, 9.05 as bytes.
FP4_MOE_WORDS = _flag("FP4_MOE_WORDS", True)
# the MoE down launch reading all of a token's experts' words in one load: 5.0 us, 9.2 as bytes.
FP4_MOE_DOWN_WORDS = _flag("FP4_MOE_DOWN_WORDS", True)
# a word's codes turned into fp16 pairs by inline PTX (never in the interpreter): qkv 7.75 -> 6.64 us.
FP4_PTX = _flag("FP4_PTX", True)
# each word's 8 products summed in fp16 pairs in the GEMVs' prefetching splits (bf16 x): H200
# 2026-12-05, NVFP4 2.094 -> 2.054 ms. Off: fp32 products, for activations beyond fp16's range
# (|x| >= 65504) and as the reference of test_f16_products_real_shapes.
FP4_GEMV_F16 = _flag("FP4_GEMV_F16", True)

# NVFP4 tensor-core tiles (the grouped MoE, moe_grouped.py; the W4A16 GEMM's decoding tiles,
# nvfp4_linear.py) decode packed bytes to fp16 with the block scale applied in PTX
# (nvfp4.weight_tile_f16, four bytes in 15 instructions) and take the activations as fp16:
# products exact for 2**-14 <= |x| < 65504, as FP4_GEMV_F16. Off: bytes decoded through fp32 to
# bf16 tiles. H100 2026-12-06, random routing: grouped MoE at 64 tokens 333 -> 238 us, 256 tokens
# 440 -> 326 us; the W4A16 GEMM at 64 tokens unchanged (17.1 us).
FP4_MMA_F16 = _flag("FP4_MMA_F16", True)

# The grouped MoE's transposed decode tiles take their activations in fp16 in the halves layout
# (each K step's even columns, then its odd ones: halves.py) where every weight is
# NVFP4 in fp16 tiles: no instruction pairs the decoded weight's halves, none converts x. H100
# 2026-12-06 (326bb96), T=64: 214.3 -> 201.8 us. Off: x and inter in x's dtype, tiles in k order.
MOE_HALVES = _flag("MOE_HALVES", True)

# The grouped MoE's transposed decode tiles hand each block from gate/up to down by a counter
# (moe_grouped HANDOFF): down programs, scheduled once every gate/up program has started, take
# the blocks gate/up finished while its last programs still run, instead of waiting for the
# whole launch. Off: down waits for gate/up to complete (PDL). H100 2026-12-06 (4598b02), the
# batch-64 step's replay 14.10 -> 13.67 ms (down 55.1 -> 48.2 us a layer on the critical path),
# 64 streams 4651 decode tok/s; at 4f7e8c3 4622 against 4499 off at 9a3104b (test_moe's handoff
# cases passed on the H100 there).
MOE_HANDOFF = _flag("MOE_HANDOFF", True)

# Up to this many tokens the grouped MoE's decode tiles with MOE_HANDOFF take each block straight
# from the router's ids (moe_grouped UNSORTED: routed expert e's first 8 pairs are block e, its
# further ones in blocks after every expert's first), so no sort launch runs between the router
# and gate/up; None (env 0): the sort's block table. H100 2026-12-07 (114d2cf): the batch-64 step's
# replay 13.093 -> 12.404 ms paired (the sort's 10.1 us a layer gone, the grouped launches 87.9 ->
# 85.8 us each), 64 streams 4789 -> 5145 decode tok/s; its GPU tests passed at 8, 64 and 256
# tokens. At 256 tokens slower (272baaf: replay 25.26 -> 28.14 ms, the grouped launches 128.9 ->
# 164.8 us each: every program scans 1536 ids); 65-255 not timed.
MOE_UNSORTED_MAX_TOKENS = _tokens("MOE_UNSORTED_MAX_TOKENS", 64)

# From this many tokens the grouped MoE runs the shared expert apart, as dense GEMMs of every
# token (moe_grouped.shared_expert_dense), and the combine adds its rows; None (env 0): it is one
# more pair a token in the grouped launches. The shared expert is a quarter of a prefill chunk's
# MoE FLOPs, which the grouped tiles run at ~220 TFLOP/s and the W4A16 prefill GEMMs at ~530.
# H100 2026-12-07 (b3bc4e7, sweep_tiles.py --only moe --tokens 8192): 1907 -> 1739 us a layer
# (predicted -230); 1024-4096 tokens not timed yet (the sweep's rows at those sizes pair it).
# The interpreter's tests take batches from 32 tokens through it.
MOE_SHARED_DENSE_MIN_TOKENS = _tokens("MOE_SHARED_DENSE_MIN_TOKENS", 32 if INTERPRET else 1024)

# (BLOCK_M, BLOCK_N gate/up, BLOCK_N down, BLOCK_K, warps, stages[, registers a thread]) of the
# grouped MoE's launches (moe_grouped.py; the registers as ptxas's .maxnreg); None:
# moe_grouped._tiles by the mean rows an expert. tools/bench/sweep_tiles.py. (No cap by default: at
# 64 tokens caps of 64-96 registers, for 5-8 programs an SM, took 192.6-231.0 us against 176.1,
# H100 2026-12-07, 7d6a687.)
MOE_GROUPED_TILES: tuple[int, ...] | None = None
# (BLOCK_M, BLOCK_N, warps, stages, K splits or 0 for the launcher's) of the W4A16 GEMM's decoding
# tiles (batches above the GEMV's tokens, below FP4_DEQUANT_MIN_TOKENS); None: nvfp4_linear._gemm_tiles.
FP4_GEMM_TILES: tuple[int, int, int, int, int] | None = None

# (BLOCK_M rows = query tokens x padded GQA heads, BLOCK_N keys, warps, stages) of prefill
# attention's tiles (prefill_attention.py); None: the launcher's, prefill_attention.PAGE_TILES for
# whole pages, else (128, 64, 8, 3) (303-329 TFLOP/s on an H200, 2026-12-02).
# tools/bench/sweep_tiles.py --only prefill_attention.
PREFILL_ATTENTION_TILES: tuple[int, int, int, int] | None = None
# Whole pages of a paged cache that holds the step's keys (full layers) read through tensor
# descriptors (TMA) instead of gathered rows, two pages a key tile (prefill_attention.PAGE_TILES).
# H100 2026-12-06, an 8192-token chunk at 92160 cached positions: 296 -> 452 TFLOP/s (at 0: 308 -> 448).
PREFILL_ATTENTION_TMA = _flag("PREFILL_ATTENTION_TMA", True)

# --- the router at prefill chunks (router.py) ---
# The fp32 router weight's three bf16 parts (router.weight_parts: one launch a chunk, 3 MB) are
# loaded by the prefill tiles instead of each of the 1024 programs of an 8192-token chunk
# splitting its weight tiles again (~7 instructions a weight). H100 2026-12-07 (6ce1c89,
# sweep_tiles.py --only router --tokens 8192): 166.8 -> 119.4 us a layer in the default 32 x 64
# tiles (16 x 64: 253.5 -> 170.0, 64 x 64: 227.3 -> 153.3), the same bits there (its GPU test);
# a tile the parts move onto wgmma (64 x 32) sums in another order. Off: each program splits.
ROUTER_WEIGHT_PARTS = _flag("ROUTER_WEIGHT_PARTS", True)

# --- the W4A16 prefill GEMM (nvfp4_linear.py) ---
# From this many tokens the weight is decoded once into a dense scratch the GEMM tiles load
# (env 0: None, the tiles decode it in their K loop; bench_kernels.py times both). H100
# 2026-12-05, qkv at 8192 tokens: 552 -> 345 us. The interpreter's tests take small chunks through it.
FP4_DEQUANT_MIN_TOKENS = _tokens("FP4_DEQUANT_MIN_TOKENS", 32 if INTERPRET else 256)
# o_proj's decoding tiles at decode batches take the attention output in fp16, written so by
# decode attention (rounded to bf16 first), instead of converting x in every K step of every
# column tile: sm_90 K loop at 64 tokens 306 -> 188 instructions a step (compile_kernels.py
# --loop-loads --only "nvfp4_linear o T=64"). Same bits on a GPU. H100 2026-12-07 (34b09c5,
# sweep_tiles.py --only w4a16 --tokens 64): o_proj 13.7 -> 11.0 us; the same for qkv (the RMSNorm
# writing fp16) measured 13.6 -> 18.2 and the LM head 217 -> 252, so only o_proj has it; with all
# three (and the MoE's prefill tiles taking fp16 x, since removed) the 64-stream step was 13.94
# ms against 13.72 (not paired). o_proj alone, H100 2026-12-07 (c55af0f): the batch-64 step's
# replay 13.428 -> 13.402 and 13.120 -> 13.094 ms in two paired timelines (bench_step_timeline.py
# --variant), 64 streams 4742 -> 4749 decode tok/s (bench.py), its GPU tests passed.
FP4_GEMM_F16_ACTIVATIONS = _flag("FP4_GEMM_F16_ACTIVATIONS", True)
# (BLOCK_M, BLOCK_N, warps, stages) of the GEMM over the decoded weight; None:
# nvfp4_linear._gemm_tiles (256 x 128 from DEQUANT_WIDE_M_TOKENS). H100 2026-12-05: (128, 256, 8,
# 3) took qkv 350 us against 345 (bench_kernels.py's row, pointer tiles).
FP4_DEQUANT_GEMM_TILES: tuple[int, int, int, int] | None = None
# The GEMM over the decoded weight reads x and weight tiles through tensor descriptors (TMA)
# instead of per-thread pointer copies, where both are 2-byte, K-contiguous and 16-byte aligned
# (no address arithmetic or masks in the K loop). H100 2026-12-07 (41a0aec, sweep_tiles.py --only
# w4a16 --tokens 8192): qkv 302 -> 294 us, o_proj 232 -> 224 in 128 x 128 tiles, 267 and 204 in
# 256 x 128 (nvfp4_linear._gemm_tiles); an 8192-token chunk at 92160 cached positions 527.6 ->
# 524.1 ms, 521.6 with the 256-row tiles (bench_step_timeline.py --variant, paired).
FP4_DEQUANT_GEMM_TMA = _flag("FP4_DEQUANT_GEMM_TMA", True)

# --- the decode GEMVs (dense_gemv.py, nvfp4_linear.py) ---
# Up to this many K steps a split loads before its PDL wait (1..4). H200 2026-12-03: the BF16
# o_proj (K = 4096) in one split of four: 2.838 -> 2.793 ms.
GEMV_PREFETCH_STEPS = 4
# Rows a program of a launch left as one split of 3-4 prefetched steps (o_proj); None: the
# launcher's rows. H200 2026-12-04: BF16 2.818 -> 2.809 ms in three paired runs (2 rows: no better).
DENSE_GEMV_UNSPLIT_ROWS: int | None = 4
# The same for an NVFP4 launch that would split K over its <= 4 word steps: one split instead. H200
# 2026-12-04: 2.268 -> 2.230 ms (8 rows 2.235; None: the split). The interpreter: few, large programs.
FP4_GEMV_UNSPLIT_ROWS: int | None = 64 if INTERPRET else 4
# Rows a program where N >= *_WIDE_N. Dense: the interpreter's only (a tiny model's LM head in few
# programs). NVFP4: the dense MLP's gate/up (20480 rows), H200 2026-12-04: 13.3 -> 11.8-12.1 us.
DENSE_GEMV_WIDE_N, DENSE_GEMV_WIDE_ROWS = 4096, (1024 if INTERPRET else None)
# (Measured on the former 10240-wide dense MLP: flint-40b's official one is 6144, gate/up 12288 rows,
# below FP4_GEMV_WIDE_N, so only the NVFP4 LM head takes 16 rows now; the long-K splits below
# meet K = 6144: to re-measure.)
FP4_GEMV_WIDE_N, FP4_GEMV_WIDE_ROWS = 16384, (None if INTERPRET else 16)
# K splits of a launch whose K takes more steps than a split prefetches (the dense MLP's down,
# K = 10240); None: the launcher's. H200 2026-12-04: BF16 one split through the pipelined loop,
# 19.3-20.0 -> 15.1-16.6 us (2.779 -> 2.774 ms); NVFP4 five prefetching splits, 11.0 -> 9.7 us.
DENSE_GEMV_LONG_K_SPLITS: int | None = None if INTERPRET else 1
FP4_GEMV_LONG_K_SPLITS: int | None = None if INTERPRET else 5

# --- the small-batch MoE (moe_gemv.py) ---
# Rows a program of the gate/up and the per-expert down launch; None: rows shrink until ~2
# programs an SM. H200 2026-12-04: gate/up at 4 or 16 rows 2.380 / 2.631 ms against 2.276.
# tools/bench/sweep_fp4_decode.py varies them.
MOE_GATE_UP_ROWS: int | None = None
MOE_DOWN_ROWS: int | None = None

# --- the op table (flint_backend/ops.py) ---
# Warps of a decode-attention reduce program before an NVFP4 o_proj (decode_attention.REDUCE_WARPS
# otherwise). H200 2026-12-04: NVFP4 2.222 -> 2.209 ms; BF16 lost with 4 (2.800 -> 2.817).
NVFP4_REDUCE_WARPS = 4
# The final RMSNorm folded into the LM head's GEMV. H200 2026-12-04: 2.103 ms both ways (the
# head's 138.8 us of the critical path either way); on: one launch fewer.
HEAD_FOLD_NORM = _flag("HEAD_FOLD_NORM", True)


def snapshot() -> dict:
    """Every switch's present value by name (what a benchmark's JSON records)."""
    return {name: value for name, value in sorted(globals().items()) if name.isupper()}
