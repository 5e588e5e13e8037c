"""Small-batch MoE (decode): two GEMV launches that read only the chosen experts' weights, no
sorting. Semantics are `moe.fused_moe_torch` (numerics in moe.py); weights dense or NVFP4
(nvfp4.py), each of the four weights independently.

  gate/up  program (slot, BLOCK_N rows): slot = (token t, k) for the K routed choices, then the
           shared expert's chunks (shared_chunks: Is / I slots of I rows where they fit 8
           slots, flint-40b's 1024 as two of 512; else one slot of Is rows) riding in the same
           launch; streams its expert's gate and up rows once, then SiLU(gate) * up rounded as
           swiglu.silu_mul_rounded -> inter [T * SLOTS, max(I, CS)].
  down     program (token, BLOCK_H output dims): the down-projection rows of each of the
           token's slots; each routed expert's output rounded to x.dtype, combined in fp32
           with the router weights, rounded; the shared expert's chunks summed in fp32, rounded
           (one rounding, as one slot); the two added, rounded -> out [T, H]. The combine needs
           no atomics and is deterministic.
Row blocks shrink until the grid gives ~2 programs per SM: at batch 1 the 8 slots' 3 x 2048 x
512 weights (50 MB in bf16) spread over every SM.
Tokens that chose the same expert each read it (L2 absorbs most re-reads at these sizes).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import nvfp4, tuning
from .nvfp4 import (fp4_dot_loaded, fp4_dot_words, fp4_scale_unit, fp4_word_columns, fp4_x_block, fp4_x_unit,
                    is_nvfp4, weight_args, weight_tile)
from .pdl import launch_args, pdl_prologue, poll_at_least
from .router import ROUTING_COLS, route_from_logits
from .split_k import num_sms
from .swiglu import silu_mul_rounded
from .tuning import INTERPRET

# GPU: [rows, k] step tiles of TILE weights (32 fp32 registers a thread at 4 warps), rows shrunk
# until the grid fills the SMs; the interpreter runs few, large programs (its cost is per op)
MAX_BLOCK_K, TILE, MIN_ROWS, MAX_ROWS = (256, 1 << 16, 4, 256) if INTERPRET else (512, 4096, 4, 32)
WAVES = 2
NUM_STAGES = 3               # weight tiles in flight per program (cp.async through shared memory)
WARPS = 4                    # per program, both launches (bytes decode)
# NVFP4 as 32-bit words (tuning.FP4_MOE_WORDS, FP4_MOE_DOWN_WORDS): a thread's x values must serve
# many rows, since each costs a load and a conversion. gate/up: a step spans WORDS_TILE weights of
# the 2 x BLOCK_N interleaved rows (1024 of H at 8 rows: two steps), and where H is one or two
# whole steps the programs load x as 16-byte blocks right after the PDL wait, before the pick
# (their word and scale offsets computed before the wait), then every word of their rows at once:
# x's round trip runs under the logits load and the top-k (H200 2026-12-04: gate/up 8.31 -> 7.47
# us a layer, NVFP4 100K 2.309 -> 2.276 ms a token; the offsets first 2.109 -> 2.103). Longer H:
# the pipelined loop with x read by stride-8 loads, which come through cp.async with the weights
# and hit L1 (blocks there cost a layout conversion a step: 8.39 -> 8.98 us). down: a program
# loads DOWN_WORDS_ROWS rows of all the token's experts at once (_moe_down_words_kernel), the
# SwiGLU outputs as 16-byte blocks of a word's 8 values (eight stride-8 loads went one round trip
# after another: down 5.18 -> 4.32 us a layer, H200 2026-12-03) and the global scales before the
# wait (4.32 against 4.52 us after the dot). 8 rows (256 programs at batch 1, 80 registers): down
# 4.97 -> 4.17 us a layer on the H200's critical path, NVFP4 100K 2.297 -> 2.275 ms (2026-12-04).
WORDS_MAX_K, WORDS_TILE = (256, 1 << 16) if INTERPRET else (2048, 1 << 14)
DOWN_WORDS_ROWS, DOWN_WORDS_WARPS = (16, 4) if INTERPRET else (8, 8)
# Dense (BF16) down weights, up to 8 slots of at most DOWN_DENSE_MAX_I: the same one-load launch
# (_moe_down_dense_kernel), DOWN_DENSE_ROWS rows of every slot a program (4 x 8 x 512 bf16 = 32 KB,
# 128 registers a thread at 2 warps), loaded before the PDL wait (an expert at a time, through
# _moe_down_kernel's pipelined loop: H200 2026-12-03, BF16 100K 3.282 -> 3.085 ms a token); more
# slots or wider experts take that loop.
DOWN_DENSE_ROWS, DOWN_DENSE_MAX_I = (16, 1024) if INTERPRET else (4, 1024)
# Warps a program of that launch. flint-40b's shared expert of 1024 fills all 8 slots
# (shared_chunks): at 2 warps the sm_90 compile takes 255 registers and spills 66-98 bytes a
# thread (four programs an SM, one wave); at 4, 154 registers, no spill, three an SM (1.29 waves).
# The MoE layer alone (tools/bench/bench_kernels.py --only moe), H100 2026-12-06: T=1 22.9 ->
# 20.1 us (74% -> 84% of copy), T=8 123.6 -> 106.2 us, T=64 672 -> 585 us. (With 7 slots, a
# shared expert of 512, 2 warps had won: no spill, one wave; H100 2026-12-05, 2.073 -> 2.035 ms
# a token on flint-40b's first 28 layers, BF16 at 100K.) Read at each launch.
DOWN_DENSE_WARPS = WARPS if INTERPRET else 4


@triton.jit
def _gate_up_rows(x_row_ptr, w_ptr, scales_ptr, scale_ptr, rows, n_rows, up_off, H,
                  stride_wn, stride_sn, stride_gn, BLOCK_K: tl.constexpr, MASK_K: tl.constexpr,
                  FP4: tl.constexpr, NUM_STAGES: tl.constexpr, WORDS: tl.constexpr, PTX: tl.constexpr):
    """-> gate, up [BLOCK_N] fp32 (global scale applied) of one expert's rows `rows` (< n_rows;
    up row r is gate row r + up_off).
    WORDS: an NVFP4 weight comes as int32 words (nvfp4.fp4_dot_words, PTX: its inline-PTX
    decode; x by stride-8 loads), else as bytes. The global scales are loaded before the loop,
    so their round trip overlaps the weights'."""
    row_mask = rows < n_rows
    gate_scale = 1.0
    up_scale = 1.0
    if FP4:
        gate_scale = tl.load(scale_ptr + rows * stride_gn, mask=row_mask, other=0.0)
        up_scale = tl.load(scale_ptr + (rows + up_off) * stride_gn, mask=row_mask, other=0.0)
    USE_WORDS: tl.constexpr = WORDS if FP4 else False
    if USE_WORDS:
        # gate and up rows interleaved in one tile [2 BLOCK_N] (even: gate, odd: up): each x value
        # a thread loads serves twice the rows; acc [2 BLOCK_N, BLOCK_K / 16], a sum per 16 weights
        both, both_mask = _interleaved_rows(rows, n_rows, up_off)
        acc = tl.zeros([2 * rows.shape[0], BLOCK_K // 16], tl.float32)
        for k0 in tl.range(0, H, BLOCK_K, num_stages=NUM_STAGES):
            acc += fp4_dot_words(x_row_ptr, w_ptr, scales_ptr, both, both_mask, k0 // 8, H // 8, stride_wn,
                                 stride_sn, BLOCK_K // 8, MASK_K, PTX)
        gate, up = tl.split(tl.reshape(tl.sum(acc, axis=1), [rows.shape[0], 2]))
    else:
        acc_g = tl.zeros([rows.shape[0], BLOCK_K], tl.float32)
        acc_u = tl.zeros([rows.shape[0], BLOCK_K], tl.float32)
        for k0 in tl.range(0, H, BLOCK_K, num_stages=NUM_STAGES):
            cols = k0 + tl.arange(0, BLOCK_K)
            x = tl.load(x_row_ptr + cols, mask=cols < H, other=0.0).to(tl.float32)
            g = weight_tile(w_ptr, scales_ptr, rows, row_mask, k0, H, stride_wn, stride_sn, BLOCK_K, MASK_K, FP4)
            u = weight_tile(w_ptr, scales_ptr, rows + up_off, row_mask, k0, H, stride_wn, stride_sn, BLOCK_K,
                            MASK_K, FP4)
            acc_g += g * x[None, :]
            acc_u += u * x[None, :]
        gate = tl.sum(acc_g, axis=1)
        up = tl.sum(acc_u, axis=1)
    return gate * gate_scale, up * up_scale  # the global scale, once per output


@triton.jit
def _gate_up_prefetched(x_row_ptr, w_ptr, scales_ptr, scale_ptr, rows, n_rows, up_off, H, stride_gn,
                        BLOCK_K: tl.constexpr,
                        STEPS: tl.constexpr, PTX: tl.constexpr, xa0, xa1, offs):
    """_gate_up_rows for NVFP4 words whose H is STEPS (1 or 2) whole steps, after the PDL
    prologue: every word of the interleaved gate/up rows (offs: _gate_up_offsets) and the global
    scales are loaded at once, then multiplied by x (xa0, xa1: the steps' blocks, _x_blocks).
    -> gate, up."""
    row_mask = rows < n_rows
    kw: tl.constexpr = BLOCK_K // 8
    w_off, s_off, w_mask = offs
    w0 = tl.load(w_ptr + w_off, mask=w_mask, other=0)
    s0 = tl.load(scales_ptr + s_off, mask=w_mask, other=0.0)
    if STEPS > 1:
        w1 = tl.load(w_ptr + w_off + kw, mask=w_mask, other=0)
        s1 = tl.load(scales_ptr + s_off + kw // 2, mask=w_mask, other=0.0)
    gate_scale = tl.load(scale_ptr + rows * stride_gn, mask=row_mask, other=0.0)
    up_scale = tl.load(scale_ptr + (rows + up_off) * stride_gn, mask=row_mask, other=0.0)
    acc = fp4_dot_loaded(x_row_ptr, w0, s0, 0, H // 8, kw, False, PTX, X_BLOCK=True, xa=xa0)
    if STEPS > 1:
        acc += fp4_dot_loaded(x_row_ptr, w1, s1, kw, H // 8, kw, False, PTX, X_BLOCK=True, xa=xa1)
    gate, up = tl.split(tl.reshape(tl.sum(acc, axis=1), [rows.shape[0], 2]))
    return gate * gate_scale, up * up_scale  # the global scale, once per output


@triton.jit
def _gate_up_after_wait(x_row_ptr, w_ptr, scales_ptr, scale_ptr, rows, n_rows, up_off, H, stride_wn, stride_sn,
                        stride_gn, BLOCK_K: tl.constexpr, MASK_K: tl.constexpr, FP4: tl.constexpr,
                        NUM_STAGES: tl.constexpr, WORDS: tl.constexpr, PTX: tl.constexpr, X_FIRST: tl.constexpr,
                        xa0, xa1, offs):
    """gate, up of one expert's rows after the PDL prologue: X_FIRST (1 or 2 word steps): x
    already loaded (xa0, xa1: _x_blocks) and every word loaded at once; else the pipelined loop."""
    if X_FIRST > 0:
        return _gate_up_prefetched(x_row_ptr, w_ptr, scales_ptr, scale_ptr, rows, n_rows, up_off, H, stride_gn,
                                   BLOCK_K, X_FIRST, PTX, xa0, xa1, offs)
    return _gate_up_rows(x_row_ptr, w_ptr, scales_ptr, scale_ptr, rows, n_rows, up_off, H, stride_wn, stride_sn,
                         stride_gn, BLOCK_K, MASK_K, FP4, NUM_STAGES, WORDS, PTX)


@triton.jit
def _interleaved_rows(rows, n_rows, up_off):
    """Gate row r and up row up_off + r of each of `rows` [R] (< n_rows), interleaved -> ([2R],
    its mask)."""
    row_mask = rows < n_rows
    both = tl.reshape(tl.join(rows, rows + up_off), [2 * rows.shape[0]])
    return both, tl.reshape(tl.join(row_mask, row_mask), [2 * rows.shape[0]])


@triton.jit
def _gate_up_offsets(rows, n_rows, up_off, stride_wn, stride_sn, KW: tl.constexpr):
    """Offsets of step 0's words [2R, KW] and block scales [2R, KW / 2] of the interleaved gate
    and up rows (gate row r, up row up_off + r; the next step adds KW and KW / 2), and their mask."""
    both, both_mask = _interleaved_rows(rows, n_rows, up_off)
    w_off = both[:, None] * stride_wn + tl.arange(0, KW)[None, :]
    s_off = both[:, None] * stride_sn + tl.arange(0, KW // 2)[None, :]
    return w_off, s_off, both_mask[:, None]


@triton.jit
def _x_blocks(x_row_ptr, H, BLOCK_K: tl.constexpr, STEPS: tl.constexpr):
    """x of a gate/up program's STEPS (1 or 2) steps as [BLOCK_K / 8, 8] blocks (fp4_x_block),
    loaded at once. -> (step 0's, step 1's; step 0's again when STEPS == 1)"""
    kw: tl.constexpr = BLOCK_K // 8
    xa0 = fp4_x_block(x_row_ptr, x_row_ptr, 0, H // 8, kw, False)
    xa1 = xa0
    if STEPS > 1:
        xa1 = fp4_x_block(x_row_ptr, x_row_ptr, kw, H // 8, kw, False)
    return xa0, xa1


@triton.jit
def _slot_expert(ids_ptr, logits_ptr, t, k, E, K: tl.constexpr, ROUTE: tl.constexpr,
                 RENORMALIZE: tl.constexpr, E_POW2: tl.constexpr):
    """Expert id (int64; 0 for the shared slot k == K) of token t's slot k: the router's ids, or
    (ROUTE) picked from the router's logits (router.route_from_logits), with all the token's picks (ids [1, 8] int32, router weights [1, 8] fp32; unused without
    ROUTE), by tl.topk's bitonic network (the same picks as TOP_K rounds of a max; H200
    2026-12-03: gate/up 9.05 -> 8.54 us a layer, NVFP4 100K 2.475 -> 2.457 ms a token). Ids and
    logits are read past L1."""
    if ROUTE:
        ids, mix = route_from_logits(logits_ptr, t + tl.arange(0, 1), tl.full([1], True, tl.int1), E, K,
                                     RENORMALIZE, E_POW2, 8, True)
        e = tl.sum(tl.where(tl.arange(0, 8)[None, :] == k, ids, 0))
    else:
        e = tl.load(ids_ptr + t * K + k, mask=k < K, other=0, cache_modifier=".cg")
        ids = tl.zeros([1, 8], tl.int32)
        mix = tl.zeros([1, 8], tl.float32)
    return tl.where(k < K, e, 0).to(tl.int64), ids, mix


@triton.jit
def _publish_routing(routing_ptr, t, ids, mix, K: tl.constexpr):
    """Token t's picks for the down launch: the weights' bits, then (release) each id + 1, which
    the down programs wait for (_token_routing); the router zeroed the row this step."""
    j = tl.arange(0, 8)
    row = routing_ptr + t * ROUTING_COLS
    tl.store(row + 8 + j, tl.reshape(mix, [8]).to(tl.int32, bitcast=True), mask=j < K)
    tl.debug_barrier()  # every thread's weight stores precede the ids' release
    tl.atomic_xchg(row + j, tl.reshape(ids, [8]) + 1, mask=j < K, sem="release", scope="gpu")


@triton.jit
def _moe_gate_up_kernel(
    x_ptr,                # [T, H]
    ids_ptr,              # [T, K] int32 (not ROUTE)
    logits_ptr,           # [T, E] fp32 router logits (ROUTE)
    routing_ptr,          # [T, ROUTING_COLS] int32 handoff to the down launch (ROUTE), zeroed by the router
    inter_ptr,            # [T * SLOTS, max(I, CS)] in x.dtype
    w13_ptr, w13_scales_ptr, w13_scale_ptr,   # routed [E, 2I, H] (dense or NVFP4)
    s13_ptr, s13_scales_ptr, s13_scale_ptr,   # shared [2Is, H] (read when SLOTS > K)
    w13_se, w13_sn, w13_sse, w13_ssn, w13_sge, w13_sgn,
    s13_se, s13_sn, s13_sse, s13_ssn, s13_sge, s13_sgn,
    H, I, IS, CS, stride_xt, stride_inter, E,
    K: tl.constexpr, SLOTS: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    MASK_K: tl.constexpr, W13_FP4: tl.constexpr, S13_FP4: tl.constexpr, NUM_STAGES: tl.constexpr,
    WORDS: tl.constexpr, PTX: tl.constexpr, X_FIRST: tl.constexpr,
    ROUTE: tl.constexpr, RENORMALIZE: tl.constexpr, E_POW2: tl.constexpr,
    PDL: tl.constexpr,
):
    """Program (slot, BLOCK_N rows) over the SLOTS slots of each token: K routed experts, then
    the shared expert's SLOTS - K chunks of CS intermediate rows each (rows [c CS, (c + 1) CS)
    of its gate and of its up, which lie IS rows on). ROUTE: a routed program
    picks its expert from the router's logits itself (route_from_logits), instead of reading the
    router's ids, and program (t, slot 0, rows 0) hands the token's picks to the down launch
    (_publish_routing). X_FIRST (NVFP4 words, 1 or 2 steps spanning H): the rows' word and scale
    offsets are computed before the PDL prologue and x is loaded right after it, before the pick,
    then every word of the rows at once (_gate_up_prefetched)."""
    slot = tl.program_id(0)
    nb = tl.program_id(1)
    t = slot // SLOTS
    k = slot % SLOTS
    n_rows = tl.where(k < K, I, CS)
    up_off = tl.where(k < K, I, IS)
    if nb * BLOCK_N >= n_rows:
        return
    rows = nb * BLOCK_N + tl.arange(0, BLOCK_N)
    x_row = x_ptr + t.to(tl.int64) * stride_xt
    offs = None
    if X_FIRST > 0:  # the rows' word and scale offsets: index math, before the wait
        offs = _gate_up_offsets(rows, n_rows, up_off, tl.where(k < K, w13_sn, s13_sn),
                                tl.where(k < K, w13_ssn, s13_ssn), BLOCK_K // 8)
    pdl_prologue(PDL)
    xa0 = None
    xa1 = None
    if X_FIRST > 0:
        xa0, xa1 = _x_blocks(x_row, H, BLOCK_K, X_FIRST)  # before the pick: it needs no expert id
    if k < K:
        e, ids, mix = _slot_expert(ids_ptr, logits_ptr, t, k, E, K, ROUTE, RENORMALIZE, E_POW2)
        if ROUTE and k == 0 and nb == 0:
            _publish_routing(routing_ptr, t, ids, mix, K)
        gate, up = _gate_up_after_wait(x_row, w13_ptr + e * w13_se, w13_scales_ptr + e * w13_sse,
                                       w13_scale_ptr + e * w13_sge, rows, n_rows, up_off, H, w13_sn, w13_ssn,
                                       w13_sgn, BLOCK_K, MASK_K, W13_FP4, NUM_STAGES, WORDS, PTX, X_FIRST, xa0, xa1,
                                       offs)
    else:  # the shared expert's chunk k - K: its first gate row
        r0 = (k - K).to(tl.int64) * CS
        gate, up = _gate_up_after_wait(x_row, s13_ptr + r0 * s13_sn, s13_scales_ptr + r0 * s13_ssn,
                                       s13_scale_ptr + r0 * s13_sgn, rows, n_rows, up_off, H, s13_sn, s13_ssn,
                                       s13_sgn, BLOCK_K, MASK_K, S13_FP4, NUM_STAGES, WORDS, PTX, X_FIRST, xa0, xa1,
                                       offs)
    h = silu_mul_rounded(gate, up, inter_ptr.dtype.element_ty)
    tl.store(inter_ptr + slot.to(tl.int64) * stride_inter + rows, h, mask=rows < n_rows)


@triton.jit
def _down_rows(a_ptr, stride_a, w_ptr, scales_ptr, scale_ptr, ids_ptr, mix_ptr, rows, row_mask, n_experts, n_k,
               stride_we, stride_wn, stride_se, stride_sn, stride_ge, stride_gn, dtype: tl.constexpr,
               BLOCK_K: tl.constexpr, MASK_K: tl.constexpr, FP4: tl.constexpr, NUM_STAGES: tl.constexpr):
    """-> [BLOCK_H] fp32: sum over j < n_experts of mix[j] * (rows `rows` of expert ids[j]'s down
    projection applied to row j of A, rounded to `dtype`). ids_ptr None: the shared expert's
    chunks j (e = j: stride_we and stride_se step to the chunk's first column), weight 1, summed
    unrounded (the caller rounds the shared expert's output once).
    One flat pipelined loop over (expert, k chunk): the next expert's weights stream in while
    this one finishes."""
    n_chunks = tl.cdiv(n_k, BLOCK_K)
    acc = tl.zeros([rows.shape[0], BLOCK_K], tl.float32)
    out = tl.zeros([rows.shape[0]], tl.float32)
    for it in tl.range(0, n_experts * n_chunks, num_stages=NUM_STAGES):
        j = it // n_chunks
        k0 = (it % n_chunks) * BLOCK_K
        e = j.to(tl.int64) if ids_ptr is None else tl.load(ids_ptr + j).to(tl.int64)
        cols = k0 + tl.arange(0, BLOCK_K)
        a = tl.load(a_ptr + j * stride_a + cols, mask=cols < n_k, other=0.0).to(tl.float32)
        w = weight_tile(w_ptr + e * stride_we, scales_ptr + e * stride_se, rows, row_mask, k0, n_k,
                        stride_wn, stride_sn, BLOCK_K, MASK_K, FP4)
        acc += w * a[None, :]
        if k0 + BLOCK_K >= n_k:  # the expert's last chunk: its output, rounded, weighted
            y = tl.sum(acc, axis=1)
            if FP4:  # the global scale, once per output
                y *= tl.load(scale_ptr + e * stride_ge + rows * stride_gn, mask=row_mask, other=0.0)
            if ids_ptr is None:
                out += y
            else:
                out += tl.load(mix_ptr + j) * y.to(dtype).to(tl.float32)
            acc = tl.zeros([rows.shape[0], BLOCK_K], tl.float32)
    return out


@triton.jit
def _moe_down_kernel(
    inter_ptr,            # [T * SLOTS, max(I, CS)]
    ids_ptr,              # [T, K] int32
    topk_weights_ptr,     # [T, K] fp32
    out_ptr,              # [T, H], contiguous
    w2_ptr, w2_scales_ptr, w2_scale_ptr,      # routed [E, H, I]
    s2_ptr, s2_scales_ptr, s2_scale_ptr,      # shared [H, Is] (read when SLOTS > K)
    w2_se, w2_sn, w2_sse, w2_ssn, w2_sge, w2_sgn,
    s2_se, s2_sn, s2_sse, s2_ssn, s2_sge, s2_sgn,
    H, I, CS, s2_chunk, s2_chunk_scales, stride_inter,
    K: tl.constexpr, SLOTS: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_K: tl.constexpr,
    MASK_I: tl.constexpr, MASK_CS: tl.constexpr, W2_FP4: tl.constexpr, S2_FP4: tl.constexpr,
    NUM_STAGES: tl.constexpr,
    PDL: tl.constexpr,
):
    """Program (token, BLOCK_H output dims): each routed expert's down projection, rounded,
    weighted in fp32, rounded; the shared expert's SLOTS - K chunks (CS columns each: s2_chunk,
    s2_chunk_scales elements of its pointers apart) summed in fp32, rounded; the two added,
    rounded."""
    pdl_prologue(PDL)
    t = tl.program_id(0).to(tl.int64)
    rows = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    row_mask = rows < H
    dtype = out_ptr.dtype.element_ty
    a_row = inter_ptr + t * SLOTS * stride_inter
    routed = _down_rows(a_row, stride_inter, w2_ptr, w2_scales_ptr, w2_scale_ptr, ids_ptr + t * K,
                        topk_weights_ptr + t * K, rows, row_mask, K, I, w2_se, w2_sn, w2_sse, w2_ssn, w2_sge,
                        w2_sgn, dtype, BLOCK_K, MASK_I, W2_FP4, NUM_STAGES)
    out = routed.to(dtype)
    if SLOTS > K:  # the shared expert: no expert index, weight 1
        shared = _down_rows(a_row + K * stride_inter, stride_inter, s2_ptr, s2_scales_ptr, s2_scale_ptr, None, None,
                            rows, row_mask, SLOTS - K, CS, s2_chunk, s2_sn, s2_chunk_scales, s2_ssn, 0, s2_sgn,
                            dtype, BLOCK_K, MASK_CS, S2_FP4, NUM_STAGES)
        out = (out.to(tl.float32) + shared.to(dtype).to(tl.float32)).to(dtype)
    tl.store(out_ptr + t * H + rows, out, mask=row_mask)


@triton.jit
def _token_routing(ids_ptr, topk_weights_ptr, routing_ptr, t, K: tl.constexpr, SLOTS: tl.constexpr,
                   ROUTE: tl.constexpr, PTX: tl.constexpr):
    """The 8 slots of token t in the down launches -> (slot index j, routed (j < K), used
    (j < SLOTS), expert id of the routed ones (int64), router weight of the routed ones (fp32)):
    the router's, or (ROUTE) the gate/up launch's handoff (_publish_routing). Read before the PDL
    prologue: the router is two kernels back (pdl.py); the handoff is written by the gate/up
    launch just before, so its ids are awaited (acquire) until set: every gate/up program is
    resident or done once a down program runs (PDL schedules a launch's programs only after all
    of the previous one's passed their prologue), so the wait ends. Bounded, never a hang."""
    j = tl.arange(0, 8)  # slots: K routed experts, then the shared one
    routed = j < K
    if ROUTE:
        row = routing_ptr + t * ROUTING_COLS
        tagged = poll_at_least(row + j, routed, 1, PTX)  # ids + 1, 0 until published
        e = tl.maximum(tagged - 1, 0)  # a poll that gave up (SPIN_LIMIT) reads expert 0, never out of bounds
        mix = tl.load(row + 8 + j, mask=routed, other=0, cache_modifier=".cg").to(tl.float32, bitcast=True)
    else:
        e = tl.load(ids_ptr + t * K + j, mask=routed, other=0, cache_modifier=".cg")
        mix = tl.load(topk_weights_ptr + t * K + j, mask=routed, other=0.0, cache_modifier=".cg")
    return j, routed, j < SLOTS, e.to(tl.int64), mix


@triton.jit
def _store_combined(y, mix, out_ptrs, row_mask, K: tl.constexpr, SLOTS: tl.constexpr):
    """y [8 slots, BLOCK_H] fp32: each slot's down projection -> the routed ones each rounded to
    out's dtype, combined with the router weights mix [8] in fp32, rounded; the shared expert's
    chunks (slots K .. SLOTS - 1) summed in fp32, rounded; the two added (weight 1), rounded:
    stored to out_ptrs [BLOCK_H]."""
    dtype = out_ptrs.dtype.element_ty
    j = tl.arange(0, 8)
    routed = j < K
    y_routed = y.to(dtype).to(tl.float32)  # each routed expert's output, rounded
    out = tl.sum(tl.where(routed[:, None], mix[:, None] * y_routed, 0.0), axis=0).to(dtype)
    if SLOTS > K:  # plus the shared expert, weight 1
        shared = tl.sum(tl.where(((j >= K) & (j < SLOTS))[:, None], y, 0.0), axis=0).to(dtype)
        out = (out.to(tl.float32) + shared.to(tl.float32)).to(dtype)
    tl.store(out_ptrs, out, mask=row_mask)


@triton.jit
def _moe_down_words_kernel(
    inter_ptr,            # [T * SLOTS, I_MAX]
    ids_ptr,              # [T, K] int32 (not ROUTE)
    topk_weights_ptr,     # [T, K] fp32 (not ROUTE)
    routing_ptr,          # [T, ROUTING_COLS] int32 the gate/up launch's handoff (ROUTE)
    out_ptr,              # [T, H], contiguous
    w2_ptr, w2_scales_ptr, w2_scale_ptr,      # routed NVFP4 [E, H, I]: int32 words [E, H, I/8]
    s2_ptr, s2_scales_ptr, s2_scale_ptr,      # shared NVFP4 [H, Is]: int32 words (read when SLOTS > K)
    w2_se, w2_sn, w2_sse, w2_ssn, w2_sge, w2_sgn,
    s2_se, s2_sn, s2_sse, s2_ssn, s2_sge, s2_sgn,
    H, I, CS, stride_inter,
    K: tl.constexpr, SLOTS: tl.constexpr, BLOCK_H: tl.constexpr, KW: tl.constexpr, PTX: tl.constexpr,
    ROUTE: tl.constexpr, ACQUIRE_PTX: tl.constexpr, PDL: tl.constexpr,
):
    """Program (token, BLOCK_H output dims): the down projection of all the token's SLOTS slots
    (K routed experts, then the shared expert's chunks of CS columns) in one load of [8 slots,
    BLOCK_H, KW] words (no per-expert loop: the read is one round trip), one reduction over k,
    then combined as _moe_down_kernel combines (_store_combined). The expert
    ids (the router's, two kernels back, or the gate/up launch's handoff), the weight tiles and
    the global scales are loaded before the PDL prologue, so the weight read overlaps the gate/up
    launch (pdl.py)."""
    t = tl.program_id(0).to(tl.int64)
    rows = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    row_mask = rows < H
    j, routed, used, e, mix = _token_routing(ids_ptr, topk_weights_ptr, routing_ptr, t, K, SLOTS, ROUTE, ACQUIRE_PTX)
    n_words = tl.where(routed, I // 8, CS // 8)  # [8]
    c = tl.maximum(j - K, 0).to(tl.int64)  # the shared expert's chunk of a slot >= K
    w_base = tl.where(routed, w2_ptr + e * w2_se, s2_ptr + c * (CS // 8))
    w_sn = tl.where(routed, w2_sn, s2_sn)
    s_base = tl.where(routed, w2_scales_ptr + e * w2_sse, s2_scales_ptr + c * (CS // 16))
    s_sn = tl.where(routed, w2_ssn, s2_ssn)
    kw = tl.arange(0, KW)
    live = used[:, None, None] & row_mask[None, :, None]  # [8, BLOCK_H, 1]
    words = tl.load(w_base[:, None, None] + rows[None, :, None] * w_sn[:, None, None] + kw[None, None, :],
                    mask=live & (kw[None, None, :] < n_words[:, None, None]), other=0)  # [8, BLOCK_H, KW]
    g = tl.arange(0, KW // 2)
    s = tl.load(s_base[:, None, None] + rows[None, :, None] * s_sn[:, None, None] + g[None, None, :],
                mask=live & (g[None, None, :] < n_words[:, None, None] // 2), other=0.0)  # [8, BLOCK_H, KW/2]
    g_ptrs = tl.where(routed, w2_scale_ptr + e * w2_sge, s2_scale_ptr)[:, None] + \
        rows[None, :] * tl.where(routed, w2_sgn, s2_sgn)[:, None]  # [8, BLOCK_H] global scales
    global_scale = tl.load(g_ptrs, mask=used[:, None] & row_mask[None, :], other=0.0)
    pdl_prologue(PDL)  # the SwiGLU outputs come from the gate/up launch just before
    a_rows = inter_ptr + (t * SLOTS + j) * stride_inter  # [8] row j of the token's SwiGLU outputs
    a_mask = used[:, None] & (kw[None, :] < n_words[:, None])
    n8 = tl.arange(0, 8)
    # the word's 8 values in one vector load; [8, BLOCK_H, KW, 8] products summed over the word's 8
    a8 = tl.load(a_rows[:, None, None] + kw[None, :, None] * 8 + n8[None, None, :],
                 mask=a_mask[:, :, None] & (n8 < 8)[None, None, :], other=0.0).to(tl.float32)  # [8, KW, 8]
    w8 = tl.reshape(fp4_word_columns(words, PTX), [8, BLOCK_H, KW, 8])
    part = tl.sum(w8 * (a8 * fp4_x_unit(PTX))[:, None, :, :], axis=3)
    block = tl.sum(tl.reshape(part, [8, BLOCK_H, KW // 2, 2]), axis=3)  # [8, BLOCK_H, KW/2]
    y = tl.sum(block * (s.to(tl.float32) * fp4_scale_unit(PTX)), axis=2)  # [8, BLOCK_H]
    y *= global_scale
    _store_combined(y, mix, out_ptr + t * H + rows, row_mask, K, SLOTS)


@triton.jit
def _moe_down_dense_kernel(
    inter_ptr,            # [T * SLOTS, max(I, CS)]
    ids_ptr,              # [T, K] int32 (not ROUTE)
    topk_weights_ptr,     # [T, K] fp32 (not ROUTE)
    routing_ptr,          # [T, ROUTING_COLS] int32 the gate/up launch's handoff (ROUTE)
    out_ptr,              # [T, H], contiguous
    w2_ptr,               # routed dense [E, H, I]
    s2_ptr,               # shared dense [H, Is] (read when SLOTS > K), in chunks of CS columns
    w2_se, w2_sn, s2_sn,
    H, I, CS, stride_inter,
    K: tl.constexpr, SLOTS: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_I: tl.constexpr,
    ROUTE: tl.constexpr, ACQUIRE_PTX: tl.constexpr,
    PDL: tl.constexpr,
):
    """_moe_down_words_kernel for dense (BF16) weights: program (token, BLOCK_H output dims) loads
    the rows of all the token's SLOTS experts as one [8 slots, BLOCK_H, BLOCK_I] tile before the
    PDL prologue (the expert ids are the router's, two kernels back: pdl.py), then one reduction
    over the intermediate dim, combined as _moe_down_kernel combines (_store_combined)."""
    t = tl.program_id(0).to(tl.int64)
    rows = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    row_mask = rows < H
    j, routed, used, e, mix = _token_routing(ids_ptr, topk_weights_ptr, routing_ptr, t, K, SLOTS, ROUTE, ACQUIRE_PTX)
    n_k = tl.where(routed, I, CS)  # [8]
    w_base = tl.where(routed, w2_ptr + e * w2_se, s2_ptr + tl.maximum(j - K, 0).to(tl.int64) * CS)
    w_sn = tl.where(routed, w2_sn, s2_sn)
    kk = tl.arange(0, BLOCK_I)
    live = used[:, None, None] & row_mask[None, :, None] & (kk[None, None, :] < n_k[:, None, None])
    w = tl.load(w_base[:, None, None] + rows[None, :, None] * w_sn[:, None, None] + kk[None, None, :],
                mask=live, other=0.0)  # [8, BLOCK_H, BLOCK_I]
    pdl_prologue(PDL)  # the SwiGLU outputs come from the gate/up launch just before
    a_rows = inter_ptr + (t * SLOTS + j) * stride_inter  # [8] row j of the token's SwiGLU outputs
    a = tl.load(a_rows[:, None] + kk[None, :], mask=used[:, None] & (kk[None, :] < n_k[:, None]), other=0.0)
    y = tl.sum(w.to(tl.float32) * a.to(tl.float32)[:, None, :], axis=2)  # [8, BLOCK_H]
    _store_combined(y, mix, out_ptr + t * H + rows, row_mask, K, SLOTS)


def moe_gemv(x: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor, w13, w2,
             shared_w13=None, shared_w2=None) -> torch.Tensor:
    """Small-batch path of `moe.fused_moe` (inputs checked there): x [T, H] -> [T, H]."""
    return _moe_gemv(x, topk_ids.shape[1], (topk_ids, topk_weights), None, w13, w2, shared_w13, shared_w2)


def shared_chunks(i: int, i_s: int, top_k: int) -> tuple[int, int]:
    """The shared expert's slots: -> (chunks, CS): its intermediate rows as `chunks` slots of CS
    rows each. Where Is is a multiple of the routed experts' I and the chunks fit the 8 slots of
    the one-load down launches beside the K routed ones, slots of I rows (flint-40b: 6 + 2 of
    512), so every slot is as wide as a routed expert (a 1024-wide slot doubled every slot's tile
    in the one-load down launches: the BF16 one spilled); else one slot of Is rows."""
    if i_s % i == 0 and top_k + i_s // i <= 8:
        return i_s // i, i
    return 1, i_s


def routes_in_experts(w2, shared_w2=None, top_k: int = 1) -> bool:
    """Whether moe_gemv_routed takes these experts: its down launch must be the one-load kernel
    of NVFP4 words or of dense rows (<= 8 slots); the per-expert loop reads the router's ids."""
    shared2 = w2[0] if shared_w2 is None else shared_w2
    i = w2.shape[-1]
    chunks, cs = shared_chunks(i, shared2.shape[-1], top_k) if shared_w2 is not None else (0, i)
    if top_k + chunks > 8:
        return False
    if is_nvfp4(w2) and is_nvfp4(shared2):
        return tuning.FP4_MOE_DOWN_WORDS
    return not is_nvfp4(w2) and not is_nvfp4(shared2) and max(i, cs) <= DOWN_DENSE_MAX_I


def moe_gemv_routed(x: torch.Tensor, logits: torch.Tensor, routing: torch.Tensor, top_k: int, renormalize: bool,
                    w13, w2, shared_w13=None, shared_w2=None) -> torch.Tensor:
    """moe_gemv with the top-k picked inside its launches from the router's fp32 logits [T, E]
    (inputs checked by moe.fused_moe_routed; routes_in_experts holds): each gate/up program
    picks after its PDL wait (router.route_from_logits), so the router launch ends at its logits'
    store; one gate/up program a token hands the picks to the down launch through `routing`
    ([T, 16] int32 that the router launch zeroed: router.rms_norm_router_logits)."""
    return _moe_gemv(x, top_k, None, (logits, routing, bool(renormalize)), w13, w2, shared_w13, shared_w2)


def _moe_gemv(x, k, topk, route, w13, w2, shared_w13, shared_w2):
    """topk: (ids, weights) from the router, or route: (logits, routing handoff, renormalize)."""
    t, h = x.shape
    i = w13.shape[-2] // 2
    has_shared = shared_w13 is not None
    i_s = shared_w13.shape[-2] // 2 if has_shared else i
    chunks, cs = shared_chunks(i, i_s, k) if has_shared else (0, i)
    slots = k + chunks
    i_max = max(i, cs)
    inter = torch.empty((t * slots, i_max), dtype=x.dtype, device=x.device)
    out = torch.empty((t, h), dtype=x.dtype, device=x.device)
    if t == 0:
        return out
    shared13 = shared_w13 if has_shared else w13[0]
    shared2 = shared_w2 if has_shared else w2[0]
    if route is None:
        topk_ids, topk_weights = topk
        logits, handoff, renormalize = topk_weights, topk_ids, False  # unread
    else:
        logits, handoff, renormalize = route
        topk_ids = topk_weights = logits  # unread
    routing = dict(logits_ptr=logits, routing_ptr=handoff, E=logits.shape[1] if route else 1,
                   ROUTE=route is not None, RENORMALIZE=renormalize,
                   E_POW2=max(16, triton.next_power_of_2(logits.shape[1])) if route else 16)
    down_routing = dict(routing_ptr=handoff, ROUTE=route is not None, ACQUIRE_PTX=not INTERPRET)
    # the NVFP4 decode of each launch (nvfp4.py); word tiles when both weights of a launch are
    # NVFP4 (dense rows would not fit them)
    words_up, words_down = tuning.FP4_MOE_WORDS, tuning.FP4_MOE_DOWN_WORDS
    words13 = words_up and is_nvfp4(w13) and is_nvfp4(shared13)
    block_n = tuning.MOE_GATE_UP_ROWS or _rows_per_program(t * slots, i_max, x.device)
    block_k = min(MAX_BLOCK_K, TILE // block_n, triton.next_power_of_2(h))
    if words13:
        block_k = min(WORDS_MAX_K, WORDS_TILE // (2 * block_n), triton.next_power_of_2(h))
    steps = h // block_k if h % block_k == 0 else 0
    _moe_gate_up_kernel[(t * slots, triton.cdiv(i_max, block_n))](
        x_ptr=x, ids_ptr=topk_ids, inter_ptr=inter, **routing, **weight_args("w13", w13, words=words_up),
        **weight_args("s13", shared13, words=words_up),
        H=h, I=i, IS=i_s, CS=cs, stride_xt=x.stride(0), stride_inter=inter.stride(0),
        K=k, SLOTS=slots, BLOCK_N=block_n, BLOCK_K=block_k, MASK_K=h % block_k != 0,
        W13_FP4=is_nvfp4(w13), S13_FP4=is_nvfp4(shared13), NUM_STAGES=NUM_STAGES,
        X_FIRST=steps if words13 and steps <= 2 else 0, **launch_args(x.device),
        WORDS=words_up, PTX=nvfp4.ptx_decode(), num_warps=WARPS)
    if words_down and is_nvfp4(w2) and is_nvfp4(shared2) and slots <= 8:
        _moe_down_words_kernel[(t, triton.cdiv(h, DOWN_WORDS_ROWS))](
            inter_ptr=inter, ids_ptr=topk_ids, topk_weights_ptr=topk_weights, out_ptr=out, **down_routing,
            **weight_args("w2", w2, words=True), **weight_args("s2", shared2, words=True),
            H=h, I=i, CS=cs, stride_inter=inter.stride(0),
            K=k, SLOTS=slots, BLOCK_H=DOWN_WORDS_ROWS, KW=max(2, triton.next_power_of_2(i_max) // 8),
            PTX=nvfp4.ptx_decode(), **launch_args(x.device), num_warps=DOWN_WORDS_WARPS)
        return out
    if not is_nvfp4(w2) and not is_nvfp4(shared2) and slots <= 8 and i_max <= DOWN_DENSE_MAX_I:
        _moe_down_dense_kernel[(t, triton.cdiv(h, DOWN_DENSE_ROWS))](
            inter_ptr=inter, ids_ptr=topk_ids, topk_weights_ptr=topk_weights, out_ptr=out, **down_routing, w2_ptr=w2,
            s2_ptr=shared2, w2_se=w2.stride(0), w2_sn=w2.stride(1), s2_sn=shared2.stride(0),
            H=h, I=i, CS=cs, stride_inter=inter.stride(0), K=k, SLOTS=slots, BLOCK_H=DOWN_DENSE_ROWS,
            BLOCK_I=triton.next_power_of_2(i_max), **launch_args(x.device), num_warps=DOWN_DENSE_WARPS)
        return out
    assert route is None, "routes_in_experts: the per-expert down loop reads the router's ids"
    block_h = tuning.MOE_DOWN_ROWS or _rows_per_program(t, h, x.device)
    block_k = min(MAX_BLOCK_K, TILE // block_h, triton.next_power_of_2(i_max))
    _moe_down_kernel[(t, triton.cdiv(h, block_h))](
        inter_ptr=inter, ids_ptr=topk_ids, topk_weights_ptr=topk_weights, out_ptr=out,
        **weight_args("w2", w2), **weight_args("s2", shared2),
        H=h, I=i, CS=cs, s2_chunk=cs // 2 if is_nvfp4(shared2) else cs,
        s2_chunk_scales=cs // 16 if is_nvfp4(shared2) else 0, stride_inter=inter.stride(0),
        K=k, SLOTS=slots, BLOCK_H=block_h, BLOCK_K=block_k,
        MASK_I=i % block_k != 0, MASK_CS=cs % block_k != 0, W2_FP4=is_nvfp4(w2), S2_FP4=is_nvfp4(shared2),
        **launch_args(x.device),
        NUM_STAGES=NUM_STAGES, num_warps=WARPS)
    return out


def _rows_per_program(items: int, rows: int, device: torch.device) -> int:
    """Largest power of two in [MIN_ROWS, MAX_ROWS] giving at least WAVES programs per SM."""
    block = MAX_ROWS
    while block > MIN_ROWS and items * triton.cdiv(rows, block) < WAVES * num_sms(device):
        block //= 2
    return block
