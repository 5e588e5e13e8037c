"""HF-layout checkpoints: memory-mapped safetensors, checked against the schema, streamed.

`SafetensorsCheckpoint` reads `model.safetensors.index.json` (or a single `model.safetensors`),
checks every tensor name, shape and dtype against the schema from the shard headers alone, and
then hands out tensors one at a time: `load()` walks shard by shard, copying each tensor
straight from the memory map to the device (routed experts into their stacked [E, N, K] slot),
so the host never holds more than one tensor.

Names: the Hub's (one tensor per routed expert, `self_attn.softmax_offset`: what
`save_pretrained` writes) or transformers' in-memory ones (`schema.ALIASES`: fused
`mlp.experts.gate_up_proj` / `down_proj`, `self_attn.sinks`), chosen tensor by tensor.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors import safe_open
from tqdm import tqdm

from flint_backend.config import FlintConfig
from flint_backend.weights.safetensors_writer import INDEX_FILE
from flint_backend.weights.schema import (
    CheckpointError, Scope, aliases, check_names, check_shape, checkpoint_tensors, expert_names, loaded_tensors,
    storage_dtype,
)

SINGLE_FILE = "model.safetensors"
_FLOAT_DTYPES = ("BF16", "F16", "F32", "F64")


class SafetensorsCheckpoint:
    def __init__(self, directory: str | Path, config: FlintConfig):
        self.directory = Path(directory)
        self.config = config
        self.weight_map = self._read_weight_map()          # stored name -> shard file name
        self.specs = {name: (shape, spec) for name, shape, spec in checkpoint_tensors(config)}
        self.loaded = {t.name: t for t in loaded_tensors(config)}
        self.aliases = {name: parts for name, parts in aliases(config).items() if name in self.weight_map}
        self.alias_of = {part: name for name, parts in self.aliases.items() for part in parts}
        check_names(self._expected_names(), list(self.weight_map), str(self.directory))
        self._check_shards()
        self._open: tuple[str, object] | None = None        # (shard, safe_open handle) for get()
        self._fused: tuple[str, torch.Tensor] | None = None  # the last alias tensor get() read

    def _read_weight_map(self) -> dict[str, str]:
        index = self.directory / INDEX_FILE
        if index.is_file():
            try:
                weight_map = json.loads(index.read_text())["weight_map"]
            except (json.JSONDecodeError, KeyError, TypeError) as e:
                raise CheckpointError(f"{index}: expected JSON with a 'weight_map' object ({e!r})") from None
            return dict(weight_map)
        single = self.directory / SINGLE_FILE
        if single.is_file():
            with safe_open(single, framework="pt") as f:
                return {name: SINGLE_FILE for name in f.keys()}
        raise CheckpointError(f"{self.directory}: neither {INDEX_FILE} nor {SINGLE_FILE} found")

    def _expected_names(self) -> list[str]:
        """The stored names this checkpoint must have: per loaded tensor, its Hub name(s), or the
        transformers name that holds it."""
        names: list[str] = []
        for t in self.loaded.values():
            if t.name in self.alias_of:
                alias = self.alias_of[t.name]
                if alias not in names:
                    names.append(alias)
            elif t.spec.scope is Scope.EXPERT:
                names.extend(expert_names(self.config, t))
            else:
                names.append(t.name)
        return names

    def _expected_shape(self, name: str) -> tuple[int, ...]:
        if name in self.aliases:
            shapes = [self.loaded[p].shape for p in self.aliases[name]]
            if len(shapes) == 1:
                return tuple(shapes[0])
            return (*shapes[0][:-2], sum(s[-2] for s in shapes), shapes[0][-1])
        return tuple(self.specs[name][0])

    def shards(self) -> dict[str, list[str]]:
        """Shard file -> its tensor names, in index order."""
        by_shard: dict[str, list[str]] = {}
        for name, shard in self.weight_map.items():
            by_shard.setdefault(shard, []).append(name)
        return by_shard

    def _check_shards(self) -> None:
        for shard, names in self.shards().items():
            path = self.directory / shard
            if not path.is_file():
                raise CheckpointError(f"{path}: shard named by {INDEX_FILE} is missing (holds e.g. {names[:3]})")
            try:
                with safe_open(path, framework="pt") as f:
                    present = set(f.keys())
                    for name in names:
                        if name not in present:
                            raise CheckpointError(f"{path}: tensor {name!r} listed in {INDEX_FILE} is not in the shard")
                        meta = f.get_slice(name)
                        if meta.get_dtype() not in _FLOAT_DTYPES:
                            raise CheckpointError(f"{path}: tensor {name!r} has dtype {meta.get_dtype()}, "
                                                  f"expected one of {_FLOAT_DTYPES}")
                        check_shape(name, self._expected_shape(name), tuple(meta.get_shape()), str(path))
            except CheckpointError:
                raise
            except Exception as e:  # safetensors raises its own error types for corrupt headers
                raise CheckpointError(f"{path}: not a readable safetensors file ({e})") from None

    def _read(self, name: str) -> torch.Tensor:
        shard = self.weight_map[name]
        if self._open is None or self._open[0] != shard:
            self._open = (shard, safe_open(self.directory / shard, framework="pt"))
        return self._open[1].get_tensor(name)

    def get(self, name: str) -> torch.Tensor:
        """One tensor by Hub name (per-expert for routed experts), as stored; cut out of the
        transformers tensor that holds it when the checkpoint uses those names. Keeps the last
        shard open: call in shard order."""
        if name in self.weight_map:
            return self._read(name)
        spec = self.specs[name][1]
        loaded, expert = name, None
        if spec.scope is Scope.EXPERT:
            parts = name.split(".")
            loaded, expert = ".".join(parts[:5] + parts[6:]), int(parts[5])
        alias = self.alias_of[loaded]
        if self._fused is None or self._fused[0] != alias:
            self._fused = (alias, self._read(alias))
        part = self._split(alias, self._fused[1])[loaded]
        return part if expert is None else part[expert]

    def _split(self, alias: str, tensor: torch.Tensor) -> dict[str, torch.Tensor]:
        """An alias tensor -> its loaded tensors (split along dim -2)."""
        parts = self.aliases[alias]
        if len(parts) == 1:
            return {parts[0]: tensor}
        sizes = [self.loaded[p].shape[-2] for p in parts]
        return dict(zip(parts, tensor.split(sizes, dim=-2)))

    def load(self, device: str | torch.device, dtype: torch.dtype, progress: bool = True) -> dict[str, torch.Tensor]:
        """Loaded-checkpoint naming (routed experts stacked), each tensor in its storage dtype."""
        out: dict[str, torch.Tensor] = {}
        stacked = {t.name: t for t in self.loaded.values() if t.spec.scope is Scope.EXPERT}
        slots = {hf: (t.name, e) for t in stacked.values() for e, hf in enumerate(expert_names(self.config, t))}
        bar = tqdm(total=len(self.weight_map), desc=f"loading {self.directory.name}", unit="t", disable=not progress)
        for shard, names in self.shards().items():
            with safe_open(self.directory / shard, framework="pt", device=str(device)) as f:
                for name in names:
                    tensor = f.get_tensor(name)
                    if name in self.aliases:
                        for part, value in self._split(name, tensor).items():
                            out[part] = value.to(storage_dtype(self.loaded[part].spec.kind, dtype)).contiguous()
                    elif name in slots:
                        key, expert = slots[name]
                        if key not in out:
                            out[key] = torch.empty(stacked[key].shape, dtype=storage_dtype(stacked[key].spec.kind, dtype),
                                                   device=device)
                        out[key][expert] = tensor
                    else:
                        out[name] = tensor.to(storage_dtype(self.specs[name][1].kind, dtype))
                    bar.update()
        bar.close()
        return {name: out[name] for name in self.loaded}  # schema order
