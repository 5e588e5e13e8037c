"""MoE routing as transformers' FlintTopKRouter: fp32 logits (fp32 products of the activations
and the router weight, bf16 or fp32), sigmoid scores, top-k on the scores (the lowest expert id
among exact ties), the chosen scores renormalised to sum 1 when asked (norm_topk_prob). No
correction bias, no scaling factor.

One launch. Program (token tile, expert block) computes the [BLOCK_T, BLOCK_E] fp32 logits over
all of H and stores them; the last program of a token tile to arrive (split_k.py) reads the
tile's [BLOCK_T, E] logits back and does sigmoid, top-k and the weights. Two tile shapes:
- decode (T <= GEMV_MAX_T): one token x GEMV_BLOCK_E experts, products summed with tl.sum, so
  the router weight (E x H = 1 MB in bf16) is spread over ~one program per SM, each issuing
  its rows' loads at once, and every token's top-k runs in its own program;
- decode batches of 9-256 tokens: 16 tokens x 64 experts x 256 of H a program (H split), the
  weight chunk (64 KB in fp32) loaded before the PDL wait, so the router weight is read once,
  spread over every SM; the last split of a tile to arrive sums the splits' partial logits in
  split order (split_k.py), the last expert block of a token tile picks its top-k;
- prefill: PREFILL_BLOCK_T tokens x 64 experts with tl.dot over H chunks (fewer tokens, 16, and
  16-64 experts where that gives every SM a program); an fp32 weight against bf16 activations
  as three bf16 parts on the tensor cores (exact products, _logits_dot), made once a launch
  (weight_parts: tuning.ROUTER_WEIGHT_PARTS) rather than by every program. The top-k of a token
  tile goes 16 tokens at a time ([16, E] keys a pass).
Both give exact products in fp32 (an fp32 operand: IEEE fp32 dots); sums differ in order only.
Top-k: each expert's key is the order-preserving int of its score's fp32 bits in the high half
and the reversed expert id in the low half, so one int64 max per pick finds the best expert and
the lowest id among ties.

Numerics against transformers: the same fp32 logits up to the order of the sum over H (so a
near-tie between the k-th and (k+1)-th score may pick the other expert); sigmoid is Triton's
(exp-based, not torch's); the renormalising sum adds the K chosen scores in another order.
(vLLM's reference runtime rounds the logits and the routing weights to bf16; transformers, our
oracle, keeps both fp32, as here.)
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import tuning
from .pdl import launch_args, pdl_prologue
from .rms_norm import check_norm_inputs, folded_row, normed_by, rms_norm_torch
from .split_k import arrival_counters, last_to_arrive, num_sms
from .tuning import INTERPRET

DOT_FP32 = INTERPRET  # Triton's interpreter computes bf16 tl.dot wrongly
BLOCK_T = 16           # tokens per tl.dot tile of decode batches (its smallest M); the top-k holds [BLOCK_T, E]
DOT_BLOCK_TS = (16, 32, 64, 128)  # token tiles of the tl.dot programs
TOPK_ROWS = tl.constexpr(16)      # tokens a pass of a tile's top-k ([16, E] keys)
# prefill chunks' token tile (sweep_tiles.py --only router --tokens 8192, H100 2026-12-06, 90718c6:
# 16 x 64 241 us, 32 x 64 159, 64 x 64 224, 64 x 32 262, 32 x 32 559)
PREFILL_BLOCK_T = 32
BLOCK_H = 32 if INTERPRET else 128
PARTS_BLOCK = 1024     # weights a program of weight_parts
GEMV_MAX_T = 8         # decode batches up to here read W once per token (8 MB of L2 reads at 8)
GEMV_BLOCK_E = 2       # experts per decode program: 128 programs for E = 256
# larger decode batches: 16 tokens x 32 experts x SPLIT_H of H a program. Alone (sweep_tiles.py,
# H100 2026-12-06, 144af92, the weight in L2) 64 experts led: T=64 9.6 us, 32 experts 10.8, 16
# 15.9, the former 16 x 32 over all of H 20.0; T=256 17.5, 18.9, 44.0, 20.2. In the batch-64 step
# (bench_step_timeline.py, H100 2026-12-07, c55af0f, the weight from HBM): 32 experts 11.6 us a
# layer against 64's 18.3 (16: 22.2; SPLIT_H 128 / 512 with 32: 18.8 / 26.7), replay 13.47 -> 13.12 ms
DOT_DECODE_MAX_T, DOT_DECODE_BLOCK_E = 256, 32
SPLIT_H = 32 if INTERPRET else 256  # H a program of the split tiles
GEMV_TILE = 4096       # [BLOCK_E, H chunk] elements a decode program loads at once (128 a thread)
GEMV_WARPS = 1         # one warp: the top-k's reductions are shuffles, with no barriers between warps
# with the RMSNorm folded in, a program also normalises a whole row (2048 values: 64 a thread
# and 255 registers at one warp); 4 warps share it (8: no better, H200 2026-12-03)
GEMV_NORM_WARPS = 4
NO_KEY = tl.constexpr(-(2 ** 63 - 1))  # below every expert's key: masked or already chosen
# the routing handoff of the routed expert launches (moe_gemv.py): per token, expert id + 1 of each
# of <= 8 slots (0: not written yet), then the 8 router weights' fp32 bits
ROUTING_WORDS = 16
ROUTING_COLS = tl.constexpr(ROUTING_WORDS)


# T: a count of tokens, not specialised on divisibility (moe_grouped.py: first-use compiles); == 1 still is (decode)
@triton.jit(do_not_specialize_on_alignment=["T"])
def _router_kernel(
    x_ptr,        # [T, H]
    w_ptr,        # [E, H] bf16/fp16/fp32
    ids_ptr,      # [T, TOP_K] int32
    weights_ptr,  # [T, TOP_K] fp32
    logits_ptr,   # [T, E] fp32 scratch
    part_ptr,     # [H_SPLITS, T, E] fp32 partial logits (H_SPLITS > 1)
    counter_ptr,  # [cdiv(T, BLOCK_T) * (1 + expert blocks if H_SPLITS > 1)] int32, zero between launches
    routing_ptr,  # [T, ROUTING_COLS] int32 (LOGITS_ONLY): zeroed here, filled by the gate/up launch
    res_ptr,      # [T, H] residual stream before the add (NORM and HAS_RESIDUAL), strided like x
    res_out_ptr,  # [T, H] residual + x, contiguous (NORM: written by the programs (t, 0))
    h_ptr,        # [T, H] rms_norm(residual + x), contiguous (NORM: written by the programs (t, 0))
    norm_w_ptr,   # [H] RMSNorm weight (NORM)
    T, E, H, stride_xt, stride_we, eps,
    TOP_K: tl.constexpr, RENORMALIZE: tl.constexpr,
    BLOCK_T: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_H: tl.constexpr, E_POW2: tl.constexpr,
    K_POW2: tl.constexpr, USE_DOT: tl.constexpr, DOT_FP32: tl.constexpr, DOT_PRECISION: tl.constexpr,
    ONE_CHUNK: tl.constexpr, NORM: tl.constexpr, HAS_RESIDUAL: tl.constexpr, LOGITS_ONLY: tl.constexpr,
    SPLIT_W: tl.constexpr, PARTS: tl.constexpr, H_SPLITS: tl.constexpr, PDL: tl.constexpr,
):
    """NORM (decode tiles with ONE_CHUNK): x is the previous sublayer's output and the router
    reads rms_norm(residual + x), computed in every program (the RMSNorm launch folded in); the
    programs of expert block 0 also store it (h, for the experts) and residual + x.
    LOGITS_ONLY: stop at the logits (the expert launches pick the top-k: route_from_logits); the
    programs of expert block 0 zero their token's row of the routing handoff (moe_gemv.py).
    H_SPLITS > 1 (USE_DOT): program (token tile, expert block, split) covers BLOCK_H of H; the
    last split of a (token tile, expert block) to arrive sums the partials, in split order.
    PARTS (SPLIT_W, one split): w_ptr holds the fp32 weight's three bf16 parts [3, E, H]
    (weight_parts), which the programs load instead of splitting each weight tile themselves."""
    tt = tl.program_id(0)
    tokens = tt * BLOCK_T + tl.arange(0, BLOCK_T)
    experts = tl.program_id(1) * BLOCK_E + tl.arange(0, BLOCK_E)
    t_mask = tokens < T
    e_mask = experts < E
    if NORM:
        logits = _logits_norm(x_ptr + tt * stride_xt, res_ptr + tt * stride_xt, res_out_ptr + tt * H,
                              h_ptr + tt * H, norm_w_ptr, w_ptr, experts, e_mask, H, stride_we, eps,
                              tl.program_id(1) == 0, BLOCK_E, BLOCK_H, HAS_RESIDUAL, PDL)
    elif H_SPLITS > 1:
        split = tl.program_id(2)
        partial = _logits_chunk(x_ptr, w_ptr, tokens, t_mask, experts, e_mask, H, stride_xt, stride_we,
                                split * BLOCK_H, BLOCK_T, BLOCK_E, BLOCK_H, DOT_FP32, DOT_PRECISION, SPLIT_W, PDL)
        offs = tokens[:, None] * E + experts[None, :]
        mask = t_mask[:, None] & e_mask[None, :]
        tl.store(part_ptr + split * T * E + offs, partial, mask=mask)
        tile_counter = counter_ptr + tl.cdiv(T, BLOCK_T) + tt * tl.num_programs(1) + tl.program_id(1)
        if not last_to_arrive(tile_counter, H_SPLITS):
            return
        logits = tl.zeros([BLOCK_T, BLOCK_E], tl.float32)
        for i in tl.static_range(H_SPLITS):
            logits += tl.load(part_ptr + i * T * E + offs, mask=mask, other=0.0, cache_modifier=".cg")
    elif USE_DOT:
        pdl_prologue(PDL)
        logits = _logits_dot(x_ptr, w_ptr, tokens, t_mask, experts, e_mask, E, H, stride_xt, stride_we,
                             BLOCK_T, BLOCK_E, BLOCK_H, DOT_FP32, DOT_PRECISION, SPLIT_W, PARTS)
    else:
        logits = _logits_sum(x_ptr, w_ptr, tokens, t_mask, experts, e_mask, H, stride_xt, stride_we,
                             BLOCK_E, BLOCK_H, ONE_CHUNK, PDL)
    tl.store(logits_ptr + tokens[:, None] * E + experts[None, :], logits,
             mask=t_mask[:, None] & e_mask[None, :])
    if LOGITS_ONLY:
        cols = tl.arange(0, ROUTING_COLS)
        tl.store(routing_ptr + tokens[:, None] * ROUTING_COLS + cols[None, :], 0,
                 mask=t_mask[:, None] & (tl.program_id(1) == 0))
        return
    if last_to_arrive(counter_ptr + tt, tl.num_programs(1)):
        TOPK_T: tl.constexpr = BLOCK_T if BLOCK_T < TOPK_ROWS else TOPK_ROWS  # [TOPK_T, E] keys a pass
        for sub in tl.static_range(BLOCK_T // TOPK_T):
            rows = tt * BLOCK_T + sub * TOPK_T + tl.arange(0, TOPK_T)
            _top_k(logits_ptr, ids_ptr, weights_ptr, rows, rows < T, E, TOP_K, RENORMALIZE, E_POW2, K_POW2)


@triton.jit
def _logits_dot(x_ptr, w_ptr, tokens, t_mask, experts, e_mask, E, H, stride_xt, stride_we,
                BLOCK_T: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_H: tl.constexpr,
                DOT_FP32: tl.constexpr, DOT_PRECISION: tl.constexpr, SPLIT_W: tl.constexpr,
                PARTS: tl.constexpr):
    """[BLOCK_T, BLOCK_E] fp32 logits with tl.dot over H chunks (_weight_parts, _dot_weight);
    PARTS: the weight's parts loaded from [3, E, H] (row stride stride_we) instead."""
    acc = tl.zeros([BLOCK_T, BLOCK_E], tl.float32)
    for h0 in range(0, H, BLOCK_H):
        cols = h0 + tl.arange(0, BLOCK_H)
        a = tl.load(x_ptr + tokens[:, None] * stride_xt + cols[None, :],
                    mask=t_mask[:, None] & (cols[None, :] < H), other=0.0)  # [BLOCK_T, BLOCK_H]
        w_tile = w_ptr + experts[:, None] * stride_we + cols[None, :]
        w_mask = e_mask[:, None] & (cols[None, :] < H)
        if PARTS:  # [BLOCK_E, BLOCK_H] bf16 each
            hi = tl.load(w_tile, mask=w_mask, other=0.0)
            mid = tl.load(w_tile + E * stride_we, mask=w_mask, other=0.0)
            lo = tl.load(w_tile + 2 * E * stride_we, mask=w_mask, other=0.0)
            w = hi  # (unread with SPLIT_W)
        else:
            w = tl.load(w_tile, mask=w_mask, other=0.0)  # [BLOCK_E, BLOCK_H]
            hi, mid, lo = _weight_parts(w, SPLIT_W)
        acc = _dot_weight(acc, a, w, hi, mid, lo, DOT_FP32, DOT_PRECISION, SPLIT_W)
    return acc


@triton.jit
def _weight_parts_kernel(w_ptr, parts_ptr, N, BLOCK: tl.constexpr, PDL: tl.constexpr):
    """fp32 w [N] (an [E, H] weight, contiguous) -> parts [3, N] bf16 (_weight_parts); the
    weight is loaded before the PDL wait."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < N
    hi, mid, lo = _weight_parts(tl.load(w_ptr + offs, mask=mask, other=0.0), True)
    pdl_prologue(PDL)
    tl.store(parts_ptr + offs, hi, mask=mask)
    tl.store(parts_ptr + N + offs, mid, mask=mask)
    tl.store(parts_ptr + 2 * N + offs, lo, mask=mask)


@triton.jit
def _weight_parts(w, SPLIT_W: tl.constexpr):
    """SPLIT_W (bf16 x, fp32 W): the W tile as three bf16 parts that sum to it exactly (8
    significant bits each), so that x meets each part on the tensor cores: bf16 products are
    exact in fp32, and the logits are fp32 products summed in fp32, as the "ieee" dot computes
    them, at a fraction of its time. Else unused (and not computed)."""
    hi = w.to(tl.bfloat16)
    if SPLIT_W:
        rest = w - hi.to(tl.float32)  # exact: w and hi agree in their top bits
        mid = rest.to(tl.bfloat16)
        lo = (rest - mid.to(tl.float32)).to(tl.bfloat16)  # exact: the last <= 8 bits
    else:
        mid, lo = hi, hi
    return hi, mid, lo


@triton.jit
def _dot_weight(acc, a, w, hi, mid, lo, DOT_FP32: tl.constexpr, DOT_PRECISION: tl.constexpr,
                SPLIT_W: tl.constexpr):
    """acc [BLOCK_T, BLOCK_E] += a [BLOCK_T, BLOCK_H] @ w.T, from the parts with SPLIT_W (smallest first)."""
    if SPLIT_W:
        if DOT_FP32:
            a = a.to(tl.float32)
            hi, mid, lo = hi.to(tl.float32), mid.to(tl.float32), lo.to(tl.float32)
        acc = tl.dot(a, tl.trans(lo), acc, input_precision=DOT_PRECISION)
        acc = tl.dot(a, tl.trans(mid), acc, input_precision=DOT_PRECISION)
        acc = tl.dot(a, tl.trans(hi), acc, input_precision=DOT_PRECISION)
    else:
        if DOT_FP32 or a.dtype != w.dtype:
            a = a.to(tl.float32)
            w = w.to(tl.float32)
        acc = tl.dot(a, tl.trans(w), acc, input_precision=DOT_PRECISION)
    return acc


@triton.jit
def _logits_chunk(x_ptr, w_ptr, tokens, t_mask, experts, e_mask, H, stride_xt, stride_we, h0,
                  BLOCK_T: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_H: tl.constexpr, DOT_FP32: tl.constexpr,
                  DOT_PRECISION: tl.constexpr, SPLIT_W: tl.constexpr, PDL: tl.constexpr):
    """[BLOCK_T, BLOCK_E] fp32 partial logits over H[h0 : h0 + BLOCK_H], as _logits_dot's: the
    weight chunk is loaded and split before the PDL prologue, x after it."""
    cols = h0 + tl.arange(0, BLOCK_H)
    w = tl.load(w_ptr + experts[:, None] * stride_we + cols[None, :],
                mask=e_mask[:, None] & (cols[None, :] < H), other=0.0)  # [BLOCK_E, BLOCK_H]
    hi, mid, lo = _weight_parts(w, SPLIT_W)
    pdl_prologue(PDL)
    a = tl.load(x_ptr + tokens[:, None] * stride_xt + cols[None, :],
                mask=t_mask[:, None] & (cols[None, :] < H), other=0.0)  # [BLOCK_T, BLOCK_H]
    return _dot_weight(tl.zeros([BLOCK_T, BLOCK_E], tl.float32), a, w, hi, mid, lo, DOT_FP32, DOT_PRECISION,
                       SPLIT_W)


@triton.jit
def _logits_norm(x_row, res_row, res_out_row, h_row, norm_w_ptr, w_ptr, experts, e_mask, H, stride_we, eps,
                 write, BLOCK_E: tl.constexpr, BLOCK_H: tl.constexpr, HAS_RESIDUAL: tl.constexpr,
                 PDL: tl.constexpr):
    """[1, BLOCK_E] fp32 logits of one token from rms_norm(residual + x) (BLOCK_H >= H): the weight
    rows and the norm weight are loaded before the PDL prologue, the norm computed after it;
    `write`: store h and residual + x."""
    cols = tl.arange(0, BLOCK_H)
    c_mask = cols < H
    w = tl.load(w_ptr + experts[:, None] * stride_we + cols[None, :],
                mask=e_mask[:, None] & c_mask[None, :], other=0.0)  # [BLOCK_E, BLOCK_H]
    nw = tl.load(norm_w_ptr + cols, mask=c_mask, other=0.0)  # a weight too
    pdl_prologue(PDL)
    a, rstd = folded_row(x_row, res_row, res_out_row, H, eps, write, HAS_RESIDUAL, BLOCK_H)
    h = normed_by(a, nw, rstd)  # [BLOCK_H], from the row's one load
    tl.store(h_row + cols, h, mask=c_mask & write)
    return tl.sum(h.to(tl.float32)[None, :] * w.to(tl.float32), axis=1)[None, :]


@triton.jit
def _logits_sum(x_ptr, w_ptr, tokens, t_mask, experts, e_mask, H, stride_xt, stride_we,
                BLOCK_E: tl.constexpr, BLOCK_H: tl.constexpr, ONE_CHUNK: tl.constexpr, PDL: tl.constexpr):
    """[1, BLOCK_E] fp32 logits of one token (tokens: [1]): fp32 products summed along H chunks.
    Runs the PDL prologue: with ONE_CHUNK (BLOCK_H >= H), after loading the weight rows (pdl.py)."""
    acc = tl.zeros([BLOCK_E], tl.float32)
    if ONE_CHUNK:  # the weight rows' load overlaps the previous kernel
        cols = tl.arange(0, BLOCK_H)
        w = tl.load(w_ptr + experts[:, None] * stride_we + cols[None, :],
                    mask=e_mask[:, None] & (cols[None, :] < H), other=0.0)  # [BLOCK_E, BLOCK_H]
        pdl_prologue(PDL)
        a = tl.load(x_ptr + tokens[:, None] * stride_xt + cols[None, :],
                    mask=t_mask[:, None] & (cols[None, :] < H), other=0.0)  # [1, BLOCK_H]
        return tl.sum(a.to(tl.float32) * w.to(tl.float32), axis=1)[None, :]
    pdl_prologue(PDL)
    for h0 in range(0, H, BLOCK_H):
        cols = h0 + tl.arange(0, BLOCK_H)
        a = tl.load(x_ptr + tokens[:, None] * stride_xt + cols[None, :],
                    mask=t_mask[:, None] & (cols[None, :] < H), other=0.0)  # [1, BLOCK_H]
        w = tl.load(w_ptr + experts[:, None] * stride_we + cols[None, :],
                    mask=e_mask[:, None] & (cols[None, :] < H), other=0.0)  # [BLOCK_E, BLOCK_H]
        acc += tl.sum(a.to(tl.float32) * w.to(tl.float32), axis=1)
    return acc[None, :]


@triton.jit
def _top_k(logits_ptr, ids_ptr, weights_ptr, tokens, t_mask, E, TOP_K: tl.constexpr, RENORMALIZE: tl.constexpr,
           E_POW2: tl.constexpr, K_POW2: tl.constexpr):
    """Writes the top-k of `tokens` from their [len(tokens), E] logits (stored by every program)."""
    ids, weights = route_from_logits(logits_ptr, tokens, t_mask, E, TOP_K, RENORMALIZE, E_POW2, K_POW2)
    slots = tl.arange(0, K_POW2)
    out = tokens[:, None] * TOP_K + slots[None, :]
    out_mask = t_mask[:, None] & (slots[None, :] < TOP_K)
    tl.store(ids_ptr + out, ids, mask=out_mask)
    tl.store(weights_ptr + out, weights, mask=out_mask)


@triton.jit
def route_from_logits(logits_ptr, tokens, t_mask, E, TOP_K: tl.constexpr, RENORMALIZE: tl.constexpr,
                      E_POW2: tl.constexpr, K_POW2: tl.constexpr, TOPK_SORT: tl.constexpr = False):
    """The routing of `tokens` from their fp32 logits rows ([T, E] at logits_ptr, read past L1):
    -> ids [len(tokens), K_POW2] int32 and weights fp32, 0 in slots >= TOP_K. Sigmoid scores,
    top-k on them, the chosen scores (renormalised with RENORMALIZE); the same bits in every
    kernel that calls it (the router's last program, or the expert launches). TOPK_SORT:
    the K_POW2 largest keys by tl.topk's bitonic network instead of TOP_K rounds of a max (the
    keys are unique, so the same picks in the same order)."""
    experts = tl.arange(0, E_POW2)
    e_mask = experts < E
    logits = tl.load(logits_ptr + tokens[:, None] * E + experts[None, :],
                     mask=t_mask[:, None] & e_mask[None, :], other=0.0, cache_modifier=".cg")
    scores = tl.sigmoid(logits)  # [BLOCK_T, E_POW2]
    bits = scores.to(tl.int32, bitcast=True)
    order = tl.where(bits < 0, bits ^ 0x7FFFFFFF, bits)  # int order = float order (-0.0 below +0.0)
    key = (order.to(tl.int64) << 32) | (E_POW2 - 1 - experts)[None, :]
    key = tl.where(e_mask[None, :], key, NO_KEY)
    slots = tl.arange(0, K_POW2)
    if TOPK_SORT:
        best = tl.topk(key, K_POW2, dim=1)  # [BLOCK_T, K_POW2], descending
        ids = tl.where(slots[None, :] < TOP_K, E_POW2 - 1 - (best & (E_POW2 - 1)).to(tl.int32), 0)
    else:
        ids = tl.zeros([tokens.shape[0], K_POW2], tl.int32)
        for k in tl.static_range(TOP_K):
            best = tl.max(key, axis=1)
            pick = E_POW2 - 1 - (best & (E_POW2 - 1)).to(tl.int32)
            key = tl.where(experts[None, :] == pick[:, None], NO_KEY, key)
            ids = tl.where(slots[None, :] == k, pick[:, None], ids)
    chosen = tl.where(slots[None, :] < TOP_K, tl.gather(scores, ids, axis=1), 0.0)
    if RENORMALIZE:
        chosen = chosen / tl.sum(chosen, axis=1)[:, None]
    return ids, chosen


def router_topk(x: torch.Tensor, weight: torch.Tensor, top_k: int, renormalize: bool, *,
                tile: tuple[int, ...] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """x [T, H], weight [E, H] (bf16/fp16/fp32) -> ids [T, K] int32, weights [T, K] fp32.

    tile: (tokens, experts) per program, powers of two: (1, any) sums products, (16, >= 16) uses
    tl.dot; (16, >= 16, splits): tl.dot over H in that many splits, a program each. None:
    (1, GEMV_BLOCK_E) up to GEMV_MAX_T tokens, (16, 64, H / SPLIT_H) up to DOT_DECODE_MAX_T, else
    (16, 16-64 by the SM count)."""
    _check_inputs(x, weight, top_k)
    return _launch(x, weight, top_k, renormalize, tile, None)[:2]


def folds_norm(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether rms_norm_router_topk takes this launch: a decode batch whose programs load their
    weight rows in one chunk (H <= GEMV_TILE / GEMV_BLOCK_E)."""
    return x.shape[0] <= GEMV_MAX_T and triton.next_power_of_2(x.shape[1]) <= GEMV_TILE // GEMV_BLOCK_E


def rms_norm_router_topk(x: torch.Tensor, residual: torch.Tensor | None, norm_w: torch.Tensor, eps: float,
                         weight: torch.Tensor, top_k: int, renormalize: bool,
                         ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The residual add + RMSNorm before the router, folded into it (one launch instead of two):
    -> (h = rms_norm(residual + x, norm_w) [T, H], ids, weights, residual + x [T, H] in a new
    tensor; x itself when residual is None). Computes rms_norm(x, norm_w, eps, residual)
    then router_topk(h, ...). Decode batches (folds_norm); x, residual contiguous, one dtype."""
    _check_inputs(x, weight, top_k)
    check_norm_inputs("rms_norm_router_topk", x, residual, norm_w, GEMV_MAX_T)
    if not folds_norm(x, weight):
        raise ValueError(f"rms_norm_router_topk: hidden size {x.shape[1]}, expected at most "
                         f"{GEMV_TILE // GEMV_BLOCK_E} (one chunk a program)")
    h = torch.empty_like(x)
    res_out = x if residual is None else torch.empty_like(x)
    ids, weights, _ = _launch(x, weight, top_k, renormalize, (1, GEMV_BLOCK_E), (residual, res_out, h, norm_w, eps))
    return h, ids, weights, res_out


def rms_norm_router_logits(x: torch.Tensor, residual: torch.Tensor | None, norm_w: torch.Tensor, eps: float,
                           weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """rms_norm_router_topk without the top-k: -> (h [T, H], logits [T, E] fp32 = h @ weight.T,
    residual + x, routing [T, 16] int32 zeroed: the expert launches' handoff). The expert launches
    pick the top-k from the logits themselves (moe_gemv.moe_gemv_routed, route_from_logits), so
    this launch ends at the logits' store: no arrival counter, no one-program tail on the decode
    step's critical path."""
    check_norm_inputs("rms_norm_router_logits", x, residual, norm_w, GEMV_MAX_T)
    if weight.dim() != 2 or weight.shape[1] != x.shape[1] or weight.stride(-1) != 1:
        raise ValueError(f"rms_norm_router_logits: weight has shape {tuple(weight.shape)}, expected "
                         f"[E, {x.shape[1]}] with unit stride in H")
    if not folds_norm(x, weight):
        raise ValueError(f"rms_norm_router_logits: {x.shape[0]} tokens of hidden size {x.shape[1]}, expected at "
                         f"most {GEMV_MAX_T} tokens and {GEMV_TILE // GEMV_BLOCK_E} (one chunk a program)")
    h = torch.empty_like(x)
    res_out = x if residual is None else torch.empty_like(x)
    # no top-k here: the launch writes no ids
    routing = torch.empty((x.shape[0], ROUTING_WORDS), dtype=torch.int32, device=x.device)
    _, _, logits = _launch(x, weight, 1, False, (1, GEMV_BLOCK_E), (residual, res_out, h, norm_w, eps),
                           routing=routing)
    return h, logits, res_out, routing


def rms_norm_router_logits_torch(x, residual, norm_w, eps, weight):
    """Same signature and semantics as `rms_norm_router_logits` (residual itself is not modified)."""
    check_norm_inputs("rms_norm_router_logits", x, residual, norm_w, GEMV_MAX_T)
    res_out = x if residual is None else residual.clone()
    h = rms_norm_torch(x, norm_w, eps, residual=None if residual is None else res_out)
    routing = torch.zeros((x.shape[0], ROUTING_WORDS), dtype=torch.int32, device=x.device)
    return h, h.float() @ weight.float().T, res_out, routing


def route_from_logits_torch(logits: torch.Tensor, top_k: int, renormalize: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """router_topk_torch from the fp32 logits [T, E] -> ids [T, K] int32, weights [T, K] fp32
    (transformers' FlintTopKRouter after its logits; ties to the lowest expert id)."""
    scores = torch.sigmoid(logits.float())
    # a stable descending sort puts the lowest id first among equal scores (torch.topk's tie
    # order is unspecified)
    ids = torch.sort(scores, dim=-1, descending=True, stable=True).indices[:, :top_k]
    weights = scores.gather(-1, ids)
    if renormalize:
        weights = weights / weights.sum(-1, keepdim=True)
    return ids.to(torch.int32), weights


def _launch(x, weight, top_k, renormalize, tile, norm, routing=None):
    """norm: (residual or None, res_out, h, norm_w, eps) to fold the RMSNorm in (decode tiles);
    routing: stop at the logits and zero this handoff buffer; -> (ids, weights, logits)."""
    t, h = x.shape
    e = weight.shape[0]
    ids = torch.empty((t, top_k), dtype=torch.int32, device=x.device)
    weights = torch.empty((t, top_k), dtype=torch.float32, device=x.device)
    logits = torch.empty((t, e), dtype=torch.float32, device=x.device)
    if t == 0:
        return ids, weights, logits
    block_t, block_e, splits = _tile(t, e, h, x.device, tile)
    use_dot = block_t > 1
    if splits > 1:  # one H chunk a program
        block_h = triton.next_power_of_2(triton.cdiv(h, splits))
        splits = triton.cdiv(h, block_h)
    elif use_dot:  # narrow expert blocks (decode batches, few programs): half the H steps, 16 KB a stage
        block_h = BLOCK_H * (2 if block_e <= 32 else 1)
    else:
        block_h = min(triton.next_power_of_2(h), max(GEMV_TILE // block_e, 16))
    tiles = (triton.cdiv(t, block_t), triton.cdiv(e, block_e), splits)
    one_chunk = not use_dot and block_h >= h  # a decode program loads its weight rows at once
    fp32 = torch.float32 in (x.dtype, weight.dtype)
    split_w = use_dot and x.dtype in (torch.bfloat16, torch.float16) and weight.dtype == torch.float32
    parts = split_w and splits == 1 and tuning.ROUTER_WEIGHT_PARTS
    w = weight_parts(weight) if parts else weight
    residual, res_out, h_out, norm_w, eps = norm or (None, x, x, x, 0.0)
    counters = tiles[0] * (1 + (tiles[1] if splits > 1 else 0))  # top-k tails, then the splits' tiles
    _router_kernel[tiles](
        x_ptr=x, w_ptr=w, ids_ptr=ids, weights_ptr=weights, logits_ptr=logits,
        part_ptr=torch.empty((splits, t, e), dtype=torch.float32, device=x.device) if splits > 1 else logits,
        counter_ptr=arrival_counters(counters, x.device), routing_ptr=ids if routing is None else routing,
        res_ptr=x if residual is None else residual, res_out_ptr=res_out, h_ptr=h_out, norm_w_ptr=norm_w,
        T=t, E=e, H=h, stride_xt=x.stride(0), stride_we=w.stride(-2), eps=eps,
        TOP_K=top_k, RENORMALIZE=bool(renormalize), BLOCK_T=block_t, BLOCK_E=block_e, BLOCK_H=block_h,
        E_POW2=max(16, triton.next_power_of_2(e)), K_POW2=triton.next_power_of_2(top_k), USE_DOT=use_dot,
        DOT_FP32=DOT_FP32, DOT_PRECISION="ieee" if fp32 and not split_w else "tf32", ONE_CHUNK=one_chunk,
        SPLIT_W=split_w, PARTS=parts, H_SPLITS=splits,
        NORM=norm is not None, HAS_RESIDUAL=residual is not None, LOGITS_ONLY=routing is not None,
        **launch_args(x.device),
        num_warps=4 if use_dot else GEMV_NORM_WARPS if norm is not None else GEMV_WARPS,
    )
    return ids, weights, logits


def weight_parts(weight: torch.Tensor) -> torch.Tensor:
    """fp32 router weight [E, H] -> its three bf16 parts [3, E, H], which sum to it exactly
    (_weight_parts): one launch, so that a prefill chunk's router programs load them instead of
    each splitting its weight tiles."""
    if weight.dtype != torch.float32 or weight.dim() != 2:
        raise ValueError(f"weight_parts: weight is {weight.dtype} {tuple(weight.shape)}, expected float32 [E, H]")
    weight = weight.contiguous()
    parts = torch.empty((3, *weight.shape), dtype=torch.bfloat16, device=weight.device)
    n = weight.numel()
    _weight_parts_kernel[(triton.cdiv(n, PARTS_BLOCK),)](w_ptr=weight, parts_ptr=parts, N=n, BLOCK=PARTS_BLOCK,
                                                         **launch_args(weight.device))
    return parts


def weight_parts_torch(weight: torch.Tensor) -> torch.Tensor:
    """Same as `weight_parts`."""
    hi = weight.to(torch.bfloat16)
    rest = weight - hi.float()
    mid = rest.to(torch.bfloat16)
    return torch.stack([hi, mid, (rest - mid.float()).to(torch.bfloat16)])


def _tile(t: int, e: int, h: int, device: torch.device, asked: tuple[int, ...] | None) -> tuple[int, int, int]:
    """(tokens, experts, H splits) a program."""
    if asked is not None:
        block_t, block_e, splits = (*asked, 1) if len(asked) == 2 else asked
        pow2 = all(b >= 1 and not b & (b - 1) for b in (block_t, block_e))
        if (len(asked) not in (2, 3) or not pow2 or block_t not in (1, *DOT_BLOCK_TS) or (block_t > 1 and block_e < 16)
                or not 1 <= splits <= h or (splits > 1 and block_t != BLOCK_T)):
            raise ValueError(f"router_topk: tile {asked}, expected (1, a power of two), "
                             f"(one of {DOT_BLOCK_TS}, a power of two >= 16) or ({BLOCK_T}, a power of two >= 16, "
                             "H splits)")
        return block_t, block_e, splits
    if t <= GEMV_MAX_T:
        return 1, GEMV_BLOCK_E, 1
    if t <= DOT_DECODE_MAX_T:  # decode batches are latency-bound: the weight read once, over every SM
        return BLOCK_T, max(16, min(DOT_DECODE_BLOCK_E, triton.next_power_of_2(e))), triton.cdiv(h, SPLIT_H)
    # PREFILL_BLOCK_T tokens where that gives every SM a program, else 16-token tiles of the
    # widest expert block that does
    block_e = min(64, max(16, triton.next_power_of_2(e)))
    if triton.cdiv(t, PREFILL_BLOCK_T) * triton.cdiv(e, block_e) >= num_sms(device):
        return PREFILL_BLOCK_T, block_e, 1
    while block_e > 16 and triton.cdiv(t, BLOCK_T) * triton.cdiv(e, block_e) < num_sms(device):
        block_e //= 2
    return BLOCK_T, block_e, 1


def rms_norm_router_topk_torch(x, residual, norm_w, eps, weight, top_k, renormalize):
    """Same signature and semantics as `rms_norm_router_topk` (residual itself is not modified)."""
    check_norm_inputs("rms_norm_router_topk", x, residual, norm_w, GEMV_MAX_T)
    res_out = x if residual is None else residual.clone()
    h = rms_norm_torch(x, norm_w, eps, residual=None if residual is None else res_out)
    return (h, *router_topk_torch(h, weight, top_k, renormalize), res_out)


def router_topk_torch(x: torch.Tensor, weight: torch.Tensor, top_k: int,
                      renormalize: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """x [T, H], weight [E, H] (bf16/fp16/fp32) -> ids [T, K] int32, weights [T, K] fp32:
    fp32 logits x.float() @ weight.float().T, as transformers' FlintTopKRouter."""
    return route_from_logits_torch(x.float() @ weight.float().T, top_k, renormalize)


def _check_inputs(x, weight, top_k):
    if x.dim() != 2 or x.stride(-1) != 1:
        raise ValueError(f"router_topk: x has shape {tuple(x.shape)} strides {x.stride()}, "
                         "expected [T, H] with unit stride in H")
    e, h = weight.shape if weight.dim() == 2 else (None, None)
    if h != x.shape[1] or weight.stride(-1) != 1:
        raise ValueError(f"router_topk: weight has shape {tuple(weight.shape)}, expected [E, {x.shape[1]}] "
                         "with unit stride in H")
    if weight.dtype not in (torch.bfloat16, torch.float16, torch.float32):
        raise ValueError(f"router_topk: weight is {weight.dtype}, expected bfloat16, float16 or float32")
    if not 1 <= top_k <= e:
        raise ValueError(f"router_topk: top_k {top_k}, expected 1..{e}")
