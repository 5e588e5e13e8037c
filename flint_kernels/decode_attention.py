"""Decode attention with sinks: one new token per sequence (N == B); semantics in attention.py.

Split-KV (flash-decoding): program (b, kv head, split) streams one contiguous range of the
visible cached positions [lo, ctx) and keeps unnormalised partial results for the G query heads
of its KV head, which share every K/V tile (G rows padded to 16 for tl.dot), and stores them to
fp32 scratch. The reduce program (b, query head) merges the partials online, issuing its loads
before it knows the context length, and adds the new token (read from k/v) and the sink, each
exactly once. A single non-empty split (short or
empty context) adds them itself and writes the output from its registers; the reduce program
then exits (a launch of one split has no reduce launch).

The grid and scratch depend only on (B, num_splits), never on context lengths, so a captured
CUDA graph replays for any lengths: splits past a sequence's length exit at once.

Numerics: S = q . k with bf16 operands and fp32 accumulation, the softmax in fp32 (exp2 of the
scaled scores, running max and sum), the unnormalised probabilities rounded to bf16 for the P V
dot (fp32 accumulation), split partials (O, m, l) fp32, the sink added to the fp32 denominator,
one rounding of O / l to the output dtype. The interpreter feeds its dots fp32. With FP8 KV the K
scale multiplies the scores and the V scale the sum of p * v (powers of two: exact); a bf16
model's dots take the E4M3 codes as fp16 (exact) and q as fp16 (q comes out of an RMSNorm: in
fp16's range, with 3 more mantissa bits than bf16), an fp32 model's the codes as fp32. transformers
normalises P before rounding it to bf16; we divide the fp32 accumulator by l at the end.
(Merging in the last split to arrive instead of a second launch measured slower on the H200,
2026-12-02: a full layer at 100K 70.5 us vs 61.0, a sliding one 8.36 vs 6.53. The Q/K norm,
RoPE and cache write inside these two launches measured slower than qk_norm_rope's launch
before them, 2026-12-03 and 2026-12-04: NVFP4 100K 2.570 -> 2.695 and 2.103 -> 2.249 ms a token.)
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .attention import attention_torch, check_attention_inputs
from .pdl import launch_args, pdl_prologue
from .split_k import num_sms
from .tuning import INTERPRET

# Triton's interpreter computes bf16 tl.dot wrongly: feed it fp32 there, bf16 on a GPU.
DOT_FP32 = INTERPRET
LOG2E = 1.4426950408889634
TILE_N = 64            # cached positions per tile
MAX_SPLITS = 128       # upper bound of the split grid axis (scratch is [B, Hq, splits, D] fp32)
WAVES = 2              # default splits aim at this many programs per SM
# K/V tiles in flight per split program (cp.async): paged 3 (72 KB of shared memory, 4 stages take
# 104 KB), ring 3. Batch-1 decode at 100K on the H200 (2026-12-04), graph replay: 3 paged stages
# take a full layer's split 50.8 -> 50.2 us, NVFP4 2.199 -> 2.187 ms, BF16 2.786 -> 2.776 (2: 58 us
# a full split). Read at each launch.
PAGED_STAGES, RING_STAGES = 3, 3
SPLIT_WARPS = 4        # warps of a split program (a launch-config knob: tools/bench/sweep_decode_attention.py)
# A sliding-window layer's default splits are capped at a tile each (one split per KV head, or
# 2, 3 or 5, measured slower on the H200, 2026-12-03/04: NVFP4 100K 2.570 -> 2.719 ms, and 2.223
# -> 2.304 / 2.275 / 2.253).
# splits a reduce program merges per step: on a GPU all of them at batch 1 (one round trip; 8
# warps hold [128, D] fp32), the interpreter also runs the multi-step loop. A launch's
# reduce_warps overrides REDUCE_WARPS (the NVFP4 model's decode steps take tuning.NVFP4_REDUCE_WARPS)
REDUCE_BLOCK_S, REDUCE_WARPS = (16, 4) if INTERPRET else (128, 8)


@triton.jit
def _split_range(context_lens_ptr, b, s, window, num_splits, BLOCK_N: tl.constexpr):
    """Cached positions [start, end) of split s of sequence b, and how many splits are non-empty."""
    ctx = tl.load(context_lens_ptr + b)
    lo = tl.where(window > 0, tl.maximum(ctx - window + 1, 0), 0)
    split_len = tl.cdiv(tl.cdiv(ctx - lo, num_splits), BLOCK_N) * BLOCK_N
    split_len = tl.maximum(split_len, BLOCK_N)
    start = lo + s * split_len
    return start, tl.minimum(start + split_len, ctx), tl.cdiv(ctx - lo, split_len)


@triton.jit
def _partials(part_ml_ptr, part_acc_ptr, part, s0, splits, cols, num_splits, n_splits, D: tl.constexpr):
    """The partials of splits s0 + splits of a reduce program (its first at part): -> max [BLOCK_S],
    sum of p [BLOCK_S], sum of p * v [BLOCK_S, D]; those of splits that did not run (past the
    n_splits non-empty ones, or all when one split ran: any bits) read as empty."""
    idx = part + s0 + splits
    loaded = s0 + splits < num_splits
    live = (s0 + splits < n_splits) & (n_splits > 1)  # partials exist when several splits ran
    ms = tl.load(part_ml_ptr + idx * 2, mask=loaded, other=-1e30)
    ls = tl.load(part_ml_ptr + idx * 2 + 1, mask=loaded, other=0.0)
    accs = tl.load(part_acc_ptr + idx[:, None] * D + cols[None, :], mask=loaded[:, None], other=0.0)
    return tl.where(live, ms, -1e30), tl.where(live, ls, 0.0), tl.where(live[:, None], accs, 0.0)


@triton.jit
def _merge(m, l, acc, m2, l2, acc2):
    """Two softmax partials (max in log2 units [BLOCK_G], sum of p, sum of p * v) rescaled to their common max."""
    m_new = tl.maximum(m, m2)
    a = tl.exp2(m - m_new)
    a2 = tl.exp2(m2 - m_new)
    return m_new, l * a + l2 * a2, acc * a[:, None] + acc2 * a2[:, None]


@triton.jit
def _decode_split_kernel(
    q_ptr,             # [B, Hq, D]
    k_ptr,             # [B, Hk, D] this step's keys
    v_ptr,             # [B, Hk, D] this step's values
    k_cache_ptr,       # [num_slots, Hk, D] contiguous
    v_cache_ptr,       # [num_slots, Hk, D] contiguous
    context_lens_ptr,  # [B] int32
    block_tables_ptr,  # [B, max_blocks] int32 (read when PAGED)
    ring_rows_ptr,     # [B] int32 (read when not PAGED)
    sinks_ptr,         # [Hq] fp32 (read when USE_SINKS)
    part_acc_ptr,      # [B, Hq, num_splits, D] fp32: unnormalised sum of p * v
    part_ml_ptr,       # [B, Hq, num_splits, 2] fp32: running max (log2 units), sum of p
    out_ptr,           # [B, Hq, D]
    stride_qb, stride_qh, stride_kb, stride_kh, stride_vb, stride_vh, stride_ob, stride_oh, stride_bt,
    qk_scale, window, num_splits, k_scale, v_scale,  # scales: FP8 KV (KV_FP8) only
    HK: tl.constexpr, G: tl.constexpr, D: tl.constexpr, ROWS_PER: tl.constexpr,
    BLOCK_G: tl.constexpr, BLOCK_N: tl.constexpr,
    PAGED: tl.constexpr, USE_SINKS: tl.constexpr, DOT_FP32: tl.constexpr, DOT_PRECISION: tl.constexpr,
    KV_FP8: tl.constexpr, FP16_DOTS: tl.constexpr, PDL: tl.constexpr,
):
    # the step's metadata (context lengths, ring rows, block tables: copied in by the host,
    # written by no kernel of the step) is read before the PDL wait (pdl.py)
    b = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1)
    s = tl.program_id(2)
    start, end, n_splits = _split_range(context_lens_ptr, b, s, window, num_splits, BLOCK_N)
    n_splits = tl.maximum(n_splits, 1)  # no cached position: split 0 still adds the new token and sink
    if s >= n_splits:
        return
    rows = tl.arange(0, BLOCK_G)  # query heads h*G + rows
    cols = tl.arange(0, D)
    table = block_tables_ptr + b * stride_bt
    ring_base = 0
    if not PAGED:
        ring_base = tl.load(ring_rows_ptr + b).to(tl.int64) * ROWS_PER
    # block numbers are read one tile ahead, so K/V loads do not wait on them (deeper pipelining)
    pos_next = start + tl.arange(0, BLOCK_N)
    block_next = tl.load(table + pos_next // ROWS_PER, mask=PAGED & (pos_next < end), other=0)
    pdl_prologue(PDL)
    q = _load_heads(q_ptr + b * stride_qb, h * G + rows, rows < G, stride_qh, D)  # [BLOCK_G, D]
    if DOT_FP32:
        q = q.to(tl.float32)
    q_dot = q
    tile_scale = qk_scale
    if KV_FP8:  # the scales go to the scores and to the sum of p * v, not to every element
        tile_scale = qk_scale * k_scale
        if FP16_DOTS:  # a bf16 model: dots on the E4M3 codes as fp16 (one conversion a pair)
            q_dot = q.to(tl.float16)
    m = tl.full([BLOCK_G], -1e30, tl.float32)  # finite: a fully masked tile gives p = 0, not NaN
    l = tl.zeros([BLOCK_G], tl.float32)
    acc = tl.zeros([BLOCK_G, D], tl.float32)
    for kstart in range(start, end, BLOCK_N):
        pos = kstart + tl.arange(0, BLOCK_N)
        valid = pos < end
        if PAGED:
            block = block_next.to(tl.int64)
            pos_next = pos + BLOCK_N
            block_next = tl.load(table + pos_next // ROWS_PER, mask=pos_next < end, other=0)
            slot = block * ROWS_PER + pos % ROWS_PER
        else:
            slot = ring_base + pos % ROWS_PER
        kv_off = slot[:, None] * (HK * D) + h * D + cols[None, :]  # [BLOCK_N, D]
        k = tl.load(k_cache_ptr + kv_off, mask=valid[:, None], other=0.0)
        v = tl.load(v_cache_ptr + kv_off, mask=valid[:, None], other=0.0)
        if DOT_FP32:
            k = k.to(tl.float32)
            v = v.to(tl.float32)
        elif FP16_DOTS:
            k = k.to(tl.float16)
            v = v.to(tl.float16)
        elif KV_FP8:  # an fp32 model
            k = k.to(tl.float32)
            v = v.to(tl.float32)
        scores = tl.dot(q_dot, tl.trans(k), input_precision=DOT_PRECISION) * tile_scale  # [BLOCK_G, BLOCK_N]
        scores = tl.where(valid[None, :], scores, float("-inf"))
        m_new = tl.maximum(m, tl.max(scores, axis=1))
        alpha = tl.exp2(m - m_new)
        p = tl.exp2(scores - m_new[:, None])
        l = l * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
        m = m_new
    if KV_FP8:
        acc = acc * v_scale
    head_ok = rows < G
    part = (b * (HK * G) + h * G + rows) * num_splits  # [BLOCK_G] (b, head, split 0)
    if n_splits > 1:  # partials for _decode_reduce_kernel
        tl.store(part_acc_ptr + (part + s)[:, None] * D + cols[None, :], acc, mask=head_ok[:, None])
        tl.store(part_ml_ptr + (part + s) * 2, m, mask=head_ok)
        tl.store(part_ml_ptr + (part + s) * 2 + 1, l, mask=head_ok)
        return
    one = tl.arange(0, 1)
    k_new = tl.reshape(_load_heads(k_ptr + b * stride_kb, h + one, one < 1, stride_kh, D), [D]).to(tl.float32)
    v_new = tl.load(v_ptr + b * stride_vb + h * stride_vh + cols).to(tl.float32)
    out = _finish_one_split(q, m, l, acc, k_new, v_new, sinks_ptr + h * G + rows, head_ok, qk_scale, USE_SINKS)
    tl.store(out_ptr + b * stride_ob + (h * G + rows[:, None]) * stride_oh + cols[None, :],
             out.to(q_ptr.dtype.element_ty).to(out_ptr.dtype.element_ty), mask=head_ok[:, None])


@triton.jit
def _load_heads(ptr, heads, head_ok, stride_h, D: tl.constexpr):
    """Heads [R, D] at ptr + heads * stride_h (heads [R]), as stored."""
    cols = tl.arange(0, D)
    return tl.load(ptr + heads[:, None] * stride_h + cols[None, :], mask=head_ok[:, None], other=0.0)


@triton.jit
def _finish_one_split(q, m, l, acc, k_new, v_new, sink_ptrs, head_ok, qk_scale, USE_SINKS: tl.constexpr):
    """Normalised output [BLOCK_G, D] of a KV head's G query heads when one split saw every cached
    position: its partial (m, l, acc), the new token (k_new, v_new [D] fp32; it always sees
    itself) and the sink."""
    m_out = tl.sum(q.to(tl.float32) * k_new[None, :], axis=1) * qk_scale  # the new token's score, p = 1
    l_out = tl.full(m_out.shape, 1.0, tl.float32)
    acc_out = tl.zeros(acc.shape, tl.float32) + v_new[None, :]
    if USE_SINKS:  # the sink: a score with no value
        sink = tl.load(sink_ptrs, mask=head_ok, other=0.0) * 1.4426950408889634
        m_out, l_out, acc_out = _merge(m_out, l_out, acc_out, sink, 1.0, 0.0)
    m_out, l_out, acc_out = _merge(m_out, l_out, acc_out, m, l, acc)
    return acc_out / l_out[:, None]


@triton.jit
def _decode_reduce_kernel(
    q_ptr,             # [B, Hq, D]
    k_ptr,             # [B, Hk, D] this step's keys
    v_ptr,             # [B, Hk, D] this step's values
    context_lens_ptr,  # [B] int32
    sinks_ptr,         # [Hq] fp32 (read when USE_SINKS)
    part_acc_ptr,      # [B, Hq, num_splits, D] fp32
    part_ml_ptr,       # [B, Hq, num_splits, 2] fp32
    out_ptr,           # [B, Hq, D]
    stride_qb, stride_qh, stride_kb, stride_kh, stride_vb, stride_vh, stride_ob, stride_oh,
    qk_scale, window, num_splits,
    G: tl.constexpr, D: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_N: tl.constexpr,
    USE_SINKS: tl.constexpr, PDL: tl.constexpr,
):
    """Program (b, query head): one pass over the splits' partials, BLOCK_S at a time, merged
    online. The new token's q, k, v (written before the split launch, which has completed once
    this program runs: pdl.py) are read and merged with the sink before the PDL wait; after it
    every load is issued without waiting for the context length (partials of splits past the
    sequence's non-empty ones are loaded, then masked), the first BLOCK_S partials at once, so
    with BLOCK_S >= num_splits the program makes one round trip to memory. H200 2026-12-03/05:
    the partials with q, k, v 2.349 -> 2.330 ms a token (NVFP4 100K), the new token before the
    wait 2.1119 -> 2.1049. Nothing is stored when one split wrote the output itself."""
    b = tl.program_id(0).to(tl.int64)
    hq = tl.program_id(1)
    hk = hq // G
    _, _, n_splits = _split_range(context_lens_ptr, b, 0, window, num_splits, BLOCK_N)  # metadata: before the wait
    sink = 0.0
    if USE_SINKS:  # a weight: before the wait too
        sink = tl.load(sinks_ptr + hq) * 1.4426950408889634
    cols = tl.arange(0, D)
    m, l, acc = _new_token(q_ptr, k_ptr, v_ptr, b, hq, hk, cols, stride_qb, stride_qh, stride_kb, stride_kh,
                           stride_vb, stride_vh, qk_scale, sink, D, USE_SINKS)
    pdl_prologue(PDL)
    splits = tl.arange(0, BLOCK_S)
    part = (b * tl.num_programs(1) + hq) * num_splits
    ms, ls, accs = _partials(part_ml_ptr, part_acc_ptr, part, 0, splits, cols, num_splits, n_splits, D)
    for s0 in range(0, num_splits, BLOCK_S):
        if s0 > 0:
            ms, ls, accs = _partials(part_ml_ptr, part_acc_ptr, part, s0, splits, cols, num_splits, n_splits, D)
        m_new = tl.maximum(m, tl.max(ms, axis=0))
        alpha = tl.exp2(m - m_new)
        w = tl.exp2(ms - m_new)  # [BLOCK_S]
        l = l * alpha + tl.sum(w * ls, axis=0)
        acc = acc * alpha + tl.sum(w[:, None] * accs, axis=0)
        m = m_new
    out = (acc / l).to(q_ptr.dtype.element_ty)
    tl.store(out_ptr + b * stride_ob + hq * stride_oh + cols, out.to(out_ptr.dtype.element_ty),
             mask=(cols < D) & (n_splits > 1))  # else split 0 wrote the output from its registers


@triton.jit
def _new_token(q_ptr, k_ptr, v_ptr, b, hq, hk, cols, stride_qb, stride_qh, stride_kb, stride_kh, stride_vb,
               stride_vh, qk_scale, sink, D: tl.constexpr, USE_SINKS: tl.constexpr):
    """A reduce program's start: the new token (score q . k, p = 1, value v at cols [D]) and the
    sink (a score with no value), merged -> (max in log2 units, sum of p, sum of p * v [D])."""
    one = tl.arange(0, 1)
    q = tl.reshape(_load_heads(q_ptr + b * stride_qb, hq + one, one < 1, stride_qh, D), [D]).to(tl.float32)
    k = tl.reshape(_load_heads(k_ptr + b * stride_kb, hk + one, one < 1, stride_kh, D), [D]).to(tl.float32)
    v = tl.load(v_ptr + b * stride_vb + hk * stride_vh + cols).to(tl.float32)
    m = tl.sum(q * k, axis=0) * qk_scale  # the new token always sees itself: p = 1 at m
    l = tl.full([], 1.0, tl.float32)
    acc = v
    if USE_SINKS:
        m_new = tl.maximum(m, sink)
        alpha = tl.exp2(m - m_new)
        l = l * alpha + tl.exp2(sink - m_new)
        acc = acc * alpha
        m = m_new
    return m, l, acc


def decode_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                     k_cache: torch.Tensor, v_cache: torch.Tensor, context_lens: torch.Tensor,
                     sinks: torch.Tensor | None, sm_scale: float, window: int,
                     block_tables: torch.Tensor | None = None, ring_rows: torch.Tensor | None = None,
                     out: torch.Tensor | None = None, num_splits: int | None = None,
                     reduce_warps: int | None = None, kv_scales: tuple[float, float] | None = None) -> torch.Tensor:
    """q [B, Hq, D], k/v [B, Hk, D] (token b at position context_lens[b]) -> out [B, Hq, D], in
    q's dtype or, where out is given in float16, rounded to q's dtype and then converted (the
    activations of fp16 GEMM tiles).
    num_splits: the split grid axis (default: enough programs for WAVES per SM, capped by the window).
    reduce_warps: warps of a reduce program (default REDUCE_WARPS), a launch config.
    kv_scales: FP8 KV (attention.py)."""
    check_attention_inputs("decode_attention", q, k, v, None, context_lens, k_cache, v_cache, sinks,
                           window, block_tables, ring_rows, kv_scales)
    return _launch(q, k, v, k_cache, v_cache, context_lens, sinks, sm_scale, window, block_tables, ring_rows, out,
                   num_splits, kv_scales, reduce_warps)


def _launch(q, k, v, k_cache, v_cache, context_lens, sinks, sm_scale, window, block_tables, ring_rows, out,
            num_splits, kv_scales, reduce_warps) -> torch.Tensor:
    """The split and reduce launches."""
    batch, hq, d = q.shape
    hk = k.shape[1]
    if context_lens.shape != (batch,):
        raise ValueError(f"decode_attention: context_lens has shape {tuple(context_lens.shape)}, "
                         f"expected ({batch},): one new token per sequence")
    if d & (d - 1) or d < 16:
        raise ValueError(f"decode_attention: head_dim {d}, expected a power of two >= 16")
    if out is None:
        out = torch.empty((batch, hq, d), dtype=q.dtype, device=q.device)
    elif out.shape != q.shape or out.dtype not in (q.dtype, torch.float16) or out.stride(-1) != 1:
        raise ValueError(f"decode_attention: out is {out.dtype} {tuple(out.shape)}, expected {q.dtype} (or "
                         f"float16: q's dtype converted, for fp16 GEMM tiles) {tuple(q.shape)} with unit stride in D")
    if reduce_warps is not None and reduce_warps not in (1, 2, 4, 8, 16):
        raise ValueError(f"decode_attention: reduce_warps {reduce_warps}, expected a power of two 1..16 or None")
    if batch == 0:
        return out
    splits = num_splits or _default_num_splits(batch, hk, window, q.device)
    if not 1 <= splits <= MAX_SPLITS:
        raise ValueError(f"decode_attention: num_splits {splits}, expected 1..{MAX_SPLITS}")
    part_acc = torch.empty((batch, hq, splits, d), dtype=torch.float32, device=q.device)
    part_ml = torch.empty((batch, hq, splits, 2), dtype=torch.float32, device=q.device)
    paged = block_tables is not None
    common = dict(
        q_ptr=q, k_ptr=k, v_ptr=v, context_lens_ptr=context_lens,
        sinks_ptr=sinks if sinks is not None else part_ml,
        part_acc_ptr=part_acc, part_ml_ptr=part_ml, out_ptr=out,
        stride_qb=q.stride(0), stride_qh=q.stride(1), stride_kb=k.stride(0), stride_kh=k.stride(1),
        stride_vb=v.stride(0), stride_vh=v.stride(1), stride_ob=out.stride(0), stride_oh=out.stride(1),
        qk_scale=sm_scale * LOG2E, window=window, num_splits=splits, G=hq // hk, D=d, BLOCK_N=TILE_N,
        USE_SINKS=sinks is not None, **launch_args(q.device))
    _decode_split_kernel[(batch, hk, splits)](
        k_cache_ptr=k_cache, v_cache_ptr=v_cache,
        block_tables_ptr=block_tables if paged else context_lens,
        ring_rows_ptr=context_lens if paged else ring_rows,
        stride_bt=block_tables.stride(0) if paged else 0,
        HK=hk, ROWS_PER=k_cache.shape[1], BLOCK_G=max(16, triton.next_power_of_2(hq // hk)),
        PAGED=paged, DOT_FP32=DOT_FP32, DOT_PRECISION="ieee" if q.dtype == torch.float32 else "tf32",
        k_scale=kv_scales[0] if kv_scales else 1.0, v_scale=kv_scales[1] if kv_scales else 1.0,
        KV_FP8=kv_scales is not None,
        FP16_DOTS=kv_scales is not None and q.dtype == torch.bfloat16 and not DOT_FP32, **common,
        num_warps=SPLIT_WARPS, num_stages=PAGED_STAGES if paged else RING_STAGES,
    )
    if splits > 1:  # else the one split wrote every output itself
        _decode_reduce_kernel[(batch, hq)](
            BLOCK_S=min(REDUCE_BLOCK_S, triton.next_power_of_2(splits)), **common,
            num_warps=reduce_warps or REDUCE_WARPS)
    return out


def _default_num_splits(batch: int, num_kv_heads: int, window: int, device: torch.device) -> int:
    """Splits that give every SM about WAVES programs at the batch's decode-graph bucket (the
    next power of two), so an eager step of 3 rows splits each context as the replay of its
    bucket of 4 does and gives the same bits; a window caps them at one tile each."""
    splits = triton.cdiv(WAVES * num_sms(torch.device(device)), triton.next_power_of_2(batch) * num_kv_heads)
    if window:
        splits = min(splits, triton.cdiv(window, TILE_N))
    return max(1, min(MAX_SPLITS, splits))


def decode_attention_torch(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                           k_cache: torch.Tensor, v_cache: torch.Tensor, context_lens: torch.Tensor,
                           sinks: torch.Tensor | None, sm_scale: float, window: int,
                           block_tables: torch.Tensor | None = None, ring_rows: torch.Tensor | None = None,
                           out: torch.Tensor | None = None, num_splits: int | None = None,
                           reduce_warps: int | None = None, kv_scales: tuple[float, float] | None = None,
                           ) -> torch.Tensor:
    """Same signature and semantics as `decode_attention` (num_splits and reduce_warps are ignored)."""
    qsl = torch.arange(q.shape[0] + 1, dtype=torch.int32, device=q.device)
    result = attention_torch(q, k, v, qsl, context_lens, k_cache, v_cache, sinks, sm_scale, window,
                             block_tables=block_tables, ring_rows=ring_rows, kv_scales=kv_scales)
    if out is None:
        return result
    out.copy_(result)
    return out

