"""nvfp4.weight_tile_f16: a tile of an NVFP4 matrix decoded to fp16 with the block scale applied
must equal the exact dequantised weight (E2M1 x E4M3, global scale not applied) over
F16_TILE_UNIT bit for bit, in k order, with masked rows and columns as 0, over the whole E4M3
range of block scales (subnormals included). On the CPU the interpreter runs the fp32 decode;
on a GPU also the PTX one (the tensor-core tiles of tuning.FP4_MMA_F16)."""

import pytest
import torch
import triton
import triton.language as tl

from flint_backend.weights.nvfp4 import NVFP4Weight
from flint_kernels.nvfp4 import F16_TILE_UNIT, weight_tile_f16

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@triton.jit
def _tile_kernel(w_ptr, scales_ptr, out_ptr, N, K, k0, stride_wn, stride_sn,
                 BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, MASK_K: tl.constexpr, PTX: tl.constexpr):
    rows = tl.arange(0, BLOCK_N)
    tile = weight_tile_f16(w_ptr, scales_ptr, rows, rows < N, k0, K, stride_wn, stride_sn,
                           BLOCK_K, MASK_K, PTX)  # [BLOCK_N, BLOCK_K]
    cols = tl.arange(0, BLOCK_K)
    tl.store(out_ptr + rows[:, None] * BLOCK_K + cols[None, :], tile)


def _every_code_weight(n: int, k: int, seed: int) -> NVFP4Weight:
    """Random codes (all 16 appear) and block scales over E4M3's range, subnormals included."""
    g = torch.Generator().manual_seed(seed)
    packed = torch.randint(0, 256, (n, k // 2), generator=g, dtype=torch.uint8)
    codes = torch.randint(1, 127, (n, k // 16), generator=g, dtype=torch.uint8)  # positive, finite E4M3
    codes[0, 0], codes[-1, -1] = 1, 126  # the smallest subnormal 2**-9 and 448
    return NVFP4Weight(packed, codes.view(torch.float8_e4m3fn), torch.tensor(1.0))


def _exact(w: NVFP4Weight) -> torch.Tensor:
    """E2M1 x block scale in fp32 (the global scale left out, as the tile leaves it)."""
    return NVFP4Weight(w.packed, w.scales, torch.tensor(1.0)).dequantize(torch.float32)


@pytest.mark.parametrize("ptx", [False, pytest.param(True, marks=pytest.mark.gpu)], ids=["fp32-decode", "ptx"])
@pytest.mark.parametrize("n,k,k0,block_k", [(8, 64, 0, 64), (5, 96, 32, 128), (16, 96, 64, 32)],
                         ids=["whole", "rows-and-columns-masked", "last-step"])
def test_tile_equals_the_dequantised_weight(ptx, n, k, k0, block_k):
    w = _every_code_weight(n, k, seed=n + k)
    block_n = triton.next_power_of_2(n)
    out = torch.full((block_n, block_k), float("nan"), dtype=torch.float16, device=DEVICE)
    _tile_kernel[(1,)](w.packed.to(DEVICE), w.scales.to(DEVICE), out, n, k, k0, w.packed.stride(0),
                       w.scales.stride(0), BLOCK_N=block_n, BLOCK_K=block_k, MASK_K=k0 + block_k > k, PTX=ptx)
    expected = torch.zeros(block_n, block_k)
    cols = min(block_k, k - k0)
    expected[:n, :cols] = _exact(w)[:, k0:k0 + cols] / F16_TILE_UNIT.value
    assert torch.equal(out.float().cpu(), expected)
