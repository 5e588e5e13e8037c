"""Flint GGUF files (NVFP4 or BF16), memory-mapped with gguf.GGUFReader, checked, repacked.

The config comes from `hf_config_path` (a directory or config.json, as the announcement serves
GGUF with `--hf-config-path`) and is checked against the GGUF metadata key by key; without it,
the config is built from the metadata. Every tensor is checked against the schema (name, shape,
ggml type) before its bytes are read. NVFP4 blocks travel to the device as raw bytes and are
repacked there (nvfp4.from_ggml_blocks); companion `<name>.scale` tensors become the global scale.
A file that marks FP4 activations (`general.tensor_extra.prec_a4`) is refused: the format served
is weight-only NVFP4.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import torch
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFReader, ReaderTensor
from tqdm import tqdm

from flint_backend.config import ConfigError, FlintConfig
from flint_backend.weights.gguf_metadata import ARCH, architecture, check_metadata, config_from_metadata, read_metadata
from flint_backend.weights.nvfp4 import NVFP4Weight, from_ggml_blocks
from flint_backend.weights.schema import (
    INPUT_SCALE_SUFFIX, SCALE_SUFFIX, CheckpointError, LoadedTensor, Scope, check_names, check_shape,
    gguf_companion, loaded_tensors, nvfp4_eligible, storage_dtype,
)

PREC_A4_KEY = "general.tensor_extra.prec_a4"  # FP4 activations (W4A4): refused
_DENSE = {GGMLQuantizationType.F32: torch.float32, GGMLQuantizationType.F16: torch.float16,
          GGMLQuantizationType.BF16: torch.bfloat16}


class _CheckedReader(GGUFReader):
    """GGUFReader that names the first tensor lying past the end of a truncated file."""

    def _build_tensors(self, start_offs, fields):
        for field in fields:
            try:
                _, name, _, dims, qtype, offset = field.parts
                block, size = GGML_QUANT_SIZES[GGMLQuantizationType(int(qtype[0]))]
                end = start_offs + int(offset[0]) + int(np.prod(dims)) * size // block
            except (ValueError, KeyError, TypeError):
                continue  # a gguf version with another field layout: let the reader judge
            if end > len(self.data):
                raise CheckpointError(
                    f"tensor {bytes(name).decode()!r} needs bytes up to offset {end}, but the file has only "
                    f"{len(self.data)} bytes: the file is truncated")
        super()._build_tensors(start_offs, fields)


def open_gguf(path: Path) -> GGUFReader:
    try:
        reader = _CheckedReader(path, "r")
    except CheckpointError as e:
        raise CheckpointError(f"{path}: {e}") from None
    except Exception as e:  # gguf raises ValueError/IndexError/... on a corrupt header
        raise CheckpointError(f"{path}: not a readable GGUF file of {path.stat().st_size} bytes ({e})") from None
    arch = architecture(reader)
    if arch != ARCH:
        raise CheckpointError(f"{path}: general.architecture is {arch!r}, expected {ARCH!r}")
    prec_a4 = reader.fields.get(PREC_A4_KEY)
    if prec_a4 is not None and _any_true(prec_a4.contents()):
        raise CheckpointError(f"{path}: {PREC_A4_KEY} marks tensors with FP4 activations; only weight-only "
                              f"NVFP4 (W4A16: BF16 activations) is served")
    return reader


def _any_true(value) -> bool:
    return any(_any_true(v) for v in value) if isinstance(value, (list, tuple)) else bool(value)


def gguf_config(reader: GGUFReader, path: Path, hf_config_path: str | Path | None) -> FlintConfig:
    values = read_metadata(reader)
    if hf_config_path is None:
        return config_from_metadata(values, str(path))
    try:
        config = FlintConfig.from_json(hf_config_path)
    except ConfigError as e:
        raise CheckpointError(f"hf_config_path: {e}") from None
    check_metadata(config, values, str(path), f"hf_config_path {hf_config_path}")
    return config


def load_gguf(path: Path, reader: GGUFReader, config: FlintConfig, device: str | torch.device,
              dtype: torch.dtype, keep_nvfp4: bool, progress: bool = True) -> dict[str, torch.Tensor | NVFP4Weight]:
    by_name = {t.name: t for t in reader.tensors}
    planned = list(loaded_tensors(config))
    companions = [gguf_companion(t.gguf, suffix) for t in planned if nvfp4_eligible(t.spec)
                  for suffix in (SCALE_SUFFIX, INPUT_SCALE_SUFFIX)]
    check_names([t.gguf for t in planned], [n for n in by_name if n not in set(companions)], str(path))
    out: dict[str, torch.Tensor | NVFP4Weight] = {}
    for t in tqdm(planned, desc=f"loading {path.name}", unit="t", disable=not progress):
        found = by_name[t.gguf]
        check_shape(t.gguf, t.shape, tuple(reversed(found.shape.tolist())), str(path))
        scale = _global_scale(path, t, by_name.get(gguf_companion(t.gguf, SCALE_SUFFIX)))
        if found.tensor_type is GGMLQuantizationType.NVFP4:
            if not nvfp4_eligible(t.spec):
                raise CheckpointError(f"{path}: tensor {t.gguf!r} is NVFP4, expected F32/BF16/F16 "
                                      f"for a {t.spec.kind.value} tensor")
            weight = from_ggml_blocks(_host(found.data).to(device), scale, f"{path}: {t.gguf}")
            out[t.name] = weight if keep_nvfp4 else weight.dequantize(dtype)
        else:
            out[t.name] = _dense(path, t, found, scale, device, dtype)
    return out


def _dense(path: Path, t: LoadedTensor, found: ReaderTensor, scale: torch.Tensor, device, dtype) -> torch.Tensor:
    if found.tensor_type not in _DENSE:
        allowed = [q.name for q in _DENSE] + (["NVFP4"] if nvfp4_eligible(t.spec) else [])
        raise CheckpointError(f"{path}: tensor {t.gguf!r} has ggml type {found.tensor_type.name}, "
                              f"expected one of {allowed}")
    host = _host(found.data)
    if host.dtype == torch.uint8:  # gguf-py hands BF16 out as raw bytes
        host = host.view(_DENSE[found.tensor_type])
    tensor = host.reshape(t.shape).to(device)
    if not bool((scale == 1).all()):  # llama.cpp scales any matmul weight it has `.scale` for
        tensor = tensor.float() * scale.to(device).reshape(*scale.shape, *[1] * (tensor.dim() - scale.dim()))
    tensor = tensor.to(storage_dtype(t.spec.kind, dtype))
    if tensor.device.type == "cpu" and tensor.untyped_storage().data_ptr() == host.untyped_storage().data_ptr():
        tensor = tensor.clone()  # never hand out a view of the read-only memory map
    return tensor


def _global_scale(path: Path, t: LoadedTensor, found: ReaderTensor | None) -> torch.Tensor:
    """fp32 [] for a matrix, [E] for stacked experts; 1 where the file has no `.scale` tensor."""
    shape = (t.shape[0],) if t.spec.scope is Scope.EXPERT else ()
    if found is None:
        return torch.ones(shape, dtype=torch.float32)
    expected = shape or (1,)
    name = gguf_companion(t.gguf, SCALE_SUFFIX)
    if found.tensor_type is not GGMLQuantizationType.F32:
        raise CheckpointError(f"{path}: tensor {name!r} has ggml type {found.tensor_type.name}, expected F32")
    check_shape(name, expected, tuple(reversed(found.shape.tolist())), str(path))
    return _host(found.data).reshape(shape).clone()


def _host(array: np.ndarray) -> torch.Tensor:
    """A CPU tensor viewing the read-only memory map (no copy; never written to)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
        return torch.from_numpy(array)
