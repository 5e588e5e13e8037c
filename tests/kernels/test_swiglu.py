"""silu_mul (dense MLP activation) vs silu_mul_torch, which rounds like the reference."""

import pytest
import torch

from flint_kernels.swiglu import silu_mul, silu_mul_torch

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
