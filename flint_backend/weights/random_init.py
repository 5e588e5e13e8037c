"""Deterministic random weights of the real shapes, for tests, checkpoints and GPU benchmarks.

Each tensor has its own generator seeded from (seed, name), so a tensor's values do not
depend on sharding, order or which other tensors are built. Scales keep activations in a
sane range through every layer: unit-RMS inputs to every projection give unit-variance
outputs, residual-writing projections are halved, sinks are O(1) so that they visibly matter.
"""

from __future__ import annotations

import math
import zlib
from typing import Iterator

import torch

from flint_backend.config import FlintConfig
from flint_backend.weights.nvfp4 import GGML_BLOCK, NVFP4Weight
from flint_backend.weights.nvfp4_quantize import quantize_nvfp4
from flint_backend.weights.schema import Kind, Scope, checkpoint_tensors, nvfp4_eligible, storage_dtype

Weight = torch.Tensor | NVFP4Weight

OUTPUT_SCALE = 0.5  # o_proj / down_proj: keep the residual stream from growing layer over layer
NORM_JITTER = 0.1   # norm weights 1 + N(0, 0.1): a test notices a norm whose weight is ignored


def _generator(seed: int, name: str, device: torch.device) -> torch.Generator:
    g = torch.Generator(device=device)
    g.manual_seed((seed * 1_000_003 + zlib.crc32(name.encode())) % (2**63))
    return g


def random_tensor(name: str, shape: tuple[int, ...], kind: Kind, seed: int = 0,
                  device: str | torch.device = "cpu") -> torch.Tensor:
    """fp32 values for one checkpoint tensor (CPU and CUDA generators give different streams)."""
    device = torch.device(device)
    x = torch.randn(shape, generator=_generator(seed, name, device), device=device, dtype=torch.float32)
    if kind is Kind.EMBEDDING:
        return x
    if kind is Kind.NORM:
        return 1.0 + NORM_JITTER * x
    if kind is Kind.SINK:
        return x
    scale = 1.0 / math.sqrt(shape[-1])  # LINEAR, OUTPUT, ROUTER: fan-in scaling
    if kind is Kind.OUTPUT:
        scale *= OUTPUT_SCALE
    return x * scale


def random_weights(config: FlintConfig, seed: int = 0, dtype: torch.dtype = torch.bfloat16,
                   device: str | torch.device = "cpu") -> Iterator[tuple[str, torch.Tensor]]:
    """(HF name, tensor) for every checkpoint tensor, stored as a checkpoint stores it."""
    for name, shape, spec in checkpoint_tensors(config):
        yield name, random_tensor(name, shape, spec.kind, seed, device).to(storage_dtype(spec.kind, dtype))


def random_stacked_weights(config: FlintConfig, seed: int = 0, dtype: torch.dtype = torch.bfloat16,
                           device: str | torch.device = "cpu", nvfp4: bool = False) -> dict[str, Weight]:
    """The same values as random_weights, in the engine's layout: each MoE layer's routed experts
    stacked as `model.layers.{i}.mlp.experts.{gate,up,down}_proj.weight` [E, N, K].

    nvfp4=True quantises what an NVFP4 GGUF quantises (nvfp4_eligible, K a multiple of 64) as
    soon as each tensor is built, so the full model never exists in BF16 (GPU benchmarks)."""
    out: dict[str, Weight] = {}
    stacks: dict[str, tuple] = {}  # stacked name -> (spec, per-expert tensors)

    def keep(name: str, tensor: torch.Tensor, spec) -> None:
        quantize = nvfp4 and nvfp4_eligible(spec) and tensor.shape[-1] % GGML_BLOCK == 0
        out[name] = quantize_nvfp4(tensor) if quantize else tensor

    def flush() -> None:  # a layer's expert stacks are complete once a non-expert tensor follows
        for name, (spec, tensors) in stacks.items():
            keep(name, torch.stack(tensors), spec)
        stacks.clear()

    for name, shape, spec in checkpoint_tensors(config):
        tensor = random_tensor(name, shape, spec.kind, seed, device).to(storage_dtype(spec.kind, dtype))
        if spec.scope is Scope.EXPERT:
            parts = name.split(".")
            stacks.setdefault(".".join(parts[:5] + parts[6:]), (spec, []))[1].append(tensor)
        else:
            flush()
            keep(name, tensor, spec)
    flush()
    return out
