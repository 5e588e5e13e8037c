"""kv_prefetch: the K/V pages each decode-attention split reads first, named by the prefetch
launch (dry run, literal expectations), and the prefetch changing no result (on the H200)."""

import math

import pytest
import torch

from flint_kernels import decode_attention, kv_prefetch
from flint_kernels.decode_attention import decode_attention as decode_attention_kernel
from flint_kernels.kv_prefetch import prefetch_first_pages
from kv_cases import make_step

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def named(tables, contexts, num_splits, pages, block_size, tile, monkeypatch, programs=0):
    """-> per sequence, per split: the (block, K or V) pairs the dry run names, in item order."""
    monkeypatch.setattr(decode_attention, "TILE_N", tile)
    tables = torch.as_tensor(tables, dtype=torch.int32)
    lens = torch.tensor(contexts, dtype=torch.int32)
    cache = torch.zeros(int(tables.max()) + 1, block_size, 2, 4)
    got = prefetch_first_pages(cache, cache.clone(), tables, lens, num_splits, pages, programs, dry_run=True)
    assert got.shape == (len(contexts), num_splits, pages, 2)
    return [[[(block, "KV"[kv]) for page in split.tolist() for kv, block in enumerate(page) if block >= 0]
             for split in seq] for seq in got]


@pytest.mark.parametrize("programs", [0, 1, 3])
def test_first_pages_of_each_split(monkeypatch, programs):
    # 150 positions, 2 splits of 16-position tiles: split lengths cdiv(75, 16) * 16 = 80, so
    # [0, 80) and [80, 150); pages of 16 positions: split 0 starts at page 0, split 1 at page 5
    # (one program a split, or 1 or 3 programs walking the items: the same pages)
    table = [[30, 31, 32, 33, 34, 35, 36, 37, 38, 39]]
    assert named(table, [150], 2, 2, 16, 16, monkeypatch, programs) == [[
        [(30, "K"), (30, "V"), (31, "K"), (31, "V")],
        [(35, "K"), (35, "V"), (36, "K"), (36, "V")]]]
    # 20 positions, 4 splits: one tile each, so splits [0, 16) and [16, 20) and two empty ones;
    # split 0 has one page, split 1 the page of position 16 only
    assert named(table, [20], 4, 2, 16, 16, monkeypatch, programs) == [[
        [(30, "K"), (30, "V")], [(31, "K"), (31, "V")], [], []]]


def test_first_pages_with_pages_smaller_than_tiles_and_two_sequences(monkeypatch):
    # pages of 8 positions, tiles of 16: 40 positions in 2 splits of 32 -> [0, 32), [32, 40):
    # split 0 starts at page 0, split 1 at page 4 and has no page 5 (position 40 is not cached)
    tables = [[9, 8, 7, 6, 5, 4], [19, 18, 17, 16, 15, 14]]
    assert named(tables, [40, 8], 2, 2, 8, 16, monkeypatch) == [
        [[(9, "K"), (9, "V"), (8, "K"), (8, "V")], [(5, "K"), (5, "V")]],
        [[(19, "K"), (19, "V")], []]]  # 8 positions: one split of one page


def test_empty_context_prefetches_nothing(monkeypatch):
    assert named([[3, 4]], [0], 3, 2, 16, 16, monkeypatch) == [[[], [], []]]


def test_default_splits_are_decode_attentions(monkeypatch):
    monkeypatch.setattr(kv_prefetch, "PAGES", 1)
    step = make_step([(5000, 1)], rows_per=64)
    got = prefetch_first_pages(step.k_cache, step.v_cache, step.block_tables, step.context_lens, dry_run=True)
    splits = decode_attention.default_num_splits(1, 2, 0, step.context_lens.device)
    assert got.shape == (1, splits, 1, 2)
    # split s starts at position s * split_len: its first page is that position's block
    split_len = -(-(-(-5000 // splits)) // 64) * 64  # cdiv(cdiv(5000, splits), TILE_N) * TILE_N
    expected = [int(step.block_tables[0, s * split_len // 64]) if s * split_len < 5000 else -1 for s in range(splits)]
    assert got[0, :, 0, 0].tolist() == expected
    assert got[0, :, 0, 1].tolist() == expected


def test_bad_inputs_name_the_field():
    step = make_step([(100, 1)], rows_per=16)
    args = (step.k_cache, step.v_cache, step.block_tables, step.context_lens)
    with pytest.raises(ValueError, match="pages 0"):
        prefetch_first_pages(*args, pages=0)
    with pytest.raises(ValueError, match="num_splits 0"):
        prefetch_first_pages(*args, num_splits=0, pages=1)
    with pytest.raises(ValueError, match="context_lens is torch.int64"):
        prefetch_first_pages(*args[:3], step.context_lens.long(), pages=1)
    with pytest.raises(ValueError, match="block_tables"):
        prefetch_first_pages(*args[:2], step.block_tables.repeat(2, 1), step.context_lens, pages=1)
    with pytest.raises(ValueError, match="k_cache"):
        prefetch_first_pages(step.k_cache[0], step.v_cache[0], *args[2:], pages=1)


def test_off_on_the_cpu_issues_nothing():
    step = make_step([(100, 1)], rows_per=16)
    assert not kv_prefetch.can_prefetch(torch.device("cpu"))
    assert prefetch_first_pages(step.k_cache, step.v_cache, step.block_tables, step.context_lens, pages=2) is None


@pytest.mark.gpu
@pytest.mark.parametrize("context,pages,evict_last", [(1024, 2, False), (100_000, 2, True), (100_000, 8, False),
                                                       (262_143, 4, True)])
def test_prefetch_then_attention_real_shapes(context, pages, evict_last, monkeypatch):
    """A full layer's batch-1 decode at the real shapes after the prefetch (sm_90): the cache and
    the attention output are bit-equal to the launch without it."""
    monkeypatch.setattr(kv_prefetch, "EVICT_LAST", evict_last)
    hq, hk, d = 32, 4, 128
    step = make_step([(context, 1)], hq=hq, hk=hk, d=d, dtype=torch.bfloat16, rows_per=64, device=DEVICE)
    outs = []
    for prefetch in (False, True):
        kc, vc = step.k_cache.clone(), step.v_cache.clone()
        if prefetch:
            prefetch_first_pages(kc, vc, step.block_tables, step.context_lens, pages=pages)
        out = decode_attention_kernel(step.q, step.k, step.v, kc, vc, step.context_lens, step.sinks,
                                      1 / math.sqrt(d), 0, block_tables=step.block_tables)
        outs.append((kc, vc, out))
    for got, expected in zip(*outs):
        torch.testing.assert_close(got, expected, rtol=0, atol=0, equal_nan=True)
