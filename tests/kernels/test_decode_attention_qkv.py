"""decode_attention_qkv (Q/K norm, RoPE and this step's cache write inside the decode-attention
launches) vs decode_attention_qkv_torch = qk_norm_rope_torch then attention_torch, each checked
against flint_backend.reference in test_qk_norm_rope.py and test_attention.py; and
ops.decode_attention_o, the engine's decode-step op (those launches, then o_proj)."""

import math

import pytest
import torch

from flint_backend import ops as ops_module
from flint_backend.weights.nvfp4_quantize import quantize_nvfp4
from flint_kernels import decode_attention as decode_attention_module
from flint_kernels.decode_attention import decode_attention, decode_attention_qkv, decode_attention_qkv_torch
from flint_kernels.qk_norm_rope import qk_norm_rope
from kv_cases import assert_scaled_close, make_step
from launch_spy import spy_launches
from test_qk_norm_rope import cos_sin_table

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
# bf16: the normed q/k may differ from torch's by a rounding (fp32 statistics summed in another
# order; the interpreter truncates fp32 -> bf16 where torch rounds to nearest), which the softmax
# amplifies (up to 5 ulps measured, the same for qk_norm_rope then decode_attention); fp32:
# summation order
TOL = {torch.bfloat16: dict(rtol=4e-2, atol=4e-2), torch.float32: dict(rtol=1e-4, atol=1e-5)}
CACHE_TOL = {torch.bfloat16: dict(rtol=1.6e-2, atol=1.6e-2), torch.float32: dict(rtol=1e-5, atol=1e-5)}
MAX_POS = 512


def _case(contexts, *, hq=8, hk=2, d=16, dtype=torch.float32, layout="paged", rows_per=8, rope=True, seed=0,
          pad_last=False):
    """A decode step: the caches hold every earlier position; qkv holds this step's raw projections.
    pad_last: the last sequence is a CUDA-graph padding row (slot -1: nothing written)."""
    step = make_step([(c, 1) for c in contexts], hq=hq, hk=hk, d=d, dtype=dtype, layout=layout,
                     rows_per=rows_per, seed=seed, device=DEVICE)
    g = torch.Generator().manual_seed(seed + 1)
    b = len(contexts)
    qkv = (torch.randn(b, (hq + 2 * hk) * d, generator=g) * 2).to(dtype).to(DEVICE)
    qw = (1 + 0.1 * torch.randn(d, generator=g)).to(dtype).to(DEVICE)
    kw = (1 + 0.1 * torch.randn(d, generator=g)).to(dtype).to(DEVICE)
    pos = step.context_lens.long()
    slots = _new_token_slots(step)
    if pad_last:
        slots[-1] = -1
    window = 9 if rope else 0  # sliding layers rotate, full layers (NoPE) see everything
    cos_sin = cos_sin_table(MAX_POS, d).to(DEVICE) if rope else None
    return step, (qkv, qw, kw, pos, cos_sin, 1e-6, hq, hk), slots, window


def _new_token_slots(step) -> torch.Tensor:
    """[B] int64: where each sequence's new token (at position context_lens) goes in the cache."""
    pos, rows_per = step.context_lens.long(), step.k_cache.shape[1]
    if step.block_tables is not None:
        rows = torch.arange(pos.shape[0], device=pos.device)
        return step.block_tables.long()[rows, pos // rows_per] * rows_per + pos % rows_per
    return step.ring_rows.long() * rows_per + pos % rows_per


def _run(fn, step, head, slots, window, num_splits=None, **launch):
    """-> (output, k_cache, v_cache) of fn on copies of the step's caches."""
    k_cache, v_cache = step.k_cache.clone(), step.v_cache.clone()
    out = fn(*head, k_cache, v_cache, slots, step.context_lens, step.sinks, 1 / math.sqrt(head[1].shape[0]),
             window, **step.cache_kwargs(), num_splits=num_splits, **launch)
    return out, k_cache, v_cache


def _assert_same(step, head, slots, window, dtype, num_splits=None):
    got, got_k, got_v = _run(decode_attention_qkv, step, head, slots, window, num_splits)
    exp, exp_k, exp_v = _run(decode_attention_qkv_torch, step, head, slots, window)
    torch.testing.assert_close(got, exp, **TOL[dtype])
    # this step's K/V written where slot >= 0 (and nowhere else: unwritten slots stay NaN)
    torch.testing.assert_close(got_k, exp_k, equal_nan=True, **CACHE_TOL[dtype])
    torch.testing.assert_close(got_v, exp_v, equal_nan=True, rtol=0, atol=0)
    assert torch.isnan(got_k).sum() == torch.isnan(exp_k).sum()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("contexts,num_splits", [([0, 1, 3, 4, 5], 3), ([17, 8, 9], None), ([150, 31, 64], 2),
                                                 ([150], 1)])
def test_paged_full_layer_nope(contexts, num_splits, dtype):
    # full layers: no RoPE, no window; one split finishing alone, several, more than tiles
    step, head, slots, window = _case(contexts, dtype=dtype, rope=False, rows_per=4 if 0 in contexts else 16,
                                      seed=len(contexts))
    _assert_same(step, head, slots, window, dtype, num_splits)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rows_per", [9, 12])
def test_ring_sliding_layer_rope(rows_per, dtype):
    # window-2 .. window+1 cached positions, a long-wrapped ring, an empty one; one padding row
    contexts = [7, 8, 9, 10, 40, 0, 70, 3]
    step, head, slots, window = _case(contexts, dtype=dtype, layout="ring", rows_per=rows_per, seed=rows_per,
                                      pad_last=True)
    for splits in (1, 2):
        _assert_same(step, head, slots, window, dtype, splits)


def test_new_token_first_gives_the_same_bits(monkeypatch):
    """decode_attention.REDUCE_NEW_TOKEN_FIRST with the Q/K norm and RoPE in the reduce (the raw
    projections read before its wait on a GPU): the bits of reading them after it."""
    step, head, slots, window = _case([150, 31, 64, 0], rope=False, rows_per=16, seed=6, dtype=torch.bfloat16)
    outs = []
    for first in (False, True):  # a full layer's 3 splits: the reduce merges
        monkeypatch.setattr(decode_attention_module, "REDUCE_NEW_TOKEN_FIRST", first)
        outs.append(_run(decode_attention_qkv, step, head, slots, window, num_splits=3)[0])
    assert torch.equal(outs[0], outs[1])
    torch.testing.assert_close(outs[1], _run(decode_attention_qkv_torch, step, head, slots, window)[0],
                               **TOL[torch.bfloat16])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_equals_the_two_launches(dtype):
    # the fused launches compute what qk_norm_rope then decode_attention compute: the same roundings
    # (bit-equal under the interpreter; on a GPU the statistics may be summed in another order)
    step, head, slots, window = _case([40, 3, 70], layout="ring", rows_per=12, seed=5, dtype=dtype)
    got, got_k, got_v = _run(decode_attention_qkv, step, head, slots, window, num_splits=2)
    k_cache, v_cache = step.k_cache.clone(), step.v_cache.clone()
    q, k, v = qk_norm_rope(*head, k_cache, v_cache, slots)
    exp = decode_attention(q, k, v, k_cache, v_cache, step.context_lens, step.sinks, 0.25, window,
                           **step.cache_kwargs(), num_splits=2)
    tol = dict(rtol=1e-5, atol=1e-6) if dtype == torch.float32 else CACHE_TOL[dtype]
    torch.testing.assert_close(got, exp, **tol)
    torch.testing.assert_close(got_k, k_cache, equal_nan=True, **tol)
    torch.testing.assert_close(got_v, v_cache, equal_nan=True, rtol=0, atol=0)


def test_errors_name_the_field():
    step, head, slots, window = _case([5, 3], rows_per=4, rope=False)
    with pytest.raises(ValueError, match="decode_attention_qkv: q_weight has shape"):
        _run(decode_attention_qkv, step, (head[0], head[1][:-1], *head[2:]), slots, window)
    with pytest.raises(ValueError, match="decode_attention_qkv: slot_mapping is"):
        _run(decode_attention_qkv, step, head, slots.int(), window)
    with pytest.raises(ValueError, match="decode_attention_qkv: k_cache, v_cache and slot_mapping"):
        decode_attention_qkv(*head, step.k_cache, step.v_cache, None, step.context_lens, step.sinks, 0.25, 0,
                             **step.cache_kwargs())
    with pytest.raises(ValueError, match="decode_attention_qkv: reduce_warps 3, expected a power of two"):
        _run(decode_attention_qkv, step, head, slots, window, reduce_warps=3)


def test_reduce_warps_reach_the_reduce_launch_and_keep_the_output(monkeypatch):
    # a launch config: the reduce launch gets reduce_warps warps (REDUCE_WARPS without it), and
    # nothing computed changes (bit-equal under the interpreter, which ignores warps; on a GPU the
    # cross-warp sums may run in another order)
    launches = spy_launches(monkeypatch, decode_attention_module, "_decode_reduce_kernel", "num_warps")
    step, head, slots, window = _case([40, 3, 70], layout="ring", rows_per=12, seed=7)
    exp, exp_k, _ = _run(decode_attention_qkv, step, head, slots, window, num_splits=3)
    for warps in (1, 2, 8):
        got, got_k, _ = _run(decode_attention_qkv, step, head, slots, window, num_splits=3, reduce_warps=warps)
        torch.testing.assert_close(got, exp, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(got_k, exp_k, equal_nan=True, rtol=0, atol=0)
    assert [warps for _, warps in launches] == [decode_attention_module.REDUCE_WARPS, 1, 2, 8]


@pytest.mark.parametrize("fuse", ["0", "1"])
@pytest.mark.parametrize("o_format", ["bf16", "nvfp4"])
def test_ops_decode_attention_o(o_format, fuse, monkeypatch):
    """ops.decode_attention_o (Q/K norm + RoPE + cache write, attention, o_proj): the triton op is
    the attention launches then the triton linear, close to the torch op, with dense and NVFP4
    o_proj; the reduce takes ops.NVFP4_REDUCE_WARPS warps before an NVFP4 o_proj,
    decode_attention.REDUCE_WARPS before a dense one."""
    monkeypatch.setattr(ops_module, "FUSE_QK_NORM_ROPE", fuse)
    launches = []
    launch = decode_attention_module._launch

    def spy(name, *args):
        launches.append((name, args[-2]))  # (launcher, reduce_warps)
        return launch(name, *args)

    monkeypatch.setattr(decode_attention_module, "_launch", spy)
    step, head, slots, window = _case([40, 3, 70], dtype=torch.bfloat16, layout="ring", rows_per=12, seed=9)
    g = torch.Generator().manual_seed(3)
    o_w = torch.randn(24, 8 * 16, generator=g) / 11  # [H, Hq * D]
    o_w = quantize_nvfp4(o_w).to(DEVICE) if o_format == "nvfp4" else o_w.bfloat16().to(DEVICE)
    scale = 1 / math.sqrt(16)
    outs = []
    for ops in (ops_module.get_ops("triton"), ops_module.get_ops("torch")):
        k_cache, v_cache = step.k_cache.clone(), step.v_cache.clone()
        outs.append((ops.decode_attention_o(*head, k_cache, v_cache, slots, step.context_lens, step.sinks, scale,
                                            window, o_w, **step.cache_kwargs()), k_cache))
    (got, got_k), (exp, exp_k) = outs
    name = "decode_attention_qkv" if fuse == "1" else "decode_attention"
    assert launches == [(name, ops_module.NVFP4_REDUCE_WARPS if o_format == "nvfp4" else None)]
    if fuse == "1":
        attention, _, _ = _run(decode_attention_qkv, step, head, slots, window)  # [3, Hq, D]
    else:
        k_cache, v_cache = step.k_cache.clone(), step.v_cache.clone()
        q, k, v = qk_norm_rope(*head, k_cache, v_cache, slots)
        attention = decode_attention(q, k, v, k_cache, v_cache, step.context_lens, step.sinks, scale, window,
                                     **step.cache_kwargs())
    assert torch.equal(got, ops_module.linear_triton(attention.reshape(3, -1), o_w))
    # the attention outputs differ from torch's by up to ~5 bf16 ulps (TOL), summed over 128 columns
    assert_scaled_close(got, exp, rel=4e-2)
    torch.testing.assert_close(got_k, exp_k, equal_nan=True, **CACHE_TOL[torch.bfloat16])


@pytest.mark.gpu
@pytest.mark.parametrize("batch,context,layout", [(1, 100_000, "paged"), (1, 1024, "paged"), (8, 32768, "paged"),
                                                  (1, 5000, "ring"), (8, 511, "ring"), (64, 600, "ring")])
def test_real_shapes(batch, context, layout):
    contexts = [(context - 13 * i) % (context + 1) for i in range(batch)]  # spread over [0, context]
    rope = layout == "ring"
    step = make_step([(c, 1) for c in contexts], hq=32, hk=4, d=128, dtype=torch.bfloat16, layout=layout,
                     rows_per=64 if layout == "paged" else 513, device=DEVICE)
    g = torch.Generator().manual_seed(batch)
    qkv = (torch.randn(batch, 40 * 128, generator=g) * 2).bfloat16().to(DEVICE)
    qw = (1 + 0.1 * torch.randn(128, generator=g)).bfloat16().to(DEVICE)
    kw = (1 + 0.1 * torch.randn(128, generator=g)).bfloat16().to(DEVICE)
    pos = step.context_lens.long()
    slots = _new_token_slots(step)
    cos_sin = cos_sin_table(context + 1, 128).to(DEVICE) if rope else None
    head = (qkv, qw, kw, pos, cos_sin, 1e-6, 32, 4)
    got, got_k, _ = _run(decode_attention_qkv, step, head, slots, 513 if rope else 0)
    exp, exp_k, _ = _run(decode_attention_qkv_torch, step, head, slots, 513 if rope else 0)
    torch.testing.assert_close(got, exp, **TOL[torch.bfloat16])
    assert_scaled_close(got, exp)
    torch.testing.assert_close(got_k, exp_k, equal_nan=True, **CACHE_TOL[torch.bfloat16])
