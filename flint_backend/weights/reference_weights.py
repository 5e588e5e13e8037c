"""The W4A16 oracle's weights: a loaded checkpoint as a plain state dict for reference.build_reference.

NVFP4 weights are dequantised exactly as nvfp4.NVFP4Weight documents (fp32), so the reference
model computes with precisely the weights the W4A16 kernels decode; routed experts are
unstacked to per-expert HF names.

    ref = build_reference(ckpt.config, reference_state_dict(ckpt.tensors), dtype=torch.float32)
"""

from __future__ import annotations

import torch

from flint_backend.weights.loader import Weight, unstack_experts
from flint_backend.weights.nvfp4 import NVFP4Weight


def reference_state_dict(tensors: dict[str, Weight], dtype: torch.dtype = torch.float32) -> dict[str, torch.Tensor]:
    """HF name -> dense tensor; NVFP4 dequantised to `dtype` (fp32 keeps the decoded values exact)."""
    return {name: value.dequantize(dtype) if isinstance(value, NVFP4Weight) else value
            for name, value in unstack_experts(tensors).items()}
