"""Where a decode step issues the next full-attention layer's K/V prefetch (model.KV_PREFETCH_AT,
ops.prefetch_kv): with the layer's own caches and the step's block tables, ahead of that layer's
attention, joined after the LM head; never in a prefill step. flint-tiny: 7 layers, full
attention at 3 and 6."""

import dataclasses

import pytest
import torch

from flint_backend import model as model_mod
from flint_backend.engine.sampling_params import SamplingParams
from flint_backend.engine.step_batch import build_step_batch

from engine_cases import make_engine


def traced_step(at: str, decode: bool, monkeypatch):
    """Run one step of the tiny engine's model with ops that log attention, prefetch and join
    (by layer) -> the log."""
    monkeypatch.setattr(model_mod, "KV_PREFETCH_AT", at)
    eng = make_engine()
    seqs = [eng.add_request([5, 6, 7, 8, 9, 10, 11], SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True))]
    eng.step()  # prefill
    model, kv = eng.runner.model, eng.runner.kv
    layer_of = {id(kv.layer(i)[0]): i for i in range(len(model.layers))}
    log = []
    ops = model.ops

    def attention_o(*args, **kwargs):
        log.append(("attend", layer_of[id(args[8])]))
        return ops.decode_attention_o(*args, **kwargs)

    def attention(*args, **kwargs):
        log.append(("attend", layer_of[id(args[5])]))
        return ops.attention(*args, **kwargs)

    def prefetch_kv(k_cache, v_cache, block_tables, context_lens):
        assert v_cache is kv.layer(layer_of[id(k_cache)])[1]
        assert block_tables is batch.block_tables and context_lens is batch.context_lens
        log.append(("prefetch", layer_of[id(k_cache)]))
        return lambda: log.append(("join", layer_of[id(k_cache)]))

    def logits(*args):
        log.append(("logits", None))
        return ops.logits(*args)

    for layer in model.layers:  # the layers hold the op table too
        layer.ops = layer.self_attn.ops = layer.mlp.ops = dataclasses.replace(
            ops, decode_attention_o=attention_o, attention=attention)
    monkeypatch.setattr(model, "ops", dataclasses.replace(ops, prefetch_kv=prefetch_kv, logits=logits))
    batch = build_step_batch([(seqs[0], 1)], eng.blocks.block_size, model.config.sliding_window, eng.device)
    if not decode:  # the same token through the prefill path
        batch = dataclasses.replace(batch, decode_only=False)
    model.forward(batch, kv)
    return log


def test_prefetch_after_the_attention_of_the_layer_before(monkeypatch):
    assert traced_step("attention", True, monkeypatch) == [
        ("attend", 0), ("attend", 1), ("attend", 2), ("prefetch", 3), ("attend", 3), ("attend", 4),
        ("attend", 5), ("prefetch", 6), ("attend", 6), ("logits", None), ("join", 3), ("join", 6)]


def test_prefetch_before_the_layer_before(monkeypatch):
    assert traced_step("layer", True, monkeypatch) == [
        ("attend", 0), ("attend", 1), ("prefetch", 3), ("attend", 2), ("attend", 3), ("attend", 4),
        ("prefetch", 6), ("attend", 5), ("attend", 6), ("logits", None), ("join", 3), ("join", 6)]


def test_no_prefetch_in_a_prefill_step(monkeypatch):
    log = traced_step("attention", False, monkeypatch)
    assert [e for e in log if e[0] in ("prefetch", "join")] == []
    assert log[-1] == ("logits", None)


def test_the_ops_issue_nothing_without_a_gpu():
    from flint_backend.ops import TORCH_OPS, triton_ops
    from flint_kernels import kv_prefetch

    cache = torch.zeros(4, 4, 2, 8)
    tables, lens = torch.zeros(1, 2, dtype=torch.int32), torch.tensor([5], dtype=torch.int32)
    assert TORCH_OPS.prefetch_kv(cache, cache, tables, lens) is None
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(kv_prefetch, "PAGES", 2)
        assert triton_ops().prefetch_kv(cache, cache, tables, lens) is None  # no sm_90 here
