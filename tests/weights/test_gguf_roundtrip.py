"""BF16 directory -> GGUF (nvfp4 / bf16) -> load: bit-exact NVFP4 repack, identical BF16 tensors."""

import re

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
from flint_backend.weights.hf_state import transformers_state_dict
from flint_backend.weights.loader import load_checkpoint
from flint_backend.weights.nvfp4 import NVFP4Weight
from flint_backend.weights.random_init import random_weights
from flint_backend.weights.safetensors_loader import SafetensorsCheckpoint
from flint_backend.weights.schema import (
    SCALE_SUFFIX, Kind, Scope, gguf_companion, loaded_tensors, nvfp4_eligible,
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
    assert checked == len(eligible) == 65  # 7 layers x 4 attention + 2 dense x 3 + 5 MoE x 6 + LM head


def test_nvfp4_file_types_and_scale_tensors(config, nvfp4_gguf):
    file = {t.name: t for t in GGUFReader(nvfp4_gguf).tensors}
    for t in loaded_tensors(config):
        qtype = file[t.gguf].tensor_type
        if nvfp4_eligible(t.spec):
            assert qtype is GGMLQuantizationType.NVFP4, t.gguf
            scale = file[gguf_companion(t.gguf, SCALE_SUFFIX)]
            assert scale.tensor_type is GGMLQuantizationType.F32
            assert scale.data.shape == ((config.num_experts,) if t.spec.scope is Scope.EXPERT else (1,))
        elif t.spec.kind is Kind.EMBEDDING:
            assert qtype is GGMLQuantizationType.BF16, t.gguf
        else:  # norms, sinks, router
            assert qtype is GGMLQuantizationType.F32, t.gguf
    assert file["output.weight"].tensor_type is GGMLQuantizationType.NVFP4


SPEC_NAMES = re.compile(r"token_embd\.weight|output_norm\.weight|output\.(weight|scale)|blk\.\d+\.("
                        r"(attn_norm|ffn_norm|attn_q_norm|attn_k_norm|attn_sinks|ffn_gate_inp)\.weight|"
                        r"(attn_q|attn_k|attn_v|attn_output|ffn_gate|ffn_up|ffn_down|ffn_gate_shexp|ffn_up_shexp|"
                        r"ffn_down_shexp|ffn_gate_exps|ffn_up_exps|ffn_down_exps)\.(weight|scale))")


def test_every_tensor_name_is_one_of_the_official_layout(nvfp4_gguf, bf16_gguf):
    """The names SPEC section 2 lists (vLLM's Flint GGUF loader's): nothing else in the file."""
    for path in (nvfp4_gguf, bf16_gguf):
        names = [t.name for t in GGUFReader(path).tensors]
        assert [n for n in names if not SPEC_NAMES.fullmatch(n)] == []
        assert "blk.2.attn_sinks.weight" in names and "blk.2.ffn_gate_inp.weight" in names


def test_the_nvfp4_lm_head_loads_as_nvfp4(nvfp4_gguf):
    ckpt = load_checkpoint(nvfp4_gguf, progress=False)
    assert isinstance(ckpt.tensors["lm_head.weight"], NVFP4Weight)
    assert ckpt.tensors["model.embed_tokens.weight"].dtype == torch.bfloat16
    assert ckpt.tensors["model.layers.2.mlp.gate.weight"].dtype == torch.float32


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
    assert ckpt.tensors["model.layers.0.self_attn.softmax_offset"].dtype == torch.float32
    assert ckpt.tensors["model.layers.2.mlp.gate.weight"].dtype == torch.float32
    assert ckpt.tensors["model.norm.weight"].dtype == torch.float16
    # each stacked slot is exactly the checkpoint's per-expert tensor
    source = SafetensorsCheckpoint(bf16_dir, config)
    name = "model.layers.4.mlp.experts.11.up_proj.weight"
    assert torch.equal(ckpt.tensors["model.layers.4.mlp.experts.up_proj.weight"][11], source.get(name).to(torch.float16))


def test_transformers_names_load_as_the_hub_names(config, bf16_dir, tmp_path):
    """A FlintForCausalLM's own state dict (fused experts, `sinks`) loads to the same tensors, and
    get() cuts a Hub tensor out of it (convert_to_gguf reads through get())."""
    hub = load_checkpoint(bf16_dir, dtype=torch.float32, progress=False)
    out = tmp_path / "transformers-names"
    out.mkdir()
    save_file({k: v.contiguous() for k, v in transformers_state_dict(hub.tensors, config).items()},
              str(out / "model.safetensors"))
    config.to_json(out)
    fused = load_checkpoint(out, dtype=torch.float32, progress=False)
    assert list(fused.tensors) == list(hub.tensors)
    for name, tensor in hub.tensors.items():
        assert torch.equal(fused.tensors[name], tensor), name
    source = SafetensorsCheckpoint(out, config)
    for name in ("model.layers.3.mlp.experts.7.up_proj.weight", "model.layers.3.mlp.experts.7.gate_proj.weight",
                 "model.layers.6.mlp.experts.0.down_proj.weight", "model.layers.1.self_attn.softmax_offset"):
        assert torch.equal(source.get(name).float(), SafetensorsCheckpoint(bf16_dir, config).get(name).float()), name


def test_router_weights_exact_in_bf16_load_as_bf16(config, tmp_path):
    tensors = dict(random_weights(config, seed=4))
    tensors["model.layers.2.mlp.gate.weight"] = tensors["model.layers.2.mlp.gate.weight"].bfloat16().float()
    out = tmp_path / "router"
    out.mkdir()
    save_file(tensors, str(out / "model.safetensors"))
    config.to_json(out)
    ckpt = load_checkpoint(out, progress=False)
    assert ckpt.tensors["model.layers.2.mlp.gate.weight"].dtype == torch.bfloat16  # every value exact
    assert ckpt.tensors["model.layers.3.mlp.gate.weight"].dtype == torch.float32
    assert torch.equal(ckpt.tensors["model.layers.2.mlp.gate.weight"].float(), tensors["model.layers.2.mlp.gate.weight"])


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
    assert meta["flint.expert_shared_feed_forward_length"] == config.shared_expert_intermediate_size


def test_k32_down_projections_stay_bf16():
    """ggml's NVFP4 super-block is 64 weights: a linear with K = 32 falls back to BF16."""
    config = FlintConfig.preset("flint-tiny", moe_intermediate_size=32, shared_expert_intermediate_size=32)
    plan = {p.tensor.gguf: p.qtype for p in plan_tensors(config, "nvfp4")}
    assert plan["blk.2.ffn_down_exps.weight"] is GGMLQuantizationType.BF16   # K = 32
    assert plan["blk.2.ffn_down_shexp.weight"] is GGMLQuantizationType.BF16
    assert plan["blk.2.ffn_gate_exps.weight"] is GGMLQuantizationType.NVFP4  # K = 64
    assert plan["output.weight"] is GGMLQuantizationType.NVFP4


def test_convert_refuses_to_overwrite_without_force(bf16_dir, tmp_path):
    out = tmp_path / "x.gguf"
    out.write_bytes(b"keep me")
    with pytest.raises(FileExistsError, match="--force"):
        convert_checkpoint(bf16_dir, out, outtype="bf16", progress=False)
    assert out.read_bytes() == b"keep me"
    convert_checkpoint(bf16_dir, out, outtype="bf16", force=True, progress=False)
    assert load_checkpoint(out, progress=False).format == "gguf"


def test_metadata_round_trip_of_every_config_field(tmp_path):
    config = FlintConfig.preset("flint-tiny", rms_norm_eps=1e-5, rope_parameters={"rope_type": "default",
                                "rope_theta": 500000.0}, mlp_only_layers=[0, 3], decoder_sparse_step=2,
                                norm_topk_prob=False, bos_token_id=1, eos_token_id=[2, 5, 7], pad_token_id=0,
                                shared_expert_intermediate_size=192,
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
