"""Prefill attention with sinks: chunked, causal, sliding window, mixed batches; semantics in
attention.py.

Flash attention over tiles of (BLOCK_Q query tokens x the G query heads of one KV head) =
BLOCK_M rows, so the heads of a GQA group share every K/V tile and a one-token sequence
fills G rows, not BLOCK_M. Keys stream in BLOCK_N tiles over the positions the tile can see,
cached ones from the paged/ring cache and this step's from k/v (a tile may mix both). Tiles
every row sees whole skip the causal/window mask; tiles no row sees are never loaded.
The grid is (cdiv(N, BLOCK_Q) + B, Hk): sequence b owns tile slots from
query_start_loc[b] // BLOCK_Q + b on, found by binary search, so no host sync is needed.
A paged cache that already holds the step's keys (full layers write before attention:
kv_in_cache) is read by whole pages through tensor descriptors (TMA on Hopper), one or two
pages a key tile (_attend_pages), with no address tensors in registers.

Numerics as decode_attention.py: bf16 dots with fp32 accumulation, an fp32 online softmax with
the sink in its denominator, unnormalised probabilities rounded to bf16 for P V, one rounding
of the output (transformers rounds the normalised P instead).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from .attention import attention_torch, check_attention_inputs
from . import tuning
from .pdl import launch_args, pdl_prologue
from .tuning import INTERPRET

DOT_FP32 = INTERPRET  # Triton's interpreter computes bf16 tl.dot wrongly
LOG2E = 1.4426950408889634
# GPU tiles: 128 rows x 64 keys, D up to 128 (H100/H200 flash-attention shape; other shapes:
# tuning.PREFILL_ATTENTION_TILES); interpreter: small
TILE_M, TILE_N = (32, 16) if INTERPRET else (128, 64)
# (rows, keys, warps, stages) of tiles read by whole pages (kv_in_cache): two 64-row pages a key
# tile, 2 stages. H100 2026-12-06 (sweep_tiles.py), an 8192-token chunk at 92160 cached positions:
# 296 TFLOP/s gathered in 128 x 64 tiles, 348 by pages in them, 452 by pages in 128 x 128 x 2.
PAGE_TILES = (32, 32, 4, 1) if INTERPRET else (128, 128, 8, 2)


@triton.jit
def _find_sequence(query_start_loc_ptr, tile, num_seqs, BLOCK_Q: tl.constexpr):
    """Largest b with query_start_loc[b] // BLOCK_Q + b <= tile."""
    left: tl.int32 = 0
    right = num_seqs
    while left < right:
        mid = (left + right) // 2
        if tl.load(query_start_loc_ptr + mid) // BLOCK_Q + mid <= tile:
            left = mid + 1
        else:
            right = mid
    return left - 1


@triton.jit
def _attend_tile(
    q, m, l, acc,            # [BLOCK_M, D], [BLOCK_M], [BLOCK_M], [BLOCK_M, D]
    kstart, qpos,            # first key position of the tile; [BLOCK_M] query positions
    hi, ctx, window, qk_scale, k_scale, v_scale,  # scales: FP8 KV (KV_FP8) only
    k_cache_ptr, v_cache_ptr,  # [num_slots, Hk, D]
    k_ptr, v_ptr,            # this sequence's first new row, kv head h applied
    stride_kt, stride_vt,
    table_ptr, ring_base, h,
    HK: tl.constexpr, D: tl.constexpr, ROWS_PER: tl.constexpr, BLOCK_N: tl.constexpr,
    PAGED: tl.constexpr, MASKED: tl.constexpr, DOT_FP32: tl.constexpr, DOT_PRECISION: tl.constexpr,
    KV_FP8: tl.constexpr,
):
    pos = kstart + tl.arange(0, BLOCK_N)
    cols = tl.arange(0, D)
    in_range = pos < hi
    cached = pos < ctx
    if PAGED:
        block = tl.load(table_ptr + pos // ROWS_PER, mask=cached & in_range, other=0).to(tl.int64)
        slot = block * ROWS_PER + pos % ROWS_PER
    else:
        slot = ring_base + pos % ROWS_PER
    new = tl.maximum(pos - ctx, 0).to(tl.int64)  # row of this step's k/v
    cache_off = slot * (HK * D) + h * D
    if KV_FP8:  # E4M3 codes in the cache (another element type than k/v): two masked loads
        from_cache = (cached & in_range)[:, None]
        from_step = (~cached & in_range)[:, None]
        k_step = tl.load(k_ptr + new[:, None] * stride_kt + cols[None, :], mask=from_step, other=0.0)
        v_step = tl.load(v_ptr + new[:, None] * stride_vt + cols[None, :], mask=from_step, other=0.0)
        k_code = tl.load(k_cache_ptr + cache_off[:, None] + cols[None, :], mask=from_cache, other=0.0)
        v_code = tl.load(v_cache_ptr + cache_off[:, None] + cols[None, :], mask=from_cache, other=0.0)
        k = tl.where(from_cache, (k_code.to(tl.float32) * k_scale).to(k_step.dtype), k_step)
        v = tl.where(from_cache, (v_code.to(tl.float32) * v_scale).to(v_step.dtype), v_step)
    else:
        k_rows = tl.where(cached, k_cache_ptr + cache_off, k_ptr + new * stride_kt)  # [BLOCK_N] pointers
        v_rows = tl.where(cached, v_cache_ptr + cache_off, v_ptr + new * stride_vt)
        if MASKED:
            k = tl.load(k_rows[:, None] + cols[None, :], mask=in_range[:, None], other=0.0)
            v = tl.load(v_rows[:, None] + cols[None, :], mask=in_range[:, None], other=0.0)
        else:
            k = tl.load(k_rows[:, None] + cols[None, :])
            v = tl.load(v_rows[:, None] + cols[None, :])
    if DOT_FP32:
        k = k.to(tl.float32)
        v = v.to(tl.float32)
    scores = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION)  # [BLOCK_M, BLOCK_N], unscaled
    if MASKED:
        seen = in_range[None, :] & (pos[None, :] <= qpos[:, None])
        seen &= (window == 0) | (pos[None, :] > qpos[:, None] - window)
        scores = tl.where(seen, scores, float("-inf"))
    m_new = tl.maximum(m, tl.max(scores, axis=1) * qk_scale)
    alpha = tl.exp2(m - m_new)
    p = tl.exp2(scores * qk_scale - m_new[:, None])  # one fma a score
    l = l * alpha + tl.sum(p, axis=1)
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
    return m_new, l, acc


@triton.jit
def _page_scores(q, kstart, qpos, hi, window, k_desc, v_desc, table_ptr, n_pages, h,
                 D: tl.constexpr, ROWS_PER: tl.constexpr, MASKED: tl.constexpr, DOT_FP32: tl.constexpr,
                 DOT_PRECISION: tl.constexpr):
    """One page's scores [BLOCK_M, ROWS_PER] (masked: -inf) and values [ROWS_PER, D] (masked: 0,
    as rows past the written ones may hold anything)."""
    page = tl.load(table_ptr + kstart // ROWS_PER, mask=kstart // ROWS_PER < n_pages, other=0)
    k = k_desc.load([page * ROWS_PER, h * D])
    v = v_desc.load([page * ROWS_PER, h * D])
    if DOT_FP32:
        k = k.to(tl.float32)
        v = v.to(tl.float32)
    scores = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION)  # unscaled (_attend_pages scales)
    if MASKED:
        pos = kstart + tl.arange(0, ROWS_PER)
        in_range = pos < hi
        seen = in_range[None, :] & (pos[None, :] <= qpos[:, None])
        seen &= (window == 0) | (pos[None, :] > qpos[:, None] - window)
        scores = tl.where(seen, scores, float("-inf"))
        v = tl.where(in_range[:, None], v, 0.0)
    return scores, v


@triton.jit
def _attend_pages(q, m, l, acc, kstart, qpos, hi, window, qk_scale, k_desc, v_desc, table_ptr, n_pages, h,
                  D: tl.constexpr, ROWS_PER: tl.constexpr, PAGES: tl.constexpr, MASKED: tl.constexpr,
                  DOT_FP32: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """_attend_tile over PAGES (1 or 2) whole pages of a cache holding every key (kv_in_cache)."""
    s0, v0 = _page_scores(q, kstart, qpos, hi, window, k_desc, v_desc, table_ptr, n_pages, h,
                          D, ROWS_PER, MASKED, DOT_FP32, DOT_PRECISION)
    top = tl.max(s0, axis=1)
    if PAGES == 2:
        s1, v1 = _page_scores(q, kstart + ROWS_PER, qpos, hi, window, k_desc, v_desc, table_ptr,
                              n_pages, h, D, ROWS_PER, MASKED, DOT_FP32, DOT_PRECISION)
        top = tl.maximum(top, tl.max(s1, axis=1))
    m_new = tl.maximum(m, top * qk_scale)  # the scale on a row's max (it keeps the order), then in the fma below
    alpha = tl.exp2(m - m_new)
    p0 = tl.exp2(s0 * qk_scale - m_new[:, None])
    l = l * alpha + tl.sum(p0, axis=1)
    acc = tl.dot(p0.to(v0.dtype), v0, acc * alpha[:, None], input_precision=DOT_PRECISION)
    if PAGES == 2:
        p1 = tl.exp2(s1 * qk_scale - m_new[:, None])
        l += tl.sum(p1, axis=1)
        acc = tl.dot(p1.to(v1.dtype), v1, acc, input_precision=DOT_PRECISION)
    return m_new, l, acc


@triton.jit
def _attend(q, m, l, acc, kstart, qpos, hi, ctx, window, qk_scale, k_scale, v_scale, k_cache_ptr, v_cache_ptr,
            k_new, v_new, stride_kt, stride_vt, table_ptr, ring_base, h, k_desc, v_desc, n_pages,
            HK: tl.constexpr, D: tl.constexpr, ROWS_PER: tl.constexpr, BLOCK_N: tl.constexpr, PAGED: tl.constexpr,
            PAGES: tl.constexpr, MASKED: tl.constexpr, DOT_FP32: tl.constexpr, DOT_PRECISION: tl.constexpr,
            KV_FP8: tl.constexpr):
    """The key tile at kstart by whole pages (PAGES) or by gathered rows."""
    if PAGES:
        m, l, acc = _attend_pages(q, m, l, acc, kstart, qpos, hi, window, qk_scale, k_desc, v_desc, table_ptr,
                                  n_pages, h, D=D, ROWS_PER=ROWS_PER, PAGES=PAGES, MASKED=MASKED,
                                  DOT_FP32=DOT_FP32, DOT_PRECISION=DOT_PRECISION)
    else:
        m, l, acc = _attend_tile(q, m, l, acc, kstart, qpos, hi, ctx, window, qk_scale, k_scale, v_scale,
                                 k_cache_ptr, v_cache_ptr, k_new, v_new, stride_kt, stride_vt, table_ptr, ring_base,
                                 h, HK=HK, D=D, ROWS_PER=ROWS_PER, BLOCK_N=BLOCK_N, PAGED=PAGED, MASKED=MASKED,
                                 DOT_FP32=DOT_FP32, DOT_PRECISION=DOT_PRECISION, KV_FP8=KV_FP8)
    return m, l, acc


@triton.jit(do_not_specialize=["stride_bt", "num_seqs", "n_pages"])  # counts (moe_grouped.py: first-use compiles)
def _prefill_kernel(
    q_ptr,                # [N, Hq, D]
    k_ptr,                # [N, Hk, D] this step's keys
    v_ptr,                # [N, Hk, D] this step's values
    query_start_loc_ptr,  # [B + 1] int32
    context_lens_ptr,     # [B] int32
    k_cache_ptr,          # [num_slots, Hk, D] contiguous
    v_cache_ptr,          # [num_slots, Hk, D] contiguous
    block_tables_ptr,     # [B, max_blocks] int32 (read when PAGED)
    ring_rows_ptr,        # [B] int32 (read when not PAGED)
    sinks_ptr,            # [Hq] fp32 (read when USE_SINKS)
    out_ptr,              # [N, Hq, D]
    k_desc, v_desc,       # PAGES: descriptors of the caches as [num_slots, Hk * D], blocks [ROWS_PER, D]
    stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh, stride_ot, stride_oh, stride_bt,
    qk_scale, window, num_seqs, k_scale, v_scale, n_pages,  # n_pages: block_tables' width
    HK: tl.constexpr, G: tl.constexpr, D: tl.constexpr, ROWS_PER: tl.constexpr,
    G_PAD: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK_N: tl.constexpr,
    PAGED: tl.constexpr, USE_SINKS: tl.constexpr, DOT_FP32: tl.constexpr, DOT_PRECISION: tl.constexpr,
    KV_FP8: tl.constexpr, PAGES: tl.constexpr, PDL: tl.constexpr,  # PAGES: 0, or pages a key tile (kv_in_cache)
):
    pdl_prologue(PDL)
    tile = tl.num_programs(0) - 1 - tl.program_id(0)  # last tiles see the most keys: start them first
    h = tl.program_id(1)
    b = _find_sequence(query_start_loc_ptr, tile, num_seqs, BLOCK_Q)
    q_start = tl.load(query_start_loc_ptr + b)
    q_len = tl.load(query_start_loc_ptr + b + 1) - q_start
    q0 = (tile - q_start // BLOCK_Q - b) * BLOCK_Q  # first query of this tile within the sequence
    if q0 >= q_len:
        return
    ctx = tl.load(context_lens_ptr + b)

    BLOCK_M: tl.constexpr = BLOCK_Q * G_PAD
    rows = tl.arange(0, BLOCK_M)
    qi = q0 + rows // G_PAD
    head = h * G + rows % G_PAD
    row_ok = (qi < q_len) & (rows % G_PAD < G)
    qpos = ctx + qi
    cols = tl.arange(0, D)
    q_rows = (q_start + qi).to(tl.int64) * stride_qt + head * stride_qh
    q = tl.load(q_ptr + q_rows[:, None] + cols[None, :], mask=row_ok[:, None], other=0.0)
    if DOT_FP32:
        q = q.to(tl.float32)
    if USE_SINKS:  # the sink starts the running softmax: max = sink, sum = exp(0) = 1
        m = tl.load(sinks_ptr + head, mask=row_ok, other=0.0) * 1.4426950408889634
        l = tl.full([BLOCK_M], 1.0, tl.float32)
    else:
        m = tl.full([BLOCK_M], -1e30, tl.float32)  # finite: a fully masked row gives p = 0, not NaN
        l = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, D], tl.float32)

    # key positions: [lo, hi) is seen by some row; [all_lo, all_hi) by every row
    p_first = ctx + q0
    p_last = ctx + tl.minimum(q0 + BLOCK_Q, q_len) - 1
    hi = p_last + 1
    lo = tl.where(window > 0, tl.maximum(p_first - window + 1, 0), 0)
    all_lo = tl.where(window > 0, tl.maximum(p_last - window + 1, 0), 0)
    all_hi = p_first + 1
    # tiles start at lo: masked up to all_lo, unmasked while a whole tile fits below all_hi, masked after
    mid_lo = tl.minimum(lo + tl.cdiv(tl.maximum(all_lo - lo, 0), BLOCK_N) * BLOCK_N, hi)
    mid_hi = mid_lo + tl.maximum(all_hi - mid_lo, 0) // BLOCK_N * BLOCK_N

    k_new = k_ptr + q_start.to(tl.int64) * stride_kt + h * stride_kh
    v_new = v_ptr + q_start.to(tl.int64) * stride_vt + h * stride_vh
    table = block_tables_ptr + b.to(tl.int64) * stride_bt
    ring_base = 0
    if not PAGED:
        ring_base = tl.load(ring_rows_ptr + b).to(tl.int64) * ROWS_PER
    for kstart in range(lo, mid_lo, BLOCK_N):
        m, l, acc = _attend(q, m, l, acc, kstart, qpos, hi, ctx, window, qk_scale, k_scale, v_scale,
                            k_cache_ptr, v_cache_ptr, k_new, v_new, stride_kt, stride_vt, table, ring_base, h,
                            k_desc, v_desc, n_pages, HK=HK, D=D, ROWS_PER=ROWS_PER, BLOCK_N=BLOCK_N, PAGED=PAGED,
                            PAGES=PAGES, MASKED=True, DOT_FP32=DOT_FP32, DOT_PRECISION=DOT_PRECISION, KV_FP8=KV_FP8)
    for kstart in range(mid_lo, mid_hi, BLOCK_N):
        m, l, acc = _attend(q, m, l, acc, kstart, qpos, hi, ctx, window, qk_scale, k_scale, v_scale,
                            k_cache_ptr, v_cache_ptr, k_new, v_new, stride_kt, stride_vt, table, ring_base, h,
                            k_desc, v_desc, n_pages, HK=HK, D=D, ROWS_PER=ROWS_PER, BLOCK_N=BLOCK_N, PAGED=PAGED,
                            PAGES=PAGES, MASKED=False, DOT_FP32=DOT_FP32, DOT_PRECISION=DOT_PRECISION, KV_FP8=KV_FP8)
    for kstart in range(mid_hi, hi, BLOCK_N):
        m, l, acc = _attend(q, m, l, acc, kstart, qpos, hi, ctx, window, qk_scale, k_scale, v_scale,
                            k_cache_ptr, v_cache_ptr, k_new, v_new, stride_kt, stride_vt, table, ring_base, h,
                            k_desc, v_desc, n_pages, HK=HK, D=D, ROWS_PER=ROWS_PER, BLOCK_N=BLOCK_N, PAGED=PAGED,
                            PAGES=PAGES, MASKED=True, DOT_FP32=DOT_FP32, DOT_PRECISION=DOT_PRECISION, KV_FP8=KV_FP8)
    o_rows = (q_start + qi).to(tl.int64) * stride_ot + head * stride_oh
    tl.store(out_ptr + o_rows[:, None] + cols[None, :], (acc / l[:, None]).to(out_ptr.dtype.element_ty),
             mask=row_ok[:, None])


def prefill_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                      query_start_loc: torch.Tensor, context_lens: torch.Tensor,
                      k_cache: torch.Tensor, v_cache: torch.Tensor, sinks: torch.Tensor | None,
                      sm_scale: float, window: int, max_query_len: int,
                      block_tables: torch.Tensor | None = None, ring_rows: torch.Tensor | None = None,
                      out: torch.Tensor | None = None, kv_scales: tuple[float, float] | None = None,
                      kv_in_cache: bool = False) -> torch.Tensor:
    """q [N, Hq, D], k/v [N, Hk, D] of B sequences (query_start_loc [B+1]) -> out [N, Hq, D].
    max_query_len: an upper bound of the new tokens per sequence (picks the tile height only).
    kv_scales: FP8 KV (attention.py). kv_in_cache: the paged cache already holds k/v at the
    step's positions (then whole pages are read through descriptors: _tile_pages)."""
    check_attention_inputs("prefill_attention", q, k, v, query_start_loc, context_lens, k_cache, v_cache,
                           sinks, window, block_tables, ring_rows, kv_scales)
    n, hq, d = q.shape
    hk = k.shape[1]
    if d & (d - 1) or d < 16:
        raise ValueError(f"prefill_attention: head_dim {d}, expected a power of two >= 16")
    if max_query_len < 1:
        raise ValueError(f"prefill_attention: max_query_len {max_query_len}, expected >= 1")
    if out is None:
        out = torch.empty_like(q)
    elif out.shape != q.shape or out.dtype != q.dtype or out.stride(-1) != 1:
        raise ValueError(f"prefill_attention: out is {out.dtype} {tuple(out.shape)}, expected {q.dtype} "
                         f"{tuple(q.shape)} with unit stride in D")
    batch = context_lens.shape[0]
    if n == 0 or batch == 0:
        return out
    g = hq // hk
    g_pad = triton.next_power_of_2(g)
    paged = block_tables is not None
    rows_per = k_cache.shape[1]
    whole_pages = kv_in_cache and paged and not window and kv_scales is None
    default = PAGE_TILES if whole_pages and _tile_pages(PAGE_TILES[1], rows_per) else (TILE_M, TILE_N, None, 3)
    tile_m, tile_n, warps, stages = tuning.PREFILL_ATTENTION_TILES or default
    block_m = max(16, min(tile_m, triton.next_power_of_2(max_query_len) * g_pad))
    block_q = max(1, block_m // g_pad)
    pages = _tile_pages(tile_n, rows_per) if whole_pages else 0
    descs = (None, None)
    if pages:
        descs = tuple(TensorDescriptor.from_tensor(c.view(-1, hk * d), [rows_per, d]) for c in (k_cache, v_cache))
    _prefill_kernel[(triton.cdiv(n, block_q) + batch, hk)](
        q_ptr=q, k_ptr=k, v_ptr=v, query_start_loc_ptr=query_start_loc, context_lens_ptr=context_lens,
        k_cache_ptr=k_cache, v_cache_ptr=v_cache,
        block_tables_ptr=block_tables if paged else context_lens,
        ring_rows_ptr=context_lens if paged else ring_rows,
        sinks_ptr=sinks if sinks is not None else q, out_ptr=out, k_desc=descs[0], v_desc=descs[1],
        stride_qt=q.stride(0), stride_qh=q.stride(1), stride_kt=k.stride(0), stride_kh=k.stride(1),
        stride_vt=v.stride(0), stride_vh=v.stride(1), stride_ot=out.stride(0), stride_oh=out.stride(1),
        stride_bt=block_tables.stride(0) if paged else 0,
        qk_scale=sm_scale * LOG2E, window=window, num_seqs=batch,
        k_scale=kv_scales[0] if kv_scales else 1.0, v_scale=kv_scales[1] if kv_scales else 1.0,
        n_pages=block_tables.shape[1] if paged else 0,
        HK=hk, G=g, D=d, ROWS_PER=rows_per, G_PAD=g_pad, BLOCK_Q=block_q, BLOCK_N=tile_n,
        PAGED=paged, USE_SINKS=sinks is not None, DOT_FP32=DOT_FP32,
        DOT_PRECISION="ieee" if q.dtype == torch.float32 else "tf32", KV_FP8=kv_scales is not None, PAGES=pages,
        **launch_args(q.device), num_warps=warps or (8 if block_m >= 128 else 4), num_stages=stages,
    )
    return out


def _tile_pages(tile_n: int, rows_per: int) -> int:
    """Pages a key tile of tile_n keys when whole pages are read by descriptors: 1 or 2, or 0
    (the gathered path) for pages that are not a power of two of >= 16 rows (tl.dot's least) or
    that a tile does not hold once or twice (tuning.PREFILL_ATTENTION_TMA off: 0)."""
    if not tuning.PREFILL_ATTENTION_TMA or rows_per < 16 or rows_per & (rows_per - 1):
        return 0
    return tile_n // rows_per if tile_n in (rows_per, 2 * rows_per) else 0


def prefill_attention_torch(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                            query_start_loc: torch.Tensor, context_lens: torch.Tensor,
                            k_cache: torch.Tensor, v_cache: torch.Tensor, sinks: torch.Tensor | None,
                            sm_scale: float, window: int, max_query_len: int,
                            block_tables: torch.Tensor | None = None, ring_rows: torch.Tensor | None = None,
                            out: torch.Tensor | None = None, kv_scales: tuple[float, float] | None = None,
                            kv_in_cache: bool = False) -> torch.Tensor:
    """Same signature and semantics as `prefill_attention` (max_query_len and kv_in_cache are
    only hints)."""
    result = attention_torch(q, k, v, query_start_loc, context_lens, k_cache, v_cache, sinks, sm_scale,
                             window, block_tables=block_tables, ring_rows=ring_rows, kv_scales=kv_scales)
    if out is None:
        return result
    out.copy_(result)
    return out
