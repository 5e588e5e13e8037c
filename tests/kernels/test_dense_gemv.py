"""dense_gemv (decode-batch GEMV, split-K, weights loaded before the PDL wait) vs F.linear."""

import pytest
import torch
import torch.nn.functional as F

from flint_kernels import dense_gemv as dense_gemv_module
from flint_kernels import tuning
from flint_kernels.dense_gemv import MAX_TOKENS, dense_gemv, uses_dense_gemv
from launch_spy import spy_launches

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
# fp32: summation order only; bf16: the output's rounding (the interpreter truncates: 1 ulp)
TOL = {torch.float32: dict(rtol=1e-5, atol=1e-5), torch.bfloat16: dict(rtol=1e-2, atol=1e-2)}


def operands(t, n, k, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(t, k, generator=g).to(dtype).to(DEVICE)
    w = (torch.randn(n, k, generator=g) * k ** -0.5).to(dtype).to(DEVICE)
    return x, w


STEP = dense_gemv_module.BLOCK_K  # K in launcher steps: the same cases on a GPU (1024) and the interpreter (128)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("t,n,k,splits", [
    (1, 48, STEP, None),     # one step a program, loaded before the wait
    (2, 40, 2 * STEP, 1),    # two steps a program, both loaded before the wait
    (3, 33, 4 * STEP, 2),    # split-K, two steps a split, odd rows
    (4, 24, 10 * STEP, 2),   # five steps a split: the pipelined loop
    (1, 20, 96, None),       # K not a power of two: one masked step
    (2, 17, 200, None),      # K not a multiple of the step (of the interpreter's: masked loop steps)
])
def test_matches_f_linear(t, n, k, splits, dtype):
    x, w = operands(t, n, k, dtype, seed=t * k)
    got = dense_gemv(x, w, num_splits=splits)
    assert got.dtype == dtype and got.shape == (t, n)
    torch.testing.assert_close(got, F.linear(x, w), **TOL[dtype])


@pytest.mark.parametrize("k", [384, 512])
@pytest.mark.parametrize("norm", [False, True])
def test_one_split_of_three_or_four_prefetched_steps(k, norm):
    # K of at most tuning.GEMV_PREFETCH_STEPS (4) steps: one split, every step loaded before x
    # (the interpreter's step is 128 columns: 3 or 4 steps); with and without the folded RMSNorm
    x, w = operands(2, 24, k, torch.float32, seed=k)
    if not norm:
        torch.testing.assert_close(dense_gemv(x, w), F.linear(x, w), **TOL[torch.float32])
        return
    residual, _ = operands(2, 1, k, torch.float32, seed=k + 1)
    norm_w = 1 + 0.1 * operands(1, 1, k, torch.float32, seed=k + 2)[0][0]
    got, got_res = dense_gemv_module.rms_norm_dense_gemv(x, residual, norm_w, 1e-6, w)
    exp, exp_res = dense_gemv_module.rms_norm_dense_gemv_torch(x, residual, norm_w, 1e-6, w)
    torch.testing.assert_close(got, exp, **TOL[torch.float32])
    torch.testing.assert_close(got_res, exp_res, rtol=0, atol=0)



@pytest.mark.parametrize("norm", [False, True])
@pytest.mark.parametrize("rows", [4, 16])
def test_unsplit_launch_of_fewer_rows(rows, norm, monkeypatch):
    """tuning.DENSE_GEMV_UNSPLIT_ROWS: a launch left as one split of 4 steps runs in programs of
    `rows` rows, close to F.linear (the folded RMSNorm's too); a launch of two steps keeps
    BLOCK_N rows."""
    monkeypatch.setattr(tuning, "DENSE_GEMV_UNSPLIT_ROWS", rows)
    launches = spy_launches(monkeypatch, dense_gemv_module, "_dense_gemv_kernel", "BLOCK_N", "SPLIT", "PREFETCH")
    x, w = operands(1, 40, 4 * STEP, torch.float32, seed=rows)
    if norm:
        residual, _ = operands(1, 1, 4 * STEP, torch.float32, seed=rows + 1)
        norm_w = 1 + 0.1 * operands(1, 1, 4 * STEP, torch.float32, seed=rows + 2)[0][0]
        got, got_res = dense_gemv_module.rms_norm_dense_gemv(x, residual, norm_w, 1e-6, w)
        exp, exp_res = dense_gemv_module.rms_norm_dense_gemv_torch(x, residual, norm_w, 1e-6, w)
        torch.testing.assert_close(got_res, exp_res, rtol=0, atol=0)
    else:
        got, exp = dense_gemv(x, w), F.linear(x, w)
    torch.testing.assert_close(got, exp, **TOL[torch.float32])
    two_steps = dense_gemv(x[:, :2 * STEP].contiguous(), w[:, :2 * STEP].contiguous())
    torch.testing.assert_close(two_steps, F.linear(x[:, :2 * STEP], w[:, :2 * STEP]), **TOL[torch.float32])
    block_n = dense_gemv_module.BLOCK_N
    assert launches == [((1, -(-40 // rows), 1), rows, 1, 4), ((1, -(-40 // block_n), 1), block_n, 1, 2)]


@pytest.mark.parametrize("t,n,steps,splits", [(1, 40, 2, None), (2, 33, 4, 2), (3, 24, 8, 2)])
def test_fp32_logits_are_the_rounded_outputs(t, n, steps, splits):
    """out_dtype=torch.float32 (the LM head's logits): dense_gemv(x, w).float() bit for bit, in
    one launch, unsplit and split-K (K in launcher steps: valid splits on a GPU too)."""
    x, w = operands(t, n, steps * STEP, torch.bfloat16, seed=n)
    got = dense_gemv(x, w, num_splits=splits, out_dtype=torch.float32)
    assert got.dtype == torch.float32 and got.shape == (t, n)
    assert torch.equal(got, dense_gemv(x, w, num_splits=splits).float())
    with pytest.raises(ValueError, match="out_dtype torch.float16"):
        dense_gemv(x, w, out_dtype=torch.float16)


def test_one_hot_rows_read_back_the_weights_exactly():
    x, w = operands(1, 40, 256, torch.float32, seed=1)
    x = torch.eye(256, device=DEVICE)[[3, 200]]
    assert torch.equal(dense_gemv(x, w), w[:, [3, 200]].T)


def test_split_k_is_deterministic():
    x, w = operands(2, 16, 8 * STEP, torch.float32, seed=2)
    assert torch.equal(dense_gemv(x, w, num_splits=4), dense_gemv(x, w, num_splits=4))


def test_which_linears_it_takes():
    x, w = operands(MAX_TOKENS, 8, 64, torch.bfloat16, seed=3)
    assert uses_dense_gemv(x, w)
    assert not uses_dense_gemv(torch.cat([x, x]), w)                # a prefill chunk: cuBLAS
    assert not uses_dense_gemv(x.float(), w)                         # mixed dtypes
    head = torch.empty(dense_gemv_module.MAX_ROWS + 1, 64, dtype=torch.bfloat16, device="meta")
    assert not uses_dense_gemv(x.to("meta"), head)                   # wider than any LM head


def test_errors_name_the_argument():
    x, w = operands(2, 8, 64, torch.bfloat16, seed=4)
    assert dense_gemv(x[:0], w).shape == (0, 8)
    with pytest.raises(ValueError, match=r"x has shape \(2, 32\).*expected \[T, 64\]"):
        dense_gemv(x[:, :32], w)
    with pytest.raises(ValueError, match="at most 4"):
        dense_gemv(torch.cat([x, x, x]), w)
    with pytest.raises(ValueError, match="x is torch.float32 and w torch.bfloat16"):
        dense_gemv(x.float(), w)
    with pytest.raises(ValueError, match="num_splits 3, expected 1..1"):
        dense_gemv(x, w, num_splits=3)


@pytest.mark.gpu
@pytest.mark.parametrize("unsplit_rows", [None, 4])
@pytest.mark.parametrize("t", [1, 4])
@pytest.mark.parametrize("n,k", [(5120, 2048), (2048, 4096), (12288, 2048), (2048, 6144)])
def test_real_shapes(t, n, k, unsplit_rows, monkeypatch):
    monkeypatch.setattr(tuning, "DENSE_GEMV_UNSPLIT_ROWS", unsplit_rows)  # o_proj (2048 x 4096)
    x, w = operands(t, n, k, torch.bfloat16, seed=n + k)
    torch.testing.assert_close(dense_gemv(x, w), F.linear(x, w), **TOL[torch.bfloat16])


@pytest.mark.parametrize("splits,prefetch", [(1, 0), (2, 0), (5, 2)])
def test_long_k_splits(splits, prefetch, monkeypatch):
    """tuning.DENSE_GEMV_LONG_K_SPLITS (one split on a GPU: the dense MLP's down, K = 10 steps): a
    launch whose K takes more steps than a split prefetches takes that many splits, through the
    pipelined loop when a split has more than GEMV_PREFETCH_STEPS steps, close to F.linear."""
    monkeypatch.setattr(tuning, "DENSE_GEMV_LONG_K_SPLITS", splits)
    launches = spy_launches(monkeypatch, dense_gemv_module, "_dense_gemv_kernel", "SPLIT", "PREFETCH")
    x, w = operands(1, 24, 10 * STEP, torch.float32, seed=splits)
    torch.testing.assert_close(dense_gemv(x, w), F.linear(x, w), **TOL[torch.float32])
    assert [(grid[2], split, pre) for grid, split, pre in launches] == [(splits, splits, prefetch)]
