"""decode_attention (split-KV kernel + reduce kernel; one non-empty split finishes by itself) vs
decode_attention_torch (= attention_torch, itself checked against transformers' attention in
test_attention.py)."""

import math

import pytest
import torch

from flint_kernels import decode_attention as decode_attention_module
from flint_kernels.decode_attention import decode_attention, decode_attention_torch
from kv_cases import assert_scaled_close, make_step
from launch_spy import spy_launches

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


@pytest.mark.parametrize("hq,hk,dtype", [(16, 2, torch.float32), (12, 4, torch.bfloat16)])  # G = 8; G = 3 padded
def test_every_row_written_for_any_number_of_nonempty_splits(hq, hk, dtype):
    # 8 splits of 64 positions, 0 to 5 of them non-empty: one non-empty split writes its rows itself
    # (the reduce program exits), more leave them to the reduce program; a row neither wrote stays NaN
    calls = [([130, 0, 70, 1, 257], 0, "paged"), ([70, 300, 5, 129, 64], 100, "paged"),
             ([300, 64, 0, 65, 129], 100, "ring")]
    for i, (contexts, window, layout) in enumerate(calls):
        step = make_step([(c, 1) for c in contexts], hq=hq, hk=hk, dtype=dtype, layout=layout,
                         rows_per=16 if layout == "paged" else 128, write_current=i % 2 == 1, seed=i,
                         device=DEVICE)
        args = (step.q, step.k, step.v, step.k_cache, step.v_cache, step.context_lens, step.sinks,
                1 / math.sqrt(step.q.shape[-1]), window)
        out = torch.full_like(step.q, float("nan"))
        decode_attention(*args, **step.cache_kwargs(), out=out, num_splits=8)
        torch.testing.assert_close(out, decode_attention_torch(*args, **step.cache_kwargs()), **TOL[dtype])



@pytest.mark.parametrize("layout,window", [("paged", 0), ("ring", 200)])
@pytest.mark.parametrize("sinks", ["step", None])
def test_reduce_of_more_partials_than_a_block(layout, window, sinks):
    """The reduce (the new token and the sink merged before its PDL wait on a GPU, the first
    block of partials loaded with them): 20 splits run two of the interpreter's blocks of 16
    partials, a window of several tiles, the default splits."""
    step = make_step([(c, 1) for c in (300, 5, 129, 0)], dtype=torch.bfloat16, layout=layout,
                     rows_per=16 if layout == "paged" else window, seed=8, device=DEVICE)
    for splits in (20 if layout == "paged" else 3, None):
        got, expected = run_both(step, window, num_splits=splits, sinks=sinks)
        torch.testing.assert_close(got, expected, **TOL[torch.bfloat16])


def test_reduce_warps_reach_the_reduce_launch_and_keep_the_output(monkeypatch):
    # a launch config: the reduce launch gets reduce_warps warps (REDUCE_WARPS without it), and
    # nothing computed changes (bit-equal under the interpreter, which ignores warps; on a GPU the
    # cross-warp sums may run in another order)
    launches = spy_launches(monkeypatch, decode_attention_module, "_decode_reduce_kernel", "num_warps")
    step = make_step([(c, 1) for c in (40, 3, 70)], layout="ring", rows_per=12, seed=7, device=DEVICE)
    args = (step.q, step.k, step.v, step.k_cache, step.v_cache, step.context_lens, step.sinks, 0.25, 9)
    exp = decode_attention(*args, **step.cache_kwargs(), num_splits=3)
    for warps in (1, 2, 8):
        got = decode_attention(*args, **step.cache_kwargs(), num_splits=3, reduce_warps=warps)
        torch.testing.assert_close(got, exp, rtol=1e-5, atol=1e-6)
    assert [warps for _, warps in launches] == [decode_attention_module.REDUCE_WARPS, 1, 2, 8]
    with pytest.raises(ValueError, match="decode_attention: reduce_warps 3, expected a power of two"):
        decode_attention(*args, **step.cache_kwargs(), reduce_warps=3)


@pytest.mark.parametrize("layout,window", [("paged", 0), ("ring", 200)])
def test_a_batch_padded_to_its_bucket_gives_the_same_bits(layout, window):
    """A decode graph replays a batch of 3 in its bucket of 4 (the 4th row padding, context 0).
    The default splits come from the bucket, so the 3 rows get the bits of an eager step of 3
    (from the batch itself, 3 rows took 2 splits and 4 rows 1 here: 4 host SMs, 2 KV heads)."""
    step = make_step([(c, 1) for c in (300, 5, 129, 0)], dtype=torch.float32, layout=layout,
                     rows_per=16 if layout == "paged" else window, seed=5, device=DEVICE)
    scale = 1 / math.sqrt(step.q.shape[-1])
    padded = decode_attention(step.q, step.k, step.v, step.k_cache, step.v_cache, step.context_lens, step.sinks,
                              scale, window, **step.cache_kwargs())
    three = decode_attention(step.q[:3], step.k[:3], step.v[:3], step.k_cache, step.v_cache, step.context_lens[:3],
                             step.sinks, scale, window,
                             **{name: rows[:3] for name, rows in step.cache_kwargs().items() if rows is not None})
    assert torch.equal(three, padded[:3])
    torch.testing.assert_close(three, run_both(step, window)[1][:3], **TOL[torch.float32])


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


@pytest.mark.parametrize("num_splits", [1, 3])  # the one split's own store; the reduce's
def test_fp16_out_is_the_bf16_output_converted(num_splits):
    """out in float16 (fp16 GEMM tiles' activations, nvfp4_linear.wants_f16_activations): the
    output rounded to q's bf16 first, then converted, so the same values as the bf16 output."""
    step = make_step([(17, 1), (40, 1), (3, 1)], dtype=torch.bfloat16, rows_per=8, seed=4, device=DEVICE)
    args = (step.q, step.k, step.v, step.k_cache, step.v_cache, step.context_lens, step.sinks, 0.25, 0)
    bf16 = decode_attention(*args, **step.cache_kwargs(), num_splits=num_splits)
    out = torch.empty(step.q.shape, dtype=torch.float16, device=DEVICE)
    got = decode_attention(*args, **step.cache_kwargs(), num_splits=num_splits, out=out)
    assert got is out and bf16.dtype == torch.bfloat16
    assert torch.equal(got, bf16.to(torch.float16))
    with pytest.raises(ValueError, match=r"out is torch.float32 .* expected torch.bfloat16 \(or float16"):
        decode_attention(*args, **step.cache_kwargs(), out=torch.empty(step.q.shape, device=DEVICE))


@pytest.mark.gpu
@pytest.mark.parametrize("batch,context", [(1, 1024), (1, 32768), (1, 100_000), (1, 262_143),
                                           (8, 32768), (64, 4096), (3, 77_777)])
def test_real_shapes_paged(batch, context):
    contexts = [context - 13 * i for i in range(batch)]
    step = make_step([(c, 1) for c in contexts], hq=32, hk=4, d=128, dtype=torch.bfloat16,
                     rows_per=64, write_current=True, device=DEVICE)
    got, expected = run_both(step, 0)
    torch.testing.assert_close(got, expected, **TOL[torch.bfloat16])
    assert_scaled_close(got, expected)


@pytest.mark.gpu
@pytest.mark.parametrize("batch", [1, 8, 64])
def test_real_shapes_ring(batch):
    contexts = [[100, 511, 512, 513, 514, 5000][i % 6] + i for i in range(batch)]
    step = make_step([(c, 1) for c in contexts], hq=32, hk=4, d=128, dtype=torch.bfloat16,
                     layout="ring", rows_per=513, write_current=True, device=DEVICE)
    got, expected = run_both(step, 513)
    torch.testing.assert_close(got, expected, **TOL[torch.bfloat16])
    assert_scaled_close(got, expected)
