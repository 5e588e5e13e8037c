"""Low-latency decode kernels: fused norm + router logits, and MoE with routing in the prologue."""

import pytest
import torch

from flint_kernels.moe_decode import moe_decode, moe_decode_torch
from flint_kernels.norm_router import norm_router, norm_router_torch


def _moe_inputs(t, h, e, inter, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    r = lambda *s, scale=1.0: (torch.randn(*s, generator=g) * scale).to(dtype)
    x = r(t, h)
    logits = torch.randn(t, e, generator=g)
    bias = torch.randn(e, generator=g) * 0.1
    w13, w2 = r(e, 2 * inter, h, scale=h ** -0.5), r(e, h, inter, scale=inter ** -0.5)
    sw13, sw2 = r(2 * inter, h, scale=h ** -0.5), r(h, inter, scale=inter ** -0.5)
    return x, logits, bias, w13, w2, sw13, sw2


@pytest.mark.parametrize("t", [1, 3, 8])
@pytest.mark.parametrize("e, k", [(16, 4), (8, 8)])  # (8, 8): every expert chosen by every token
@pytest.mark.parametrize("dtype, tol", [(torch.float32, 1e-4), (torch.bfloat16, 2e-2)])
def test_moe_decode_matches_router_plus_fused_moe(t, e, k, dtype, tol):
    x, logits, bias, w13, w2, sw13, sw2 = _moe_inputs(t, 96, e, 32, dtype)
    got = moe_decode(x, logits, bias, k, 2.5, True, w13, w2, sw13, sw2)
    want = moe_decode_torch(x, logits, bias, k, 2.5, True, w13, w2, sw13, sw2)
    # bf16: a sum of K + 1 rounded expert outputs; errors are ~1 bf16 step of the output's scale
    # (the CPU interpreter also truncates instead of rounding to nearest)
    scale = want.float().abs().max().item()
    torch.testing.assert_close(got.float(), want.float(), rtol=tol, atol=tol * scale)


def test_moe_decode_without_renormalisation():
    x, logits, bias, w13, w2, sw13, sw2 = _moe_inputs(2, 64, 16, 32, torch.float32, seed=3)
    got = moe_decode(x, logits, bias, 3, 1.0, False, w13, w2, sw13, sw2)
    want = moe_decode_torch(x, logits, bias, 3, 1.0, False, w13, w2, sw13, sw2)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("t", [1, 5])
@pytest.mark.parametrize("dtype, tol", [(torch.float32, 1e-4), (torch.bfloat16, 2e-2)])
def test_norm_router_matches_rms_norm_plus_fp32_logits(t, dtype, tol):
    g = torch.Generator().manual_seed(1)
    x, res = torch.randn(t, 160, generator=g).to(dtype), torch.randn(t, 160, generator=g).to(dtype)
    norm_w = (1 + 0.1 * torch.randn(160, generator=g)).to(dtype)
    router = (torch.randn(20, 160, generator=g) / 13).to(dtype)  # E not a multiple of the tile
    got = norm_router(x, res, norm_w, 1e-5, router)
    want = norm_router_torch(x, res, norm_w, 1e-5, router)
    for a, b in zip(got, want):
        torch.testing.assert_close(a.float(), b.float(), rtol=tol, atol=tol)
