"""SwiGLU activation: silu(gate) * up on a fused [T, 2I] gate_up projection."""

import torch
import torch.nn.functional as F


def silu_mul_torch(gate_up: torch.Tensor) -> torch.Tensor:
    """gate_up [T, 2I] (gate columns first) -> [T, I], rounded like the reference's
    silu(gate(x)) * up(x) in the input dtype."""
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up
