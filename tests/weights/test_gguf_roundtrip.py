"""BF16 directory -> GGUF (nvfp4 / bf16) -> load: bit-exact NVFP4 repack, identical BF16 tensors."""

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType, GGUFReader, GGUFWriter
from gguf.quants import dequantize
from safetensors.torch import save_file

from flint_backend.config import FlintConfig
from flint_backend.weights.convert import convert_checkpoint
from flint_backend.weights.gguf_metadata import config_from_metadata, read_metadata, write_metadata
from flint_backend.weights.gguf_writer import plan_tensors
from flint_backend.weights.loader import load_checkpoint, unstack_experts
from flint_backend.weights.nvfp4 import NVFP4Weight
from flint_backend.weights.random_init import random_weights
from flint_backend.weights.safetensors_loader import SafetensorsCheckpoint
from flint_backend.weights.schema import (
    SCALE_SUFFIX, Kind, Scope, checkpoint_tensors, gguf_companion, loaded_tensors, nvfp4_eligible,
)


def test_nvfp4_tensors_dequantise_bit_exactly_like_the_files_blocks(config, bf16_dir, nvfp4_gguf):
    ckpt = load_checkpoint(nvfp4_gguf, hf_config_path=bf16_dir, progress=False)
    file = {t.name: t for t in GGUFReader(nvfp4_gguf).tensors}
    checked = 0
    for t in loaded_tensors(config):
        found = file[t.gguf]
        if found.tensor_type is not GGMLQuantizationType.NVFP4:
            continue
        scale = np.array(file[gguf_companion(t.gguf, SCALE_SUFFIX)].data)  # [1] or [E]
        expected = dequantize(found.data, GGMLQuantizationType.NVFP4)
        expected = expected * (scale.reshape(-1, 1, 1) if t.spec.scope is Scope.EXPERT else scale)
        weight = ckpt.tensors[t.name]
        assert isinstance(weight, NVFP4Weight) and weight.shape == t.shape
        got = weight.dequantize(torch.float32).numpy()
        assert np.array_equal(got.view(np.uint32), expected.astype(np.float32).view(np.uint32)), t.name
        checked += 1
    eligible = [t for t in loaded_tensors(config) if nvfp4_eligible(t.spec)]
    assert checked == len(eligible) == 64  # 7 layers x 4 attention + 2 dense x 3 + 5 MoE x 6


def test_nvfp4_file_types_and_scale_tensors(config, nvfp4_gguf):
    file = {t.name: t for t in GGUFReader(nvfp4_gguf).tensors}
    for t in loaded_tensors(config):
        qtype = file[t.gguf].tensor_type
        if nvfp4_eligible(t.spec):
            assert qtype is GGMLQuantizationType.NVFP4, t.gguf
            scale = file[gguf_companion(t.gguf, SCALE_SUFFIX)]
            assert scale.tensor_type is GGMLQuantizationType.F32
            assert scale.data.shape == ((config.n_routed_experts,) if t.spec.scope is Scope.EXPERT else (1,))
        elif t.spec.kind in (Kind.EMBEDDING, Kind.LINEAR):  # embedding and (unquantised) LM head
            assert qtype is GGMLQuantizationType.BF16, t.gguf
        else:
            assert qtype is GGMLQuantizationType.F32, t.gguf


def test_quantize_lm_head(bf16_dir, tmp_path):
    out = tmp_path / "lm-head.gguf"
    convert_checkpoint(bf16_dir, out, outtype="nvfp4", quantize_lm_head=True, progress=False)
    ckpt = load_checkpoint(out, progress=False)
    assert isinstance(ckpt.tensors["lm_head.weight"], NVFP4Weight)
    assert ckpt.tensors["model.embed_tokens.weight"].dtype == torch.bfloat16


def test_bf16_gguf_loads_exactly_the_safetensors_tensors(bf16_dir, bf16_gguf):
    a = load_checkpoint(bf16_dir, progress=False)
    b = load_checkpoint(bf16_gguf, hf_config_path=bf16_dir, progress=False)
    assert a.config == b.config
    assert list(a.tensors) == list(b.tensors)
    for name, tensor in a.tensors.items():
        other = b.tensors[name]
        assert other.dtype == tensor.dtype and torch.equal(other, tensor), name


def test_loaded_names_dtypes_and_stacked_experts(config, bf16_dir):
    ckpt = load_checkpoint(bf16_dir, dtype=torch.float16, progress=False)
    stacked = ckpt.tensors["model.layers.2.mlp.experts.down_proj.weight"]
    assert stacked.shape == (16, 64, 64) and stacked.dtype == torch.float16
    assert ckpt.tensors["model.layers.0.self_attn.sinks"].dtype == torch.float32
    assert ckpt.tensors["model.layers.2.mlp.gate.e_score_correction_bias"].dtype == torch.float32
    assert ckpt.tensors["model.norm.weight"].dtype == torch.float16
    # unstacking gives back exactly the checkpoint's per-expert tensors
    per_expert = unstack_experts(ckpt.tensors)
    assert sorted(per_expert) == sorted(name for name, _, _ in checkpoint_tensors(config))
    source = SafetensorsCheckpoint(bf16_dir, config)
    name = "model.layers.4.mlp.experts.11.up_proj.weight"
    assert torch.equal(per_expert[name], source.get(name).to(torch.float16))


def test_single_file_checkpoint(config, tmp_path):
    out = tmp_path / "single"
    out.mkdir()
    save_file(dict(random_weights(config, seed=3)), str(out / "model.safetensors"))
    config.to_json(out)
    ckpt = load_checkpoint(out, progress=False)
    assert ckpt.format == "safetensors" and len(ckpt.tensors) == len(list(loaded_tensors(config)))


def test_keep_nvfp4_false_gives_dequantised_tensors(bf16_dir, nvfp4_gguf):
    packed = load_checkpoint(nvfp4_gguf, progress=False)
    dense = load_checkpoint(nvfp4_gguf, keep_nvfp4=False, dtype=torch.float32, progress=False)
    name = "model.layers.3.mlp.experts.gate_proj.weight"
    assert torch.equal(dense.tensors[name], packed.tensors[name].dequantize(torch.float32))


def test_config_from_gguf_metadata_alone(config, bf16_dir, nvfp4_gguf):
    ckpt = load_checkpoint(nvfp4_gguf, progress=False)  # no hf_config_path
    assert ckpt.config == config
    meta = read_metadata(GGUFReader(nvfp4_gguf))
    assert meta["flint.attention.sliding_window_pattern"] == [t == "sliding_attention" for t in config.layer_types]
    assert meta["flint.expert_gating_func"] == 2  # sigmoid
    assert meta["flint.expert_shared_feed_forward_length"] == config.shared_intermediate_size


def test_k32_down_projections_stay_bf16():
    """ggml's NVFP4 super-block is 64 weights: a linear with K = 32 falls back to BF16."""
    config = FlintConfig.preset("flint-tiny", moe_intermediate_size=32)
    plan = {p.tensor.gguf: p.qtype for p in plan_tensors(config, "nvfp4")}
    assert plan["blk.2.ffn_down_exps.weight"] is GGMLQuantizationType.BF16   # K = 32
    assert plan["blk.2.ffn_down_shexp.weight"] is GGMLQuantizationType.BF16
    assert plan["blk.2.ffn_gate_exps.weight"] is GGMLQuantizationType.NVFP4  # K = 64
    assert plan["output.weight"] is GGMLQuantizationType.BF16


def test_convert_refuses_to_overwrite_without_force(bf16_dir, tmp_path):
    out = tmp_path / "x.gguf"
    out.write_bytes(b"keep me")
    with pytest.raises(FileExistsError, match="--force"):
        convert_checkpoint(bf16_dir, out, outtype="bf16", progress=False)
    assert out.read_bytes() == b"keep me"
    convert_checkpoint(bf16_dir, out, outtype="bf16", force=True, progress=False)
    assert load_checkpoint(out, progress=False).format == "gguf"


def test_metadata_round_trip_of_every_config_field(tmp_path):
    config = FlintConfig.preset("flint-tiny", rms_norm_eps=1e-6, rope_theta=500000.0, routed_scaling_factor=1.5,
                                norm_topk_prob=False, bos_token_id=1, eos_token_id=[2, 5, 7], pad_token_id=0,
                                layer_types=["full_attention"] * 2 + ["sliding_attention"] * 5)
    path = tmp_path / "meta.gguf"
    writer = GGUFWriter(path, "flint")
    write_metadata(writer, config)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    values = read_metadata(GGUFReader(path))
    assert config_from_metadata(values, str(path)) == config
    assert values["tokenizer.ggml.eos_token_id"] == 2
