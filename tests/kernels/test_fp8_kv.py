"""FP8 (E4M3) KV cache: the kernels' quantisation against torch's conversion (exact), qk_norm_rope
writing codes and handing out their values, decode and prefill attention reading codes, each
against its torch twin."""

import math

import pytest
import torch
import triton
import triton.language as tl

from flint_kernels.decode_attention import decode_attention, decode_attention_torch
from flint_kernels.fp8_kv import FP8_DTYPE, dequantize_torch, e4m3_round, quantize_torch
from flint_kernels.prefill_attention import prefill_attention, prefill_attention_torch
from flint_kernels.qk_norm_rope import qk_norm_rope, qk_norm_rope_torch
from kv_cases import assert_scaled_close, make_step
from test_qk_norm_rope import _inputs

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
SCALES = [(1.0, 1.0), (0.5, 4.0)]
# attention: bf16 with unit scales (what serves), fp32 with others (tight tolerances catch a lost scale)
SCALED_DTYPES = [((1.0, 1.0), torch.bfloat16), ((0.5, 4.0), torch.float32)]


@triton.jit
def _quantize_kernel(x_ptr, codes_ptr, inv_scale, N: tl.constexpr):
    i = tl.arange(0, N)
    tl.store(codes_ptr + i, e4m3_round(tl.load(x_ptr + i).to(tl.float32) * inv_scale).to(tl.float8e4nv))


@pytest.mark.parametrize("scale", [1.0, 8.0])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_e4m3_round_is_torchs_conversion(scale, dtype):
    g = torch.Generator().manual_seed(0)
    edges = torch.tensor([448.0, 464.0, 1e4, -1e4, 0.0, 1e-9, 2.0 ** -9, 1.5 * 2.0 ** -9, 0.0029296875,
                          1.9375, 1.96875, 239.0, 240.0, 248.0, -17.5])
    x = torch.cat([torch.randn(3000, generator=g) * 4, torch.randn(1000, generator=g) * 0.01,
                   torch.randn(1000, generator=g) * 300, edges * scale])
    x = torch.cat([x, torch.zeros(8192 - x.numel())]).to(dtype).to(DEVICE)
    codes = torch.empty(x.shape, dtype=FP8_DTYPE, device=DEVICE)
    _quantize_kernel[(1,)](x, codes, 1.0 / scale, N=x.numel())
    expected = quantize_torch(x, scale)
    assert torch.equal(codes.float(), expected.float())  # values (a code of -0 reads as 0)


@pytest.mark.parametrize("kv_scales", SCALES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rope", [True, False])
def test_qk_norm_rope_writes_codes_and_hands_out_their_values(kv_scales, dtype, rope):
    n, hq, hk, d = 9, 4, 2, 32
    qkv, qw, kw, pos, cos_sin = _inputs(n, hq, hk, d, dtype, seed=3)
    slots = torch.tensor([5, -1, 0, 7, 2, 9, 11, -1, 3], device=DEVICE)
    results = []
    for fn in (qk_norm_rope, qk_norm_rope_torch):
        k_cache = torch.zeros(3, 4, hk, d, dtype=FP8_DTYPE, device=DEVICE)
        v_cache = torch.zeros_like(k_cache)
        q, k, v = fn(qkv, qw, kw, pos, cos_sin if rope else None, 1e-6, hq, hk, k_cache, v_cache, slots,
                     kv_scales=kv_scales)
        written = slots[slots >= 0]
        # what the cache holds is what was handed out, exactly
        assert torch.equal(dequantize_torch(k_cache.view(-1, hk, d)[written], kv_scales[0], dtype), k[slots >= 0])
        assert torch.equal(dequantize_torch(v_cache.view(-1, hk, d)[written], kv_scales[1], dtype), v[slots >= 0])
        results.append((q, k, v))
    (q1, k1, v1), (q2, k2, v2) = results
    torch.testing.assert_close(q1, q2, rtol=1.6e-2, atol=1.6e-2)
    assert torch.equal(v1, v2)  # v is quantised as given: nothing computed before
    # k: the kernel and torch agree on the normed, roped k up to its last bit (in bf16 the
    # interpreter truncates where torch rounds), so a code may differ by one step
    step = (k2.float().abs() * 2 ** -3).clamp_min(2 ** -9 * kv_scales[0])
    assert bool(((k1.float() - k2.float()).abs() <= step).all())
    if dtype == torch.float32:
        assert float((k1 != k2).float().mean()) < 0.002
    # without caches (a sliding layer's prefill): the same values handed out
    q3, k3, v3 = qk_norm_rope(qkv, qw, kw, pos, cos_sin if rope else None, 1e-6, hq, hk, kv_scales=kv_scales)
    assert torch.equal(k3, k1) and torch.equal(v3, v1)


def quantised_step(seqs, kv_scales, dtype, **kwargs):
    """make_step with FP8 caches (codes of the written keys and values; NaN slots stay NaN) and
    this step's k/v as qk_norm_rope hands them out (quantised values)."""
    step = make_step(seqs, dtype=dtype, device=DEVICE, **kwargs)
    ks, vs = kv_scales
    step.k_cache, step.v_cache = quantize_torch(step.k_cache, ks), quantize_torch(step.v_cache, vs)
    step.k = dequantize_torch(quantize_torch(step.k, ks), ks, dtype)
    step.v = dequantize_torch(quantize_torch(step.v, vs), vs, dtype)
    return step


@pytest.mark.parametrize("kv_scales,dtype", SCALED_DTYPES)
@pytest.mark.parametrize("layout,rows_per,window,contexts", [
    ("paged", 8, 0, [0, 1, 17, 40]),     # empty cache, block boundaries, several tiles
    ("ring", 9, 9, [7, 9, 10, 40]),      # a wrapped ring
])
def test_decode_attention_reads_codes(kv_scales, dtype, layout, rows_per, window, contexts):
    step = quantised_step([(c, 1) for c in contexts], kv_scales, dtype, layout=layout, rows_per=rows_per,
                          seed=rows_per)
    args = (step.q, step.k, step.v, step.k_cache, step.v_cache, step.context_lens, step.sinks,
            1 / math.sqrt(step.q.shape[-1]), window)
    for splits in (1, 3):
        got = decode_attention(*args, **step.cache_kwargs(), num_splits=splits, kv_scales=kv_scales)
        expected = decode_attention_torch(*args, **step.cache_kwargs(), kv_scales=kv_scales)
        assert_scaled_close(got, expected, 2e-2 if dtype == torch.bfloat16 else 1e-4)
    # the twin's meaning: attention over the dequantised cache in the model dtype
    plain = decode_attention_torch(step.q, step.k, step.v, dequantize_torch(step.k_cache, kv_scales[0], dtype),
                                   dequantize_torch(step.v_cache, kv_scales[1], dtype), step.context_lens,
                                   step.sinks, 1 / math.sqrt(step.q.shape[-1]), window, **step.cache_kwargs())
    assert torch.equal(expected, plain)


@pytest.mark.parametrize("kv_scales,dtype", SCALED_DTYPES)
@pytest.mark.parametrize("layout,rows_per,window,seqs", [
    ("paged", 4, 0, [(0, 5), (13, 17), (40, 1), (3, 33)]),   # chunks after cached prefixes, a decode row
    ("ring", 12, 9, [(7, 4), (30, 9), (0, 20)]),
])
def test_prefill_attention_reads_codes(kv_scales, dtype, layout, rows_per, window, seqs):
    step = quantised_step(seqs, kv_scales, dtype, layout=layout, rows_per=rows_per, seed=rows_per)
    max_q = max(n for _, n in seqs)
    args = (step.q, step.k, step.v, step.query_start_loc, step.context_lens, step.k_cache, step.v_cache,
            step.sinks, 1 / math.sqrt(step.q.shape[-1]), window, max_q)
    got = prefill_attention(*args, **step.cache_kwargs(), kv_scales=kv_scales)
    expected = prefill_attention_torch(*args, **step.cache_kwargs(), kv_scales=kv_scales)
    assert_scaled_close(got, expected, 2e-2 if dtype == torch.bfloat16 else 1e-4)


def test_fp8_caches_need_scales_and_scales_powers_of_two():
    step = quantised_step([(5, 1)], (1.0, 1.0), torch.float32, layout="paged", rows_per=4)
    args = (step.q, step.k, step.v, step.k_cache, step.v_cache, step.context_lens, step.sinks, 0.25, 0)
    with pytest.raises(ValueError, match=r"k_cache is torch.float8_e4m3fn, expected torch.float32"):
        decode_attention_torch(*args, **step.cache_kwargs())
    with pytest.raises(ValueError, match=r"kv_scales\[1\] \(v_scale\): got 0.3, expected a power of two"):
        decode_attention(*args, **step.cache_kwargs(), kv_scales=(1.0, 0.3))


@pytest.mark.gpu
@pytest.mark.parametrize("layout,rows_per,window,contexts", [
    ("paged", 64, 0, [1024, 32768, 100_000]),
    ("ring", 513, 513, [100, 512, 513, 5000]),
])
def test_real_shapes_decode_attention_reads_codes(layout, rows_per, window, contexts):
    step = quantised_step([(c, 1) for c in contexts], (1.0, 1.0), torch.bfloat16, hq=32, hk=4, d=128,
                          layout=layout, rows_per=rows_per)
    args = (step.q, step.k, step.v, step.k_cache, step.v_cache, step.context_lens, step.sinks, 128 ** -0.5, window)
    got = decode_attention(*args, **step.cache_kwargs(), kv_scales=(1.0, 1.0))
    assert_scaled_close(got, decode_attention_torch(*args, **step.cache_kwargs(), kv_scales=(1.0, 1.0)))


@pytest.mark.gpu
@pytest.mark.parametrize("seqs", [[(0, 8192)], [(30000, 2048), (0, 1)], [(4096, 4096), (100, 7)]])
def test_real_shapes_prefill_attention_reads_codes(seqs):
    for layout, rows_per, window in (("paged", 64, 0), ("ring", 513, 513)):
        step = quantised_step(seqs, (1.0, 1.0), torch.bfloat16, hq=32, hk=4, d=128, layout=layout,
                              rows_per=rows_per)
        args = (step.q, step.k, step.v, step.query_start_loc, step.context_lens, step.k_cache, step.v_cache,
                step.sinks, 128 ** -0.5, window, max(n for _, n in seqs))
        got = prefill_attention(*args, **step.cache_kwargs(), kv_scales=(1.0, 1.0))
        assert_scaled_close(got, prefill_attention_torch(*args, **step.cache_kwargs(), kv_scales=(1.0, 1.0)))
