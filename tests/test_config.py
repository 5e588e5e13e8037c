import json

import pytest

from flint_backend.config import FULL, SLIDING, ConfigError, FlintConfig


def test_full_size_parameter_counts():
    config = FlintConfig.preset("flint-40b")
    count = config.num_parameters()
    assert 39e9 <= count.total <= 41e9
    assert 2.3e9 <= count.active <= 2.7e9
    assert config.kv_bytes_per_token() == 28 * 1024


def test_full_size_layer_pattern():
    config = FlintConfig.preset("flint-40b")
    assert config.full_attention_layers == [3, 6, 10, 13, 17, 20, 24, 27, 31, 34, 38, 41, 45, 48]
    assert len(config.sliding_attention_layers) == 35
    assert [config.is_moe_layer(i) for i in range(3)] == [False, False, True]


def test_tiny_preset_has_the_full_structure():
    c = FlintConfig.preset("flint-tiny")
    assert FULL in c.layer_types and SLIDING in c.layer_types
    assert c.first_k_dense_replace >= 2 and c.num_hidden_layers - c.first_k_dense_replace >= 3
    assert c.num_experts_per_tok >= 2 and c.n_routed_experts >= 8 and c.n_shared_experts == 1
    assert c.sliding_window < 16


def test_small_preset_has_full_size_layers():
    small, big = FlintConfig.preset("flint-small"), FlintConfig.preset("flint-40b")
    assert small.num_hidden_layers < big.num_hidden_layers
    for field in ("hidden_size", "num_attention_heads", "head_dim", "n_routed_experts", "vocab_size"):
        assert getattr(small, field) == getattr(big, field)


def test_json_round_trip(tmp_path):
    config = FlintConfig.preset("flint-tiny", rope_theta=5e5, eos_token_id=[1, 2])
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
    ({"hidden_sise": 64}, "hidden_sise"),                   # unknown field
    ({"num_key_value_heads": 3}, "num_key_value_heads"),    # 8 query heads not divisible by 3
    ({"layer_types": [SLIDING] * 3}, "layer_types"),        # wrong length
    ({"layer_types": ["sliding"] * 7}, "layer_types[0]"),   # unknown layer type
    ({"num_experts_per_tok": 17}, "num_experts_per_tok"),
    ({"model_type": "llama"}, "model_type"),
    ({"head_dim": 15}, "head_dim"),
    ({"tie_word_embeddings": True}, "tie_word_embeddings"),
    ({"rope_theta": -1.0}, "rope_theta"),
])
def test_invalid_configs_name_the_field(tmp_path, changes, field):
    with pytest.raises(ConfigError, match=field.replace("[", r"\[").replace("]", r"\]")):
        FlintConfig.from_json(_write(tmp_path, **changes))


def test_optional_fields_take_documented_defaults(tmp_path):
    data = {k: FlintConfig.preset("flint-tiny").to_dict()[k] for k in FlintConfig.REQUIRED}
    (tmp_path / "config.json").write_text(json.dumps(data))
    config = FlintConfig.from_json(tmp_path)
    assert config.sliding_window == 513 and config.routed_scaling_factor == 2.5
    assert config.layer_types[3] == FULL and config.layer_types[0] == SLIDING


def test_unknown_preset():
    with pytest.raises(ConfigError, match="flint-huge"):
        FlintConfig.preset("flint-huge")
