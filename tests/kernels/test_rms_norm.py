"""rms_norm: kernel vs rms_norm_torch vs transformers' FlintRMSNorm (fp32 throughout, the weight
applied before the one rounding)."""

import pytest
import torch
from transformers.models.flint import modeling_flint as hf

from flint_kernels.rms_norm import rms_norm, rms_norm_torch
from flint_kernels.tuning import INTERPRET

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
# bf16: one rounding step apart at most (sum order of the fp32 statistics); fp32: a few ulps
TOL = {torch.bfloat16: dict(rtol=1.6e-2, atol=1e-2), torch.float32: dict(rtol=1e-5, atol=1e-5)}
# the residual add rounds once like torch on a GPU; Triton's interpreter truncates fp32 -> bf16
RESIDUAL_TOL = (dict(rtol=2 ** -7, atol=1e-6) if INTERPRET
                else dict(rtol=0, atol=0))


def _inputs(t, h, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(t, h, generator=g) * 3).to(dtype)
    w = (1 + 0.1 * torch.randn(h, generator=g)).to(dtype)
    res = torch.randn(t, h, generator=g).to(dtype)
    return x.to(DEVICE), w.to(DEVICE), res.to(DEVICE)


def hf_norm(w, eps):
    norm = hf.FlintRMSNorm(w.shape[0], eps=eps).to(w.device)
    norm.weight.data = w
    return norm


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_torch_version_is_transformers(dtype):
    """Bit-identical to FlintRMSNorm, and with a residual to its decoder layer's `residual + x`
    (rounded) then the norm of the rounded sum."""
    x, w, res = _inputs(7, 64, dtype)
    norm = hf_norm(w, 1e-6)
    torch.testing.assert_close(rms_norm_torch(x, w, 1e-6), norm(x), rtol=0, atol=0)
    expected_stream = res + x
    expected = norm(expected_stream)
    got = rms_norm_torch(x, w, 1e-6, residual=res)
    torch.testing.assert_close(res, expected_stream, rtol=0, atol=0)
    torch.testing.assert_close(got, expected, rtol=0, atol=0)


def _bf16(v, truncate):
    """v rounded to bf16 as torch rounds (to nearest) or as Triton's interpreter casts (truncation)."""
    if truncate:
        return (v.float().view(torch.int32) & -65536).view(torch.float32).to(torch.bfloat16)
    return v.to(torch.bfloat16)


def test_one_rounding_in_bf16():
    """The weight multiplies the fp32 normalised value, one rounding at the end (FlintRMSNorm),
    not the normalised value rounded first (the Llama convention): the twin and the kernel give
    the one-rounding bits, which differ from the two-rounding ones in many places."""
    x, w, _ = _inputs(4, 256, torch.bfloat16)
    xf = x.float()
    normed = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6)
    for got, truncate in ((rms_norm_torch(x, w, 1e-6), False), (rms_norm(x, w, 1e-6), INTERPRET)):
        one = _bf16(w.float() * normed, truncate)
        two = _bf16(_bf16(normed, truncate).float() * w.float(), truncate)
        assert (one != two).sum() > 100
        if DEVICE == "cpu":  # on a GPU rsqrt is approximate: a few last-bit differences
            assert torch.equal(got, one)
        else:
            assert (got != one).sum() < (got != two).sum() / 10


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("t,h", [(1, 64), (5, 100), (3, 2048)])
def test_kernel_matches_torch(t, h, dtype):
    x, w, res = _inputs(t, h, dtype, seed=t + h)
    torch.testing.assert_close(rms_norm(x, w, 1e-5), rms_norm_torch(x, w, 1e-5), **TOL[dtype])
    res_kernel, res_torch = res.clone(), res.clone()
    got = rms_norm(x, w, 1e-5, residual=res_kernel)
    expected = rms_norm_torch(x, w, 1e-5, residual=res_torch)
    torch.testing.assert_close(res_kernel, res_torch, **RESIDUAL_TOL)
    torch.testing.assert_close(got, expected, **TOL[dtype])


def test_kernel_strided_rows_and_errors():
    x, w, _ = _inputs(4, 96, torch.float32)
    wide = torch.zeros(4, 128, device=DEVICE)
    wide[:, :96] = x
    torch.testing.assert_close(rms_norm(wide[:, :96], w, 1e-6), rms_norm_torch(x, w, 1e-6), **TOL[torch.float32])
    with pytest.raises(ValueError, match="weight"):
        rms_norm(x, w[:10], 1e-6)


@pytest.mark.gpu
@pytest.mark.parametrize("t,h", [(1, 2048), (64, 2048), (8192, 2048), (3, 8192)])
def test_kernel_matches_torch_real_shapes(t, h):
    x, w, res = _inputs(t, h, torch.bfloat16)
    res_kernel = res.clone()
    got = rms_norm(x, w, 1e-5, residual=res_kernel)
    expected = rms_norm_torch(x, w, 1e-5, residual=res)
    torch.testing.assert_close(res_kernel, res, **RESIDUAL_TOL)
    torch.testing.assert_close(got, expected, **TOL[torch.bfloat16])
