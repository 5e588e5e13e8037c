"""Writes a Flint GGUF (BF16 or NVFP4) tensor by tensor, never holding the model in host memory.

Tensor types (the llama.cpp convention):
  F32    norms, attention sinks, router weight;
  BF16   embedding, every linear with outtype "bf16";
  NVFP4  attention projections, dense MLP, shared and routed experts and the LM head with outtype "nvfp4",
         each followed by its F32 global-scale tensor `<name>.scale` ([1], or [E] for stacked
         experts). A linear whose K is not a multiple of 64 (ggml's NVFP4 super-block) stays
         BF16, as llama.cpp falls back for rows that do not fill whole blocks.
Routed experts are stacked per layer into `blk.N.ffn_{gate,up,down}_exps.weight` [E, N, K].

All tensor infos go into the header first (sizes are known from the config), then each tensor
is produced by `source` (HF name -> tensor), converted on `device`, and written.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import torch
from gguf import GGML_QUANT_VERSION, GGMLQuantizationType, GGUFWriter, LlamaFileType
from tqdm import tqdm

from flint_backend.config import FlintConfig
from flint_backend.weights.gguf_metadata import ARCH, write_metadata
from flint_backend.weights.nvfp4 import GGML_BLOCK, GGML_BLOCK_BYTES, to_ggml_blocks
from flint_backend.weights.nvfp4_quantize import quantize_nvfp4
from flint_backend.weights.schema import (
    SCALE_SUFFIX, Kind, LoadedTensor, Scope, expert_names, gguf_companion, loaded_tensors, nvfp4_eligible,
)

OUTTYPES = ("bf16", "nvfp4")
_F32_KINDS = frozenset({Kind.NORM, Kind.SINK, Kind.ROUTER})
log = logging.getLogger(__name__)

TensorSource = Callable[[str], torch.Tensor]  # HF name (per-expert for routed experts) -> tensor


@dataclass(frozen=True)
class PlannedTensor:
    tensor: LoadedTensor
    qtype: GGMLQuantizationType

    @property
    def byte_shape(self) -> tuple[int, ...]:
        *lead, k = self.tensor.shape
        if self.qtype is GGMLQuantizationType.NVFP4:
            return (*lead, k // GGML_BLOCK * GGML_BLOCK_BYTES)
        if self.qtype is GGMLQuantizationType.BF16:
            return (*lead, k * 2)
        return tuple(self.tensor.shape)

    @property
    def scale_shape(self) -> tuple[int, ...]:
        return (self.tensor.shape[0],) if self.tensor.spec.scope is Scope.EXPERT else (1,)


def plan_tensors(config: FlintConfig, outtype: str) -> list[PlannedTensor]:
    if outtype not in OUTTYPES:
        raise ValueError(f"outtype: got {outtype!r}, expected one of {OUTTYPES}")
    plan = []
    for t in loaded_tensors(config):
        if t.spec.kind in _F32_KINDS:
            qtype = GGMLQuantizationType.F32
        elif outtype == "nvfp4" and nvfp4_eligible(t.spec) and t.shape[-1] % GGML_BLOCK == 0:
            qtype = GGMLQuantizationType.NVFP4
        else:
            qtype = GGMLQuantizationType.BF16
        plan.append(PlannedTensor(t, qtype))
    kept = [p.tensor.gguf for p in plan if outtype == "nvfp4" and p.qtype is GGMLQuantizationType.BF16
            and nvfp4_eligible(p.tensor.spec)]
    if kept:
        log.warning("NVFP4 needs K %% %d == 0; %d tensor(s) stay BF16, e.g. %s", GGML_BLOCK, len(kept), kept[:3])
    return plan


def write_gguf(path: Path, config: FlintConfig, source: TensorSource, *, outtype: str,
               device: str | torch.device = "cpu", progress: bool = True) -> list[PlannedTensor]:
    """Write `path`; returns the plan (which tensor got which ggml type)."""
    plan = plan_tensors(config, outtype)
    writer = GGUFWriter(path=None, arch=ARCH)
    writer.add_file_type(LlamaFileType.MOSTLY_NVFP4 if outtype == "nvfp4" else LlamaFileType.MOSTLY_BF16)
    writer.add_quantization_version(GGML_QUANT_VERSION)
    write_metadata(writer, config)
    for p in plan:
        dtype = np.float32 if p.qtype is GGMLQuantizationType.F32 else np.uint8
        nbytes = int(np.prod(p.byte_shape)) * np.dtype(dtype).itemsize
        raw = None if p.qtype is GGMLQuantizationType.F32 else p.qtype
        writer.add_tensor_info(p.tensor.gguf, p.byte_shape, np.dtype(dtype), nbytes, raw_dtype=raw)
        if p.qtype is GGMLQuantizationType.NVFP4:
            scale_bytes = 4 * int(np.prod(p.scale_shape))
            writer.add_tensor_info(gguf_companion(p.tensor.gguf, SCALE_SUFFIX), p.scale_shape,
                                   np.dtype(np.float32), scale_bytes)
    writer.write_header_to_file(path=Path(path))
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for p in tqdm(plan, desc=f"writing {Path(path).name}", unit="t", disable=not progress):
        for array in _file_arrays(p, _fetch(config, p.tensor, source, device)):
            writer.write_tensor_data(array)
    writer.close()
    return plan


def _fetch(config: FlintConfig, t: LoadedTensor, source: TensorSource, device) -> torch.Tensor:
    """The HF tensor(s) behind one GGUF tensor on `device`; routed experts stacked [E, N, K]."""
    if t.spec.scope is not Scope.EXPERT:
        return source(t.name).to(device)
    names = expert_names(config, t)
    first = source(names[0]).to(device)
    stacked = torch.empty((len(names), *first.shape), dtype=first.dtype, device=device)
    stacked[0] = first
    for e, name in enumerate(names[1:], start=1):
        stacked[e] = source(name)
    return stacked


def _file_arrays(p: PlannedTensor, w: torch.Tensor) -> list[np.ndarray]:
    """The tensor's bytes as the GGUF stores them (NVFP4: blocks, then the `.scale` tensor)."""
    if tuple(w.shape) != tuple(p.tensor.shape):
        raise ValueError(f"{p.tensor.name}: source tensor has shape {tuple(w.shape)}, expected {p.tensor.shape}")
    if p.qtype is GGMLQuantizationType.F32:
        return [w.float().cpu().numpy()]
    if p.qtype is GGMLQuantizationType.BF16:
        return [w.to(torch.bfloat16).contiguous().view(torch.uint8).cpu().numpy()]
    try:
        q = quantize_nvfp4(w)
    except ValueError as e:
        raise ValueError(f"{p.tensor.name}: {e}") from None
    return [to_ggml_blocks(q).cpu().numpy(), q.scale.reshape(p.scale_shape).cpu().numpy()]
