"""qk_norm_rope: kernel vs qk_norm_rope_torch vs transformers' FlintRMSNorm (per head) and
apply_rotary_pos_emb with FlintRotaryEmbedding's cos/sin."""

import pytest
import torch
import transformers
from transformers.models.flint import modeling_flint as hf

from flint_backend.config import FlintConfig
from flint_backend.model import rope_cos_sin_cache
from flint_kernels import qk_norm_rope as qk_module
from flint_kernels.qk_norm_rope import qk_norm_rope, qk_norm_rope_torch

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
THETA = 10000.0
# bf16: one rounding apart (fp32 statistics summed in another order; the interpreter truncates
# fp32 -> bf16 where a GPU rounds to nearest); fp32: a few ulps
TOL = {torch.bfloat16: dict(rtol=1.6e-2, atol=1.6e-2), torch.float32: dict(rtol=1e-5, atol=1e-5)}


def cos_sin_table(max_pos, d):
    """What the engine builds (model.rope_cos_sin_cache): fp32 cos | sin halves."""
    return rope_cos_sin_cache(max_pos, d, THETA, "cpu")


def _inputs(n, hq, hk, d, dtype, seed=0, max_pos=64):
    g = torch.Generator().manual_seed(seed)
    qkv = (torch.randn(n, (hq + 2 * hk) * d, generator=g) * 2).to(dtype)
    qw = (1 + 0.1 * torch.randn(d, generator=g)).to(dtype)
    kw = (1 + 0.1 * torch.randn(d, generator=g)).to(dtype)
    pos = torch.randint(0, max_pos, (n,), generator=g)
    return [x.to(DEVICE) for x in (qkv, qw, kw, pos, cos_sin_table(max_pos, d))]


def transformers_q_k(qkv, qw, kw, pos, eps, hq, hk, d, rope):
    """q [N, Hq, D], k [N, Hk, D] as transformers' FlintAttention forms them: q_norm / k_norm per
    head, then (sliding layers) apply_rotary_pos_emb with FlintRotaryEmbedding's cos/sin."""
    n = qkv.shape[0]
    config = transformers.FlintConfig(**FlintConfig.preset("flint-tiny", head_dim=d, rms_norm_eps=eps,
                                                           rope_parameters={"rope_type": "default",
                                                                            "rope_theta": THETA}).to_dict())
    q_norm, k_norm = hf.FlintRMSNorm(d, eps=eps), hf.FlintRMSNorm(d, eps=eps)
    q_norm.weight.data, k_norm.weight.data = qw, kw
    q = q_norm(qkv[:, :hq * d].view(1, n, hq, d)).transpose(1, 2)  # [1, Hq, N, D]
    k = k_norm(qkv[:, hq * d:(hq + hk) * d].view(1, n, hk, d)).transpose(1, 2)
    if rope:
        cos, sin = hf.FlintRotaryEmbedding(config).to(qkv.device)(q, pos[None])
        q, k = hf.apply_rotary_pos_emb(q, k, cos, sin)
    return q[0].transpose(0, 1), k[0].transpose(0, 1)


def test_cos_sin_table_is_transformers():
    """model.rope_cos_sin_cache == FlintRotaryEmbedding's fp32 cos/sin, at long positions too."""
    d = 128
    config = transformers.FlintConfig(**FlintConfig.preset("flint-40b").to_dict())
    pos = torch.arange(0, 262144, 997)
    cos, sin = hf.FlintRotaryEmbedding(config)(torch.zeros(1), pos[None])
    table = rope_cos_sin_cache(262144, d, config.rope_parameters["rope_theta"], "cpu")[pos]
    assert torch.equal(table, torch.cat([cos[0, :, :d // 2], sin[0, :, :d // 2]], dim=-1))


@pytest.mark.parametrize("rope", [True, False])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_torch_version_is_transformers(dtype, rope):
    n, hq, hk, d = 6, 8, 2, 16
    qkv, qw, kw, pos, cs = _inputs(n, hq, hk, d, dtype)
    q, k, v = qk_norm_rope_torch(qkv, qw, kw, pos, cs if rope else None, 1e-5, hq, hk)
    rq, rk = transformers_q_k(qkv, qw, kw, pos, 1e-5, hq, hk, d, rope)
    if dtype == torch.float32 or not rope:  # the same fp32 ops (the norm: the same bits)
        exact = dict(rtol=1e-6, atol=1e-6) if dtype == torch.float32 else dict(rtol=0, atol=0)
        torch.testing.assert_close(q, rq, **exact)
        torch.testing.assert_close(k, rk, **exact)
    else:  # transformers rotates in bf16 (cos/sin, each product and the sum rounded): a few ulps
        exp_q, exp_k = transformers_q_k(qkv.float(), qw.float(), kw.float(), pos, 1e-5, hq, hk, d, rope)
        for got, theirs, exact in ((q, rq, exp_q), (k, rk, exp_k)):
            torch.testing.assert_close(got, theirs, rtol=2 ** -6, atol=2 ** -6)
            # one rounding: ours is closer to the fp32 rotation of the same normed heads
            assert (got.float() - exact).abs().mean() < (theirs.float() - exact).abs().mean()
    torch.testing.assert_close(v, qkv[:, (hq + hk) * d:].view(n, hk, d), rtol=0, atol=0)


@pytest.mark.parametrize("rope", [True, False])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("n,hq,hk,d", [(1, 8, 2, 16), (5, 8, 2, 32), (3, 6, 3, 16)])
def test_kernel_matches_torch_and_writes_cache(n, hq, hk, d, dtype, rope):
    qkv, qw, kw, pos, cs = _inputs(n, hq, hk, d, dtype, seed=n * d)
    slots = torch.randperm(4 * n)[:n].to(DEVICE)
    slots[0] = -1  # not written
    caches = []
    for fn in (qk_norm_rope, qk_norm_rope_torch):
        kc = torch.full((n, 4, hk, d), 7.0, dtype=dtype, device=DEVICE)
        vc = torch.full_like(kc, 7.0)
        caches.append((fn(qkv, qw, kw, pos, cs if rope else None, 1e-5, hq, hk, kc, vc, slots), kc, vc))
    ((q, k, v), kc, vc), ((tq, tk, tv), tkc, tvc) = caches
    torch.testing.assert_close(q, tq, **TOL[dtype])
    torch.testing.assert_close(k, tk, **TOL[dtype])
    torch.testing.assert_close(v, tv, rtol=0, atol=0)
    torch.testing.assert_close(kc, tkc, **TOL[dtype])
    torch.testing.assert_close(vc, tvc, rtol=0, atol=0)
    flat_k = kc.view(-1, hk, d)
    torch.testing.assert_close(flat_k[slots[1:]], k[1:], rtol=0, atol=0)  # the cache holds exactly k
    assert int((flat_k == 7.0).all(-1).all(-1).sum()) == 4 * n * 1 - (n - 1)  # nothing else touched


@pytest.mark.parametrize("heads_per_program,target", [(1, None), (2, None), (4, None), (16, None), (None, 4)])
def test_head_blocks_cover_every_head_once(heads_per_program, target, monkeypatch):
    """Blocks that straddle the last Q head (6 = 4 + 2) and K head (3 = 2 + 1) write nothing past
    them; target: a small TARGET_PROGRAMS, so the default widens blocks as at prefill."""
    if target is not None:
        monkeypatch.setattr(qk_module, "TARGET_PROGRAMS", target)
    n, hq, hk, d, dtype = 3, 6, 3, 16, torch.bfloat16
    qkv, qw, kw, pos, cs = _inputs(n, hq, hk, d, dtype, seed=11)
    slots = torch.tensor([5, -1, 0], device=DEVICE)
    out = []
    for fn, extra in ((qk_norm_rope, dict(heads_per_program=heads_per_program)), (qk_norm_rope_torch, {})):
        kc = torch.full((2, 4, hk, d), 7.0, dtype=dtype, device=DEVICE)
        vc = torch.full_like(kc, 7.0)
        out.append((*fn(qkv, qw, kw, pos, cs, 1e-5, hq, hk, kc, vc, slots, **extra), kc, vc))
    for got, expected in zip(*out):
        torch.testing.assert_close(got, expected, **TOL[dtype])
    flat_v = out[0][4].view(-1, hk, d)
    assert int((flat_v == 7.0).all(-1).all(-1).sum()) == 8 - 2  # slots 5 and 0 written, no others


def test_kernel_without_cache_and_errors():
    qkv, qw, kw, pos, cs = _inputs(4, 8, 2, 16, torch.float32)
    q, k, _ = qk_norm_rope(qkv, qw, kw, pos, cs, 1e-5, 8, 2)
    tq, tk, _ = qk_norm_rope_torch(qkv, qw, kw, pos, cs, 1e-5, 8, 2)
    torch.testing.assert_close(q, tq, **TOL[torch.float32])
    torch.testing.assert_close(k, tk, **TOL[torch.float32])
    with pytest.raises(ValueError, match="num_q_heads"):
        qk_norm_rope(qkv, qw, kw, pos, cs, 1e-5, 7, 2)
    with pytest.raises(ValueError, match="slot_mapping"):
        qk_norm_rope(qkv, qw, kw, pos, cs, 1e-5, 8, 2, k_cache=torch.zeros(4, 4, 2, 16))
    with pytest.raises(ValueError, match="heads_per_program"):
        qk_norm_rope(qkv, qw, kw, pos, cs, 1e-5, 8, 2, heads_per_program=3)


@pytest.mark.gpu
@pytest.mark.parametrize("n", [1, 8, 64, 8192])
def test_kernel_matches_torch_real_shapes(n):
    hq, hk, d = 32, 4, 128
    qkv, qw, kw, _, _ = _inputs(n, hq, hk, d, torch.bfloat16)
    pos = torch.randint(0, 262144, (n,), device=DEVICE)
    cs = cos_sin_table(262144, d).to(DEVICE)
    slots = torch.randperm(2 * n, device=DEVICE)[:n]
    out = []
    for fn in (qk_norm_rope, qk_norm_rope_torch):
        kc = torch.zeros((2 * n, hk, d), dtype=torch.bfloat16, device=DEVICE)
        vc = torch.zeros_like(kc)
        out.append((*fn(qkv, qw, kw, pos, cs, 1e-5, hq, hk, kc, vc, slots), kc, vc))
    for got, expected in zip(*out):
        torch.testing.assert_close(got, expected, **TOL[torch.bfloat16])
