"""decode_splits: the pages each decode-attention split reads first (literal expectations), and
the L2 prefetch of them in qk_norm_rope changing no result (on the H200; off on the CPU)."""

import math

import pytest
import torch
import triton
import triton.language as tl

from flint_kernels import decode_attention
from flint_kernels.decode_attention import decode_attention as decode_attention_kernel
from flint_kernels.decode_attention import split_prefetch
from flint_kernels.decode_splits import KVPrefetch, first_pages
from flint_kernels.qk_norm_rope import qk_norm_rope
from kv_cases import make_step

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@triton.jit
def _first_pages_kernel(block_tables_ptr, context_lens_ptr, out_ptr, stride_bt, num_splits,
                        ITEMS: tl.constexpr, PAGES: tl.constexpr, ROWS_PER: tl.constexpr, BLOCK_N: tl.constexpr):
    b = tl.program_id(0).to(tl.int64)
    item = tl.arange(0, ITEMS)
    block, ok, is_v = first_pages(block_tables_ptr, stride_bt, context_lens_ptr, b, item, num_splits,
                                  PAGES, ROWS_PER, BLOCK_N)
    # -1: no page (a split past the sequence's non-empty ones, or a page past its range)
    tl.store(out_ptr + b * ITEMS + item, tl.where(ok, block * 2 + is_v, -1))


def prefetched(tables, contexts, num_splits, pages, rows_per, tile):
    """-> per sequence, per split: the (block, K or V) pairs first_pages names, in item order."""
    tables = torch.as_tensor(tables, dtype=torch.int32)
    lens = torch.tensor(contexts, dtype=torch.int32)
    items = triton.next_power_of_2(num_splits * 2 * pages)
    out = torch.empty(len(contexts), items, dtype=torch.int64)
    _first_pages_kernel[(len(contexts),)](tables, lens, out, tables.stride(0), num_splits,
                                          ITEMS=items, PAGES=pages, ROWS_PER=rows_per, BLOCK_N=tile)
    got = []
    for row in out.tolist():
        per_split = [row[s * 2 * pages:(s + 1) * 2 * pages] for s in range(num_splits)]
        got.append([[(v // 2, "KV"[v % 2]) for v in split if v >= 0] for split in per_split])
    return got


def test_first_pages_of_each_split():
    # 150 positions, 2 splits of 16-position tiles: split lengths cdiv(75, 16) * 16 = 80, so
    # [0, 80) and [80, 150); pages of 16 positions: split 0 starts at page 0, split 1 at page 5
    table = [[30, 31, 32, 33, 34, 35, 36, 37, 38, 39]]
    assert prefetched(table, [150], 2, 2, 16, 16) == [[
        [(30, "K"), (30, "V"), (31, "K"), (31, "V")],
        [(35, "K"), (35, "V"), (36, "K"), (36, "V")]]]
    # 20 positions, 4 splits: one tile each, so splits [0, 16) and [16, 20) and two empty ones;
    # split 0 has one page, split 1 the page of position 16 only
    assert prefetched(table, [20], 4, 2, 16, 16) == [[
        [(30, "K"), (30, "V")], [(31, "K"), (31, "V")], [], []]]


def test_first_pages_with_pages_smaller_than_tiles_and_two_sequences():
    # pages of 8 positions, tiles of 16: 40 positions in 2 splits of 32 -> [0, 32), [32, 40):
    # split 0 starts at page 0, split 1 at page 4 and has no page 5 (position 40 is not cached)
    tables = [[9, 8, 7, 6, 5, 4], [19, 18, 17, 16, 15, 14]]
    assert prefetched(tables, [40, 8], 2, 2, 8, 16) == [
        [[(9, "K"), (9, "V"), (8, "K"), (8, "V")], [(5, "K"), (5, "V")]],
        [[(19, "K"), (19, "V")], []]]  # 8 positions: one split of one page


def test_empty_context_prefetches_nothing():
    assert prefetched([[3, 4]], [0], 3, 2, 16, 16) == [[[], [], []]]


def test_split_prefetch_names_the_splits_decode_attention_launches(monkeypatch):
    step = make_step([(150, 1)], rows_per=16, device=DEVICE)
    monkeypatch.setattr(decode_attention, "PREFETCH_PAGES", 0)
    assert split_prefetch(step.block_tables, step.context_lens, 2) is None
    monkeypatch.setattr(decode_attention, "PREFETCH_PAGES", 3)
    assert split_prefetch(None, step.context_lens, 2) is None  # ring layers: nothing to prefetch
    got = split_prefetch(step.block_tables, step.context_lens, 2)
    assert (got.num_splits, got.tile_n, got.pages) == (
        decode_attention.default_num_splits(1, 2, 0, step.context_lens.device), decode_attention.TILE_N, 3)
    assert got.block_tables is step.block_tables and got.context_lens is step.context_lens


def _decode_inputs(context, hq=8, hk=2, d=16, rows_per=16, dtype=torch.float32):
    step = make_step([(context, 1)], hq=hq, hk=hk, d=d, dtype=dtype, rows_per=rows_per, device=DEVICE)
    g = torch.Generator(device=DEVICE).manual_seed(1)
    qkv = torch.randn(1, (hq + 2 * hk) * d, generator=g, device=DEVICE).to(dtype)
    w = (1 + 0.1 * torch.randn(d, generator=g, device=DEVICE)).to(dtype)
    pos = step.context_lens.long()
    slots = (step.block_tables[0, context // rows_per].long() * rows_per + context % rows_per)[None]
    return step, qkv, w, pos, slots


def test_qk_norm_rope_with_prefetch_is_the_same_and_checks_it():
    step, qkv, w, pos, slots = _decode_inputs(150)
    hq, hk = 8, 2
    outs = []
    for prefetch in (None, KVPrefetch(step.block_tables, step.context_lens, 5, 16, 2)):
        kc, vc = step.k_cache.clone(), step.v_cache.clone()
        outs.append((*qk_norm_rope(qkv, w, w, pos, None, 1e-5, hq, hk, kc, vc, slots, prefetch=prefetch), kc, vc))
    for got, expected in zip(*outs):
        torch.testing.assert_close(got, expected, rtol=0, atol=0, equal_nan=True)
    with pytest.raises(ValueError, match="paged caches"):
        qk_norm_rope(qkv, w, w, pos, None, 1e-5, hq, hk,
                     prefetch=KVPrefetch(step.block_tables, step.context_lens, 5, 16, 2))
    with pytest.raises(ValueError, match="context_lens"):
        qk_norm_rope(qkv, w, w, pos, None, 1e-5, hq, hk, step.k_cache, step.v_cache, slots,
                     prefetch=KVPrefetch(step.block_tables, step.context_lens.repeat(2), 5, 16, 2))
    with pytest.raises(ValueError, match="pages 0"):
        qk_norm_rope(qkv, w, w, pos, None, 1e-5, hq, hk, step.k_cache, step.v_cache, slots,
                     prefetch=KVPrefetch(step.block_tables, step.context_lens, 5, 16, 0))


@pytest.mark.gpu
@pytest.mark.parametrize("context,pages", [(1024, 2), (100_000, 2), (100_000, 8), (262_143, 4)])
def test_prefetch_then_attention_real_shapes(context, pages):
    """A full layer's batch-1 decode at the real shapes with the prefetch issued (sm_90): q, k, the
    cache and the attention output are bit-equal to the launches without it."""
    hq, hk, d = 32, 4, 128
    step, qkv, w, pos, slots = _decode_inputs(context, hq, hk, d, 64, torch.bfloat16)
    splits = decode_attention.default_num_splits(1, hk, 0, step.context_lens.device)
    outs = []
    for prefetch in (None, KVPrefetch(step.block_tables, step.context_lens, splits, decode_attention.TILE_N, pages)):
        kc, vc = step.k_cache.clone(), step.v_cache.clone()
        q, k, v = qk_norm_rope(qkv, w, w, pos, None, 1e-5, hq, hk, kc, vc, slots, prefetch=prefetch)
        out = decode_attention_kernel(q, k, v, kc, vc, step.context_lens, step.sinks, 1 / math.sqrt(d), 0,
                                      block_tables=step.block_tables)
        outs.append((q, k, kc, vc, out))
    for got, expected in zip(*outs):
        torch.testing.assert_close(got, expected, rtol=0, atol=0, equal_nan=True)
