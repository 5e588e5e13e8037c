"""Fused residual + RMSNorm + QKV GEMV + Q/K norm + RoPE + KV write vs the unfused torch ops."""

import pytest
import torch

from flint_backend.model import rope_cos_sin_cache
from flint_kernels.norm_qkv_rope import norm_qkv_rope, norm_qkv_rope_torch


def _inputs(t, h, hq, hk, d, dtype, slots=True, seed=0):
    g = torch.Generator().manual_seed(seed)
    r = lambda *s, scale=1.0: (torch.randn(*s, generator=g) * scale).to(dtype)
    x, res = r(t, h), r(t, h)
    norm_w, q_w, k_w = 1 + r(h, scale=0.1), 1 + r(d, scale=0.1), 1 + r(d, scale=0.1)
    qkv_w = r((hq + 2 * hk) * d, h, scale=h ** -0.5)
    positions = torch.randint(0, 200, (t,), generator=g)
    cache_shape = (6, 8, hk, d)
    k_cache, v_cache = torch.zeros(cache_shape, dtype=dtype), torch.zeros(cache_shape, dtype=dtype)
    slot = torch.randperm(48, generator=g)[:t].long()
    if t > 1:
        slot[0] = -1  # a padding row writes nothing
    return x, res, norm_w, qkv_w, q_w, k_w, positions, k_cache, v_cache, slot if slots else None


@pytest.mark.parametrize("t", [1, 3, 8])
@pytest.mark.parametrize("rope", [True, False])
@pytest.mark.parametrize("dtype, tol", [(torch.float32, 1e-4), (torch.bfloat16, 3e-2)])
def test_matches_the_unfused_ops(t, rope, dtype, tol):
    h, hq, hk, d = 96, 4, 2, 32  # H not a multiple of the K tile
    x, res, norm_w, qkv_w, q_w, k_w, pos, kc, vc, slot = _inputs(t, h, hq, hk, d, dtype)
    cos_sin = rope_cos_sin_cache(256, d, 10000.0, "cpu") if rope else None
    kc2, vc2 = kc.clone(), vc.clone()
    got = norm_qkv_rope(x, res, norm_w, 1e-5, qkv_w, q_w, k_w, pos, cos_sin, hq, hk, kc, vc, slot)
    want = norm_qkv_rope_torch(x, res, norm_w, 1e-5, qkv_w, q_w, k_w, pos, cos_sin, hq, hk, kc2, vc2, slot)
    for a, b in zip(got, want):
        torch.testing.assert_close(a.float(), b.float(), rtol=tol, atol=tol)
    torch.testing.assert_close(kc.float(), kc2.float(), rtol=tol, atol=tol)
    torch.testing.assert_close(vc.float(), vc2.float(), rtol=tol, atol=tol)
    assert kc.abs().sum() > 0 and vc.abs().sum() > 0


def test_first_layer_has_no_residual():
    x, _, norm_w, qkv_w, q_w, k_w, pos, kc, vc, _ = _inputs(2, 64, 2, 1, 32, torch.float32)
    q, k, v, res = norm_qkv_rope(x, None, norm_w, 1e-5, qkv_w, q_w, k_w, pos, None, 2, 1)
    q2, k2, v2, res2 = norm_qkv_rope_torch(x, None, norm_w, 1e-5, qkv_w, q_w, k_w, pos, None, 2, 1)
    assert res is x and res2 is x
    torch.testing.assert_close(q, q2, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(v, v2, rtol=1e-4, atol=1e-4)


def test_rejects_too_many_tokens():
    x, res, norm_w, qkv_w, q_w, k_w, pos, *_ = _inputs(17, 64, 2, 1, 32, torch.float32)
    with pytest.raises(ValueError, match="T <= 16"):
        norm_qkv_rope(x, res, norm_w, 1e-5, qkv_w, q_w, k_w, pos, None, 2, 1)


@pytest.mark.parametrize("nvfp4", [False, True])
@pytest.mark.parametrize("t", [1, 4])
def test_split_k_and_nvfp4_weights(nvfp4, t):
    """H = 384: three K tiles, split over programs (the last to arrive finishes the head); the
    fused qkv as NVFP4 with a per-row global scale (q, k and v quantised separately)."""
    from flint_backend.weights.nvfp4 import concat_rows
    from flint_backend.weights.nvfp4_quantize import quantize_nvfp4

    h, hq, hk, d = 384, 2, 1, 32
    x, res, norm_w, qkv_w, q_w, k_w, pos, kc, vc, slot = _inputs(t, h, hq, hk, d, torch.bfloat16, seed=4)
    if nvfp4:
        q_rows, kv_rows = hq * d, hk * d
        parts = qkv_w.split([q_rows, kv_rows, kv_rows])
        qkv_w = concat_rows([quantize_nvfp4(p) for p in parts])
    cos_sin = rope_cos_sin_cache(256, d, 10000.0, "cpu")
    kc2, vc2 = kc.clone(), vc.clone()
    got = norm_qkv_rope(x, res, norm_w, 1e-5, qkv_w, q_w, k_w, pos, cos_sin, hq, hk, kc, vc, slot)
    want = norm_qkv_rope_torch(x, res, norm_w, 1e-5, qkv_w, q_w, k_w, pos, cos_sin, hq, hk, kc2, vc2, slot)
    for a, b in zip(got, want):
        torch.testing.assert_close(a.float(), b.float(), rtol=3e-2, atol=3e-2)
    torch.testing.assert_close(kc.float(), kc2.float(), rtol=3e-2, atol=3e-2)
