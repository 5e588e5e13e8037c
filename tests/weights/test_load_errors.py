"""Bad checkpoints fail at load with a CheckpointError naming the tensor or field, expected vs found."""

import dataclasses
import re
import shutil

import numpy as np
import pytest
import torch
from gguf import GGUFValueType

from flint_backend.weights.loader import load_checkpoint
from flint_backend.weights.random_init import random_weights
from flint_backend.weights.schema import CheckpointError


def fails(path, match, **kw):
    with pytest.raises(CheckpointError, match=match) as info:
        load_checkpoint(path, progress=False, **kw)
    print(info.value)  # what the user sees (pytest -s)
    return str(info.value)


# ---------------------------------------------------------------- GGUF
def test_truncated_gguf_names_the_first_missing_tensor(nvfp4_gguf, tmp_path):
    cut = tmp_path / "cut.gguf"
    data = nvfp4_gguf.read_bytes()
    cut.write_bytes(data[: len(data) * 6 // 10])
    message = fails(cut, "truncated")
    assert re.search(r"tensor 'blk\.\d+\.\w+\.(weight|scale)' needs bytes up to offset \d+, but the file has only "
                     + str(len(data) * 6 // 10), message)


def test_gguf_cut_inside_its_header(nvfp4_gguf, tmp_path):
    cut = tmp_path / "header.gguf"
    cut.write_bytes(nvfp4_gguf.read_bytes()[:200])
    fails(cut, "not a readable GGUF file of 200 bytes")


def test_wrong_architecture(nvfp4_gguf, tmp_path, edit_gguf):
    fails(edit_gguf(nvfp4_gguf, tmp_path / "llama.gguf", arch="llama"),
          "general.architecture is 'llama', expected 'flint'")


def test_missing_gguf_tensor(nvfp4_gguf, tmp_path, edit_gguf):
    fails(edit_gguf(nvfp4_gguf, tmp_path / "x.gguf", drop=("blk.3.attn_k.weight",)),
          re.escape("missing 1 tensor(s), e.g. ['blk.3.attn_k.weight']"))


def test_misshaped_gguf_tensor(nvfp4_gguf, tmp_path, edit_gguf):
    bad = edit_gguf(nvfp4_gguf, tmp_path / "x.gguf", replace={"blk.1.attn_norm.weight": np.ones(63, np.float32)})
    fails(bad, re.escape("tensor 'blk.1.attn_norm.weight' has shape (63,), expected (64,)"))


def test_misshaped_expert_scale(nvfp4_gguf, tmp_path, edit_gguf):
    bad = edit_gguf(nvfp4_gguf, tmp_path / "x.gguf", replace={"blk.2.ffn_gate_exps.scale": np.ones(3, np.float32)})
    fails(bad, re.escape("tensor 'blk.2.ffn_gate_exps.scale' has shape (3,), expected (16,)"))


@pytest.mark.parametrize("value", [(True, GGUFValueType.BOOL),
                                   ([False, True, False], GGUFValueType.ARRAY, GGUFValueType.BOOL)])
def test_a_gguf_with_fp4_activations_is_refused(nvfp4_gguf, tmp_path, edit_gguf, value):
    bad = edit_gguf(nvfp4_gguf, tmp_path / "w4a4.gguf", add_kv={"general.tensor_extra.prec_a4": value})
    fails(bad, r"general\.tensor_extra\.prec_a4 marks tensors with FP4 activations; only weight-only NVFP4")


def test_a_gguf_marking_no_fp4_activations_loads(nvfp4_gguf, tmp_path, edit_gguf):
    ok = edit_gguf(nvfp4_gguf, tmp_path / "w4a16.gguf",
                   add_kv={"general.tensor_extra.prec_a4": ([False, False], GGUFValueType.ARRAY, GGUFValueType.BOOL)})
    assert load_checkpoint(ok, progress=False).format == "gguf"


def test_hf_config_disagrees_with_gguf_metadata(config, nvfp4_gguf, tmp_path):
    other = tmp_path / "config"
    other.mkdir()
    dataclasses.replace(config, rope_parameters={"rope_type": "default", "rope_theta": 20000.0}).to_json(other)
    message = fails(nvfp4_gguf, "config/GGUF mismatch", hf_config_path=other / "config.json")
    assert "'rope_parameters'" in message and "'flint.rope.freq_base'" in message
    assert "20000.0" in message and "10000.0" in message


def test_gguf_metadata_edited_against_hf_config(bf16_dir, nvfp4_gguf, tmp_path, edit_gguf):
    bad = edit_gguf(nvfp4_gguf, tmp_path / "x.gguf", kv={"flint.expert_used_count": 3})
    message = fails(bad, "config/GGUF mismatch", hf_config_path=bf16_dir)
    assert "'num_experts_per_tok'" in message and "gives 4" in message and "has 3" in message


def test_not_a_gguf_file(tmp_path):
    path = tmp_path / "model.gguf"
    path.write_bytes(b"hello world")
    fails(path, "expected a directory or a GGUF file")
    fails(tmp_path / "absent.gguf", "does not exist")


# ---------------------------------------------------------------- safetensors
def test_missing_safetensors_tensor(config, make_ckpt, tmp_path):
    gone = "model.layers.2.mlp.experts.5.down_proj.weight"
    out = make_ckpt(config, tmp_path / "c", tensors=((n, t) for n, t in random_weights(config) if n != gone))
    fails(out, re.escape(f"missing 1 tensor(s), e.g. ['{gone}']"))


def test_unexpected_safetensors_tensor(config, make_ckpt, tmp_path):
    extra = [("model.layers.0.mlp.extra.weight", torch.zeros(2))]
    out = make_ckpt(config, tmp_path / "c", tensors=[*random_weights(config), *extra])
    fails(out, re.escape("1 unexpected tensor(s), e.g. ['model.layers.0.mlp.extra.weight']"))


def test_misshaped_safetensors_tensor(config, make_ckpt, tmp_path):
    name = "model.layers.1.self_attn.q_proj.weight"
    tensors = ((n, t[:-1] if n == name else t) for n, t in random_weights(config))
    out = make_ckpt(config, tmp_path / "c", tensors=tensors)
    rows = config.num_attention_heads * config.head_dim
    fails(out, re.escape(f"tensor '{name}' has shape ({rows - 1}, 64), expected ({rows}, 64)"))


def test_missing_shard(bf16_dir, tmp_path):
    copy = tmp_path / "c"
    shutil.copytree(bf16_dir, copy)
    shard = sorted(copy.glob("model-*.safetensors"))[1]
    shard.unlink()
    fails(copy, re.escape(f"{shard}: shard named by model.safetensors.index.json is missing"))


def test_missing_config(bf16_dir, tmp_path):
    copy = tmp_path / "c"
    shutil.copytree(bf16_dir, copy)
    (copy / "config.json").unlink()
    fails(copy, "config.json does not exist")
