"""Tiny checkpoints for the weight tests, made once per test run.

Every NVFP4-eligible tensor of the tiny preset has K % 64 == 0 (ggml's super-block is 64
weights), so in the NVFP4 GGUF every linear, the LM head included, really is NVFP4; a preset
whose K is not, cut to 32, shows the BF16 fallback (test_gguf_roundtrip).
"""

from pathlib import Path

import numpy as np
import pytest
import torch
from gguf import GGUFReader, GGUFValueType, GGUFWriter

from flint_backend.config import FlintConfig
from flint_backend.weights.convert import convert_checkpoint
from flint_backend.weights.random_init import random_weights
from flint_backend.weights.safetensors_writer import write_sharded

SHARD_BYTES = 1_000_000  # several shards, so experts of one layer straddle shard boundaries


@pytest.fixture(autouse=True, scope="session")
def one_thread():
    # tiny ops on a 2-core machine run ~10x faster without intra-op threads
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def config() -> FlintConfig:
    return FlintConfig.preset("flint-tiny")


def make_checkpoint(config: FlintConfig, out: Path, seed: int = 0, tensors=None) -> Path:
    write_sharded(tensors if tensors is not None else random_weights(config, seed), out, SHARD_BYTES)
    config.to_json(out)
    return out


@pytest.fixture(scope="session")
def bf16_dir(config, tmp_path_factory) -> Path:
    return make_checkpoint(config, tmp_path_factory.mktemp("ckpt") / "flint-tiny")


@pytest.fixture(scope="session")
def nvfp4_gguf(bf16_dir, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("gguf") / "flint-tiny-nvfp4.gguf"
    convert_checkpoint(bf16_dir, out, outtype="nvfp4", progress=False)
    return out


@pytest.fixture(scope="session")
def bf16_gguf(bf16_dir, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("gguf") / "flint-tiny-bf16.gguf"
    convert_checkpoint(bf16_dir, out, outtype="bf16", progress=False)
    return out


def rewrite_gguf(src: Path, dst: Path, *, arch: str | None = None, drop: tuple[str, ...] = (),
                 replace: dict[str, np.ndarray] | None = None, kv: dict | None = None,
                 add_kv: dict[str, tuple] | None = None) -> Path:
    """Copy a GGUF with edits: another architecture, tensors dropped or replaced, KV values changed,
    KV pairs added (key -> (value, GGUFValueType[, array element type]))."""
    reader = GGUFReader(src)
    writer = GGUFWriter(dst, arch or reader.fields["general.architecture"].contents())
    for name, field in reader.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture":
            continue
        value = (kv or {}).get(name, field.contents())
        if field.types[0] == GGUFValueType.ARRAY:
            writer.add_key_value(name, value, GGUFValueType.ARRAY, sub_type=field.types[-1])
        else:
            writer.add_key_value(name, value, field.types[0])
    for name, (value, vtype, *sub) in (add_kv or {}).items():
        writer.add_key_value(name, value, vtype, sub_type=sub[0] if sub else None)
    for t in reader.tensors:
        if t.name in drop:
            continue
        if replace and t.name in replace:
            writer.add_tensor(t.name, replace[t.name])
        elif t.data.dtype == np.uint8:
            writer.add_tensor(t.name, np.array(t.data), raw_dtype=t.tensor_type)
        else:
            writer.add_tensor(t.name, np.array(t.data))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return dst


@pytest.fixture
def edit_gguf():
    return rewrite_gguf


@pytest.fixture
def make_ckpt():
    return make_checkpoint
