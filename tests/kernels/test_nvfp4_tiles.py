"""nvfp4.weight_tile_f16: a tile of an NVFP4 matrix decoded to fp16 with the block scale applied
must equal the exact dequantised weight (E2M1 x E4M3, global scale not applied) over
F16_TILE_UNIT bit for bit, in k order, with masked rows and columns as 0, over the whole E4M3
range of block scales (subnormals included). On the CPU the interpreter runs the fp32 decode;
on a GPU also the PTX ones (the tensor-core tiles of tuning.FP4_MMA_F16: codes through E4M3 bytes,
or built in integer registers with tuning.FP4_TILE_INT_DECODE), whose PTX text also runs here
through tests/kernels/ptx_eval.py."""

import numpy as np
import pytest
import torch
import triton
import triton.language as tl

import ptx_eval
from flint_backend.weights.nvfp4 import NVFP4Weight
from flint_kernels import nvfp4
from flint_kernels.nvfp4 import weight_tile_f16

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


UNITS = {0: nvfp4.F16_TILE_UNIT.value, 1: nvfp4.F16_TILE_UNIT.value, 2: nvfp4.F16_INT_TILE_UNIT.value}


@pytest.mark.parametrize("ptx", [0, pytest.param(1, marks=pytest.mark.gpu), pytest.param(2, marks=pytest.mark.gpu)],
                         ids=["fp32-decode", "ptx", "ptx-integer"])
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
    expected[:n, :cols] = _exact(w)[:, k0:k0 + cols] / UNITS[ptx]
    assert torch.equal(out.float().cpu(), expected)


E2M1 = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])


def _e2m1(code: np.ndarray) -> np.ndarray:
    return np.where(code & 8, -1.0, 1.0) * E2M1[code & 7]


@pytest.mark.parametrize("ptx", [1, 2], ids=["e4m3-cvt", "integer"])
def test_ptx_text_gives_e2m1_times_scale_over_the_unit(ptx):
    """The tiles' PTX itself (ptx_eval): every value of every byte of a word, with every finite
    E4M3 block scale (zero and subnormals included), gives E2M1 * scale / unit bit for bit, as
    (byte 0, byte 1) and (byte 2, byte 3) pairs of low nibbles, then of high ones."""
    text = (nvfp4._FP4_BYTES_SCALED_F16_PTX if ptx == 1 else nvfp4._FP4_BYTES_INT_SCALED_F16_PTX).value
    scale_in = 1.0 if ptx == 1 else nvfp4.F16_INT_SCALE_UNIT.value  # what the kernel multiplies them by
    i = np.arange(256)[:, None]
    c = np.arange(127)[None, :]  # E4M3 codes 0 (zero) .. 126 (448)
    every = torch.arange(127, dtype=torch.uint8).view(torch.float8_e4m3fn).float().numpy().astype(np.float64)
    byte = [(i + 67 * j) % 256 + 0 * c for j in range(4)]  # [256, 127] each: every value in every byte
    scale = [every[(c + 37 * j) % 127] + 0 * i for j in range(4)]
    word = sum(b.astype(np.uint32) << np.uint32(8 * j) for j, b in enumerate(byte))

    def f16x2(lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
        return (lo.astype(np.float16).view(np.uint16).astype(np.uint32)
                | hi.astype(np.float16).view(np.uint16).astype(np.uint32) << np.uint32(16))

    out = ptx_eval.run(text, {4: word, 5: f16x2(scale[0] * scale_in, scale[1] * scale_in),
                              6: f16x2(scale[2] * scale_in, scale[3] * scale_in)})
    unit = UNITS[ptx]
    for n, nibble, pair in ((0, 0, (0, 1)), (1, 0, (2, 3)), (2, 4, (0, 1)), (3, 4, (2, 3))):
        exact = [_e2m1(byte[j] >> nibble & 15) * scale[j] / unit for j in pair]
        assert all(np.array_equal(e.astype(np.float16).astype(np.float64), e) for e in exact)  # fp16 holds them
        assert np.array_equal(out[n], f16x2(*exact)), f"${n}"
