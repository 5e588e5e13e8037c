"""Where a decode step issues a sliding-window layer's K/V ring prefetch (ops.prefetch_rings):
with that layer's own caches and the step's ring rows, after the attention of the layer before
it, joined after the LM head; never in a prefill step. flint-tiny: 7 layers, full attention at
3 and 6, so layers 1, 2, 4 and 5 are prefetched (layer 0 has no layer before it)."""

import dataclasses

import pytest
import torch

from flint_backend.engine.sampling_params import SamplingParams
from flint_backend.engine.step_batch import build_step_batch

from engine_cases import make_engine


def traced_step(decode: bool):
    """Run one step of the tiny engine's model with ops that log attention, prefetch, join (by
    layer) and the LM head -> the log."""
    eng = make_engine()
    seqs = [eng.add_request([5, 6, 7, 8, 9, 10, 11], SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True))]
    eng.step()  # prefill
    model, kv = eng.runner.model, eng.runner.kv
    layer_of = {id(kv.layer(i)[0]): i for i in range(len(model.layers))}
    batch = build_step_batch([(seqs[0], 1)], eng.blocks.block_size, model.config.sliding_window, eng.device)
    if not decode:  # the same token through the prefill path
        batch = dataclasses.replace(batch, decode_only=False)
    log = []
    ops = model.ops

    def attention_o(*args, **kwargs):
        log.append(("attend", layer_of[id(args[8])]))
        return ops.decode_attention_o(*args, **kwargs)

    def attention(*args, **kwargs):
        log.append(("attend", layer_of[id(args[5])]))
        return ops.attention(*args, **kwargs)

    def prefetch_rings(k_cache, v_cache, ring_rows):
        assert v_cache is kv.layer(layer_of[id(k_cache)])[1]
        assert ring_rows is batch.ring_rows
        log.append(("prefetch", layer_of[id(k_cache)]))
        return lambda: log.append(("join", layer_of[id(k_cache)]))

    def norm_logits(*args):
        log.append(("logits", None))
        return ops.norm_logits(*args)

    for layer in model.layers:  # the layers hold the op table too
        layer.ops = layer.self_attn.ops = layer.mlp.ops = dataclasses.replace(
            ops, decode_attention_o=attention_o, attention=attention)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(model, "ops", dataclasses.replace(ops, prefetch_rings=prefetch_rings, norm_logits=norm_logits))
        model.forward(batch, kv)
    return log


def test_prefetch_after_the_attention_of_the_layer_before():
    assert traced_step(True) == [
        ("attend", 0), ("prefetch", 1), ("attend", 1), ("prefetch", 2), ("attend", 2), ("attend", 3),
        ("prefetch", 4), ("attend", 4), ("prefetch", 5), ("attend", 5), ("attend", 6), ("logits", None),
        ("join", 1), ("join", 2), ("join", 4), ("join", 5)]


def test_no_prefetch_in_a_prefill_step():
    log = traced_step(False)
    assert [e for e in log if e[0] in ("prefetch", "join")] == []
    assert log[-1] == ("logits", None)


def test_the_ops_issue_nothing_without_a_gpu():
    from flint_backend.ops import TORCH_OPS, triton_ops
    from flint_kernels import kv_prefetch

    cache = torch.zeros(4, 5, 2, 8)
    rows = torch.tensor([1], dtype=torch.int32)
    assert TORCH_OPS.prefetch_rings(cache, cache, rows) is None
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(kv_prefetch, "RINGS", True)
        assert triton_ops().prefetch_rings(cache, cache, rows) is None  # no sm_90 here
