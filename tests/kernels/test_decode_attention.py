"""decode_attention (split-KV kernel + reduce kernel; one non-empty split finishes by itself) vs
decode_attention_torch (= attention_torch, itself checked against flint_backend.reference in
test_attention.py)."""

import math

import pytest
import torch
import triton
import triton.language as tl

from flint_kernels import decode_attention as decode_attention_module
from flint_kernels.decode_attention import _first_pages, _split_range, decode_attention, decode_attention_torch
from kv_cases import assert_scaled_close, make_step

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
# bf16: output rounding plus bf16 probabilities in the P.V dot (on a GPU); fp32: summation order
TOL = {torch.bfloat16: dict(rtol=2e-2, atol=1e-2), torch.float32: dict(rtol=1e-4, atol=1e-5)}
WINDOW = 9


def run_both(step, window, num_splits=None, sinks="step"):
    sinks = step.sinks if sinks == "step" else sinks
    args = (step.q, step.k, step.v, step.k_cache, step.v_cache, step.context_lens, sinks,
            1 / math.sqrt(step.q.shape[-1]), window)
    got = decode_attention(*args, **step.cache_kwargs(), num_splits=num_splits)
    return got, decode_attention_torch(*args, **step.cache_kwargs())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("block_size,contexts,num_splits", [
    (4, [0, 1, 3, 4, 5], 3),            # block boundaries, empty cache, more splits than tiles
    (8, [17, 8, 9], None),              # odd batch, default splits
    (16, [150, 31, 64], 2),             # several tiles per split, tile = block boundary
    (16, [150], 1),                     # one split streams everything
])
def test_paged_full_context(block_size, contexts, num_splits, dtype):
    step = make_step([(c, 1) for c in contexts], dtype=dtype, rows_per=block_size, seed=block_size,
                     device=DEVICE)
    got, expected = run_both(step, 0, num_splits)
    torch.testing.assert_close(got, expected, **TOL[dtype])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("layout,rows_per", [("ring", WINDOW), ("ring", 12), ("paged", 4)])
@pytest.mark.parametrize("write_current", [False, True])
def test_sliding_window(layout, rows_per, write_current, dtype):
    # window-2, window-1, window, window+1 cached positions, a long-wrapped ring, an empty one
    contexts = [WINDOW - 2, WINDOW - 1, WINDOW, WINDOW + 1, 40, 0, 70]
    step = make_step([(c, 1) for c in contexts], dtype=dtype, layout=layout, rows_per=rows_per,
                     write_current=write_current, seed=rows_per, device=DEVICE)
    for splits in (1, 2):
        got, expected = run_both(step, WINDOW, splits)
        torch.testing.assert_close(got, expected, **TOL[dtype])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("hq,hk", [(16, 2), (12, 4)])  # G = 8; G = 3 padded to 16 rows
def test_every_row_written_for_any_number_of_nonempty_splits(hq, hk, dtype):
    # 8 splits of 64 positions, 0 to 5 of them non-empty: one non-empty split writes its rows itself
    # (the reduce program exits), more leave them to the reduce program; a row neither wrote stays NaN
    calls = [([130, 0, 70, 1, 257], 0, "paged"), ([70, 300, 5, 129, 64], 100, "paged"),
             ([300, 64, 0, 65, 129], 100, "ring"), ([130, 0, 70, 1, 257], 0, "paged")]
    for i, (contexts, window, layout) in enumerate(calls):
        step = make_step([(c, 1) for c in contexts], hq=hq, hk=hk, dtype=dtype, layout=layout,
                         rows_per=16 if layout == "paged" else 128, write_current=i % 2 == 1, seed=i,
                         device=DEVICE)
        args = (step.q, step.k, step.v, step.k_cache, step.v_cache, step.context_lens, step.sinks,
                1 / math.sqrt(step.q.shape[-1]), window)
        out = torch.full_like(step.q, float("nan"))
        decode_attention(*args, **step.cache_kwargs(), out=out, num_splits=8)
        torch.testing.assert_close(out, decode_attention_torch(*args, **step.cache_kwargs()), **TOL[dtype])



@pytest.mark.parametrize("layout,window", [("paged", 0), ("ring", WINDOW)])
def test_partials_loaded_first_give_the_same_bits(layout, window, monkeypatch):
    """decode_attention.REDUCE_PARTIALS_FIRST: the reduce programs' first block of partials loaded
    with q, k, v gives the bits of loading it after q . k; 20 splits run the interpreter's
    blocks of 16 twice (the second loaded in the loop)."""
    step = make_step([(c, 1) for c in (300, 5, 129)], dtype=torch.bfloat16, layout=layout,
                     rows_per=16 if layout == "paged" else 128, seed=4, device=DEVICE)
    outs = []
    for first in (False, True):
        monkeypatch.setattr(decode_attention_module, "REDUCE_PARTIALS_FIRST", first)
        outs.append(run_both(step, window, num_splits=20 if layout == "paged" else 2)[0])
    assert torch.equal(outs[0], outs[1])
    torch.testing.assert_close(outs[1], run_both(step, window)[1], **TOL[torch.bfloat16])

@pytest.mark.parametrize("window", [WINDOW, 200])
@pytest.mark.parametrize("num_splits", [1, 2, None])
def test_ring_kv_first_gives_the_same_bits(num_splits, window, monkeypatch):
    """decode_attention.RING_KV_FIRST: a ring split that loads q in its loop's first iteration
    (after that tile's K/V loads; the PDL wait with it on a GPU) gives the bits of loading q
    first: empty caches (one masked iteration), contexts inside and past the window, one split
    finishing the output itself, several splits, and splits of several tiles (window 200: q
    carried through the loop)."""
    step = make_step([(c, 1) for c in (0, 5, window - 1, 40, 300)], dtype=torch.bfloat16, layout="ring",
                     rows_per=window, write_current=True, seed=6, device=DEVICE)
    outs = []
    for first in (False, True):
        monkeypatch.setattr(decode_attention_module, "RING_KV_FIRST", first)
        outs.append(run_both(step, window, num_splits=num_splits)[0])
    assert torch.equal(outs[0], outs[1])
    torch.testing.assert_close(outs[1], run_both(step, window)[1], **TOL[torch.bfloat16])


@pytest.mark.parametrize("layout,window", [("paged", 0), ("ring", 200)])
@pytest.mark.parametrize("blocks", [2, 4])
def test_reduce_column_blocks_give_the_same_bits(layout, window, blocks, monkeypatch):
    """decode_attention.FULL_REDUCE_D_BLOCKS / WINDOW_REDUCE_D_BLOCKS: reduce programs that each
    merge D / blocks columns (the scores from q and k whole) give the bits of whole-row programs:
    20 splits (two of the interpreter's blocks of 16 partials), a window of several tiles in 3
    splits, and the default splits."""
    step = make_step([(c, 1) for c in (300, 5, 129, 0)], dtype=torch.bfloat16, layout=layout,
                     rows_per=16 if layout == "paged" else window, seed=7, device=DEVICE)
    knob = "WINDOW_REDUCE_D_BLOCKS" if window else "FULL_REDUCE_D_BLOCKS"
    for splits in (20 if layout == "paged" else 3, None):
        outs = []
        for b in (1, blocks):
            monkeypatch.setattr(decode_attention_module, knob, b)
            outs.append(run_both(step, window, num_splits=splits)[0])
        assert torch.equal(outs[0], outs[1])
    torch.testing.assert_close(outs[1], run_both(step, window)[1], **TOL[torch.bfloat16])
    monkeypatch.setattr(decode_attention_module, knob, 3)
    with pytest.raises(ValueError, match="3 reduce column blocks, expected a divisor of head_dim 16"):
        run_both(step, window, num_splits=2)


@pytest.mark.parametrize("layout,window", [("paged", 0), ("ring", 200)])
@pytest.mark.parametrize("sinks", ["step", None])
def test_new_token_first_gives_the_same_bits(layout, window, sinks, monkeypatch):
    """decode_attention.REDUCE_NEW_TOKEN_FIRST: reduce programs that merge the new token and the
    sink before their wait (on a GPU) give the bits of merging them after it: 20 splits (two of
    the interpreter's blocks of 16 partials), a window of several tiles, the default splits."""
    step = make_step([(c, 1) for c in (300, 5, 129, 0)], dtype=torch.bfloat16, layout=layout,
                     rows_per=16 if layout == "paged" else window, seed=8, device=DEVICE)
    for splits in (20 if layout == "paged" else 3, None):
        outs = []
        for first in (False, True):
            monkeypatch.setattr(decode_attention_module, "REDUCE_NEW_TOKEN_FIRST", first)
            outs.append(run_both(step, window, num_splits=splits, sinks=sinks)[0])
        assert torch.equal(outs[0], outs[1])
    torch.testing.assert_close(outs[1], run_both(step, window, sinks=sinks)[1], **TOL[torch.bfloat16])


@triton.jit
def _first_pages_kernel(context_lens_ptr, block_tables_ptr, named_ptr, stride_bt, num_splits, HK: tl.constexpr,
                        ROWS_PER: tl.constexpr, BLOCK_N: tl.constexpr, PAGES: tl.constexpr, LANES: tl.constexpr):
    """Program (b, KV head, split), as decode_attention's split programs: stores the block of each
    L2 request it issues (PAGED_L2_PAGES) at named[b, split, item], -1 where the item is not live."""
    b = tl.program_id(0)
    h = tl.program_id(1)
    s = tl.program_id(2)
    start, end, n_splits = _split_range(context_lens_ptr, b, s, 0, num_splits, BLOCK_N)
    if s >= tl.maximum(n_splits, 1):  # the split kernel's programs of empty splits exit first
        return
    block, is_v, live = _first_pages(block_tables_ptr + b * stride_bt, start, end, h, HK, ROWS_PER, PAGES, LANES)
    item = h + HK * tl.arange(0, LANES)
    tl.store(named_ptr + (b * num_splits + s) * 2 * PAGES + item, tl.where(live, block, -1), mask=item < 2 * PAGES)
    tl.device_assert((item % 2 == 1) == is_v)


def first_pages(tables, contexts, num_splits, pages, hk, rows_per, tile=16):
    """-> per sequence, per split: the blocks of its (page 0 K, page 0 V, page 1 K, ...) requests."""
    tables = torch.as_tensor(tables, dtype=torch.int32)
    named = torch.full((len(contexts), num_splits, 2 * pages), -2, dtype=torch.int64)
    _first_pages_kernel[(len(contexts), hk, num_splits)](
        torch.tensor(contexts, dtype=torch.int32), tables, named, tables.stride(0), num_splits, HK=hk,
        ROWS_PER=rows_per, BLOCK_N=tile, PAGES=pages, LANES=triton.next_power_of_2(-(-2 * pages // hk)))
    return named.tolist()


@pytest.mark.parametrize("hk", [1, 2, 4, 8])
def test_l2_pages_named_by_the_split_programs(hk):
    """decode_attention.PAGED_L2_PAGES: the KV heads' programs of a split together request the
    first pages of its range, K and V, each once, for any number of heads (8 > 2 x 2 pages: some
    programs request nothing)."""
    # 150 positions, 2 splits of 16-position tiles: split lengths cdiv(75, 16) * 16 = 80, so
    # [0, 80) and [80, 150); pages of 16 positions: split 0 starts at page 0, split 1 at page 5
    table = [[30, 31, 32, 33, 34, 35, 36, 37, 38, 39]]
    assert first_pages(table, [150], 2, 2, hk, 16) == [[[30, 30, 31, 31], [35, 35, 36, 36]]]
    # 20 positions, 4 splits: [0, 16), [16, 20) and two empty ones (no program runs: -2 stays)
    assert first_pages(table, [20], 4, 2, hk, 16) == [[[30, 30, -1, -1], [31, 31, -1, -1],
                                                       [-2, -2, -2, -2], [-2, -2, -2, -2]]]


def test_l2_pages_smaller_than_tiles_two_sequences_and_an_empty_cache():
    # pages of 8 positions, tiles of 16: 40 positions in 2 splits of 32 -> [0, 32), [32, 40):
    # split 0 starts at page 0, split 1 at page 4 and has no page 5 (position 40 is not cached);
    # 8 positions: one split of one page; none: split 0 runs (the new token) and requests nothing
    tables = [[9, 8, 7, 6, 5, 4], [19, 18, 17, 16, 15, 14], [29, 28, 27, 26, 25, 24]]
    assert first_pages(tables, [40, 8, 0], 2, 2, 2, 8) == [
        [[9, 9, 8, 8], [5, 5, -1, -1]],
        [[19, 19, -1, -1], [-2, -2, -2, -2]],
        [[-1, -1, -1, -1], [-2, -2, -2, -2]]]


def test_l2_pages_knob(monkeypatch):
    """PAGED_L2_PAGES asks for nothing without PDL (the interpreter, a CPU launch): the same bits;
    a value that is not a page count is refused by name."""
    step = make_step([(c, 1) for c in (300, 5)], dtype=torch.bfloat16, rows_per=16, seed=9, device=DEVICE)
    off = run_both(step, 0, num_splits=4)[0]
    monkeypatch.setattr(decode_attention_module, "PAGED_L2_PAGES", 2)
    assert torch.equal(run_both(step, 0, num_splits=4)[0], off)
    for bad in (-1, 17):
        monkeypatch.setattr(decode_attention_module, "PAGED_L2_PAGES", bad)
        with pytest.raises(ValueError, match=f"PAGED_L2_PAGES {bad}, expected an int in 0..16"):
            run_both(step, 0, num_splits=4)


def test_huge_sink_and_no_sink():
    step = make_step([(5, 1), (20, 1), (0, 1)], rows_per=4, device=DEVICE)
    got, _ = run_both(step, 0, 2, sinks=torch.full((8,), 1e4, device=DEVICE))
    assert got.abs().max() < 1e-6
    got, expected = run_both(step, 0, 2, sinks=None)
    torch.testing.assert_close(got, expected, **TOL[torch.float32])


def test_out_argument_and_errors():
    step = make_step([(5, 1), (3, 1)], rows_per=4, device=DEVICE)
    out = torch.empty_like(step.q)
    got = decode_attention(step.q, step.k, step.v, step.k_cache, step.v_cache, step.context_lens,
                           step.sinks, 0.25, 0, block_tables=step.block_tables, out=out, num_splits=2)
    assert got is out
    with pytest.raises(ValueError, match="num_splits"):
        decode_attention(step.q, step.k, step.v, step.k_cache, step.v_cache, step.context_lens,
                         step.sinks, 0.25, 0, block_tables=step.block_tables, num_splits=1000)


@pytest.mark.gpu
@pytest.mark.parametrize("batch,context", [(1, 1024), (1, 32768), (1, 100_000), (1, 262_143),
                                           (8, 32768), (64, 4096), (3, 77_777)])
def test_real_shapes_paged(batch, context, monkeypatch):
    contexts = [context - 13 * i for i in range(batch)]
    step = make_step([(c, 1) for c in contexts], hq=32, hk=4, d=128, dtype=torch.bfloat16,
                     rows_per=64, write_current=True, device=DEVICE)
    got, expected = run_both(step, 0)
    torch.testing.assert_close(got, expected, **TOL[torch.bfloat16])
    assert_scaled_close(got, expected)
    if batch == 1:  # the reduce in 4 column blocks (FULL_REDUCE_D_BLOCKS): bf16-close to the same
        monkeypatch.setattr(decode_attention_module, "FULL_REDUCE_D_BLOCKS", 4)
        torch.testing.assert_close(run_both(step, 0)[0], got, **TOL[torch.bfloat16])
        monkeypatch.setattr(decode_attention_module, "FULL_REDUCE_D_BLOCKS", 1)
    for pages in (1, 2):  # the first pages into L2 before the wait (PAGED_L2_PAGES): a hint, the same bits
        monkeypatch.setattr(decode_attention_module, "PAGED_L2_PAGES", pages)
        assert torch.equal(run_both(step, 0)[0], got)


@pytest.mark.gpu
@pytest.mark.parametrize("kv_first", [False, True])
@pytest.mark.parametrize("batch", [1, 8, 64])
def test_real_shapes_ring(batch, kv_first, monkeypatch):
    monkeypatch.setattr(decode_attention_module, "RING_KV_FIRST", kv_first)
    contexts = [[100, 511, 512, 513, 514, 5000][i % 6] + i for i in range(batch)]
    step = make_step([(c, 1) for c in contexts], hq=32, hk=4, d=128, dtype=torch.bfloat16,
                     layout="ring", rows_per=513, write_current=True, device=DEVICE)
    got, expected = run_both(step, 513)
    torch.testing.assert_close(got, expected, **TOL[torch.bfloat16])
    assert_scaled_close(got, expected)
