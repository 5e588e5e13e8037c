"""SwiGLU activation: silu(gate) * up on a fused [T, 2I] gate_up projection (dense MLP layers;
the MoE kernels apply `silu_mul_rounded` in their epilogues, and the decode GEMVs of the dense
MLP's down projection apply `silu_mul_at` to the activations they load).

Numerics are transformers' FlintMLP in the activations' dtype: gate(x) and up(x) are linear
outputs rounded to it, silu(gate) is computed in fp32 and rounded, the product rounded. (vLLM's
reference runtime keeps gate/up in fp32 and rounds silu(g) * u once; transformers, our oracle,
rounds as here.) Triton's exp is not torch's: silu may differ in the last bit before rounding.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from .pdl import launch_args, pdl_prologue

BLOCK = 1024


@triton.jit
def silu_mul_rounded(gate, up, dtype: tl.constexpr):
    """silu(gate) * up in fp32 math with transformers' roundings to `dtype`: gate(x) and up(x)
    (linear outputs), silu, and the product."""
    g = gate.to(dtype).to(tl.float32)
    u = up.to(dtype).to(tl.float32)
    s = (g / (1.0 + tl.exp(-g))).to(dtype).to(tl.float32)
    return (s * u).to(dtype)


@triton.jit
def silu_mul_at(gate_ptr, offs, mask, I):
    """silu(gate) * up at columns offs of one fused gate_up row (gate at gate_ptr + offs, up I
    columns on), rounded as silu_mul_rounded in the row's dtype: the values silu_mul stores, for
    a GEMV that loads them itself. Masked columns read as 0."""
    gate = tl.load(gate_ptr + offs, mask=mask, other=0.0)
    up = tl.load(gate_ptr + I + offs, mask=mask, other=0.0)
    return silu_mul_rounded(gate, up, gate.dtype)


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
    tl.store(out_ptr + t * I + cols, silu_mul_at(gate_up_ptr + t * stride_t, cols, mask, I), mask=mask)


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """gate_up [T, 2I] (gate columns first) -> [T, I] in gate_up's dtype."""
    check_gate_up(gate_up)
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
    """gate_up [T, 2I] (gate columns first) -> [T, I], rounded like transformers'
    act_fn(gate_proj(x)) * up_proj(x) in the input dtype."""
    check_gate_up(gate_up)
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up


def gate_half(gate_up: torch.Tensor, where: str) -> torch.Tensor:
    """A checked fused gate_up [T, 2I] -> its gate half [T, I], a view with gate_up's row stride
    (what a GEMV folding the SwiGLU takes as its x; the up half lies I columns on)."""
    check_gate_up(gate_up, where)
    return gate_up[:, :gate_up.shape[1] // 2]


def check_gate_up(gate_up, where: str = "silu_mul"):
    if gate_up.dim() != 2 or gate_up.shape[1] % 2 or gate_up.stride(-1) != 1:
        raise ValueError(f"{where}: gate_up has shape {tuple(gate_up.shape)} strides {gate_up.stride()}, "
                         "expected [T, 2I] with unit stride")
