"""SwiGLU activation: silu(gate) * up on a fused [T, 2I] gate_up projection (dense MLP layers;
the MoE kernels apply `silu_mul_rounded` in their epilogues)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from .pdl import launch_args, pdl_prologue

BLOCK = 1024


@triton.jit
def silu_mul_rounded(gate, up, dtype: tl.constexpr):
    """silu(gate) * up in fp32 math with the reference's roundings to `dtype`: gate(x) and up(x)
    (linear outputs), silu, and the product."""
    g = gate.to(dtype).to(tl.float32)
    u = up.to(dtype).to(tl.float32)
    s = (g / (1.0 + tl.exp(-g))).to(dtype).to(tl.float32)
    return (s * u).to(dtype)


@triton.jit
def _silu_mul_kernel(
    gate_up_ptr,  # [T, 2I]
    out_ptr,      # [T, I], contiguous
    I, stride_t,
    BLOCK: tl.constexpr,
    PDL: tl.constexpr,
):
    pdl_prologue(PDL)
    t = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < I
    gate = tl.load(gate_up_ptr + t * stride_t + cols, mask=mask, other=0.0)
    up = tl.load(gate_up_ptr + t * stride_t + I + cols, mask=mask, other=0.0)
    tl.store(out_ptr + t * I + cols, silu_mul_rounded(gate, up, out_ptr.dtype.element_ty), mask=mask)


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """gate_up [T, 2I] (gate columns first) -> [T, I] in gate_up's dtype."""
    _check_inputs(gate_up)
    t, two_i = gate_up.shape
    out = torch.empty((t, two_i // 2), dtype=gate_up.dtype, device=gate_up.device)
    if t == 0:
        return out
    block = min(BLOCK, triton.next_power_of_2(two_i // 2))
    _silu_mul_kernel[(t, triton.cdiv(two_i // 2, block))](
        gate_up_ptr=gate_up, out_ptr=out, I=two_i // 2, stride_t=gate_up.stride(0), BLOCK=block,
        **launch_args(gate_up.device), num_warps=4)
    return out


def silu_mul_torch(gate_up: torch.Tensor) -> torch.Tensor:
    """gate_up [T, 2I] (gate columns first) -> [T, I], rounded like the reference's
    silu(gate(x)) * up(x) in the input dtype."""
    _check_inputs(gate_up)
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up


def _check_inputs(gate_up):
    if gate_up.dim() != 2 or gate_up.shape[1] % 2 or gate_up.stride(-1) != 1:
        raise ValueError(f"silu_mul: gate_up has shape {tuple(gate_up.shape)} strides {gate_up.stride()}, "
                         "expected [T, 2I] with unit stride")
