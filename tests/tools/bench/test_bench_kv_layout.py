"""tools/bench/bench_kv_layout.py's read kernels (interpreted in CI): each page layout's programs
together read every K and V word of the paged cache exactly once, in the engine's shuffled block
order."""

import pytest
import torch
import triton

from tools.bench import bench_kv_layout as kv_layout

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.mark.parametrize("layout", ["nhd", "hnd", "nhd-pages"])
def test_each_layout_reads_every_word_once(layout):
    n_pages, splits = 10, 3  # 4 splits of a head's 10 pages: the last split short
    g = torch.Generator().manual_seed(0)
    k = torch.randint(-100, 100, (n_pages, kv_layout.ROWS * kv_layout.HK * kv_layout.WORDS), generator=g,
                      dtype=torch.int32).to(DEVICE)
    v = torch.randint(-100, 100, k.shape, generator=g, dtype=torch.int32).to(DEVICE)
    table = torch.randperm(n_pages, generator=g).to(torch.int32).to(DEVICE)
    all_heads = layout == "nhd-pages"
    grid = (1, kv_layout.HK * splits) if all_heads else (kv_layout.HK, splits)
    per_split = triton.cdiv(n_pages, grid[1] if all_heads else splits)
    out = torch.empty(grid[0] * grid[1], dtype=torch.int32, device=DEVICE)
    kv_layout._paged_read_kernel[grid](k, v, table, out, per_split, n_pages, HEAD_MAJOR=layout == "hnd",
                                       ALL_HEADS=all_heads, HK=kv_layout.HK, ROWS=kv_layout.ROWS,
                                       WORDS=kv_layout.WORDS, STAGES=3)
    assert int(out.long().sum()) == int(k.long().sum() + v.long().sum())
