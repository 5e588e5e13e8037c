"""Grouped MoE GEMM (prefill and large batches): semantics are `moe.fused_moe_torch`.

A "pair" is (token t, slot k): slots 0..K-1 are the routed choices, slot K the shared expert
(expert id E), so pair p = t * SLOTS + k. `moe_sort.sort_pairs` (one launch; two at prefill
sizes) orders the pairs by expert into blocks of BLOCK_M rows; the grid is sized from the
host-side bound cdiv(P, BLOCK_M) + E + 1 and blocks past the real count exit at once. Then
three launches:
  gate/up  program (block, BLOCK_N intermediate cols): x rows gathered by token, tl.dot with
           the gate and the up tile of the block's expert, SiLU * up -> inter [P, I] (x.dtype)
  down     program (block, BLOCK_N hidden cols): inter rows @ W2[e].T -> ys [P, H] (x.dtype)
  combine  program (token, BLOCK_H): routed outputs weighted in fp32, rounded, + shared output.
Each expert's weight tile is read once per block of its tokens; NVFP4 tiles are decoded in
registers to exact values before the dot (fp16, with x as fp16: tuning.FP4_MMA_F16; else
bf16), the global scale applied to the accumulator. Decode batches (up to 8 rows an expert,
NVFP4) take blocks of 8 tokens computed transposed (SWAP) and, with every weight NVFP4, the
activations in fp16 in the halves layout (HALVES, halves.py: x converted by to_halves, inter
written so by gate/up); with tuning.MOE_HANDOFF, down takes each block once gate/up counted its
tiles stored (HANDOFF), not after the whole gate/up launch, and up to tuning.MOE_UNSORTED_MAX_TOKENS
tokens both take their blocks straight from the router's ids, with no sort launch (UNSORTED:
blocks_from_ids_torch is the table they make).
The shared expert is one pair of its full width Is (any size; its blocks span max(I, Is)); from
tuning.MOE_SHARED_DENSE_MIN_TOKENS tokens (prefill chunks) it runs apart instead, as the dense
GEMMs of every token (nvfp4_linear, or cuBLAS for a dense weight, and silu_mul: the same
roundings), and the combine adds its rows.
Numerics are moe.py's: fp32 dot accumulation, gate/up/silu/product and each expert output
rounded to x's dtype, the routed combine in fp32 rounded once, the shared output added, rounded.
First-use compiles: Triton compiles a kernel again for each new class of an int argument (== 1,
divisible by 16, neither) and each new constexpr value, and an eager step meets the token count
of its batch, so the counts of tokens (here, in moe_sort.py and in nvfp4_linear's GEMM, used only
in masks and loop bounds) are do_not_specialize, and no constexpr is computed from one but
IDS_POW2, which only the UNSORTED blocks read (tools/bench/token_specialisations.py counts what is left).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from .moe_sort import sort_pairs
from . import tuning
from .halves import dot_halves, halves_col, to_halves
from .nvfp4 import F16_BLOCK_K, F16_TILE_UNIT, is_nvfp4, ptx_decode, weight_args, weight_tile, weight_tile_f16
from .nvfp4_linear import nvfp4_linear
from .pdl import launch_args, pdl_prologue, poll_at_least
from .split_k import arrival_counters, last_to_arrive
from .swiglu import silu_mul, silu_mul_rounded
from .tuning import INTERPRET

DOT_FP32 = INTERPRET  # Triton's interpreter computes bf16 tl.dot wrongly
COMBINE_BLOCK_H = 64 if INTERPRET else 1024
_TL_DTYPES = {torch.float32: tl.float32, torch.bfloat16: tl.bfloat16, torch.float16: tl.float16}


@triton.jit
def _dot_rows(acc, a_rows_ptr, a_mask, w_ptr, scales_ptr, rows, row_mask, n_k, stride_wn, stride_sn,
              BLOCK_K: tl.constexpr, MASK_K: tl.constexpr, FP4: tl.constexpr, DOT_FP32: tl.constexpr,
              DOT_PRECISION: tl.constexpr, F16: tl.constexpr, PTX: tl.constexpr, SWAP: tl.constexpr,
              HALVES: tl.constexpr):
    """acc [BLOCK_M, BLOCK_N] += A [BLOCK_M, n_k] @ W[rows, :n_k].T; a_rows_ptr [BLOCK_M] row pointers.
    SWAP: acc [BLOCK_N, BLOCK_M] += W @ A.T (the weight rows on the MMA's M side, the tokens on
    its N side: 8 tokens fill an MMA's N of 8, where M takes 16).
    F16 (NVFP4): tiles decoded to fp16 (nvfp4.weight_tile_f16) and A taken as fp16.
    HALVES (SWAP, F16): A is fp16 in the halves layout (halves.dot_halves)."""
    if HALVES:
        return dot_halves(acc, a_rows_ptr, a_mask, w_ptr, scales_ptr, rows, row_mask, 0, n_k, stride_wn, stride_sn,
                          BLOCK_K, DOT_FP32, DOT_PRECISION, PTX)
    for k0 in range(0, n_k, BLOCK_K):
        cols = k0 + tl.arange(0, BLOCK_K)
        mask = a_mask[:, None]
        if MASK_K:
            mask = mask & (cols[None, :] < n_k)
        a = tl.load(a_rows_ptr[:, None] + cols[None, :], mask=mask, other=0.0)
        if F16:
            w = weight_tile_f16(w_ptr, scales_ptr, rows, row_mask, k0, n_k, stride_wn, stride_sn, BLOCK_K, MASK_K, PTX)
        else:
            w = weight_tile(w_ptr, scales_ptr, rows, row_mask, k0, n_k, stride_wn, stride_sn, BLOCK_K, MASK_K, FP4)
        if DOT_FP32:
            a = a.to(tl.float32)
            w = w.to(tl.float32)
        elif F16:
            a = a.to(tl.float16)
        else:
            w = w.to(a.dtype)  # NVFP4: E2M1 * E4M3 is exact in bf16 / fp16
        if SWAP:
            acc = tl.dot(w, tl.trans(a), acc, input_precision=DOT_PRECISION)
        else:
            acc = tl.dot(a, tl.trans(w), acc, input_precision=DOT_PRECISION)
    return acc


@triton.jit
def _expert_gemm(acc, acc_up, a_rows_ptr, a_mask, w_ptr, scales_ptr, scale_ptr, cols_n, n_out, n_k,
                 stride_wn, stride_sn, stride_gn, GATE_UP: tl.constexpr, BLOCK_K: tl.constexpr,
                 MASK_K: tl.constexpr, FP4: tl.constexpr, DOT_FP32: tl.constexpr, DOT_PRECISION: tl.constexpr,
                 F16: tl.constexpr, PTX: tl.constexpr, SWAP: tl.constexpr, HALVES: tl.constexpr):
    """One expert's output tile(s), global scale applied: (out, up) for GATE_UP (gate rows
    cols_n, up rows n_out + cols_n), else (out, unchanged acc_up); transposed with SWAP."""
    col_mask = cols_n < n_out
    unit = F16_TILE_UNIT if F16 else 1.0  # the fp16 tiles' weights / F16_TILE_UNIT
    acc = _dot_rows(acc, a_rows_ptr, a_mask, w_ptr, scales_ptr, cols_n, col_mask, n_k, stride_wn, stride_sn,
                    BLOCK_K, MASK_K, FP4, DOT_FP32, DOT_PRECISION, F16, PTX, SWAP, HALVES)
    if FP4:  # the global scale, once per output
        acc *= _by_col(tl.load(scale_ptr + cols_n * stride_gn, mask=col_mask, other=0.0) * unit, SWAP)
    if GATE_UP:
        acc_up = _dot_rows(acc_up, a_rows_ptr, a_mask, w_ptr, scales_ptr, cols_n + n_out, col_mask, n_k,
                           stride_wn, stride_sn, BLOCK_K, MASK_K, FP4, DOT_FP32, DOT_PRECISION, F16, PTX, SWAP,
                           HALVES)
        if FP4:
            acc_up *= _by_col(tl.load(scale_ptr + (cols_n + n_out) * stride_gn, mask=col_mask, other=0.0) * unit,
                              SWAP)
    return acc, acc_up


@triton.jit
def _by_col(v, SWAP: tl.constexpr):
    """A per-output-column vector broadcast against the accumulator (transposed with SWAP)."""
    if SWAP:
        out = v[:, None]
    else:
        out = v[None, :]
    return out


@triton.jit
def _block_from_ids(ids_ptr, b, T, P, E, shared_blocks, K: tl.constexpr, SLOTS: tl.constexpr, BLOCK_M: tl.constexpr,
                    IDS_POW2: tl.constexpr, E_POW2: tl.constexpr, PAIRS: tl.constexpr):
    """UNSORTED: block b straight from the router's ids [T, K], no sort. Blocks [0, shared_blocks)
    are the shared expert's (expert E, BLOCK_M tokens in order each); block shared_blocks + e holds
    routed expert e's first BLOCK_M pairs (by pair id); the blocks after those hold the experts'
    further pairs, BLOCK_M a block, in expert order. -> (e, pairs [BLOCK_M] int32, P where none);
    without PAIRS (down, which reads the pairs gate/up stored) pairs is only [0, P, ...] for a block
    with pairs, all P for one without."""
    r = tl.arange(0, BLOCK_M)
    s = b - shared_blocks
    if s < 0:
        t = b * BLOCK_M + r
        e = E
        pairs = tl.where(t < T, t * SLOTS + K, P)
    else:
        idx = tl.arange(0, IDS_POW2)
        n = T * K
        ids = tl.load(ids_ptr + idx, mask=idx < n, other=-1)  # [IDS_POW2]: each pair's expert, -1 past n
        e = s
        j = s * 0  # the block's place among its expert's blocks
        if s >= E:
            counts = tl.histogram(ids, E_POW2, mask=idx < n)  # [E_POW2] pairs per expert
            further = tl.maximum((counts + BLOCK_M - 1) // BLOCK_M - 1, 0)
            ends = tl.cumsum(further, 0)
            o = s - E
            e = tl.sum((ends <= o).to(tl.int32), 0)  # the expert whose further blocks hold o (>= E: none)
            j = o - tl.sum(tl.where(tl.arange(0, E_POW2) == e, ends - further, 0), 0) + 1
        hit = ids == e
        if PAIRS:
            rank = tl.cumsum(hit.to(tl.int32), 0) - 1  # [IDS_POW2] the pair's place among e's
            take = hit[None, :] & (rank[None, :] == (j * BLOCK_M + r)[:, None])  # [BLOCK_M, IDS_POW2]
            pair_of = (idx // K) * SLOTS + idx % K
            pairs = tl.where(tl.sum(take.to(tl.int32), 1) > 0, tl.sum(tl.where(take, pair_of[None, :], 0), 1), P)
        else:
            pairs = tl.where((r == 0) & (tl.sum(hit.to(tl.int32), 0) > j * BLOCK_M), 0, P)
    return e, pairs


@triton.jit(do_not_specialize=["P", "T", "shared_blocks"])  # counts of tokens: see the module docstring
def _moe_grouped_kernel(
    a_ptr,               # GATE_UP: x [T, H]; else inter [P, I_MAX] (HALVES: fp16 in the halves layout)
    sorted_pairs_ptr,    # [num_blocks * BLOCK_M] int32 pair ids by expert, P = padding (UNSORTED: gate/up stores them)
    block_expert_ptr,    # [num_blocks] int32 expert of each block, >= NUM_EXPERTS = unused block (not UNSORTED)
    ids_ptr,             # [T, K] int32 the router's expert ids (UNSORTED)
    out_ptr,             # GATE_UP: inter [P, I_MAX] (HALVES: fp16 in the halves layout); else ys [P, H]
    ready_ptr,           # [num_blocks] int32 (HANDOFF): gate/up tiles of each block stored, zero between launches
    done_ptr,            # [num_blocks] int32 (HANDOFF): down tiles of each block past their poll, likewise
    w_ptr, w_scales_ptr, w_scale_ptr,   # routed [E, N, K] (dense or NVFP4)
    s_ptr, s_scales_ptr, s_scale_ptr,   # shared [N_s, K_s] (read when HAS_SHARED)
    w_se, w_sn, w_sse, w_ssn, w_sge, w_sgn,
    s_se, s_sn, s_sse, s_ssn, s_sge, s_sgn,
    P, E, N_EXP, H, I, IS, stride_a, stride_out, tiles_routed, tiles_shared, T, shared_blocks,
    SLOTS: tl.constexpr, GATE_UP: tl.constexpr, UNSORTED: tl.constexpr, K: tl.constexpr,
    IDS_POW2: tl.constexpr, E_POW2: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, MASK_K: tl.constexpr,
    W_FP4: tl.constexpr, S_FP4: tl.constexpr, DOT_FP32: tl.constexpr, DOT_PRECISION: tl.constexpr,
    W_F16: tl.constexpr, S_F16: tl.constexpr, PTX: tl.constexpr, SWAP: tl.constexpr, HALVES: tl.constexpr,
    ROUND_TO: tl.constexpr, HANDOFF: tl.constexpr, PDL: tl.constexpr,
):
    """SWAP: the tiles computed transposed ([BLOCK_N, BLOCK_M], _dot_rows). HALVES (SWAP, both
    weights NVFP4 in fp16 tiles): the activations come in fp16 in the halves layout, and gate/up writes
    inter so. ROUND_TO: x's dtype, gate/up's roundings (silu_mul_rounded).
    HANDOFF (grid: column tiles, then blocks, so blocks finish in order): each gate/up program
    counts its stored tile in ready[block] (release); a down program polls its block's count
    (tiles_routed or tiles_shared gate/up tiles: acquire) and computes while gate/up's last
    programs still run; only its stores wait for the whole gate/up launch (pdl.py).
    UNSORTED (HANDOFF): each block from the router's ids (_block_from_ids, no sort launch); gate/up's
    column tile 0 stores its block's pairs for down, which reads them once its poll has seen every
    gate/up tile of the block counted."""
    if HANDOFF:
        col_tile, b = tl.program_id(0), tl.program_id(1)
    else:
        col_tile, b = tl.program_id(1), tl.program_id(0)
    if not HANDOFF or GATE_UP:
        pdl_prologue(PDL)  # (HANDOFF down: before its stores; the block table or the ids are three launches back)
    if UNSORTED:
        e, pairs = _block_from_ids(ids_ptr, b, T, P, E, shared_blocks, K, SLOTS, BLOCK_M, IDS_POW2, E_POW2, GATE_UP)
        if tl.min(pairs) >= P:
            return
    else:
        e = tl.load(block_expert_ptr + b)
        if e >= N_EXP:
            return
    shared = e == E
    i_e = tl.where(shared, IS, I)
    n_out = i_e if GATE_UP else H   # output columns: intermediate (gate/up) or hidden (down)
    n_k = H if GATE_UP else i_e     # reduction length
    if col_tile * BLOCK_N >= n_out:
        return
    cols_n = col_tile * BLOCK_N + tl.arange(0, BLOCK_N)
    if HANDOFF and not GATE_UP:
        one = tl.arange(0, 1)
        poll_at_least(ready_ptr + b + one, one == 0, tl.where(shared, tiles_shared, tiles_routed), PTX)
    if not UNSORTED:
        pairs = tl.load(sorted_pairs_ptr + b * BLOCK_M + tl.arange(0, BLOCK_M))
    elif GATE_UP:
        tl.store(sorted_pairs_ptr + b * BLOCK_M + tl.arange(0, BLOCK_M), pairs, mask=col_tile == 0)
    else:  # stored by gate/up's column tile 0 before its count, which the poll saw
        pairs = tl.load(sorted_pairs_ptr + b * BLOCK_M + tl.arange(0, BLOCK_M), cache_modifier=".cg")
    valid = pairs < P
    a_row = (pairs // SLOTS) if GATE_UP else pairs
    a_rows_ptr = a_ptr + a_row.to(tl.int64) * stride_a
    acc = tl.zeros([BLOCK_N, BLOCK_M] if SWAP else [BLOCK_M, BLOCK_N], tl.float32)
    acc_up = tl.zeros([BLOCK_N, BLOCK_M] if SWAP else [BLOCK_M, BLOCK_N], tl.float32)
    if shared:
        acc, acc_up = _expert_gemm(acc, acc_up, a_rows_ptr, valid, s_ptr, s_scales_ptr, s_scale_ptr, cols_n,
                                   n_out, n_k, s_sn, s_ssn, s_sgn, GATE_UP, BLOCK_K, MASK_K, S_FP4, DOT_FP32,
                                   DOT_PRECISION, S_F16, PTX, SWAP, HALVES)
    else:
        e64 = e.to(tl.int64)
        acc, acc_up = _expert_gemm(acc, acc_up, a_rows_ptr, valid, w_ptr + e64 * w_se, w_scales_ptr + e64 * w_sse,
                                   w_scale_ptr + e64 * w_sge, cols_n, n_out, n_k, w_sn, w_ssn, w_sgn,
                                   GATE_UP, BLOCK_K, MASK_K, W_FP4, DOT_FP32, DOT_PRECISION, W_F16, PTX, SWAP,
                                   HALVES)
    dtype = out_ptr.dtype.element_ty
    y = silu_mul_rounded(acc, acc_up, ROUND_TO).to(dtype) if GATE_UP else acc.to(dtype)
    if HANDOFF and not GATE_UP:
        pdl_prologue(PDL)  # the stores and atomics after the wait for gate/up, as every launch's
    if SWAP:
        if HALVES and GATE_UP:
            out = out_ptr + pairs[None, :].to(tl.int64) * stride_out + halves_col(cols_n, BLOCK_K)[:, None]
        else:
            out = out_ptr + pairs[None, :].to(tl.int64) * stride_out + cols_n[:, None]
        tl.store(out, y, mask=valid[None, :] & (cols_n[:, None] < n_out))
        if HANDOFF:
            if GATE_UP:
                tl.debug_barrier()  # every thread's stores precede the release
                tl.atomic_add(ready_ptr + b, 1, sem="release", scope="gpu")
            elif last_to_arrive(done_ptr + b, tl.num_programs(0)):
                tl.store(ready_ptr + b, 0)  # the block's last down tile: both counters zero again
    else:
        out = out_ptr + pairs[:, None].to(tl.int64) * stride_out + cols_n[None, :]
        tl.store(out, y, mask=valid[:, None] & (cols_n[None, :] < n_out))


@triton.jit
def _moe_combine_kernel(
    ys_ptr,               # [T * SLOTS, H] expert outputs in x.dtype
    topk_weights_ptr,     # [T, K] fp32
    shared_ptr,           # [T, H] rows (stride_shared apart) of the shared expert's output (HAS_SHARED)
    out_ptr,              # [T, H]
    H, stride_shared,
    K: tl.constexpr, SLOTS: tl.constexpr, HAS_SHARED: tl.constexpr, BLOCK_H: tl.constexpr,
    PDL: tl.constexpr,
):
    pdl_prologue(PDL)
    t = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    mask = cols < H
    dtype = out_ptr.dtype.element_ty
    routed = tl.zeros([BLOCK_H], tl.float32)
    for k in range(K):
        y = tl.load(ys_ptr + (t * SLOTS + k) * H + cols, mask=mask, other=0.0).to(tl.float32)
        routed += tl.load(topk_weights_ptr + t * K + k) * y
    out = routed.to(dtype)
    if HAS_SHARED:
        y = tl.load(shared_ptr + t * stride_shared + cols, mask=mask, other=0.0)
        out = (out.to(tl.float32) + y.to(tl.float32)).to(dtype)
    tl.store(out_ptr + t * H + cols, out, mask=mask)


def moe_grouped(x: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor, w13, w2,
                shared_w13=None, shared_w2=None) -> torch.Tensor:
    """Grouped path of `moe.fused_moe` (inputs checked there): x [T, H] -> [T, H]."""
    t, h = x.shape
    out = torch.empty((t, h), dtype=x.dtype, device=x.device)
    if t == 0:
        return out
    shared_out = None  # [T, H]: the shared expert run apart (prefill chunks)
    apart = tuning.MOE_SHARED_DENSE_MIN_TOKENS
    if shared_w13 is not None and apart is not None and t >= apart:
        shared_out = shared_expert_dense(x, shared_w13, shared_w2)
        shared_w13 = shared_w2 = None
    e, k = w13.shape[0], topk_ids.shape[1]
    i = w13.shape[-2] // 2
    has_shared = shared_w13 is not None
    i_s = shared_w13.shape[-2] // 2 if has_shared else i
    slots = k + has_shared
    p = t * slots
    rows_per_expert = p / (e + has_shared)
    block_m, block_n13, block_n2, block_k, warps, stages = _tiles(rows_per_expert)
    maxnreg = None  # registers a thread (ptxas .maxnreg): None, ptxas's choice
    f16 = tuning.FP4_MMA_F16 and x.dtype != torch.float32  # fp16 tiles (an fp32 model keeps fp32 x)
    if f16 and is_nvfp4(w13):
        if rows_per_expert <= 8:  # decode batches (the interpreter's too): 8-token blocks, transposed, in
            # the halves layout (sweep_tiles.py, H100 2026-12-06, 144af92: T=64 228.4 -> 201.8 us, T=256
            # 289.9 -> 280.5, against 16 x 128 tiles in 3 stages)
            block_m = 8
        if not INTERPRET:
            block_k = F16_BLOCK_K
            if block_m <= 16:  # (16 rows, sweep_tiles.py, H100 2026-12-06: T=64 241.6 -> 221.7 us, T=256 325 -> 290)
                block_n13, block_n2, stages = 128, 128, 3
            elif block_m == 128:  # prefill chunks (sweep_tiles.py --tokens 8192, H100 2026-12-06: 2612 -> 1983 us)
                block_m, block_n13, block_n2, block_k, warps, stages = 64, 128, 128, 64, 4, 4
    if any(w is not None and not is_nvfp4(w) and w.dtype == torch.float32 for w in (w13, w2, shared_w13, shared_w2)):
        # fp32 weight tiles (an fp32 model) are twice bf16's bytes: down's 128-column tiles overflow
        # sm_90's 227 KB of shared memory in 3-4 stages (32 rows: 240 KB, 128 rows: 256 KB; 2 fit)
        stages = min(stages, 2)
    if tuning.MOE_GROUPED_TILES:
        block_m, block_n13, block_n2, block_k, warps, stages, *cap = tuning.MOE_GROUPED_TILES
        maxnreg = cap[0] if cap else None
    swap = block_m < 16
    # decode tiles: down takes each block as soon as gate/up stored it (HANDOFF); small batches'
    # blocks straight from the ids (UNSORTED: no sort launch)
    handoff = tuning.MOE_HANDOFF and swap
    unsorted = handoff and tuning.MOE_UNSORTED_MAX_TOKENS is not None and t <= tuning.MOE_UNSORTED_MAX_TOKENS
    if unsorted:
        blocks = has_shared * triton.cdiv(t, block_m) + e + t * k // block_m
        sorted_pairs = torch.empty(blocks * block_m, dtype=torch.int32, device=x.device)
        block_expert = sorted_pairs  # (unread)
        topk_ids = topk_ids.contiguous()
    else:
        sorted_pairs, block_expert = sort_pairs(topk_ids, e, has_shared, block_m)
        blocks = block_expert.numel()
    # fp16 activations in the halves layout where every weight is NVFP4 in fp16 tiles: their even
    # and odd columns meet the decoded weight's halves (halves.py; every K a multiple of BLOCK_K)
    all_fp4 = all(is_nvfp4(w) for w in (w13, w2, shared_w13, shared_w2) if w is not None)
    halves = tuning.MOE_HALVES and swap and f16 and all_fp4 and not (h % block_k or i % block_k or i_s % block_k)
    inter = torch.empty((p, max(i, i_s)), dtype=torch.float16 if halves else x.dtype, device=x.device)
    ys = torch.empty((p, h), dtype=x.dtype, device=x.device)
    a13 = to_halves(x, block_k) if halves else x
    done_at = triton.cdiv(blocks, 4) * 4  # the done counters 16-byte aligned whatever the count (one compile)
    counters = arrival_counters(done_at + blocks, x.device) if handoff else block_expert  # (unread without)
    common = dict(sorted_pairs_ptr=sorted_pairs, block_expert_ptr=block_expert, ids_ptr=topk_ids, ready_ptr=counters,
                  done_ptr=counters[done_at:] if handoff else counters, tiles_routed=triton.cdiv(i, block_n13),
                  tiles_shared=triton.cdiv(i_s, block_n13), HANDOFF=handoff, T=t,
                  shared_blocks=has_shared * triton.cdiv(t, block_m), UNSORTED=unsorted, K=k,
                  IDS_POW2=triton.next_power_of_2(t * k) if unsorted else 1, E_POW2=triton.next_power_of_2(e),
                  P=p, E=e, N_EXP=e + has_shared,
                  H=h, I=i, IS=i_s, SLOTS=slots, BLOCK_M=block_m, BLOCK_K=block_k, DOT_FP32=DOT_FP32,
                  DOT_PRECISION="ieee" if x.dtype == torch.float32 else "tf32", num_warps=warps, num_stages=stages,
                  maxnreg=maxnreg, SWAP=swap, HALVES=halves, ROUND_TO=_TL_DTYPES[x.dtype], **launch_args(x.device))
    for stage, (w, s, a, dst, n_max, block_n, n_ks) in enumerate([
            (w13, shared_w13, a13, inter, max(i, i_s), block_n13, (h,)),
            (w2, shared_w2, inter, ys, h, block_n2, (i, i_s))]):
        s = s if has_shared else w[0]
        w_f16, s_f16 = f16 and is_nvfp4(w), f16 and is_nvfp4(s)
        col_tiles = triton.cdiv(n_max, block_n)
        _moe_grouped_kernel[(col_tiles, blocks) if handoff else (blocks, col_tiles)](
            a_ptr=a, out_ptr=dst, **weight_args("w", w), **weight_args("s", s),
            stride_a=a.stride(0), stride_out=dst.stride(0), GATE_UP=stage == 0, BLOCK_N=block_n,
            MASK_K=any(n % block_k for n in n_ks), W_FP4=is_nvfp4(w), S_FP4=is_nvfp4(s),
            W_F16=w_f16, S_F16=s_f16, PTX=ptx_decode(), **common)
    shared_rows = ys.view(t, slots, h)[:, k] if has_shared else shared_out  # [T, H] or None
    _moe_combine_kernel[(t, triton.cdiv(h, COMBINE_BLOCK_H))](
        ys_ptr=ys, topk_weights_ptr=topk_weights, shared_ptr=ys if shared_rows is None else shared_rows,
        out_ptr=out, H=h, stride_shared=0 if shared_rows is None else shared_rows.stride(0), K=k, SLOTS=slots,
        HAS_SHARED=shared_rows is not None, BLOCK_H=min(COMBINE_BLOCK_H, triton.next_power_of_2(h)),
        **launch_args(x.device), num_warps=4)
    return out


def blocks_from_ids_torch(topk_ids: torch.Tensor, num_experts: int, has_shared: bool,
                          block_m: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The blocks the UNSORTED decode tiles take from topk_ids [T, K] (the kernel's
    _block_from_ids, every block at once): -> block_expert [B] int32 (num_experts + has_shared
    for a block without pairs), pairs [B * block_m] int32 (P = T * (K + has_shared) where none),
    B = has_shared * cdiv(T, block_m) + num_experts + T * K // block_m."""
    t, k = topk_ids.shape
    slots = k + has_shared
    p = t * slots
    shared_blocks = has_shared * triton.cdiv(t, block_m)
    blocks = shared_blocks + num_experts + t * k // block_m
    block_expert = torch.full((blocks,), num_experts + has_shared, dtype=torch.int32)
    pairs = torch.full((blocks * block_m,), p, dtype=torch.int32)
    for b in range(shared_blocks):
        tokens = torch.arange(b * block_m, min((b + 1) * block_m, t))
        block_expert[b] = num_experts
        pairs[b * block_m:b * block_m + tokens.numel()] = (tokens * slots + k).int()
    flat = topk_ids.reshape(-1).cpu()
    further = shared_blocks + num_experts  # the next block for an expert's pairs past its first block_m
    for e in range(num_experts):
        idx = (flat == e).nonzero().flatten()  # by pair id
        for j in range(0, idx.numel(), block_m):
            b = shared_blocks + e if j == 0 else further
            further += j > 0
            chunk = idx[j:j + block_m]
            block_expert[b] = e
            pairs[b * block_m:b * block_m + chunk.numel()] = (chunk // k * slots + chunk % k).int()
    return block_expert, pairs


def shared_expert_dense(x: torch.Tensor, shared_w13, shared_w2) -> torch.Tensor:
    """The shared expert over every token of x [T, H] as dense GEMMs -> [T, H] in x.dtype: gate
    and up rounded to x.dtype, silu_mul's roundings, the down output rounded (moe.py's numerics).
    An NVFP4 weight through nvfp4_linear, a dense one through cuBLAS (in x.dtype, as the
    engine's prefill linears)."""
    return _linear(silu_mul(_linear(x, shared_w13)), shared_w2)


def _linear(x: torch.Tensor, w) -> torch.Tensor:
    return nvfp4_linear(x, w) if is_nvfp4(w) else F.linear(x, w.to(x.dtype))


def _tiles(rows_per_expert: float) -> tuple[int, int, int, int, int, int]:
    """(BLOCK_M, BLOCK_N gate/up, BLOCK_N down, BLOCK_K, warps, stages) from the mean rows per
    expert: BLOCK_M just covers an expert's tokens (decode-sized batches waste no MMA rows),
    prefill gets the H100/H200 128 x 128 shape (gate/up holds two accumulators: 64 cols)."""
    if INTERPRET:
        return 16, 32, 32, 32, 4, 1
    if rows_per_expert <= 16:
        return 16, 64, 64, 64, 4, 4
    if rows_per_expert <= 48:
        return 32, 64, 128, 64, 4, 4
    if rows_per_expert <= 96:
        return 64, 64, 128, 64, 4, 3
    return 128, 64, 128, 64, 8, 3
