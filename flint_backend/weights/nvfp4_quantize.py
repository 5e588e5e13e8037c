"""BF16/FP32 weights -> NVFP4 (the converter's quantiser; ggml ships only the dequantiser).

The ModelOpt recipe, which llama.cpp's converter carries over unchanged:
  global scale  g = amax(|W|) / (6 * 448)  per tensor, per expert for stacked experts, so the
                largest block scale lands on E4M3's largest finite value (448) and the block
                scales use the whole E4M3 range;
  block scale   s = E4M3(amax(|block of 16|) / (6 g)), round to nearest even (<= 448);
  code          q = E2M1(w / (s g)), round to nearest, ties to the even code, |q| <= 6.
Dequantised: w' = q * s * g (nvfp4.py). All-zero tensors get g = 1 and all-zero codes.
"""

from __future__ import annotations

import torch

from flint_backend.weights.nvfp4 import E2M1_MAGNITUDES, E2M1_MAX, E4M3_MAX, GROUP, NVFP4Weight, pack_codes

# Midpoints between neighbouring magnitudes; a tie goes to the neighbour with an even index.
_MIDPOINTS = tuple((a + b) / 2 for a, b in zip(E2M1_MAGNITUDES, E2M1_MAGNITUDES[1:]))
_CHUNK_ELEMENTS = 1 << 24  # bounds the fp32/int64 temporaries (the full model quantises on a GPU)


def e2m1_codes(x: torch.Tensor) -> torch.Tensor:
    """fp32 values in units of the block scale -> E2M1 codes uint8 (bit 3 sign; -0 becomes +0)."""
    mids = torch.tensor(_MIDPOINTS, dtype=torch.float32, device=x.device)
    mag = x.abs()
    idx = torch.bucketize(mag, mids)                           # ties -> lower index
    at_mid = idx < len(_MIDPOINTS)
    tie = at_mid & (mag == mids[idx.clamp(max=len(_MIDPOINTS) - 1)]) & (idx % 2 == 1)
    idx = idx + tie.long()                                     # odd lower index: tie goes up
    sign = ((x < 0) & (idx > 0)).to(torch.uint8) << 3
    return idx.to(torch.uint8) | sign


def global_scale(w: torch.Tensor) -> torch.Tensor:
    """[..., N, K] -> fp32 [...]: amax / (6 * 448), or 1 for an all-zero matrix."""
    amax = w.detach().abs().flatten(-2).amax(-1).float()
    if not bool(torch.isfinite(amax).all()):
        raise ValueError("quantize_nvfp4: the weight holds inf or NaN")
    return torch.where(amax > 0, amax / (E2M1_MAX * E4M3_MAX), torch.ones_like(amax))


def quantize_nvfp4(w: torch.Tensor) -> NVFP4Weight:
    """W [..., N, K] (K % 16 == 0), any float dtype, on any device -> NVFP4Weight on that device."""
    *lead, n, k = w.shape
    if k % GROUP:
        raise ValueError(f"quantize_nvfp4: K={k}, expected a multiple of {GROUP}")
    g = global_scale(w)                                         # [...]
    rows = w.reshape(-1, k)                                     # [M, K], M = prod(lead) * N
    row_g = g.reshape(-1, 1).expand(-1, n).reshape(-1)          # [M]
    packed = torch.empty(rows.shape[0], k // 2, dtype=torch.uint8, device=w.device)
    scales = torch.empty(rows.shape[0], k // GROUP, dtype=torch.float8_e4m3fn, device=w.device)
    step = max(1, _CHUNK_ELEMENTS // k)
    for r in range(0, rows.shape[0], step):
        packed[r:r + step], scales[r:r + step] = _quantize_rows(rows[r:r + step].float(), row_g[r:r + step])
    return NVFP4Weight(packed.reshape(*lead, n, k // 2), scales.reshape(*lead, n, k // GROUP), g)


def _quantize_rows(rows: torch.Tensor, g: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """fp32 [M, K], global scale [M] -> packed uint8 [M, K/2], E4M3 scales [M, K/16]."""
    blocks = rows.unflatten(-1, (-1, GROUP))                    # [M, K/16, 16]
    wanted = blocks.abs().amax(-1) / (E2M1_MAX * g[:, None])    # [M, K/16]
    scales = wanted.clamp(max=E4M3_MAX).to(torch.float8_e4m3fn)
    unit = scales.float() * g[:, None]                          # value of E2M1 1.0 in each block
    x = torch.where(unit[..., None] > 0, blocks / unit[..., None], torch.zeros_like(blocks))
    return pack_codes(e2m1_codes(x).flatten(-2)), scales
