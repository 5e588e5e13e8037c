"""Triton's instance placement -> the device each flint_model instance builds its engine on."""

import pytest

from flint_backend.engine.engine_args import EngineArgsError
from flint_backend.serving.placement import InstancePlacement


def placement(kind, device_id="0", name="flint_model_0_0"):
    return InstancePlacement.from_args({"model_instance_kind": kind, "model_instance_device_id": device_id,
                                        "model_instance_name": name, "model_name": "flint_model"})


@pytest.mark.parametrize("kind, device_id, configured, expected", [
    ("GPU", "1", "auto", "cuda:1"),
    ("GPU", "3", "cuda", "cuda:3"),
    ("GPU", "2", "cuda:2", "cuda:2"),
    ("KIND_GPU", "1", "auto", "cuda:1"),
    ("CPU", "0", "auto", "cpu"),
    ("CPU", "0", "cpu", "cpu"),
    ("MODEL", "0", "cuda:1", "cuda:1"),
    ("MODEL", "0", "auto", "auto"),
])
def test_the_instance_kind_and_device_pick_the_engine_device(kind, device_id, configured, expected):
    assert placement(kind, device_id).engine_device(configured) == expected


@pytest.mark.parametrize("kind, device_id, configured", [
    ("GPU", "1", "cpu"),
    ("GPU", "1", "cuda:0"),
    ("CPU", "0", "cuda"),
])
def test_a_device_that_contradicts_the_placement_is_refused(kind, device_id, configured):
    with pytest.raises(EngineArgsError, match=f"device: engine_args.json says '{configured}'.*flint_model_0_0"):
        placement(kind, device_id).engine_device(configured)


def test_placement_reads_the_python_backend_args():
    p = placement("GPU", "5", "flint_model_0_1")
    assert (p.name, p.kind, p.device_id) == ("flint_model_0_1", "GPU", 5)
    assert InstancePlacement.from_args({"model_name": "flint_model"}).kind == "MODEL"
    with pytest.raises(EngineArgsError, match="model_instance_kind"):
        placement("TPU")
