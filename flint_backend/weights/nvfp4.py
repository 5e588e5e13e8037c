"""NVFP4 weights in the layout the W4A16 Triton kernels read, and the lossless ggml repack.

Layout of an NVFP4Weight holding W [..., N, K] (y = x @ W.T; `...` is empty for a matrix and
[E] for a layer's stacked routed experts). This is the contract with the W4A16 kernels.

    packed  uint8          [..., N, K/2]   row-major, contiguous
    scales  float8_e4m3fn  [..., N, K/16]  row-major, contiguous
    scale   float32        [...] or [..., N]   per tensor: 0-dim for a matrix, [E] for stacked
                                               experts; or per output row (`concat_rows` fuses
                                               q/k/v or gate/up, each with its own global scale)

  packed: element k of row n lives in byte packed[..., n, k // 2]: the LOW nibble holds even k,
    the HIGH nibble odd k (the ModelOpt / vLLM / PyTorch float4_e2m1fn_x2 order). A nibble is an
    E2M1 code: bit 3 = sign, bits 0-2 = magnitude index into E2M1_MAGNITUDES =
    [0, 0.5, 1, 1.5, 2, 3, 4, 6]. Code 8 (-0) decodes to +0.0. A row is K/2 contiguous bytes, so
    one 16-byte load reads 32 consecutive k of one row = exactly two scale groups; rows start
    16-byte aligned whenever K % 32 == 0 (all Flint shapes).
  scales: scales[..., n, g] is the block scale of k in [16 g, 16 g + 16), a standard OCP
    float8 E4M3 (torch.float8_e4m3fn / Triton tl.float8e4nv), always finite and >= 0, never NaN
    (0x7F, which ggml's UE4M3 reads as 0, is stored as 0x00). One byte per 16 weights, so a
    [BLOCK_N, BLOCK_K] weight tile needs a [BLOCK_N, BLOCK_K/16] scale tile.
  scale: the FP32 global scale of the tensor (of each expert), or of each output row.

  Dequantisation, in fp32 (the first product is exact, so this is bit-exact to ggml's
  `dequantize_row_nvfp4` times llama.cpp's `.scale` tensor); the one implementation is
  `dequantize_nvfp4` below, which NVFP4Weight.dequantize calls (the kernels' plain-torch
  references reach it through the weight they are given, as they know no weights package):

      W[..., n, k] = (E2M1(nibble(n, k)) * float(scales[..., n, k // 16])) * scale[...(, n)]

  A Triton kernel loads a uint8 tile [BLOCK_N, BLOCK_K/2], splits `b & 0xF` / `b >> 4`, joins
  them as (even, odd) pairs -> [BLOCK_N, BLOCK_K], decodes through a 16-entry table, multiplies
  by the broadcast block scale, and may fold `scale` into the output instead of each weight
  (not bit-identical to the line above: compare with a tolerance).

ggml's NVFP4 super-block (64 weights, 36 bytes) is `d[4]` UE4M3 bytes (one per 16 weights;
ggml decodes them at half value and doubles its E2M1 table, so the byte equals the E4M3 bits)
then `qs[32]`: for sub-block s, byte qs[8 s + j] holds weight 16 s + j in its low nibble and
16 s + 8 + j in its high nibble. `from_ggml_blocks` / `to_ggml_blocks` convert losslessly.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from flint_backend.weights.schema import CheckpointError

GROUP = 16                 # weights per E4M3 block scale
E2M1_MAGNITUDES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
E2M1_VALUES = E2M1_MAGNITUDES + (0.0,) + tuple(-m for m in E2M1_MAGNITUDES[1:])  # code -> value
GGML_BLOCK = 64            # weights per ggml NVFP4 super-block
GGML_BLOCK_BYTES = 36      # 4 scale bytes + 32 nibble bytes
E2M1_MAX = 6.0
E4M3_MAX = 448.0
_UE4M3_ZERO_ALIAS = 0x7F   # ggml decodes it as 0; float8_e4m3fn decodes it as NaN
_UE4M3_INVALID = 0xFF      # refused (vLLM's Flint GGUF loader does so too)


def dequantize_nvfp4(packed: torch.Tensor, scales: torch.Tensor, scale: torch.Tensor,
                     dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """-> W [..., N, K] in `dtype`, computed in fp32 exactly as the layout defines it."""
    lut = torch.tensor(E2M1_VALUES, dtype=torch.float32, device=packed.device)
    values = lut[unpack_codes(packed).long()].unflatten(-1, (-1, GROUP))       # [..., N, K/16, 16]
    blocks = (values * scales.float()[..., None]).flatten(-2)                  # exact
    per_row = scale.dim() == packed.dim() - 1                                  # [..., N]
    return (blocks * (scale[..., None] if per_row else scale[..., None, None])).to(dtype)


@dataclass
class NVFP4Weight:
    packed: torch.Tensor   # uint8 [..., N, K/2]
    scales: torch.Tensor   # float8_e4m3fn [..., N, K/16]
    scale: torch.Tensor    # float32 [...] (per tensor / expert) or [..., N] (per output row)

    def __post_init__(self):
        p, s = self.packed, self.scales
        ok = (p.dtype == torch.uint8 and s.dtype == torch.float8_e4m3fn and self.scale.dtype == torch.float32
              and p.dim() >= 2 and s.shape[:-1] == p.shape[:-1] and s.shape[-1] * GROUP == p.shape[-1] * 2
              and tuple(self.scale.shape) in (tuple(p.shape[:-2]), tuple(p.shape[:-1])))
        if not ok:
            raise ValueError(
                f"NVFP4Weight: got packed {p.dtype} {tuple(p.shape)}, scales {s.dtype} {tuple(s.shape)}, "
                f"scale {self.scale.dtype} {tuple(self.scale.shape)}; expected uint8 [..., N, K/2], "
                f"float8_e4m3fn [..., N, K/16], float32 [...] or [..., N]")

    @property
    def shape(self) -> torch.Size:
        return torch.Size((*self.packed.shape[:-1], self.packed.shape[-1] * 2))

    @property
    def device(self) -> torch.device:
        return self.packed.device

    @property
    def per_row_scale(self) -> bool:
        return self.scale.dim() == self.packed.dim() - 1

    def __getitem__(self, index) -> "NVFP4Weight":
        """Index the leading (expert) dims: `w[e]` is expert e's [N, K] weight."""
        if self.packed.dim() == 2:
            raise IndexError("NVFP4Weight: a single matrix has no leading (expert) dimension to index")
        return NVFP4Weight(self.packed[index], self.scales[index], self.scale[index])

    def to(self, device: str | torch.device) -> "NVFP4Weight":
        return NVFP4Weight(self.packed.to(device), self.scales.to(device), self.scale.to(device))

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.packed, self.scales, self.scale))

    def dequantize(self, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
        """[..., N, K] in `dtype`, computed in fp32 as documented above."""
        return dequantize_nvfp4(self.packed, self.scales, self.scale, dtype)

    def row_scale(self) -> torch.Tensor:
        """The global scale as fp32 [..., N] (one per output row)."""
        if self.per_row_scale:
            return self.scale
        return self.scale[..., None].expand(*self.packed.shape[:-1])


def concat_rows(weights: list[NVFP4Weight]) -> NVFP4Weight:
    """Stack NVFP4 weights [..., N_i, K] along N (dim -2) -> [..., sum N_i, K] with a per-row
    global scale (each source keeps its own): the fused q/k/v or gate/up weight. Lossless."""
    if not weights:
        raise ValueError("concat_rows: expected at least one NVFP4Weight")
    lead, k = weights[0].shape[:-2], weights[0].shape[-1]
    for i, w in enumerate(weights):
        if w.shape[:-2] != lead or w.shape[-1] != k:
            raise ValueError(f"concat_rows: weight {i} has shape {tuple(w.shape)}, expected [{', '.join(map(str, lead))}"
                             f"{', ' if lead else ''}N, {k}] like weight 0")
    return NVFP4Weight(torch.cat([w.packed for w in weights], dim=-2).contiguous(),
                       torch.cat([w.scales for w in weights], dim=-2).contiguous(),
                       torch.cat([w.row_scale() for w in weights], dim=-1).contiguous())


def unpack_codes(packed: torch.Tensor) -> torch.Tensor:
    """uint8 [..., K/2] -> E2M1 codes uint8 [..., K] (low nibble = even k)."""
    return torch.stack([packed & 0x0F, packed >> 4], dim=-1).flatten(-2)


def pack_codes(codes: torch.Tensor) -> torch.Tensor:
    """E2M1 codes uint8 [..., K] -> uint8 [..., K/2] (low nibble = even k)."""
    return codes[..., 0::2] | (codes[..., 1::2] << 4)


def from_ggml_blocks(blocks: torch.Tensor, scale: torch.Tensor, name: str = "tensor") -> NVFP4Weight:
    """ggml NVFP4 bytes [..., N, K/64*36] + global scale [...] -> NVFP4Weight, lossless.

    Runs on the blocks' device. A UE4M3 scale byte is 7 bits: bit 7 is ignored (as ggml and
    gguf-py decode it) and 0x7F decodes as 0; 0xFF is no scale at all and raises CheckpointError.
    """
    if blocks.dtype != torch.uint8 or blocks.shape[-1] % GGML_BLOCK_BYTES:
        raise CheckpointError(f"{name}: NVFP4 rows of {blocks.shape[-1]} bytes ({blocks.dtype}), "
                              f"expected uint8 rows of a multiple of {GGML_BLOCK_BYTES} bytes")
    sb = blocks.unflatten(-1, (-1, GGML_BLOCK_BYTES))           # [..., N, K/64, 36]
    d = sb[..., :4].flatten(-2)                                 # [..., N, K/16] UE4M3 bytes
    if bool((d == _UE4M3_INVALID).any()):
        raise CheckpointError(f"{name}: an NVFP4 block-scale byte is 0xFF, which is no UE4M3 value")
    d = d & 0x7F
    d = torch.where(d == _UE4M3_ZERO_ALIAS, torch.zeros_like(d), d)
    qs = sb[..., 4:].unflatten(-1, (4, 8))                      # [..., N, K/64, 4 sub-blocks, 8]
    codes = torch.cat([qs & 0x0F, qs >> 4], dim=-1)             # [..., N, K/64, 4, 16] in k order
    packed = pack_codes(codes.flatten(-3))                      # [..., N, K/2]
    return NVFP4Weight(packed.contiguous(), d.contiguous().view(torch.float8_e4m3fn),
                       scale.to(device=blocks.device, dtype=torch.float32).contiguous())


def to_ggml_blocks(weight: NVFP4Weight) -> torch.Tensor:
    """NVFP4Weight -> ggml NVFP4 bytes uint8 [..., N, K/64*36] (the global scale is not included)."""
    k = weight.shape[-1]
    if k % GGML_BLOCK:
        raise ValueError(f"to_ggml_blocks: K={k}, expected a multiple of {GGML_BLOCK}")
    codes = unpack_codes(weight.packed).unflatten(-1, (k // GGML_BLOCK, 4, GROUP))  # [..., N, K/64, 4, 16]
    qs = (codes[..., :8] | (codes[..., 8:] << 4)).flatten(-2)                    # [..., N, K/64, 32]
    d = weight.scales.view(torch.uint8).unflatten(-1, (k // GGML_BLOCK, 4))      # [..., N, K/64, 4]
    return torch.cat([d, qs], dim=-1).flatten(-2).contiguous()
