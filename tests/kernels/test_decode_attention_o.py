"""ops.decode_attention_o, the engine's decode-step attention op (qk_norm_rope writing this
step's K/V, decode_attention, o_proj): the triton op is those launches then the triton linear,
close to the torch op (qk_norm_rope_torch, attention_torch, linear), with dense and NVFP4 o_proj."""

import math

import pytest
import torch

from flint_backend import ops as ops_module
from flint_backend.weights.nvfp4_quantize import quantize_nvfp4
from flint_kernels import decode_attention as decode_attention_module
from flint_kernels import tuning
from flint_kernels.decode_attention import decode_attention
from flint_kernels.qk_norm_rope import qk_norm_rope
from kv_cases import assert_scaled_close, make_step
from test_qk_norm_rope import cos_sin_table

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
# bf16 cache writes: the normed k may differ from torch's by a rounding (fp32 statistics summed in
# another order; the interpreter truncates fp32 -> bf16 where torch rounds to nearest)
CACHE_TOL = dict(rtol=1.6e-2, atol=1.6e-2)


def _new_token_slots(step) -> torch.Tensor:
    """[B] int64: where each sequence's new token (at position context_lens) goes in the cache."""
    pos, rows_per = step.context_lens.long(), step.k_cache.shape[1]
    if step.block_tables is not None:
        rows = torch.arange(pos.shape[0], device=pos.device)
        return step.block_tables.long()[rows, pos // rows_per] * rows_per + pos % rows_per
    return step.ring_rows.long() * rows_per + pos % rows_per


@pytest.mark.parametrize("o_format", ["bf16", "nvfp4"])
def test_ops_decode_attention_o(o_format, monkeypatch):
    """The reduce takes tuning.NVFP4_REDUCE_WARPS warps before an NVFP4 o_proj,
    decode_attention.REDUCE_WARPS before a dense one."""
    launches = []
    launch = decode_attention_module._launch

    def spy(*args):
        launches.append(args[-1])  # reduce_warps
        return launch(*args)

    monkeypatch.setattr(decode_attention_module, "_launch", spy)
    hq, hk, d = 8, 2, 16
    step = make_step([(c, 1) for c in (40, 3, 70)], hq=hq, hk=hk, d=d, dtype=torch.bfloat16, layout="ring",
                     rows_per=12, seed=9, device=DEVICE)
    g = torch.Generator().manual_seed(10)
    qkv = (torch.randn(3, (hq + 2 * hk) * d, generator=g) * 2).bfloat16().to(DEVICE)
    qw = (1 + 0.1 * torch.randn(d, generator=g)).bfloat16().to(DEVICE)
    kw = (1 + 0.1 * torch.randn(d, generator=g)).bfloat16().to(DEVICE)
    head = (qkv, qw, kw, step.context_lens.long(), cos_sin_table(512, d).to(DEVICE), 1e-6, hq, hk)
    slots, window = _new_token_slots(step), 9
    g = torch.Generator().manual_seed(3)
    o_w = torch.randn(24, hq * d, generator=g) / 11  # [H, Hq * D]
    o_w = quantize_nvfp4(o_w).to(DEVICE) if o_format == "nvfp4" else o_w.bfloat16().to(DEVICE)
    scale = 1 / math.sqrt(d)
    outs = []
    for ops in (ops_module.get_ops("triton"), ops_module.get_ops("torch")):
        k_cache, v_cache = step.k_cache.clone(), step.v_cache.clone()
        outs.append((ops.decode_attention_o(*head, k_cache, v_cache, slots, step.context_lens, step.sinks, scale,
                                            window, o_w, **step.cache_kwargs()), k_cache))
    (got, got_k), (exp, exp_k) = outs
    assert launches == [tuning.NVFP4_REDUCE_WARPS if o_format == "nvfp4" else None]
    k_cache, v_cache = step.k_cache.clone(), step.v_cache.clone()
    q, k, v = qk_norm_rope(*head, k_cache, v_cache, slots)
    attention = decode_attention(q, k, v, k_cache, v_cache, step.context_lens, step.sinks, scale, window,
                                 **step.cache_kwargs())
    assert torch.equal(got, ops_module.linear_triton(attention.reshape(3, -1), o_w))
    # the attention outputs differ from torch's by up to ~5 bf16 ulps, summed over 128 columns
    assert_scaled_close(got, exp, rel=4e-2)
    torch.testing.assert_close(got_k, exp_k, equal_nan=True, **CACHE_TOL)


def test_nvfp4_o_proj_takes_fp16_attention_with_fp16_gemm_activations(monkeypatch):
    """tuning.FP4_GEMM_F16_ACTIVATIONS: at the W4A16 GEMM's token counts decode attention writes
    its output in fp16 (rounded to bf16 first) for o_proj's fp16 tiles: the output is the bf16
    path's, bit for bit where fp16 holds every attention value (a GPU's tiles convert so)."""
    dtypes = []
    real = ops_module.nvfp4_k.nvfp4_linear
    monkeypatch.setattr(ops_module.nvfp4_k, "nvfp4_linear", lambda x, *a, **kw: dtypes.append(x.dtype) or
                        real(x, *a, **kw))
    hq, hk, d, b = 8, 2, 16, 6
    step = make_step([(c, 1) for c in (40, 3, 70, 0, 9, 25)], hq=hq, hk=hk, d=d, dtype=torch.bfloat16,
                     layout="paged", rows_per=8, seed=5, device=DEVICE)
    g = torch.Generator().manual_seed(6)
    qkv = (torch.randn(b, (hq + 2 * hk) * d, generator=g) * 2).bfloat16().to(DEVICE)
    qw = (1 + 0.1 * torch.randn(d, generator=g)).bfloat16().to(DEVICE)
    kw = (1 + 0.1 * torch.randn(d, generator=g)).bfloat16().to(DEVICE)
    head = (qkv, qw, kw, step.context_lens.long(), cos_sin_table(512, d).to(DEVICE), 1e-6, hq, hk)
    o_w = quantize_nvfp4(torch.randn(24, hq * d, generator=g) / 11).to(DEVICE)
    slots, ops, outs = _new_token_slots(step), ops_module.get_ops("triton"), []
    for on in (False, True):
        monkeypatch.setattr(tuning, "FP4_GEMM_F16_ACTIVATIONS", on)
        k_cache, v_cache = step.k_cache.clone(), step.v_cache.clone()
        outs.append(ops.decode_attention_o(*head, k_cache, v_cache, slots, step.context_lens, step.sinks, 0.25, 0,
                                           o_w, **step.cache_kwargs()))
    assert dtypes == [torch.bfloat16, torch.float16]
    off, on = outs
    k_cache, v_cache = step.k_cache.clone(), step.v_cache.clone()
    q, k, v = qk_norm_rope(*head, k_cache, v_cache, slots)
    attention = decode_attention(q, k, v, k_cache, v_cache, step.context_lens, step.sinks, 0.25, 0,
                                 **step.cache_kwargs()).reshape(b, -1)
    assert on.dtype == torch.bfloat16
    assert torch.equal(on, real(attention.to(torch.float16), o_w, out_dtype=torch.bfloat16))
    if DEVICE == "cuda" or not (attention.abs() < 2 ** -14).any():
        assert torch.equal(on, off)
    else:  # the interpreter's tiles take bf16 x as fp32, not through fp16
        assert_scaled_close(on, off, rel=1e-3)
