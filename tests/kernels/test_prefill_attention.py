"""prefill_attention vs prefill_attention_torch (= attention_torch, itself checked against
transformers' attention in test_attention.py)."""

import math

import pytest
import torch

from flint_kernels.prefill_attention import prefill_attention, prefill_attention_torch
from kv_cases import assert_scaled_close, make_step
from launch_spy import spy_launches

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
# bf16: output rounding plus bf16 probabilities in the P.V dot (on a GPU); fp32: summation order
TOL = {torch.bfloat16: dict(rtol=2e-2, atol=1e-2), torch.float32: dict(rtol=1e-4, atol=1e-5)}
WINDOW = 9


def run_both(step, window, sinks="step", kv_in_cache=False):
    """kv_in_cache: the kernel gets NaN k / v, so every key it uses comes from the cache."""
    sinks = step.sinks if sinks == "step" else sinks
    max_q = int((step.query_start_loc[1:] - step.query_start_loc[:-1]).max())
    args = (step.q, step.k, step.v, step.query_start_loc, step.context_lens, step.k_cache, step.v_cache,
            sinks, 1 / math.sqrt(step.q.shape[-1]), window, max_q)
    kernel_args = args
    if kv_in_cache:
        kernel_args = (step.q, torch.full_like(step.k, float("nan")), torch.full_like(step.v, float("nan"))) + args[3:]
    got = prefill_attention(*kernel_args, **step.cache_kwargs(), kv_in_cache=kv_in_cache)
    return got, prefill_attention_torch(*args, **step.cache_kwargs())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("block_size,seqs", [
    (4, [(0, 1), (0, 20), (3, 5)]),                 # fresh prompts, odd batch, block boundaries
    (8, [(13, 17), (0, 1), (40, 1), (7, 9), (0, 33)]),  # chunked + decode rows mixed, batch 5
    (16, [(50, 30)]),                               # one long chunk: several key tiles of each kind
])
def test_paged_full_context(block_size, seqs, dtype):
    step = make_step(seqs, dtype=dtype, rows_per=block_size, seed=block_size, device=DEVICE)
    got, expected = run_both(step, 0)
    torch.testing.assert_close(got, expected, **TOL[dtype])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("layout,rows_per", [("ring", WINDOW), ("ring", 12), ("paged", 4)])
def test_sliding_window(layout, rows_per, dtype):
    # fresh prompts of window-1 / window / window+1 tokens, chunks after a full and a wrapped
    # ring, decode rows at the window edges
    seqs = [(0, WINDOW - 1), (0, WINDOW), (0, WINDOW + 1), (WINDOW, 5), (23, 12), (WINDOW - 1, 1),
            (WINDOW + 1, 1), (4, 3)]
    step = make_step(seqs, dtype=dtype, layout=layout, rows_per=rows_per, seed=rows_per, device=DEVICE)
    got, expected = run_both(step, WINDOW)
    torch.testing.assert_close(got, expected, **TOL[dtype])


@pytest.mark.parametrize("layout,rows_per", [("ring", 40), ("paged", 8)])
def test_window_wider_than_tiles(layout, rows_per):
    # a window spanning more than a query tile plus a key tile: tiles all rows see skip the mask
    step = make_step([(60, 20), (0, 45), (39, 2)], layout=layout, rows_per=rows_per, device=DEVICE)
    got, expected = run_both(step, 40)
    torch.testing.assert_close(got, expected, **TOL[torch.float32])


@pytest.mark.parametrize("window", [0, 40])
def test_gpu_tile_sizes(monkeypatch, window):
    # the interpreter runs small tiles; the GPU's 128 x 64 tiles cross the same edges here
    from flint_kernels import prefill_attention as module
    monkeypatch.setattr(module, "TILE_M", 128)
    monkeypatch.setattr(module, "TILE_N", 64)
    layout, rows_per = ("ring", 40) if window else ("paged", 16)
    step = make_step([(70, 75), (0, 1), (130, 5)], layout=layout, rows_per=rows_per, device=DEVICE)
    got, expected = run_both(step, window)
    torch.testing.assert_close(got, expected, **TOL[torch.float32])


# whole pages: the default tiles hold two pages a key tile (the interpreter's 32 keys over pages
# of 16 rows, a GPU's 128 over 64); these tiles one
PAGE_ROWS = 16 if DEVICE == "cpu" else 64
ONE_PAGE_TILES = (32, 16, 4, 1) if DEVICE == "cpu" else (128, 64, 8, 2)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("tiles,pages", [(None, 2), (ONE_PAGE_TILES, 1)], ids=["two-pages", "one-page"])
def test_whole_pages_of_a_cache_holding_the_step(monkeypatch, tiles, pages, dtype):
    # full layers write the step's K/V first (kv_in_cache): keys come by whole pages (tensor
    # descriptors); rows past the written ones are NaN in make_step's cache and must not reach P V
    from flint_kernels import prefill_attention as module, tuning
    monkeypatch.setattr(tuning, "PREFILL_ATTENTION_TILES", tiles)
    launches = spy_launches(monkeypatch, module, "_prefill_kernel", "PAGES")
    seqs = [(50, 30), (0, 17), (16, 1), (33, 16), (0, 1), (47, 2)]
    step = make_step(seqs, dtype=dtype, rows_per=PAGE_ROWS, write_current=True, seed=5, device=DEVICE)
    got, expected = run_both(step, 0, kv_in_cache=True)
    torch.testing.assert_close(got, expected, **TOL[dtype])
    assert [launch[1] for launch in launches] == [pages]


@pytest.mark.parametrize("layout,rows_per,window", [("paged", 8, 0), ("paged", 16, WINDOW), ("ring", 16, WINDOW)])
def test_kv_in_cache_where_pages_do_not_fit(monkeypatch, layout, rows_per, window):
    # pages under 16 rows and windowed layers keep the gathered path, which reads the step's k / v
    from flint_kernels import prefill_attention as module
    launches = spy_launches(monkeypatch, module, "_prefill_kernel", "PAGES")
    step = make_step([(20, 9), (0, 5)], layout=layout, rows_per=rows_per, write_current=True, device=DEVICE)
    args = (step.q, step.k, step.v, step.query_start_loc, step.context_lens, step.k_cache, step.v_cache,
            step.sinks, 0.25, window, 9)
    got = prefill_attention(*args, **step.cache_kwargs(), kv_in_cache=True)
    torch.testing.assert_close(got, prefill_attention_torch(*args, **step.cache_kwargs()), **TOL[torch.float32])
    assert [launch[1] for launch in launches] == [0]


def test_huge_sink_and_no_sink():
    step = make_step([(5, 6), (0, 3), (2, 1)], rows_per=4, device=DEVICE)
    got, _ = run_both(step, 0, sinks=torch.full((8,), 1e4, device=DEVICE))
    assert got.abs().max() < 1e-6
    got, expected = run_both(step, WINDOW, sinks=None)
    torch.testing.assert_close(got, expected, **TOL[torch.float32])


def test_other_group_sizes_and_strided_inputs():
    step = make_step([(6, 7), (0, 4), (11, 1)], hq=6, hk=3, d=32, rows_per=4, device=DEVICE)
    qkv = torch.cat([step.q.flatten(1), step.k.flatten(1), step.v.flatten(1)], dim=1)
    step.v = qkv[:, (6 + 3) * 32:].view(-1, 3, 32)  # a view into qkv, as qk_norm_rope returns it
    got, expected = run_both(step, 0)
    torch.testing.assert_close(got, expected, **TOL[torch.float32])


@pytest.mark.gpu
@pytest.mark.parametrize("seqs,window", [
    ([(0, 8192)], 0), ([(0, 8192)], 513), ([(4096, 2048), (0, 1), (30_000, 1), (100, 700)], 0),
    ([(5000, 2048), (0, 1000), (512, 1), (513, 3)], 513), ([(0, 32768)], 0),
])
@pytest.mark.parametrize("kv_in_cache", [False, True])
def test_real_shapes(seqs, window, kv_in_cache):
    layout, rows_per = ("ring", 513) if window else ("paged", 64)
    step = make_step(seqs, hq=32, hk=4, d=128, dtype=torch.bfloat16, layout=layout, rows_per=rows_per,
                     write_current=kv_in_cache and not window, device=DEVICE)
    got, expected = run_both(step, window, kv_in_cache=kv_in_cache and not window)
    torch.testing.assert_close(got, expected, **TOL[torch.bfloat16])
    assert_scaled_close(got, expected)


@pytest.mark.gpu
@pytest.mark.parametrize("seqs", [[(0, 8192)], [(4096, 2048), (0, 1), (30_000, 1), (100, 700)]])
def test_real_shapes_in_pages_of_128_rows(seqs):
    """A paged cache of block_size 128 (one page a 128-key tile) on flint-40b's full layers."""
    step = make_step(seqs, hq=32, hk=4, d=128, dtype=torch.bfloat16, rows_per=128, write_current=True,
                     device=DEVICE)
    got, expected = run_both(step, 0, kv_in_cache=True)
    torch.testing.assert_close(got, expected, **TOL[torch.bfloat16])
    assert_scaled_close(got, expected)
