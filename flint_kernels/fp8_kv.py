"""FP8 (E4M3) KV cache: how K and V are quantised, in Triton and in torch.

A layer's K (and V) are stored as E4M3 codes of k / scale, with one scale per layer for K and one
for V (kv_cache.py). Scales are powers of two, so a code times its scale is exact in bf16 and
fp32: dequantising (`code * scale`) needs no rounding, and the K/V the attention reads back from
the cache equal the K/V this step's tokens attend to (qk_norm_rope hands out the quantised values
with the cache write). So a token sees the same keys whether they come from the cache, from its
own chunk, or from a prefix-cache hit.

Quantising rounds half to even and saturates at +-448 (E4M3's largest finite value), as a GPU's
cvt.rn.satfinite does and as torch's conversion does for values in range. `e4m3_round` does it
in fp32 arithmetic: Triton's interpreter (3.6) mis-rounds float8 conversions whose rounding
carries into the exponent (1.97 -> 1.0), so the kernels convert only values already on the
E4M3 grid.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

E4M3_MAX = 448.0
FP8_DTYPE = torch.float8_e4m3fn


@triton.jit
def e4m3_round(x):
    """x fp32 -> the nearest E4M3 value as fp32 (half to even; saturating at +-448), its sign kept
    where it rounds to zero (-0.0, as torch's conversion gives)."""
    sign = x.to(tl.int32, bitcast=True) & -2147483648  # the sign bit (-0.0's too)
    a = tl.minimum(tl.abs(x), 448.0)
    exponent = ((a.to(tl.int32, bitcast=True) >> 23) & 0xFF) - 127
    step_exponent = tl.maximum(exponent, -6) - 3  # 3 mantissa bits; subnormals step 2^-9
    step = ((step_exponent + 127) << 23).to(tl.float32, bitcast=True)
    y = a / step  # exact: a power of two, y < 16
    y = ((y + 12582912.0) - 12582912.0) * step  # to the nearest integer, half to even (1.5 * 2^23)
    return (y.to(tl.int32, bitcast=True) | sign).to(tl.float32, bitcast=True)  # y >= 0: the sign put back


def quantize_torch(x: torch.Tensor, scale: float) -> torch.Tensor:
    """x (any float dtype) -> E4M3 codes of x / scale (half to even, saturating)."""
    return (x.float() / scale).clamp(-E4M3_MAX, E4M3_MAX).to(FP8_DTYPE)


def dequantize_torch(codes: torch.Tensor, scale: float, dtype: torch.dtype) -> torch.Tensor:
    """E4M3 codes -> codes * scale in `dtype` (exact for a power-of-two scale)."""
    return (codes.float() * scale).to(dtype)


def index_copy_rows(cache: torch.Tensor, index: torch.Tensor, rows: torch.Tensor) -> None:
    """cache[index] = rows along dim 0, float8 too (torch's CPU index_copy_ has no float8: as bytes)."""
    if cache.dtype == FP8_DTYPE:
        cache, rows = cache.view(torch.uint8), rows.view(torch.uint8)
    cache.index_copy_(0, index, rows)


def check_scale(name: str, scale: float) -> None:
    """Scales are powers of two (exact dequantisation); ValueError naming the field otherwise."""
    mantissa, _ = math.frexp(scale)
    if not scale > 0 or mantissa != 0.5:
        raise ValueError(f"{name}: got {scale!r}, expected a power of two > 0 (an exact FP8 KV scale)")
