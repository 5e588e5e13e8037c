"""attention_torch (the oracle for both attention kernels and the engine's torch backend)
against dense masked attention with sinks on whole sequences (transformers' eager_attention_forward),
and transformers' FlintAttention layer rebuilt from qk_norm_rope_torch + attention_torch over
chunked prefill and decode steps."""

import math

import pytest
import torch
import transformers
from transformers.models.flint import modeling_flint as hf

from flint_backend.config import SLIDING, FlintConfig
from flint_backend.model import rope_cos_sin_cache
from flint_kernels.attention import attention_torch
from flint_kernels.decode_attention import decode_attention_torch
from flint_kernels.prefill_attention import prefill_attention_torch
from flint_kernels.qk_norm_rope import qk_norm_rope_torch
from kv_cases import make_step

TOL = {torch.bfloat16: dict(rtol=1e-2, atol=1e-2), torch.float32: dict(rtol=1e-5, atol=1e-5)}


def additive_mask(t: int, window: int | None, rows: slice = slice(None)) -> torch.Tensor:
    """[T, T] fp32, 0 where query i may attend key j (causal; within `window` counting the query
    itself), -inf elsewhere: what transformers' (sliding-window) causal mask holds."""
    i = torch.arange(t)[:, None]
    j = torch.arange(t)[None, :]
    allowed = j <= i
    if window:
        allowed &= j > i - window
    return torch.zeros(t, t).masked_fill(~allowed, float("-inf"))[rows]


class _Sinks(torch.nn.Module):
    """What eager_attention_forward reads from its module: the sinks and the GQA group."""

    def __init__(self, sinks, groups):
        super().__init__()
        self.sinks, self.num_key_value_groups = sinks, groups


def dense_reference(step, i, sm_scale, window):
    """Sequence i's new queries against all its positions through transformers'
    eager_attention_forward (fp32 scores and softmax with the sink)."""
    s, e = int(step.query_start_loc[i]), int(step.query_start_loc[i + 1])
    ctx = int(step.context_lens[i])
    q = step.q[s:e].float().transpose(0, 1)[None]  # [1, Hq, n, D]
    k = step.keys[i].float().transpose(0, 1)[None]  # [1, Hk, T, D]
    v = step.values[i].float().transpose(0, 1)[None]
    mask = additive_mask(ctx + e - s, window, slice(ctx, None))[None, None]  # [1, 1, n, T]
    module = _Sinks(step.sinks.float(), q.shape[1] // k.shape[1]).eval()
    out, _ = hf.eager_attention_forward(module, q, k, v, mask, scaling=sm_scale)
    return out[0].to(step.q.dtype)  # [n, Hq, D]


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


def transformers_attention(config, layer, seed):
    """transformers' FlintAttention of `layer` (eager), fp32, with random weights and sinks."""
    hf_config = transformers.FlintConfig(**config.to_dict())
    hf_config._attn_implementation = "eager"
    attn = hf.FlintAttention(hf_config, layer).eval()
    g = torch.Generator().manual_seed(seed)
    for name, p in attn.named_parameters():
        if name.endswith("norm.weight"):
            p.data = 1 + 0.2 * torch.randn(p.shape, generator=g)
        else:
            p.data = torch.randn(p.shape, generator=g) / (p.shape[-1] ** 0.5 if p.dim() > 1 else 1)
    return attn, hf_config


@pytest.mark.parametrize("layer", [2, 0])  # a sliding (RoPE, ring cache) and a full (NoPE, paged) layer
def test_transformers_layer_rebuilt_from_torch_ops(layer):
    """Chunked prefill and decode steps through qk_norm_rope_torch + attention_torch + o_proj
    equal transformers' FlintAttention run on the whole sequence (fp32; its scores and softmax
    are fp32 either way)."""
    config = FlintConfig.preset("flint-tiny")
    attn, hf_config = transformers_attention(config, layer, seed=layer + 1)
    hq, hk, d = config.num_attention_heads, config.num_key_value_heads, config.head_dim
    sliding = config.layer_types[layer] == SLIDING
    assert sliding == config.has_rope(layer)
    window = config.sliding_window if sliding else 0
    x = torch.randn(27, config.hidden_size, generator=torch.Generator().manual_seed(7))
    position_embeddings = hf.FlintRotaryEmbedding(hf_config)(x, torch.arange(27)[None])
    with torch.no_grad():
        expected = attn(x[None], position_embeddings, additive_mask(27, window)[None, None])[0][0]

    w_qkv = torch.cat([attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight]).detach()
    cos_sin = rope_cos_sin_cache(64, d, config.rope_theta, "cpu") if sliding else None
    rows_per = window if sliding else 4  # ring width = window; paged block size 4
    k_cache = torch.full((3 if sliding else 8, rows_per, hk, d), float("nan"))
    v_cache = torch.full_like(k_cache, float("nan"))
    ring_rows = torch.tensor([2], dtype=torch.int32)
    block_tables = torch.tensor([[5, 1, 7, 0, 2, 6, 4, 3]], dtype=torch.int32)
    chunks = [5, 1, 9, 1, 10, 1]
    outs, ctx = [], 0
    q_w, k_w, o_w, sinks = (t.detach() for t in (attn.q_norm.weight, attn.k_norm.weight, attn.o_proj.weight,
                                                  attn.sinks))
    for n in chunks:
        pos = torch.arange(ctx, ctx + n)
        if sliding:  # the engine writes the ring after attention
            q, k, v = qk_norm_rope_torch(x[ctx:ctx + n] @ w_qkv.T, q_w, k_w, pos, cos_sin,
                                         config.rms_norm_eps, hq, hk)
        else:  # paged: the fused write happens before attention
            slots = block_tables[0].long()[pos // 4] * 4 + pos % 4
            q, k, v = qk_norm_rope_torch(x[ctx:ctx + n] @ w_qkv.T, q_w, k_w, pos, None,
                                         config.rms_norm_eps, hq, hk, k_cache, v_cache, slots)
        heads = attention_torch(q, k, v, torch.tensor([0, n], dtype=torch.int32),
                                torch.tensor([ctx], dtype=torch.int32), k_cache, v_cache,
                                sinks.float(), 1 / math.sqrt(d), window,
                                block_tables=None if sliding else block_tables,
                                ring_rows=ring_rows if sliding else None)
        if sliding:
            for j in range(n):
                k_cache[2, (ctx + j) % rows_per] = k[j]
                v_cache[2, (ctx + j) % rows_per] = v[j]
        outs.append(heads.reshape(n, -1) @ o_w.T)
        ctx += n
    torch.testing.assert_close(torch.cat(outs), expected, rtol=1e-5, atol=1e-5)
