"""One entry point for every checkpoint: `load_checkpoint(path, device=...)`.

    ckpt = load_checkpoint("checkpoints/flint-tiny", device="cuda")              # BF16 HF directory
    ckpt = load_checkpoint("flint-nvfp4.gguf", device="cuda",
                           hf_config_path="checkpoints/flint-tiny")               # NVFP4 GGUF

`ckpt.tensors` uses the Hub's names, except that the routed experts of a layer are stacked:
`model.layers.{i}.mlp.experts.{gate,up}_proj.weight` [E, I, H] and `...down_proj.weight`
[E, H, I]. Sinks are fp32; the router weight is fp32, or `dtype` when that holds every value
exactly (a lossless copy: the router then reads half the bytes); everything else `dtype`. From
an NVFP4 GGUF (keep_nvfp4=True) the quantised linears, the LM head included, are NVFP4Weight
(nvfp4.py documents the layout); a linear the file stores densely (e.g. K not a multiple of 64)
is a plain tensor, so consumers accept either.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import torch

from flint_backend.config import ConfigError, FlintConfig
from flint_backend.weights.gguf_loader import gguf_config, load_gguf, open_gguf
from flint_backend.weights.nvfp4 import NVFP4Weight
from flint_backend.weights.safetensors_loader import SafetensorsCheckpoint
from flint_backend.weights.schema import TENSORS, CheckpointError, Kind

Weight = torch.Tensor | NVFP4Weight
GGUF_MAGIC = b"GGUF"


@dataclass
class LoadedCheckpoint:
    config: FlintConfig
    tensors: dict[str, Weight]
    format: str  # "safetensors" or "gguf"
    path: Path


def load_checkpoint(path: str | Path, *, device: str | torch.device = "cpu", dtype: torch.dtype = torch.bfloat16,
                    hf_config_path: str | Path | None = None, keep_nvfp4: bool = True,
                    progress: bool = True) -> LoadedCheckpoint:
    """An HF directory (config.json + safetensors) or a .gguf file -> tensors on `device`."""
    path = Path(path)
    if path.is_dir():
        config = _json_config(hf_config_path or path)
        tensors = SafetensorsCheckpoint(path, config).load(device, dtype, progress)
        return LoadedCheckpoint(config, exact_routers(tensors, dtype), "safetensors", path)
    if not path.is_file():
        raise CheckpointError(f"checkpoint path {path} does not exist")
    with open(path, "rb") as f:
        magic = f.read(4)
    if magic != GGUF_MAGIC:
        raise CheckpointError(f"{path}: starts with {magic!r}, expected a directory or a GGUF file ({GGUF_MAGIC!r})")
    reader = open_gguf(path)
    config = gguf_config(reader, path, hf_config_path)
    tensors = load_gguf(path, reader, config, device, dtype, keep_nvfp4, progress)
    return LoadedCheckpoint(config, exact_routers(tensors, dtype), "gguf", path)


_ROUTERS = [re.compile(re.escape(s.hf).replace(r"\{i\}", r"\d+") + "$") for s in TENSORS if s.kind is Kind.ROUTER]


def exact_routers(tensors: dict[str, Weight], dtype: torch.dtype) -> dict[str, Weight]:
    """Each fp32 router weight in `dtype` where that copy holds every value exactly."""
    for name, value in tensors.items():
        if (isinstance(value, torch.Tensor) and value.dtype == torch.float32 and dtype != torch.float32
                and any(p.match(name) for p in _ROUTERS)):
            low = value.to(dtype)
            if torch.equal(low.float(), value):
                tensors[name] = low
    return tensors


def _json_config(path: str | Path) -> FlintConfig:
    try:
        return FlintConfig.from_json(path)
    except ConfigError as e:
        raise CheckpointError(str(e)) from None
