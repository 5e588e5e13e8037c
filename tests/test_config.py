import json
import logging

import pytest
import transformers

from flint_backend.config import FULL, SLIDING, ConfigError, FlintConfig


def test_full_size_parameter_counts():
    config = FlintConfig.preset("flint-40b")
    count = config.num_parameters()
    assert 39e9 <= count.total <= 41e9
    assert 2.3e9 <= count.active <= 2.7e9
    assert config.kv_bytes_per_token() == 28 * 1024


def test_full_size_layer_pattern():
    config = FlintConfig.preset("flint-40b")
    assert config.full_attention_layers == [0, 1, 5, 9, 13, 17, 21, 25, 29, 33, 37, 41, 45, 48]
    assert len(config.sliding_attention_layers) == 35
    assert [config.is_moe_layer(i) for i in range(3)] == [False, False, True]
    assert [config.has_rope(i) for i in (0, 2, 5, 48)] == [False, True, False, False]


def test_the_full_size_preset_is_transformers_flint_config():
    """Every model field of transformers' FlintConfig() (those PreTrainedConfig does not have)."""
    ours = FlintConfig.preset("flint-40b").to_dict()
    theirs = transformers.FlintConfig().to_dict()
    fields = set(theirs) - set(transformers.PreTrainedConfig().to_dict())
    assert len(fields) >= 30
    assert {k: ours.get(k, "absent") for k in fields} == {k: theirs[k] for k in fields}


def test_a_config_saved_by_transformers_reads_back(tmp_path):
    theirs = transformers.FlintConfig(num_hidden_layers=6, vocab_size=512, mlp_only_layers=[0],
                                      rope_parameters={"rope_type": "default", "rope_theta": 5e5})
    theirs.save_pretrained(tmp_path)
    config = FlintConfig.from_json(tmp_path)
    assert config.layer_types == theirs.layer_types and config.mlp_only_layers == [0]
    assert config.rope_theta == 5e5 and config.vocab_size == 512
    again = transformers.FlintConfig(**config.to_dict()).to_dict()
    assert {**again, "architectures": None} == {**theirs.to_dict(), "_name_or_path": ""}


def test_tiny_preset_has_the_full_structure():
    c = FlintConfig.preset("flint-tiny")
    assert FULL in c.layer_types and SLIDING in c.layer_types
    assert c.mlp_only_layers == [0, 1] and len(c.moe_layers) >= 3
    assert c.num_experts_per_tok >= 2 and c.num_experts >= 8
    assert c.shared_expert_intermediate_size == 2 * c.moe_intermediate_size
    assert c.sliding_window < 16


def test_small_preset_has_full_size_layers():
    small, big = FlintConfig.preset("flint-small"), FlintConfig.preset("flint-40b")
    assert small.num_hidden_layers < big.num_hidden_layers
    for field in ("hidden_size", "num_attention_heads", "head_dim", "num_experts", "vocab_size",
                  "shared_expert_intermediate_size", "intermediate_size"):
        assert getattr(small, field) == getattr(big, field)


def test_json_round_trip(tmp_path):
    config = FlintConfig.preset("flint-tiny", rope_parameters={"rope_type": "default", "rope_theta": 5e5},
                                eos_token_id=[1, 2])
    config.to_json(tmp_path)
    assert FlintConfig.from_json(tmp_path) == config
    assert json.loads((tmp_path / "config.json").read_text())["model_type"] == "flint"


def _write(tmp_path, **changes):
    data = FlintConfig.preset("flint-tiny").to_dict()
    data.update(changes)
    for key in [k for k, v in changes.items() if v is None]:
        del data[key]
    (tmp_path / "config.json").write_text(json.dumps(data))
    return tmp_path


@pytest.mark.parametrize("changes, field", [
    ({"hidden_size": None}, "hidden_size"),                 # missing required field
    ({"num_key_value_heads": 3}, "num_key_value_heads"),    # 8 query heads not divisible by 3
    ({"layer_types": [SLIDING] * 3}, "layer_types"),        # wrong length
    ({"layer_types": ["sliding"] * 7}, "layer_types[0]"),   # unknown layer type
    ({"num_experts_per_tok": 17}, "num_experts_per_tok"),
    ({"model_type": "llama"}, "model_type"),
    ({"head_dim": 15}, "head_dim"),
    ({"tie_word_embeddings": True}, "tie_word_embeddings"),
    ({"rope_parameters": {"rope_type": "default", "rope_theta": -1.0}}, "rope_parameters.rope_theta"),
    ({"rope_parameters": {"rope_type": "yarn", "rope_theta": 1e4, "factor": 4.0}}, "rope_parameters"),
    ({"rope_scaling": {"type": "linear", "factor": 2.0}}, "rope_scaling"),
    ({"router_score_function": "softmax"}, "router_score_function"),
    ({"hidden_act": "gelu"}, "hidden_act"),
    ({"attention_bias": True}, "attention_bias"),
    ({"use_sliding_window": False}, "use_sliding_window"),
    ({"quantization_config": {"quant_method": "fp8"}}, "quantization_config"),
    ({"shared_expert_intermediate_size": 100}, "shared_expert_intermediate_size"),
    ({"mlp_only_layers": [0, 9]}, "mlp_only_layers"),
    ({"no_rope_layer_indices": [0, 1]}, "no_rope_layer_indices"),  # not the full layers (0, 1, 5, 6)
])
def test_invalid_configs_name_the_field(tmp_path, changes, field):
    with pytest.raises(ConfigError, match=field.replace("[", r"\[").replace("]", r"\]")):
        FlintConfig.from_json(_write(tmp_path, **changes))


def test_vllm_fields_and_hf_metadata_are_understood(tmp_path, caplog):
    path = _write(tmp_path, rope_parameters=None, rope_theta=2e4, no_rope_layer_indices=[0, 1, 5, 6],
                  router_score_function="sigmoid", use_sliding_window=True, torch_dtype="bfloat16",
                  transformers_version="5.21.0", max_window_layers=7)
    with caplog.at_level(logging.WARNING):
        config = FlintConfig.from_json(path)
    assert config.rope_theta == 2e4 and config.no_rope_layer_indices == [0, 1, 5, 6]
    assert "max_window_layers" in caplog.text and "torch_dtype" not in caplog.text


def test_optional_fields_take_documented_defaults(tmp_path):
    data = {k: FlintConfig.preset("flint-tiny").to_dict()[k] for k in FlintConfig.REQUIRED}
    (tmp_path / "config.json").write_text(json.dumps(data))
    config = FlintConfig.from_json(tmp_path)
    assert config.sliding_window == 513 and config.shared_expert_intermediate_size == 1024
    assert config.layer_types[1] == FULL and config.layer_types[2] == SLIDING and config.mlp_only_layers == [0, 1]


def test_decoder_sparse_step_places_the_moe_layers():
    config = FlintConfig.preset("flint-tiny", decoder_sparse_step=2, mlp_only_layers=[1])
    assert config.moe_layers == [3, 5]


def test_unknown_preset():
    with pytest.raises(ConfigError, match="flint-huge"):
        FlintConfig.preset("flint-huge")
