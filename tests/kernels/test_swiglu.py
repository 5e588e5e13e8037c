"""silu_mul (dense MLP activation) vs silu_mul_torch, which rounds like transformers' bf16
FlintMLP (silu(gate) rounded, times up, rounded); and
ops.silu_linear, which folds it into the down projection's decode GEMV."""

import pytest
import torch

from flint_backend import ops as ops_module
from flint_backend.weights.nvfp4_quantize import quantize_nvfp4
from flint_kernels.nvfp4_linear import nvfp4_linear, silu_nvfp4_linear
from flint_kernels.swiglu import silu_mul, silu_mul_torch
from kv_cases import assert_scaled_close

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("t,i", [(1, 64), (5, 40), (3, 2500)])
def test_matches_torch(t, i, dtype):
    gate_up = (3 * torch.randn(t, 2 * i, device=DEVICE)).to(dtype)
    got, expected = silu_mul(gate_up), silu_mul_torch(gate_up)
    assert got.dtype == dtype
    # bf16: silu and the product are rounded; the interpreter truncates where the GPU rounds (1 ulp)
    tol = dict(rtol=1e-5, atol=1e-6) if dtype == torch.float32 else dict(rtol=1.6e-2, atol=1e-2)
    torch.testing.assert_close(got, expected, **tol)


def test_strided_rows_and_errors():
    gate_up = torch.randn(4, 80, device=DEVICE)[:, :64]
    torch.testing.assert_close(silu_mul(gate_up), silu_mul_torch(gate_up))
    with pytest.raises(ValueError, match="2I"):
        silu_mul(torch.randn(4, 7, device=DEVICE))


@pytest.mark.parametrize("t", [1, 4, 9], ids=["batch-1", "batch-4", "gemm"])
def test_ops_silu_linear_folds_at_decode_sizes(t, monkeypatch):
    """ops.silu_linear: at decode sizes the SwiGLU inside the NVFP4 down GEMV, the bits of
    silu_mul then linear; dense weights or larger batches: those two launches; all close to the
    torch table's."""
    calls = []
    for module, name in ((ops_module.nvfp4_k, "silu_nvfp4_linear"), (ops_module.swiglu_k, "silu_mul")):
        real = getattr(module, name)
        monkeypatch.setattr(module, name, lambda *a, _real=real, _name=name, **kw: calls.append(_name) or
                            _real(*a, **kw))
    triton_ops, torch_ops = ops_module.get_ops("triton"), ops_module.get_ops("torch")
    gate_up = (3 * torch.randn(t, 256, device=DEVICE)).to(torch.bfloat16)
    for w in ((torch.randn(24, 128, device=DEVICE) / 11).to(torch.bfloat16),
              quantize_nvfp4(torch.randn(24, 128)).to(DEVICE)):
        got = triton_ops.silu_linear(gate_up, w)
        assert_scaled_close(got, torch_ops.silu_linear(gate_up, w))  # interpreter: bf16 roundings truncate
        if t <= 4:
            assert torch.equal(got, triton_ops.linear(silu_mul(gate_up), w))
    assert calls == ["silu_mul", "silu_nvfp4_linear" if t <= 4 else "silu_mul"]


@pytest.mark.gpu
@pytest.mark.parametrize("t", [1, 4])
def test_real_shapes(t):
    """flint-40b's NVFP4 dense MLP down (2048 x 6144) with the SwiGLU folded in, at the GPU's
    launch shapes: the bits of silu_mul then the GEMV."""
    gate_up = (3 * torch.randn(t, 12288, device=DEVICE)).to(torch.bfloat16)
    w4 = quantize_nvfp4(torch.randn(2048, 6144, device=DEVICE) / 100)
    assert torch.equal(silu_nvfp4_linear(gate_up, w4), nvfp4_linear(silu_mul(gate_up), w4))
