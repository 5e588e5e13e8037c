"""The residual add + RMSNorm folded into the launch after it (rms_norm_dense_gemv,
rms_norm_nvfp4_linear, rms_norm_router_topk) vs the two launches it replaces (rms_norm, then the
GEMV or the router) and vs the torch twins; and the ops that pick between them."""

import pytest
import torch

from flint_backend import ops as ops_module
from flint_backend.weights.nvfp4_quantize import quantize_nvfp4
from flint_kernels import tuning
from flint_kernels.dense_gemv import dense_gemv, rms_norm_dense_gemv, rms_norm_dense_gemv_torch
from flint_kernels.nvfp4_linear import nvfp4_linear, rms_norm_nvfp4_linear, rms_norm_nvfp4_linear_torch
from flint_kernels.rms_norm import rms_norm
from flint_kernels.router import rms_norm_router_topk, rms_norm_router_topk_torch, router_topk
from kv_cases import assert_scaled_close

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
BF16 = dict(rtol=1e-2, atol=2e-2)


def inputs(t, h, has_residual, seed=0):
    g = torch.Generator(DEVICE).manual_seed(seed)
    x = torch.randn(t, h, device=DEVICE, generator=g).to(torch.bfloat16)
    residual = (torch.randn(t, h, device=DEVICE, generator=g) * 4).to(torch.bfloat16) if has_residual else None
    norm_w = (1 + 0.5 * torch.randn(h, device=DEVICE, generator=g)).to(torch.bfloat16)
    return x, residual, norm_w


def unfused_norm(x, residual, norm_w):
    """-> (rms_norm kernel output, updated residual) without touching `residual`."""
    res = None if residual is None else residual.clone()
    return rms_norm(x, norm_w, 1e-5, residual=res), x if res is None else res


def assert_same_bits_on_cpu(got, expected):
    """The interpreter reduces like the rms_norm kernel: equal bits. On a GPU the sum of squares
    may be reduced in another order (other warp count): rstd within an ulp, outputs bf16-close."""
    if DEVICE == "cpu":
        assert torch.equal(got, expected)
    else:
        torch.testing.assert_close(got, expected, **BF16)


@pytest.fixture(params=[False, True], ids=["bytes", "words-prefetch"])
def words(request, monkeypatch):
    monkeypatch.setattr(tuning, "FP4_GEMV_WORDS", request.param)


@pytest.mark.parametrize("has_residual", [True, False], ids=["residual", "layer-0"])
@pytest.mark.parametrize("t,n,k,splits", [(1, 48, 512, None), (3, 40, 1024, 4), (2, 24, 512, 1), (4, 33, 96, None)])
def test_dense_gemv(t, n, k, splits, has_residual):
    x, residual, norm_w = inputs(t, k, has_residual, seed=t)
    # seeded: drawn from the global generator, the weights depended on the tests run before (CI
    # once drew a case 2.06% off, where 40 seeded draws of it stay within 1.5%)
    w = (torch.randn(n, k, device=DEVICE, generator=torch.Generator(DEVICE).manual_seed(n + k)) / k ** 0.5)
    w = w.to(torch.bfloat16)
    before = None if residual is None else residual.clone()
    y, res_out = rms_norm_dense_gemv(x, residual, norm_w, 1e-5, w, num_splits=splits)
    h, expected_res = unfused_norm(x, residual, norm_w)
    assert torch.equal(res_out, expected_res)
    assert residual is None or torch.equal(residual, before)  # a new tensor: the input is left as is
    assert_same_bits_on_cpu(y, dense_gemv(h, w, num_splits=splits))
    y_torch, res_torch = rms_norm_dense_gemv_torch(x, residual, norm_w, 1e-5, w)
    assert_scaled_close(y, y_torch)  # interpreter: bf16 roundings truncate
    torch.testing.assert_close(res_out, res_torch, **BF16)  # the interpreter truncates to bf16


@pytest.mark.parametrize("has_residual", [True, False], ids=["residual", "layer-0"])
@pytest.mark.parametrize("t,n,k,splits", [(1, 48, 512, None), (3, 40, 1024, 4), (2, 24, 512, 1), (4, 33, 96, None)])
def test_nvfp4_gemv(t, n, k, splits, has_residual, words):
    x, residual, norm_w = inputs(t, k, has_residual, seed=t)
    w = quantize_nvfp4(torch.randn(n, k, generator=torch.Generator().manual_seed(t))).to(DEVICE)
    y, res_out = rms_norm_nvfp4_linear(x, residual, norm_w, 1e-5, w, num_splits=splits)
    h, expected_res = unfused_norm(x, residual, norm_w)
    assert torch.equal(res_out, expected_res)
    assert_same_bits_on_cpu(y, nvfp4_linear(h, w, num_splits=splits))
    y_torch, res_torch = rms_norm_nvfp4_linear_torch(x, residual, norm_w, 1e-5, w)
    assert_scaled_close(y, y_torch)  # interpreter: bf16 roundings truncate
    torch.testing.assert_close(res_out, res_torch, **BF16)  # the interpreter truncates to bf16


@pytest.mark.parametrize("w_dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("has_residual", [True, False], ids=["residual", "layer-0"])
@pytest.mark.parametrize("t,e,h", [(1, 64, 512), (3, 40, 256), (8, 16, 96)])
def test_router(t, e, h, has_residual, w_dtype):
    """bf16 activations with a bf16 or an fp32 router weight (the loader keeps it fp32 unless
    exact in bf16)."""
    x, residual, norm_w = inputs(t, h, has_residual, seed=e)
    w = torch.randn(e, h, device=DEVICE).to(w_dtype)
    h_out, ids, weights, res_out = rms_norm_router_topk(x, residual, norm_w, 1e-5, w, 6, True)
    h_expected, expected_res = unfused_norm(x, residual, norm_w)
    assert torch.equal(res_out, expected_res)
    assert_same_bits_on_cpu(h_out, h_expected)
    expected_ids, expected_weights = router_topk(h_expected, w, 6, True)
    assert torch.equal(ids, expected_ids)
    torch.testing.assert_close(weights, expected_weights, rtol=1e-5, atol=1e-6)
    h_torch, _, _, res_torch = rms_norm_router_topk_torch(x, residual, norm_w, 1e-5, w, 6, True)
    assert_scaled_close(h_out, h_torch)  # interpreter: bf16 roundings truncate
    torch.testing.assert_close(res_out, res_torch, **BF16)  # the interpreter truncates to bf16


def test_errors_name_the_argument():
    x, residual, norm_w = inputs(2, 64, True)
    w = torch.randn(8, 64, device=DEVICE).to(torch.bfloat16)
    with pytest.raises(ValueError, match="norm_w has shape"):
        rms_norm_dense_gemv(x, residual, norm_w[:32], 1e-5, w)
    with pytest.raises(ValueError, match="residual is torch.float32"):
        rms_norm_dense_gemv(x, residual.float(), norm_w, 1e-5, w)
    with pytest.raises(ValueError, match=r"expected contiguous \[T <= 4"):
        rms_norm_nvfp4_linear(x.repeat(3, 1), None, norm_w, 1e-5, quantize_nvfp4(w.float().cpu()).to(DEVICE))
    with pytest.raises(ValueError, match="hidden size 4096"):
        big, _, big_w = inputs(1, 4096, False)
        rms_norm_router_topk(big, None, big_w, 1e-5, torch.zeros(8, 4096, device=DEVICE, dtype=torch.bfloat16),
                             2, True)


@pytest.mark.parametrize("t", [1, 5, 9], ids=["fused", "gemm", "prefill-router"])
def test_ops_fold_at_decode_sizes_and_compose_beyond(t, monkeypatch):
    """ops.norm_linear / norm_router: the folded launch at decode sizes, rms_norm then the op
    beyond; all equal the torch table's composition."""
    calls = []
    for name in ("rms_norm_dense_gemv", "rms_norm_nvfp4_linear"):
        module = ops_module.dense_gemv_k if "dense" in name else ops_module.nvfp4_k
        real = getattr(module, name)
        monkeypatch.setattr(module, name, lambda *a, _real=real, _name=name, **kw: calls.append(_name) or
                            _real(*a, **kw))
    triton_ops, torch_ops = ops_module.get_ops("triton"), ops_module.get_ops("torch")
    x, residual, norm_w = inputs(t, 128, True)
    for w in ((torch.randn(24, 128, device=DEVICE) / 11).to(torch.bfloat16),
              quantize_nvfp4(torch.randn(24, 128)).to(DEVICE)):
        y, res = triton_ops.norm_linear(x, residual.clone(), norm_w, 1e-5, w)
        y_ref, res_ref = torch_ops.norm_linear(x, residual.clone(), norm_w, 1e-5, w)
        assert_scaled_close(y, y_ref)  # interpreter: bf16 roundings truncate
        torch.testing.assert_close(res, res_ref, **BF16)
    assert calls == (["rms_norm_dense_gemv", "rms_norm_nvfp4_linear"] if t == 1 else [])
    router_w = torch.randn(16, 128, device=DEVICE)  # fp32, as the loader keeps it
    got = triton_ops.norm_router(x, residual.clone(), norm_w, 1e-5, router_w, 4, False)
    expected = torch_ops.norm_router(x, residual.clone(), norm_w, 1e-5, router_w, 4, False)
    assert_scaled_close(got[0], expected[0])
    h = got[0]  # the router's picks from the same h: equal (the ops' h differ by roundings only)
    ids, weights = torch_ops.router(h, router_w, 4, False)
    assert torch.equal(got[1].sort(1).values, ids.sort(1).values)
    torch.testing.assert_close(got[2].sort(1).values, weights.sort(1).values, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(got[3], expected[3], **BF16)


@pytest.mark.gpu
@pytest.mark.parametrize("t", [1, 4])
def test_real_shapes(t):
    """flint-40b's folded launches: qkv (5120 x 2048, BF16 and NVFP4) and the router (256 x 2048)."""
    x, residual, norm_w = inputs(t, 2048, True, seed=t)
    h, expected_res = unfused_norm(x, residual, norm_w)
    w = (torch.randn(5120, 2048, device=DEVICE) / 45).to(torch.bfloat16)
    y, res_out = rms_norm_dense_gemv(x, residual, norm_w, 1e-5, w)
    assert torch.equal(res_out, expected_res)
    torch.testing.assert_close(y, dense_gemv(h, w), **BF16)
    w4 = quantize_nvfp4(torch.randn(5120, 2048, device=DEVICE) / 45)
    y, res_out = rms_norm_nvfp4_linear(x, residual, norm_w, 1e-5, w4)
    assert torch.equal(res_out, expected_res)
    torch.testing.assert_close(y, nvfp4_linear(h, w4), **BF16)
    router_w = (torch.randn(256, 2048, device=DEVICE) / 45).to(torch.bfloat16)
    h_out, ids, weights, res_out = rms_norm_router_topk(x, residual, norm_w, 1e-5, router_w, 6, True)
    assert torch.equal(res_out, expected_res)
    torch.testing.assert_close(h_out, h, **BF16)
    expected_ids, _ = router_topk(h_out, router_w, 6, True)
    assert torch.equal(ids, expected_ids)
