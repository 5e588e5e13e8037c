"""Writes an HF-layout checkpoint: sharded *.safetensors + model.safetensors.index.json.

Tensors arrive one at a time and a shard is flushed as soon as it is full, so host memory
holds at most one shard (the full-size model is 80 GB in bf16).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Iterable

import torch
from safetensors.torch import save_file
from tqdm import tqdm

INDEX_FILE = "model.safetensors.index.json"
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMG]?i?B?)\s*$", re.IGNORECASE)
_UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "KIB": 2**10, "MIB": 2**20, "GIB": 2**30}


def parse_size(text: str) -> int:
    """'5GB' -> 5_000_000_000, '500MiB' -> 524_288_000, '1000' -> 1000."""
    match = _SIZE.match(str(text))
    unit = match.group(2).upper() if match else None
    if unit is not None and unit in ("K", "M", "G"):
        unit += "B"
    if not match or unit not in _UNITS:
        raise ValueError(f"shard size: got {text!r}, expected a size such as '5GB', '500MB' or '2GiB'")
    return int(float(match.group(1)) * _UNITS[unit])


def write_sharded(tensors: Iterable[tuple[str, torch.Tensor]], out_dir: Path, shard_bytes: int,
                  total: int | None = None) -> dict:
    """Write tensors into model-XXXXX-of-YYYYY.safetensors shards; returns the index dict."""
    out_dir.mkdir(parents=True, exist_ok=True)
    shards: list[list[str]] = []
    weight_map: dict[str, int] = {}
    pending: dict[str, torch.Tensor] = {}
    pending_bytes = total_bytes = 0

    def flush():
        nonlocal pending, pending_bytes
        if pending:
            save_file(pending, str(out_dir / f"shard-{len(shards):05d}.tmp"), metadata={"format": "pt"})
            shards.append(list(pending))
            pending, pending_bytes = {}, 0

    for name, tensor in tqdm(tensors, total=total, desc="tensors", unit="t", leave=False):
        size = tensor.numel() * tensor.element_size()
        if pending and pending_bytes + size > shard_bytes:
            flush()
        pending[name] = tensor.contiguous().cpu()
        pending_bytes += size
        total_bytes += size
        weight_map[name] = len(shards)
    flush()

    names = [f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors" for i in range(len(shards))]
    for i, name in enumerate(names):
        (out_dir / f"shard-{i:05d}.tmp").rename(out_dir / name)
    index = {"metadata": {"total_size": total_bytes},
             "weight_map": {tensor: names[shard] for tensor, shard in weight_map.items()}}
    (out_dir / INDEX_FILE).write_text(json.dumps(index, indent=2) + "\n")
    return index
