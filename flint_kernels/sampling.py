"""Fused sampling: temperature, top-k, top-p, min-p and the draw, one program per row, no sort.

Semantics (the torch sampler's, flint_backend/engine/sampler.py): greedy rows (temperature 0)
take the first argmax of the raw logits. Otherwise p = softmax(x / T) over the top-k logits
(ties with the k-th kept), top-p keeps the tokens whose mass strictly above them is < top_p,
min-p keeps p >= min_p * max p; the token is drawn from p restricted to all three. Every
filter keeps the tokens above a threshold, so none needs a sort:

  pass 1     max, first argmax and Z = sum exp((x - max) / T) (online rescaling)
  top-k      radix select of the k-th largest logit: 4 passes of 256-bin histograms over the
             order-preserving int32 keys of the logits (exact, ties kept)
  draw       inverse CDF in token order over the candidates (>= the top-k threshold, min-p,
             above the pivot) with one uniform per round
  top-p      rejection with a rising pivot: if the mass above the drawn token is >= top_p * Z_k
             it is outside the nucleus, and so is everything below it: the pivot moves up to it
             and the next round draws from what is left. An accepted draw is exactly distributed
             as p restricted to the nucleus; typical nuclei accept in the first round.

The uniform of round r is Philox4x32-10 (Triton's tl.philox) keyed by the row's seed at counter
(offset, r): a request's draw depends only on (seed, offset = index of the token being sampled),
never on the other rows of the batch. `sample_torch` is the same algorithm in plain torch and
draws the same tokens (up to fp32 summation order at a CDF boundary).

Numerics: everything in fp32 over the fp32 logits. Sampling is not part of transformers'
forward; greedy rows are its argmax (the first maximal index).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .pdl import launch_args, pdl_prologue
from .tuning import INTERPRET

BLOCK_V = 1024 if INTERPRET else 4096  # logits per chunk of a pass
MAX_ROUNDS = 64                       # top-p rejection rounds before falling back to the argmax
LOG2E = 1.4426950408889634
INT32_MIN = tl.constexpr(-2 ** 31)  # also the key below every logit's
# Philox4x32-10 constants (as tl.philox) and tl.rand's uint32 -> [0, 1) scale
PHILOX_ROUND_A, PHILOX_ROUND_B = 0xD2511F53, 0xCD9E8D57
PHILOX_KEY_A, PHILOX_KEY_B = 0x9E3779B9, 0xBB67AE85
UNIFORM_SCALE = 4.6566127342e-10


@triton.jit
def order_key(x):
    """fp32 -> int32 with the same order (signed comparison); also greedy.py's packed slots."""
    bits = x.to(tl.int32, bitcast=True)
    return bits ^ ((bits >> 31) & 0x7FFFFFFF)


@triton.jit
def _uniform(seed, offset, rnd):
    """U[0, 1) of Philox at counter (offset lo, offset hi, round, 0) under key `seed` (int64)."""
    c0 = (offset & 0xFFFFFFFF).to(tl.uint32)
    c1 = ((offset >> 32) & 0xFFFFFFFF).to(tl.uint32)
    r, _, _, _ = tl.philox(seed, c0, c1, rnd.to(tl.uint32), c1 * 0)
    return tl.uint_to_uniform_float(r)


@triton.jit
def _max_and_mass(row_ptr, V, c, BLOCK_V: tl.constexpr):
    """-> (max, first argmax, sum exp2((x - max) * c)) of the row, one online pass."""
    cols = tl.arange(0, BLOCK_V)
    m = -3.4028234663852886e38
    arg = 0
    z = 0.0
    for start in range(0, V, BLOCK_V):
        x = tl.load(row_ptr + start + cols, mask=start + cols < V, other=float("-inf"))
        chunk_max = tl.max(x, axis=0)
        chunk_arg = start + tl.argmax(x, axis=0)
        m_new = tl.maximum(m, chunk_max)
        arg = tl.where(chunk_max > m, chunk_arg, arg)  # strictly greater: the first argmax wins
        z = z * tl.exp2(tl.maximum(m - m_new, -1e30) * c) + tl.sum(tl.exp2((x - m_new) * c), axis=0)
        m = m_new
    return m, arg, z


@triton.jit
def _kth_largest_key(row_ptr, V, k, BLOCK_V: tl.constexpr):
    """Key of the k-th largest logit: radix select, 8 bits per pass from the top."""
    cols = tl.arange(0, BLOCK_V)
    digits = tl.arange(0, 256)
    prefix = tl.zeros([], tl.int32)   # chosen high digits, in the unsigned key space
    remaining = k
    for d in tl.static_range(4):
        hist = tl.zeros([256], tl.int32)
        for start in range(0, V, BLOCK_V):
            valid = start + cols < V
            x = tl.load(row_ptr + start + cols, mask=valid, other=0.0)
            ukey = order_key(x) ^ INT32_MIN  # unsigned order, as int32 bits
            if d > 0:  # keys whose higher digits are the prefix chosen so far
                valid = valid & (((ukey ^ prefix) >> (32 - 8 * d)) == 0)
            hist += tl.histogram((ukey >> (24 - 8 * d)) & 0xFF, 256, mask=valid)
        at_least = tl.sum(hist, axis=0) - tl.cumsum(hist, axis=0) + hist  # keys with this digit or above
        digit = tl.max(tl.where(at_least >= remaining, digits, -1), axis=0)
        remaining -= tl.sum(tl.where(digits > digit, hist, 0), axis=0)
        prefix = prefix | (digit << (24 - 8 * d))
    return prefix ^ INT32_MIN


@triton.jit
def _mass(row_ptr, V, m, c, lo_key, min_p, BLOCK_V: tl.constexpr):
    """-> (sum of exp2((x - m) c) over keys >= lo_key, the same over those also >= min_p)."""
    cols = tl.arange(0, BLOCK_V)
    z = 0.0
    z_min_p = 0.0
    for start in range(0, V, BLOCK_V):
        x = tl.load(row_ptr + start + cols, mask=start + cols < V, other=float("-inf"))
        e = tl.where(order_key(x) >= lo_key, tl.exp2((x - m) * c), 0.0)
        z += tl.sum(e, axis=0)
        z_min_p += tl.sum(tl.where(e >= min_p, e, 0.0), axis=0)
    return z, z_min_p


@triton.jit
def _draw(row_ptr, V, m, c, lo_key, min_p, pivot, target, fallback, BLOCK_V: tl.constexpr):
    """First token (in index order) whose running candidate mass exceeds `target`; candidates
    have key >= lo_key, key > pivot and exp2((x - m) c) >= min_p. -> (token, its key)."""
    cols = tl.arange(0, BLOCK_V)
    acc = 0.0
    token = -1
    last = fallback  # the last candidate seen: rounding may leave target just above the total
    start = 0
    while (start < V) & (token < 0):
        x = tl.load(row_ptr + start + cols, mask=start + cols < V, other=float("-inf"))
        key = order_key(x)
        e = tl.exp2((x - m) * c)
        cand = (key >= lo_key) & (key > pivot) & (e >= min_p) & (start + cols < V)
        cums = acc + tl.cumsum(tl.where(cand, e, 0.0), axis=0)
        token = tl.min(tl.where(cand & (cums > target), start + cols, V), axis=0)
        token = tl.where(token < V, token, -1)
        last = tl.maximum(last, tl.max(tl.where(cand, start + cols, -1), axis=0))
        acc = tl.max(cums, axis=0)
        start += BLOCK_V
    token = tl.where(token < 0, last, token)
    return token, order_key(tl.load(row_ptr + token))


@triton.jit
def _mass_above(row_ptr, V, m, c, key_s, BLOCK_V: tl.constexpr):
    """sum of exp2((x - m) c) over the keys strictly above key_s."""
    cols = tl.arange(0, BLOCK_V)
    z = 0.0
    for start in range(0, V, BLOCK_V):
        x = tl.load(row_ptr + start + cols, mask=start + cols < V, other=float("-inf"))
        z += tl.sum(tl.where(order_key(x) > key_s, tl.exp2((x - m) * c), 0.0), axis=0)
    return z


@triton.jit
def _sample_kernel(
    logits_ptr,       # [S, V] fp32
    temperature_ptr,  # [S] fp32, 0 = greedy
    top_k_ptr,        # [S] int32, <= 0 or >= V = off
    top_p_ptr,        # [S] fp32 in (0, 1]
    min_p_ptr,        # [S] fp32 in [0, 1]
    seeds_ptr,        # [S] int64
    offsets_ptr,      # [S] int64
    out_ptr,          # [S] int64
    V, stride_s,
    BLOCK_V: tl.constexpr, MAX_ROUNDS: tl.constexpr,
    PDL: tl.constexpr,
):
    pdl_prologue(PDL)
    s = tl.program_id(0)
    row = logits_ptr + s.to(tl.int64) * stride_s
    temperature = tl.load(temperature_ptr + s)
    top_k = tl.load(top_k_ptr + s)
    top_p = tl.load(top_p_ptr + s)
    min_p = tl.load(min_p_ptr + s)
    c = 1.4426950408889634 / tl.where(temperature > 0, temperature, 1.0)  # log2(e) / T
    m, arg, z = _max_and_mass(row, V, c, BLOCK_V)
    token = arg
    if (temperature > 0) & (top_k != 1):
        lo_key = INT32_MIN
        z_k = z
        z_b = z
        if (top_k > 0) & (top_k < V):
            lo_key = _kth_largest_key(row, V, top_k, BLOCK_V)
        if (lo_key != INT32_MIN) | (min_p > 0):
            z_k, z_b = _mass(row, V, m, c, lo_key, min_p, BLOCK_V)
        seed = tl.load(seeds_ptr + s)
        offset = tl.load(offsets_ptr + s)
        pivot = INT32_MIN
        rnd = 0
        done = False
        while not done:
            u = _uniform(seed, offset, rnd)
            token, key_s = _draw(row, V, m, c, lo_key, min_p, pivot, u * z_b, arg, BLOCK_V)
            done = top_p >= 1.0
            if not done:
                above = _mass_above(row, V, m, c, key_s, BLOCK_V)
                done = above < top_p * z_k
                # rejected: s and everything below it lie outside the nucleus
                pivot = key_s
                z_b = above
                rnd += 1
                if (not done) & (rnd >= MAX_ROUNDS):
                    token = arg
                    done = True
    tl.store(out_ptr + s, token.to(tl.int64))


def sample(logits: torch.Tensor, temperature: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor,
           min_p: torch.Tensor, seeds: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    """logits [S, V] fp32; temperature/top_p/min_p [S] fp32, top_k [S] int32, seeds/offsets [S]
    int64 -> tokens [S] int64. temperature 0 = greedy; top_k <= 0 or >= V, top_p 1, min_p 0 = off."""
    _check_inputs(logits, temperature, top_k, top_p, min_p, seeds, offsets)
    rows, vocab = logits.shape
    out = torch.empty(rows, dtype=torch.int64, device=logits.device)
    if rows == 0:
        return out
    _sample_kernel[(rows,)](
        logits_ptr=logits, temperature_ptr=temperature, top_k_ptr=top_k, top_p_ptr=top_p, min_p_ptr=min_p,
        seeds_ptr=seeds, offsets_ptr=offsets, out_ptr=out, V=vocab, stride_s=logits.stride(0),
        BLOCK_V=min(BLOCK_V, triton.next_power_of_2(vocab)), MAX_ROUNDS=MAX_ROUNDS,
        **launch_args(logits.device), num_warps=1 if INTERPRET else 8,
    )
    return out


def sample_torch(logits: torch.Tensor, temperature: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor,
                 min_p: torch.Tensor, seeds: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    """Same signature and algorithm as `sample`, in plain torch (one row at a time)."""
    _check_inputs(logits, temperature, top_k, top_p, min_p, seeds, offsets)
    out = logits.argmax(-1)
    for s, row in enumerate(logits):
        temp, k = float(temperature[s]), int(top_k[s])
        if temp > 0 and k != 1:
            out[s] = _sample_row(row, temp, k, float(top_p[s]), float(min_p[s]), int(seeds[s]), int(offsets[s]),
                                 int(out[s]))
    return out


def _sample_row(x: torch.Tensor, temp: float, k: int, top_p: float, min_p: float, seed: int, offset: int,
                argmax: int) -> int:
    e = torch.exp2((x - x.max()) * (LOG2E / temp))
    keep = torch.ones_like(x, dtype=torch.bool)
    if 0 < k < x.numel():
        keep = x >= torch.topk(x, k).values[-1]
    z_k = e[keep].sum()
    base = keep & (e >= min_p)
    pivot, z_b = float("-inf"), e[base].sum()
    for rnd in range(MAX_ROUNDS):
        cand = base & (x > pivot)
        cums = torch.cumsum(torch.where(cand, e, 0.0), 0)
        hits = torch.nonzero(cand & (cums > philox_uniform(seed, offset, rnd) * z_b))
        token = int(hits[0]) if len(hits) else int(torch.nonzero(cand)[-1])
        if top_p >= 1.0:
            return token
        above = e[x > x[token]].sum()
        if above < top_p * z_k:
            return token
        pivot, z_b = float(x[token]), above
    return argmax


def philox_uniform(seed: int, offset: int, rnd: int) -> float:
    """Triton's tl.philox(seed, offset lo, offset hi, rnd, 0)[0] -> tl.uint_to_uniform_float, in Python."""
    mask = 0xFFFFFFFF
    seed &= 0xFFFFFFFFFFFFFFFF
    k0, k1 = seed & mask, seed >> 32
    c0, c1, c2, c3 = offset & mask, (offset >> 32) & mask, rnd & mask, 0
    for _ in range(10):
        c0, c1, c2, c3 = ((PHILOX_ROUND_B * c2) >> 32) ^ c1 ^ k0, (PHILOX_ROUND_B * c2) & mask, \
            ((PHILOX_ROUND_A * c0) >> 32) ^ c3 ^ k1, (PHILOX_ROUND_A * c0) & mask
        k0, k1 = (k0 + PHILOX_KEY_A) & mask, (k1 + PHILOX_KEY_B) & mask
    r = c0 - (1 << 32) if c0 >= 1 << 31 else c0  # as int32
    r = -r - 1 if r < 0 else r
    return float(torch.tensor(r, dtype=torch.int32).float() * torch.tensor(UNIFORM_SCALE, dtype=torch.float32))


def _check_inputs(logits, temperature, top_k, top_p, min_p, seeds, offsets):
    if logits.dim() != 2 or logits.dtype != torch.float32 or logits.stride(-1) != 1:
        raise ValueError(f"sample: logits is {logits.dtype} {tuple(logits.shape)}, expected float32 [S, V] "
                         "with unit stride in V")
    rows = logits.shape[0]
    for name, t, dtype in [("temperature", temperature, torch.float32), ("top_k", top_k, torch.int32),
                           ("top_p", top_p, torch.float32), ("min_p", min_p, torch.float32),
                           ("seeds", seeds, torch.int64), ("offsets", offsets, torch.int64)]:
        if t.shape != (rows,) or t.dtype != dtype or not t.is_contiguous():
            raise ValueError(f"sample: {name} is {t.dtype} {tuple(t.shape)}, expected contiguous {dtype} ({rows},)")
