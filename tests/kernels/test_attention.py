"""attention_torch (the oracle for both attention kernels and the engine's torch backend)
against flint_backend.reference: its masks and softmax-with-sink on whole sequences, and a
whole reference attention layer rebuilt from qk_norm_rope_torch + attention_torch."""

import math

import pytest
import torch

from flint_backend import reference
from flint_backend.config import SLIDING, FlintConfig
from flint_backend.weights.random_init import random_weights
from flint_kernels.attention import attention_torch
from flint_kernels.decode_attention import decode_attention_torch
from flint_kernels.prefill_attention import prefill_attention_torch
from flint_kernels.qk_norm_rope import qk_norm_rope_torch
from kv_cases import make_step

TOL = {torch.bfloat16: dict(rtol=1e-2, atol=1e-2), torch.float32: dict(rtol=1e-5, atol=1e-5)}


def dense_reference(step, i, sm_scale, window):
    """Sequence i's new queries against all its positions, written like FlintAttention.forward."""
    s, e = int(step.query_start_loc[i]), int(step.query_start_loc[i + 1])
    ctx = int(step.context_lens[i])
    q = reference.upcast(step.q[s:e]).transpose(0, 1)  # [Hq, n, D]
    group = q.shape[0] // step.k.shape[1]
    k = reference.upcast(step.keys[i]).transpose(0, 1).repeat_interleave(group, 0)  # [Hq, T, D]
    v = reference.upcast(step.values[i]).transpose(0, 1).repeat_interleave(group, 0)
    scores = q @ k.transpose(-1, -2) * sm_scale  # [Hq, n, T]
    mask = reference.attention_mask(ctx + e - s, window or None)[ctx:]
    scores = scores.masked_fill(~mask, float("-inf"))
    sink = step.sinks.view(-1, 1, 1).expand(-1, e - s, 1)
    probs = torch.softmax(torch.cat([scores, sink], dim=-1), dim=-1)[..., :-1]
    return (probs @ v).transpose(0, 1).to(step.q.dtype)


SEQS = [(0, 1), (3, 1), (8, 1), (9, 1), (10, 1), (20, 1), (0, 7), (0, 12), (5, 4), (9, 9), (14, 6)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("layout,rows_per,window", [
    ("paged", 4, 0), ("paged", 8, 9), ("ring", 9, 9), ("ring", 12, 9)])
def test_torch_matches_dense_reference(layout, rows_per, window, dtype):
    step = make_step(SEQS, dtype=dtype, layout=layout, rows_per=rows_per, seed=rows_per + window)
    scale = 1 / math.sqrt(step.q.shape[-1])
    out = attention_torch(step.q, step.k, step.v, step.query_start_loc, step.context_lens, step.k_cache,
                          step.v_cache, step.sinks, scale, window, **step.cache_kwargs())
    for i in range(len(SEQS)):
        s, e = int(step.query_start_loc[i]), int(step.query_start_loc[i + 1])
        torch.testing.assert_close(out[s:e], dense_reference(step, i, scale, window), **TOL[dtype])


def test_decode_and_prefill_wrappers_are_attention_torch():
    decode = make_step([(3, 1), (11, 1), (0, 1)], layout="ring", rows_per=9)
    args = (decode.k_cache, decode.v_cache)
    expected = attention_torch(decode.q, decode.k, decode.v, decode.query_start_loc, decode.context_lens,
                               *args, decode.sinks, 0.3, 9, ring_rows=decode.ring_rows)
    out = torch.empty_like(decode.q)
    got = decode_attention_torch(decode.q, decode.k, decode.v, *args, decode.context_lens, decode.sinks,
                                 0.3, 9, ring_rows=decode.ring_rows, out=out)
    assert got is out
    torch.testing.assert_close(got, expected, rtol=0, atol=0)
    got = prefill_attention_torch(decode.q, decode.k, decode.v, decode.query_start_loc, decode.context_lens,
                                  *args, decode.sinks, 0.3, 9, 1, ring_rows=decode.ring_rows)
    torch.testing.assert_close(got, expected, rtol=0, atol=0)


def test_huge_sink_silences_and_no_sink_is_plain_softmax():
    step = make_step([(5, 3), (0, 2)], sink_scale=0.0, layout="paged", rows_per=4)
    call = lambda sinks: attention_torch(step.q, step.k, step.v, step.query_start_loc,  # noqa: E731
                                         step.context_lens, step.k_cache, step.v_cache, sinks, 0.25, 0,
                                         block_tables=step.block_tables)
    assert call(torch.full((8,), 1e4)).abs().max() < 1e-12
    # a sink of -inf contributes exp(-inf) = 0: the same as no sink
    torch.testing.assert_close(call(None), call(torch.full((8,), float("-inf"))), rtol=0, atol=0)


def test_input_errors():
    step = make_step([(5, 1)], layout="ring", rows_per=9)
    with pytest.raises(ValueError, match="window"):
        attention_torch(step.q, step.k, step.v, step.query_start_loc, step.context_lens, step.k_cache,
                        step.v_cache, step.sinks, 0.25, 0, ring_rows=step.ring_rows)
    with pytest.raises(ValueError, match="exactly one"):
        attention_torch(step.q, step.k, step.v, step.query_start_loc, step.context_lens, step.k_cache,
                        step.v_cache, step.sinks, 0.25, 9)


@pytest.mark.parametrize("layer", [0, 3])  # a sliding (RoPE, ring cache) and a full (NoPE, paged) layer
def test_reference_layer_rebuilt_from_torch_ops(layer):
    """Chunked prefill and decode steps through qk_norm_rope_torch + attention_torch + o_proj
    equal the reference layer run on the whole sequence (fp64; cos/sin tables are fp32)."""
    config = FlintConfig.preset("flint-tiny")
    model = reference.build_reference(config, dict(random_weights(config, 1)), dtype=torch.float64)
    attn = model.model.layers[layer].self_attn
    hq, hk, d = config.num_attention_heads, config.num_key_value_heads, config.head_dim
    sliding = config.layer_types[layer] == SLIDING
    window = config.sliding_window if sliding else 0
    x = torch.randn(27, config.hidden_size, dtype=torch.float64)
    expected = attn(x[None])[0]

    w_qkv = torch.cat([attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight])
    cos, sin = reference.rope_cos_sin(torch.arange(64), d, config.rope_theta)
    cos_sin = torch.cat([cos[:, :d // 2], sin[:, :d // 2]], dim=-1).float() if sliding else None
    rows_per = window if sliding else 4  # ring width = window; paged block size 4
    k_cache = torch.full((3 if sliding else 8, rows_per, hk, d), float("nan"), dtype=torch.float64)
    v_cache = torch.full_like(k_cache, float("nan"))
    ring_rows = torch.tensor([2], dtype=torch.int32)
    block_tables = torch.tensor([[5, 1, 7, 0, 2, 6, 4, 3]], dtype=torch.int32)
    chunks = [5, 1, 9, 1, 10, 1]
    outs, ctx = [], 0
    for n in chunks:
        pos = torch.arange(ctx, ctx + n)
        if sliding:  # the engine writes the ring after attention
            q, k, v = qk_norm_rope_torch(x[ctx:ctx + n] @ w_qkv.T, attn.q_norm.weight, attn.k_norm.weight,
                                         pos, cos_sin, config.rms_norm_eps, hq, hk)
        else:  # paged: the fused write happens before attention
            slots = block_tables[0].long()[pos // 4] * 4 + pos % 4
            q, k, v = qk_norm_rope_torch(x[ctx:ctx + n] @ w_qkv.T, attn.q_norm.weight, attn.k_norm.weight,
                                         pos, None, config.rms_norm_eps, hq, hk, k_cache, v_cache, slots)
        heads = attention_torch(q, k, v, torch.tensor([0, n], dtype=torch.int32),
                                torch.tensor([ctx], dtype=torch.int32), k_cache, v_cache,
                                attn.sinks.float(), 1 / math.sqrt(d), window,
                                block_tables=None if sliding else block_tables,
                                ring_rows=ring_rows if sliding else None)
        if sliding:
            for j in range(n):
                k_cache[2, (ctx + j) % rows_per] = k[j]
                v_cache[2, (ctx + j) % rows_per] = v[j]
        outs.append(heads.reshape(n, -1) @ attn.o_proj.weight.T)
        ctx += n
    torch.testing.assert_close(torch.cat(outs), expected, rtol=1e-6, atol=1e-6)
