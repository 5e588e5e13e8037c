"""A loaded checkpoint as transformers' FlintForCausalLM holds it: the oracle's weights.

    model = transformers.FlintForCausalLM(transformers.FlintConfig(**ckpt.config.to_dict()))
    model.load_state_dict(transformers_state_dict(ckpt.tensors))

Names become transformers' in-memory ones (schema.ALIASES: the routed experts fused into
`mlp.experts.gate_up_proj` [E, 2I, H] and `down_proj` [E, H, I], the sinks as
`self_attn.sinks`); NVFP4 weights are dequantised exactly as nvfp4.NVFP4Weight documents
(fp32), so the oracle computes with precisely the weights the W4A16 kernels decode.
"""

from __future__ import annotations

import torch

from flint_backend.config import FlintConfig
from flint_backend.weights.nvfp4 import NVFP4Weight
from flint_backend.weights.schema import aliases

Weight = torch.Tensor | NVFP4Weight
_FP32_NAMES = ("self_attn.softmax_offset", "mlp.gate.weight")  # transformers' _keep_in_fp32_modules_strict


def transformers_state_dict(tensors: dict[str, Weight], config: FlintConfig,
                            dtype: torch.dtype = torch.float32) -> dict[str, torch.Tensor]:
    """Loaded tensors (routed experts stacked) -> transformers' state dict in `dtype` (the sinks
    and router weights in fp32, as transformers keeps them)."""
    dense = {name: (value.dequantize(torch.float32) if isinstance(value, NVFP4Weight) else value)
             .to(torch.float32 if name.endswith(_FP32_NAMES) else dtype) for name, value in tensors.items()}
    out: dict[str, torch.Tensor] = {}
    held = set()
    for alias, parts in aliases(config).items():
        out[alias] = torch.cat([dense[p] for p in parts], dim=-2) if len(parts) > 1 else dense[parts[0]]
        held.update(parts)
    out.update({name: value for name, value in dense.items() if name not in held})
    return out
