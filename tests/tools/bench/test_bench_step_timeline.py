"""tools/bench/bench_step_timeline.py --layers: the full model's first N layers as a preset."""

import pytest

from flint_backend.config import PRESETS, FlintConfig
from tools.bench.bench_step_timeline import parse_variant, set_variant, with_layers


def test_with_layers_keeps_the_shapes_and_the_layer_types():
    name = with_layers("flint-40b", 28)
    try:
        config, full = FlintConfig.preset(name), FlintConfig.preset("flint-40b")
        assert name == "flint-40b:28-layers"
        assert config.num_hidden_layers == 28
        assert config.full_attention_layers == [0, 1, 5, 9, 13, 17, 21, 25]
        assert config.layer_types == full.layer_types[:28]
        assert (config.hidden_size, config.moe_intermediate_size, config.num_experts) == \
            (full.hidden_size, full.moe_intermediate_size, full.num_experts)
    finally:
        del PRESETS[name]


@pytest.mark.parametrize("layers", [-1, 50])
def test_with_layers_names_the_flag_and_the_range(layers):
    with pytest.raises(SystemExit, match=r"--layers: got -?\d+, expected 1 to 49 \(flint-40b's layers\)"):
        with_layers("flint-40b", layers)


def test_variant_sets_a_tuple_knob_and_gives_back_the_old_values(monkeypatch):
    from flint_kernels import tuning
    monkeypatch.setattr(tuning, "MOE_GROUPED_TILES", None)
    monkeypatch.setattr(tuning, "MOE_UNSORTED_MAX_TOKENS", 64)
    old = set_variant(parse_variant("flint_kernels.tuning.MOE_GROUPED_TILES=8:64:64:128:4:3:64,"
                                    "flint_kernels.tuning.MOE_UNSORTED_MAX_TOKENS=None"))
    assert tuning.MOE_GROUPED_TILES == (8, 64, 64, 128, 4, 3, 64)
    assert tuning.MOE_UNSORTED_MAX_TOKENS is None
    assert old == {("flint_kernels.tuning", "MOE_GROUPED_TILES"): None,
                   ("flint_kernels.tuning", "MOE_UNSORTED_MAX_TOKENS"): 64}
