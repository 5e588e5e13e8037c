"""nvfp4_linear (GEMV and tl.dot GEMM kernels, split-K) vs nvfp4_linear_torch = dequantise
(exactly, fp32) then matmul; and the decoded weights themselves, bit for bit."""

import pytest
import torch
import triton

from flint_backend.weights.nvfp4 import concat_rows, dequantize_nvfp4
from flint_backend.weights.nvfp4_quantize import quantize_nvfp4
from flint_kernels import nvfp4_linear as nvfp4_linear_module
from flint_kernels import tuning
from flint_kernels.nvfp4_linear import (GEMV_MAX_TOKENS, nvfp4_linear, nvfp4_linear_torch, rms_norm_nvfp4_linear,
                                        rms_norm_nvfp4_linear_torch, silu_nvfp4_linear)
from kv_cases import assert_scaled_close
from launch_spy import spy_launches

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
# fp32 x: only the accumulation order differs (global scale applied once per output, after the
# sum). bf16 x: the output's rounding to bf16, which the interpreter truncates (1 ulp, 2^-8).
TOL = {torch.float32: dict(rtol=1e-5, atol=1e-4), torch.bfloat16: dict(rtol=1e-2, atol=2e-2)}


def weight(n, k, seed=0, per_row=False):
    g = torch.Generator().manual_seed(seed)
    if per_row:  # a fused weight: three sources with their own global scales
        parts = [quantize_nvfp4(torch.randn(m, k, generator=g) * s) for m, s in [(n - n // 2, 1.0), (n // 4, 0.05),
                                                                                  (n // 2 - n // 4, 8.0)]]
        return concat_rows(parts).to(DEVICE)
    return quantize_nvfp4(torch.randn(n, k, generator=g)).to(DEVICE)


@pytest.fixture
def interpreter_steps(monkeypatch):
    """The GEMV's word steps of 256 weights, as in the interpreter, on a GPU too (1024 there): the
    cases below count steps and splits of small K in those units."""
    monkeypatch.setattr(nvfp4_linear_module, "GEMV_WORDS_BLOCK_K", 256)


@pytest.fixture(params=[False, True], ids=["bytes", "words-prefetch"])
def words(request, monkeypatch):
    """Both NVFP4 decodes of the GEMV kernels (tuning.FP4_GEMV_WORDS); words load splits of whole
    steps up front, longer ones in the k loop."""
    monkeypatch.setattr(tuning, "FP4_GEMV_WORDS", request.param)
    return request.param


@pytest.mark.parametrize("t", [1, 3, GEMV_MAX_TOKENS + 1, 64])
def test_one_hot_activations_read_back_the_exact_weights(t, words):
    # x = rows of the identity: y[i, n] = W[n, k_i] with no accumulation, bit for bit
    w = weight(40, 64, per_row=True)
    ks = torch.arange(t, device=DEVICE) * 7 % 64
    x = torch.eye(64, device=DEVICE)[ks]
    expected = dequantize_nvfp4(w.packed, w.scales, w.scale, torch.float32).T[ks]
    assert torch.equal(nvfp4_linear(x, w), expected)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("t,n,k,splits", [
    (1, 48, 64, None),        # batch-1 GEMV
    (3, 33, 96, None),        # odd rows, K not a multiple of the k step
    (4, 40, 1024, 4),         # GEMV split-K, reduction finished by the last split
    (2, 40, 512, 1),          # GEMV, two k steps a program (prefetched: both before x)
    (1, 24, 1024, 2),         # GEMV split-K, two k steps a split
    (5, 70, 64, None),        # GEMM, partial tiles
    (17, 24, 512, 2),         # GEMM split-K
])
def test_matches_dequantise_then_matmul(t, n, k, splits, dtype, words, interpreter_steps):
    w = weight(n, k, seed=t, per_row=t % 2 == 1)
    x = torch.randn(t, k, device=DEVICE, generator=torch.Generator(DEVICE).manual_seed(t)).to(dtype)
    got = nvfp4_linear(x, w, num_splits=splits)
    assert got.dtype == dtype and got.shape == (t, n)
    torch.testing.assert_close(got, nvfp4_linear_torch(x, w), **TOL[dtype])


@pytest.mark.parametrize("k", [768, 1024])
@pytest.mark.parametrize("norm", [False, True])
def test_one_split_of_three_or_four_prefetched_steps(k, norm, monkeypatch):
    # one split of K's 3 or 4 word steps (the interpreter's step is 256 weights; at most
    # tuning.GEMV_PREFETCH_STEPS), every step loaded before x; with and without the folded RMSNorm
    monkeypatch.setattr(tuning, "FP4_GEMV_WORDS", True)
    w = weight(40, k, seed=k, per_row=True)
    gen = torch.Generator(DEVICE).manual_seed(k)
    x = torch.randn(2, k, device=DEVICE, generator=gen)
    if not norm:
        torch.testing.assert_close(nvfp4_linear(x, w, num_splits=1), nvfp4_linear_torch(x, w), **TOL[torch.float32])
        return
    residual = torch.randn(2, k, device=DEVICE, generator=gen)
    norm_w = 1 + 0.1 * torch.randn(k, device=DEVICE, generator=gen)
    got, got_res = nvfp4_linear_module.rms_norm_nvfp4_linear(x, residual, norm_w, 1e-6, w, num_splits=1)
    exp, exp_res = nvfp4_linear_module.rms_norm_nvfp4_linear_torch(x, residual, norm_w, 1e-6, w)
    # fp32 sums in another order: at K = 768 the twin itself is 1.5e-4 from a float64 evaluation
    # (the kernel 6e-5), so the bound is the twin's error, not TOL's 1e-4
    torch.testing.assert_close(got, exp, rtol=1e-5, atol=3e-4)
    torch.testing.assert_close(got_res, exp_res, rtol=0, atol=0)



@pytest.mark.parametrize("norm", [False, True])
@pytest.mark.parametrize("rows", [8, 32])
def test_unsplit_launch_of_fewer_rows(rows, norm, monkeypatch, interpreter_steps):
    """tuning.FP4_GEMV_UNSPLIT_ROWS: a batch-1 launch that would split its 4 steps (the
    interpreter's step is 256 weights) runs as one prefetching split of `rows` rows a program,
    close to dequantise-then-matmul, with and without the folded RMSNorm; the launch it makes is
    one split of those rows."""
    monkeypatch.setattr(tuning, "FP4_GEMV_WORDS", True)
    monkeypatch.setattr(tuning, "FP4_GEMV_UNSPLIT_ROWS", rows)
    launches = spy_launches(monkeypatch, nvfp4_linear_module, "_nvfp4_gemv_kernel", "BLOCK_N", "SPLIT", "PREFETCH")
    k = 1024
    w = weight(40, k, seed=3, per_row=True)
    gen = torch.Generator(DEVICE).manual_seed(3)
    x, residual = torch.randn(2, 1, k, device=DEVICE, generator=gen)
    if norm:
        norm_w = 1 + 0.1 * torch.randn(k, device=DEVICE, generator=gen)
        got, got_res = nvfp4_linear_module.rms_norm_nvfp4_linear(x, residual, norm_w, 1e-6, w)
        exp, exp_res = nvfp4_linear_module.rms_norm_nvfp4_linear_torch(x, residual, norm_w, 1e-6, w)
        torch.testing.assert_close(got_res, exp_res, rtol=0, atol=0)
    else:
        got, exp = nvfp4_linear(x, w), nvfp4_linear_torch(x, w)
    torch.testing.assert_close(got, exp, **TOL[torch.float32])
    assert launches == [((1, triton.cdiv(40, rows), 1), rows, 1, 4)]


@pytest.mark.parametrize("t,splits", [(GEMV_MAX_TOKENS + 1, None), (17, 2)])
def test_fp16_activations_give_the_bf16_products(t, splits):
    """x in fp16 converted from bf16 (tuning.FP4_GEMM_F16_ACTIVATIONS: the producer converts, not
    each K step of the fp16 tiles) with out_dtype bfloat16: the bits of x in bf16."""
    w = weight(70, 512, seed=t, per_row=True)
    g = torch.Generator(DEVICE).manual_seed(t)
    x = torch.randn(t, 512, device=DEVICE, generator=g).bfloat16()
    x[x.abs() < 2 ** -10] = 2 ** -10  # fp16 holds every value exactly (no subnormals)
    expected = nvfp4_linear(x, w, num_splits=splits)
    got = nvfp4_linear(x.to(torch.float16), w, num_splits=splits, out_dtype=torch.bfloat16)
    assert got.dtype == torch.bfloat16 and torch.equal(got, expected)
    with pytest.raises(ValueError, match="out_dtype is torch.int8, expected bfloat16"):
        nvfp4_linear(x, w, out_dtype=torch.int8)


def test_split_k_is_deterministic(interpreter_steps):
    w = weight(16, 2048, seed=3)
    x = torch.randn(2, 2048, device=DEVICE)
    once, again = nvfp4_linear(x, w, num_splits=8), nvfp4_linear(x, w, num_splits=8)
    assert torch.equal(once, again)
    torch.testing.assert_close(once, nvfp4_linear(x, w, num_splits=1), **TOL[torch.float32])


def test_empty_batch_and_errors():
    w = weight(8, 64)
    assert nvfp4_linear(torch.empty(0, 64, device=DEVICE), w).shape == (0, 8)
    with pytest.raises(ValueError, match=r"expected \[T, 64\]"):
        nvfp4_linear(torch.randn(2, 32, device=DEVICE), w)
    with pytest.raises(ValueError, match="num_splits"):
        nvfp4_linear(torch.randn(2, 64, device=DEVICE), w, num_splits=5)
    stacked = quantize_nvfp4(torch.randn(2, 8, 64)).to(DEVICE)
    with pytest.raises(ValueError, match="matrix"):
        nvfp4_linear(torch.randn(2, 64, device=DEVICE), stacked)


@pytest.mark.gpu
@pytest.mark.parametrize("t", [1, 4, 8, 64, 8192])
@pytest.mark.parametrize("n,k", [(5120, 2048), (2048, 4096), (12288, 2048), (2048, 6144), (150144, 2048)])
def test_real_shapes(t, n, k, words):
    if words and t > GEMV_MAX_TOKENS:
        pytest.skip("the NVFP4 decode is the GEMV's")
    if n == 150144 and t > 64:
        pytest.skip("LM head runs on sampled rows only")
    w = quantize_nvfp4(torch.randn(n, k, device=DEVICE) / k ** 0.5)
    x = torch.randn(t, k, device=DEVICE, dtype=torch.bfloat16)
    got, expected = nvfp4_linear(x, w), nvfp4_linear_torch(x, w)
    torch.testing.assert_close(got, expected, **TOL[torch.bfloat16])
    assert_scaled_close(got, expected, rel=1e-2)


@pytest.mark.gpu
@pytest.mark.parametrize("rows", [4, 8])
@pytest.mark.parametrize("t", [1, 4])
def test_unsplit_real_shapes(t, rows, monkeypatch):
    """flint-40b's o_proj (2048 x 4096) with tuning.FP4_GEMV_UNSPLIT_ROWS = 4 (the GPU default)
    or 8: one split of four prefetched steps, 512 or 256 programs at batch 1, close to
    dequantise-then-matmul."""
    monkeypatch.setattr(tuning, "FP4_GEMV_UNSPLIT_ROWS", rows)
    w = quantize_nvfp4(torch.randn(2048, 4096, device=DEVICE) / 64)
    x = torch.randn(t, 4096, device=DEVICE, dtype=torch.bfloat16)
    got, expected = nvfp4_linear(x, w), nvfp4_linear_torch(x, w)
    torch.testing.assert_close(got, expected, **TOL[torch.bfloat16])
    assert_scaled_close(got, expected, rel=1e-2)


def test_dense_mlp_launches(monkeypatch, interpreter_steps):
    """tuning.FP4_GEMV_WIDE_ROWS and FP4_GEMV_LONG_K_SPLITS (the GPU defaults for the dense MLP's
    decode GEMVs; the interpreter's step is 256 weights): a launch of N >= FP4_GEMV_WIDE_N rows
    takes programs of that many rows, one whose K takes more steps than a split prefetches takes
    that many splits (whole steps: prefetched), each close to dequantise-then-matmul."""
    monkeypatch.setattr(tuning, "FP4_GEMV_WORDS", True)
    monkeypatch.setattr(tuning, "FP4_GEMV_UNSPLIT_ROWS", None)
    monkeypatch.setattr(tuning, "FP4_GEMV_WIDE_N", 40)
    monkeypatch.setattr(tuning, "FP4_GEMV_WIDE_ROWS", 16)
    monkeypatch.setattr(tuning, "FP4_GEMV_LONG_K_SPLITS", 5)
    launches = spy_launches(monkeypatch, nvfp4_linear_module, "_nvfp4_gemv_kernel", "BLOCK_N", "SPLIT", "PREFETCH")
    gen = torch.Generator(DEVICE).manual_seed(5)
    for n, k in ((40, 512), (24, 2560)):  # wide (2 steps), long K (10 steps)
        w = weight(n, k, seed=n)
        x = torch.randn(1, k, device=DEVICE, generator=gen)
        torch.testing.assert_close(nvfp4_linear(x, w), nvfp4_linear_torch(x, w), **TOL[torch.float32])
    block_n = nvfp4_linear_module.GEMV_BLOCK_N
    # (3 wide tiles leave SMs idle: pick_splits splits their 2 steps; flint-40b's 1280 take one split)
    assert launches == [((1, 3, 2), 16, 2, 1), ((1, triton.cdiv(24, block_n), 5), block_n, 5, 2)]


@pytest.mark.parametrize("t,k,splits,long_k", [
    (1, 512, None, None),   # two interpreter steps: prefetched (words-prefetch), or the bytes loop
    (3, 1024, 1, None),     # one split of four steps
    (1, 2560, None, 5),     # GEMV_LONG_K_SPLITS (the GPU's dense down): five splits of two steps
    (2, 320, None, None),   # K not a multiple of the step: masked words
], ids=["two-steps", "four-steps", "long-k", "masked"])
def test_silu_folded_gives_the_bits_of_silu_mul_then_gemv(t, k, splits, long_k, words, monkeypatch):
    """silu_nvfp4_linear (the dense MLP's down with the SwiGLU applied to the gate_up columns each
    program loads) stores exactly what silu_mul then nvfp4_linear store in the same launch shape,
    in each decode (bytes, words: prefetched or the k loop), and is close to its torch twin."""
    from flint_kernels.swiglu import silu_mul

    monkeypatch.setattr(tuning, "FP4_GEMV_LONG_K_SPLITS", long_k)
    launches = spy_launches(monkeypatch, nvfp4_linear_module, "_nvfp4_gemv_kernel", "SILU", "PREFETCH", "SPLIT")
    w = weight(24, k, seed=k, per_row=True)
    gen = torch.Generator(DEVICE).manual_seed(k)
    gate_up = (3 * torch.randn(t, 2 * k, device=DEVICE, generator=gen)).to(torch.bfloat16)
    got = nvfp4_linear_module.silu_nvfp4_linear(gate_up, w, num_splits=splits)
    assert got.dtype == torch.bfloat16 and got.shape == (t, 24)
    assert torch.equal(got, nvfp4_linear(silu_mul(gate_up), w, num_splits=splits))
    assert_scaled_close(got, nvfp4_linear_module.silu_nvfp4_linear_torch(gate_up, w), rel=2e-2)
    assert [silu for _, silu, _, _ in launches] == [True, False]
    assert launches[0][2:] == launches[1][2:]  # the same path (prefetched steps, or the loop) and splits


def test_silu_folded_errors_name_the_argument():
    w = weight(8, 64)
    gate_up = torch.randn(2, 128, device=DEVICE)
    with pytest.raises(ValueError, match=r"silu_nvfp4_linear: gate_up has shape \(2, 127\).*\[T, 2I\]"):
        nvfp4_linear_module.silu_nvfp4_linear(gate_up[:, :127], w)
    with pytest.raises(ValueError, match=r"x has shape \(2, 32\).*expected \[T, 64\]"):
        nvfp4_linear_module.silu_nvfp4_linear(gate_up[:, :64], w)
    with pytest.raises(ValueError, match=f"at most {GEMV_MAX_TOKENS}"):
        nvfp4_linear_module.silu_nvfp4_linear(torch.randn(GEMV_MAX_TOKENS + 1, 128, device=DEVICE), w)


@pytest.mark.gpu
@pytest.mark.parametrize("scale", [1e-3, 1.0, 300.0])
@pytest.mark.parametrize("t", [1, 4])
@pytest.mark.parametrize("name,n,k", [("qkv", 5120, 2048), ("o", 2048, 4096), ("gate_up", 12288, 2048),
                                      ("down", 2048, 6144)])
def test_f16_products_real_shapes(name, n, k, t, scale, monkeypatch):
    """tuning.FP4_GEMV_F16 (each word's products summed in fp16 pairs) at flint-40b's decode
    GEMVs, bf16 activations of three scales, with the RMSNorm (qkv, gate/up) or the SwiGLU
    (down) folded in as the engine launches them: close to dequantise-then-matmul, and no
    further from it than twice the fp32 products' error plus one bf16 rounding of the largest
    output (2**-7 of it: a bf16 value in [2**e, 2**(e+1)) has an ulp of 2**(e-7))."""
    g = torch.Generator(device=DEVICE).manual_seed(n + k + t)
    w = quantize_nvfp4(torch.randn(n, k, device=DEVICE, generator=g) / k ** 0.5)
    if name in ("qkv", "gate_up"):
        x = (scale * torch.randn(t, k, device=DEVICE, generator=g)).bfloat16()
        norm_w = (scale * (1 + 0.3 * torch.randn(k, device=DEVICE, generator=g))).bfloat16()
        run = lambda: rms_norm_nvfp4_linear(x, None, norm_w, 1e-5, w)[0]
        expected = rms_norm_nvfp4_linear_torch(x, None, norm_w, 1e-5, w)[0]
    elif name == "down":
        gate_up = (scale ** 0.5 * torch.randn(t, 2 * k, device=DEVICE, generator=g)).bfloat16()
        run = lambda: silu_nvfp4_linear(gate_up, w)
        expected = nvfp4_linear_module.silu_nvfp4_linear_torch(gate_up, w)
    else:
        x = (scale * torch.randn(t, k, device=DEVICE, generator=g)).bfloat16()
        run = lambda: nvfp4_linear(x, w)
        expected = nvfp4_linear_torch(x, w)
    errors = {}
    for f16 in (False, True):
        monkeypatch.setattr(tuning, "FP4_GEMV_F16", f16)
        got = run()
        assert torch.isfinite(got).all()
        assert_scaled_close(got, expected, rel=1e-2)
        errors[f16] = float((got.float() - expected.float()).abs().max())
    ulp = float(expected.float().abs().max()) * 2 ** -7
    print(f"{name} t={t} x scale {scale:g}: max error fp32 products {errors[False]:.3e}, "
          f"fp16 {errors[True]:.3e} (max |y| {float(expected.float().abs().max()):.3e})")
    assert errors[True] <= 2 * errors[False] + ulp


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("t,n,k,splits", [
    (40, 70, 96, None),    # partial tiles, K not a multiple of the k step
    (33, 24, 512, 2),      # split-K
])
def test_prefill_chunks_decode_each_weight_once(t, n, k, splits, dtype, monkeypatch):
    """From tuning.FP4_DEQUANT_MIN_TOKENS tokens (the interpreter's 32, here on a GPU too) a launch
    decodes the weight into a dense scratch and the GEMM tiles load it: close to
    dequantise-then-matmul and, on the CPU, the bits of the tiles that decode the weight themselves
    (FP4_DEQUANT_MIN_TOKENS None)."""
    monkeypatch.setattr(tuning, "FP4_DEQUANT_MIN_TOKENS", 32)
    decodes = spy_launches(monkeypatch, nvfp4_linear_module, "_dequantize_kernel", "N", "K", "MASK_K")
    gemms = spy_launches(monkeypatch, nvfp4_linear_module, "_nvfp4_matmul_kernel", "FP4", "SPLIT")
    w = weight(n, k, seed=t, per_row=t % 2 == 1)
    x = torch.randn(t, k, device=DEVICE, generator=torch.Generator(DEVICE).manual_seed(t)).to(dtype)
    got = nvfp4_linear(x, w, num_splits=splits)
    assert got.dtype == dtype and got.shape == (t, n)
    torch.testing.assert_close(got, nvfp4_linear_torch(x, w), **TOL[dtype])
    monkeypatch.setattr(tuning, "FP4_DEQUANT_MIN_TOKENS", None)
    decoding = nvfp4_linear(x, w, num_splits=splits)
    if DEVICE == "cpu":
        assert torch.equal(got, decoding)
    assert [d[1:] for d in decodes] == [(n, k, k % nvfp4_linear_module.DEQUANT_BLOCK_K != 0)]
    assert [g[1] for g in gemms] == [False, True]  # the dense scratch, then the decoding tiles
    if splits or DEVICE == "cpu":  # (the launcher's own split count follows the GPU's SMs)
        assert [g[2] for g in gemms] == [splits or 1] * 2


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("t,n,k,splits", [
    (40, 70, 96, None),    # partial tiles: rows, columns and the last K step past the ends
    (33, 24, 512, 2),      # split-K
])
def test_prefill_gemm_through_descriptors_gives_the_pointer_tiles_bits(t, n, k, splits, dtype, monkeypatch):
    """tuning.FP4_DEQUANT_GEMM_TMA: the GEMM over the decoded weight reads x and weight tiles
    through tensor descriptors, whose reads past the ends are zeros as the pointer tiles' masks
    make them: close to dequantise-then-matmul and, on the CPU, the pointer tiles' bits. An x
    whose rows are not 16-byte aligned goes the pointer way."""
    monkeypatch.setattr(tuning, "FP4_DEQUANT_MIN_TOKENS", 32)
    gemms = spy_launches(monkeypatch, nvfp4_linear_module, "_nvfp4_matmul_kernel", "DESC")
    w = weight(n, k, seed=t, per_row=True)
    wide = torch.randn(t, k + 1, device=DEVICE, generator=torch.Generator(DEVICE).manual_seed(t)).to(dtype)
    x = wide[:, :k].contiguous()
    monkeypatch.setattr(tuning, "FP4_DEQUANT_GEMM_TMA", True)
    got = nvfp4_linear(x, w, num_splits=splits)
    unaligned = nvfp4_linear(wide[:, 1:], w, num_splits=splits)
    monkeypatch.setattr(tuning, "FP4_DEQUANT_GEMM_TMA", False)
    pointers = nvfp4_linear(x, w, num_splits=splits)
    tol = TOL[torch.bfloat16]  # (fp16 rounds finer)
    torch.testing.assert_close(got, nvfp4_linear_torch(x, w), **tol)
    if DEVICE == "cpu":
        assert torch.equal(got, pointers)
    torch.testing.assert_close(unaligned, nvfp4_linear_torch(wide[:, 1:], w), **tol)
    assert [g[1] for g in gemms] == [True, False, False]


def test_prefill_scratch_holds_the_exact_weights():
    # the decode launch's output is dequantize_nvfp4 without the global scale, bit for bit, in
    # bf16 and fp32 (E2M1 x E4M3 is exact in both)
    w = weight(40, 96, per_row=True)
    ones = type(w)(w.packed, w.scales, torch.ones_like(w.scale))
    for dtype in (torch.bfloat16, torch.float32):
        expected = dequantize_nvfp4(ones.packed, ones.scales, ones.scale, torch.float32).to(dtype)
        assert torch.equal(nvfp4_linear_module.dequantize_for_gemm(w, dtype), expected)
