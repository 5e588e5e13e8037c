"""Attention with sinks over a KV cache plus this step's tokens: the semantics shared by
`decode_attention` and `prefill_attention`, their input checks, and the plain-torch version.

A step holds B sequences flattened: `q [N, Hq, D]`, `k/v [N, Hk, D]` (normed and roped),
sequence b owning rows `query_start_loc[b]:query_start_loc[b+1]`, whose i-th token has
position `context_lens[b] + i`. A query at position p attends to
  - cached positions j < context_lens[b] (read from the cache), and
  - this step's tokens of its own sequence up to itself (read from k/v, never the cache),
restricted to j > p - window when window > 0 (0 = whole context). Scores are
`q . k * sm_scale`; the softmax denominator also holds exp(sinks[h]) (no value).
With FP8 KV (`kv_scales` (k_scale, v_scale), fp8_kv.py) the caches hold E4M3 codes, read as
code * scale; this step's k/v are already those values (qk_norm_rope quantised them).

Caches `[rows, R, Hk, D]`, viewed as `[rows * R, Hk, D]` slots:
  - paged (`block_tables [B, max_blocks] int32`): position j of sequence b lives at slot
    `block_tables[b, j // R] * R + j % R` (R = block size);
  - ring (`ring_rows [B] int32`, sliding layers): slot `ring_rows[b] * R + j % R` (R >= window),
    so only the last R positions written survive. With R == window, writing this step's
    tokens before attention is safe for one-token sequences only (the slot it overwrites
    held position p - R, outside the window); a chunk must be written after attention.

Numerics of attention_torch: scores, the softmax with the sink and P @ V all in fp32 (q, k, v
upcast), one rounding of the output to q's dtype. transformers' eager_attention_forward (the
oracle) also takes scores and softmax in fp32 but rounds the normalised probabilities to bf16
before P @ V in bf16 (fp32 accumulation on a GPU); the kernels (decode_attention.py,
prefill_attention.py) round the unnormalised probabilities to bf16 for their P @ V dot. In fp32
all agree up to summation order.
"""

from __future__ import annotations

import torch

from .fp8_kv import FP8_DTYPE, check_scale, dequantize_torch

_MAX_SCORES = 1 << 26  # attention_torch materialises at most this many scores at once


def attention_torch(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                    query_start_loc: torch.Tensor, context_lens: torch.Tensor,
                    k_cache: torch.Tensor, v_cache: torch.Tensor, sinks: torch.Tensor | None,
                    sm_scale: float, window: int,
                    block_tables: torch.Tensor | None = None,
                    ring_rows: torch.Tensor | None = None,
                    kv_scales: tuple[float, float] | None = None) -> torch.Tensor:
    """-> out [N, Hq, D] in q's dtype. One vectorised pass per sequence (chunked over queries)."""
    check_attention_inputs("attention_torch", q, k, v, query_start_loc, context_lens,
                           k_cache, v_cache, sinks, window, block_tables, ring_rows, kv_scales)
    n, hq, d = q.shape
    hk = k.shape[1]
    out = torch.empty_like(q)
    starts = query_start_loc.tolist()
    ctxs = context_lens.tolist()
    for b, ctx in enumerate(ctxs):
        s, e = starts[b], starts[b + 1]
        if e == s:
            continue
        lo = max(0, ctx - window + 1) if window else 0  # first position any query of b sees
        slots = _cache_slots(b, torch.arange(lo, ctx, device=q.device), k_cache.shape[1],
                             block_tables, ring_rows)
        cached_k, cached_v = k_cache.view(-1, hk, d)[slots], v_cache.view(-1, hk, d)[slots]
        if kv_scales is not None:
            cached_k = dequantize_torch(cached_k, kv_scales[0], k.dtype)
            cached_v = dequantize_torch(cached_v, kv_scales[1], v.dtype)
        keys = torch.cat([cached_k.to(k.dtype), k[s:e]])  # [L, Hk, D]
        vals = torch.cat([cached_v.to(v.dtype), v[s:e]])
        out[s:e] = _sequence_attention(q[s:e], keys, vals, lo, ctx, sinks, sm_scale, window)
    return out


def _sequence_attention(q, keys, vals, lo, ctx, sinks, sm_scale, window):
    """q [n, Hq, D] at positions ctx.., keys/vals [L, Hk, D] at positions lo.. -> [n, Hq, D]."""
    n, hq, d = q.shape
    hk = keys.shape[1]
    group = hq // hk
    ft = torch.promote_types(q.dtype, torch.float32)
    kf, vf = keys.to(ft), vals.to(ft)
    out = torch.empty_like(q)
    chunk = max(1, _MAX_SCORES // (hq * keys.shape[0]))
    for a in range(0, n, chunk):
        qpos = torch.arange(ctx + a, ctx + min(n, a + chunk), device=q.device)  # [c]
        first = max(lo, int(qpos[0]) - window + 1) if window else lo
        last = int(qpos[-1]) + 1
        kpos = torch.arange(first, last, device=q.device)  # [l]
        kc, vc = kf[first - lo:last - lo], vf[first - lo:last - lo]
        qc = q[a:a + chunk].to(ft).view(-1, hk, group, d)  # [c, Hk, G, D]
        scores = torch.einsum("chgd,lhd->hgcl", qc, kc) * sm_scale  # [Hk, G, c, l]
        allowed = kpos[None, :] <= qpos[:, None]
        if window:
            allowed &= kpos[None, :] > qpos[:, None] - window
        scores = scores.masked_fill(~allowed, float("-inf"))
        if sinks is not None:
            sink = sinks.to(ft).view(hk, group, 1, 1).expand(-1, -1, scores.shape[2], 1)
            probs = torch.softmax(torch.cat([scores, sink], dim=-1), dim=-1)[..., :-1]
        else:
            probs = torch.softmax(scores, dim=-1)
        out[a:a + chunk] = torch.einsum("hgcl,lhd->chgd", probs, vc).reshape(-1, hq, d).to(q.dtype)
    return out


def _cache_slots(b, positions, rows_per, block_tables, ring_rows):
    """positions [L] of sequence b -> flat cache slots [L] (int64)."""
    if ring_rows is not None:
        return ring_rows[b].long() * rows_per + positions % rows_per
    blocks = block_tables[b].long()[positions // rows_per]
    return blocks * rows_per + positions % rows_per


def check_attention_inputs(op, q, k, v, query_start_loc, context_lens, k_cache, v_cache, sinks,
                           window, block_tables, ring_rows, kv_scales=None):
    """Shapes, dtypes and layouts only: never reads device values (launchers stay sync-free).
    query_start_loc None: one query per sequence (decode)."""
    if q.dim() != 3 or k.dim() != 3 or v.dim() != 3:
        raise ValueError(f"{op}: q, k, v have shapes {tuple(q.shape)}, {tuple(k.shape)}, "
                         f"{tuple(v.shape)}; expected [N, Hq, D], [N, Hk, D], [N, Hk, D]")
    n, hq, d = q.shape
    hk = k.shape[1]
    if k.shape != (n, hk, d) or v.shape != (n, hk, d) or hq % hk:
        raise ValueError(f"{op}: k {tuple(k.shape)} and v {tuple(v.shape)} expected [{n}, Hk, {d}] "
                         f"with Hk dividing Hq={hq}")
    for name, x in (("q", q), ("k", k), ("v", v)):
        if x.dtype != q.dtype:
            raise ValueError(f"{op}: {name} is {x.dtype}, expected q's dtype {q.dtype}")
    cache_dtype = FP8_DTYPE if kv_scales is not None else q.dtype
    for name, x in (("k_cache", k_cache), ("v_cache", v_cache)):
        if x.dtype != cache_dtype:
            raise ValueError(f"{op}: {name} is {x.dtype}, expected {cache_dtype}"
                             + (" (kv_scales given: FP8 KV)" if kv_scales is not None else " (q's dtype)"))
    if kv_scales is not None:
        check_scale(f"{op}: kv_scales[0] (k_scale)", kv_scales[0])
        check_scale(f"{op}: kv_scales[1] (v_scale)", kv_scales[1])
    for name, x in (("q", q), ("k", k), ("v", v)):
        if x.stride(-1) != 1:
            raise ValueError(f"{op}: {name} has strides {x.stride()}, expected unit stride in D")
    b = context_lens.shape[0]
    if context_lens.dim() != 1 or (query_start_loc is not None and query_start_loc.shape != (b + 1,)):
        raise ValueError(f"{op}: context_lens {tuple(context_lens.shape)} and query_start_loc "
                         f"{tuple(query_start_loc.shape)}, expected [B] and [B + 1]")
    for name, cache in (("k_cache", k_cache), ("v_cache", v_cache)):
        if cache.dim() != 4 or cache.shape[2:] != (hk, d) or not cache.is_contiguous():
            raise ValueError(f"{op}: {name} has shape {tuple(cache.shape)}, "
                             f"expected contiguous [rows, R, {hk}, {d}]")
    if k_cache.shape != v_cache.shape:
        raise ValueError(f"{op}: k_cache {tuple(k_cache.shape)} != v_cache {tuple(v_cache.shape)}")
    if sinks is not None and (sinks.shape != (hq,) or sinks.dtype != torch.float32):
        raise ValueError(f"{op}: sinks is {sinks.dtype} {tuple(sinks.shape)}, expected float32 ({hq},)")
    if window < 0:
        raise ValueError(f"{op}: window {window}, expected >= 0 (0 = whole context)")
    if (block_tables is None) == (ring_rows is None):
        raise ValueError(f"{op}: pass exactly one of block_tables (paged) and ring_rows (ring)")
    if block_tables is not None and (block_tables.dim() != 2 or block_tables.shape[0] != b):
        raise ValueError(f"{op}: block_tables has shape {tuple(block_tables.shape)}, expected [{b}, max_blocks]")
    if ring_rows is not None:
        if ring_rows.shape != (b,):
            raise ValueError(f"{op}: ring_rows has shape {tuple(ring_rows.shape)}, expected ({b},)")
        if window == 0 or k_cache.shape[1] < window:
            raise ValueError(f"{op}: a ring cache of width {k_cache.shape[1]} needs 0 < window <= width, "
                             f"got window={window}")
