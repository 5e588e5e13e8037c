"""scripts/bench_fp4_mma.py's repacked weight and x fragments, run through a torch emulation of
what its inline PTX does (E2M1 pairs of each word scaled by their block scale, two
mma.m16n8k16 per lane's word pair, with the PTX ISA's fragment layouts): the emulated GEMV
must equal dequantise-then-matmul. The PTX itself runs only on the GPU (the benchmark checks
its output there); this pins the layout the kernel relies on."""

import torch

from flint_backend.weights.nvfp4 import dequantize_nvfp4
from scripts.bench_fp4_mma import random_weight, repack, x_fragments

E2M1 = torch.tensor([0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6])


def _nibbles(words: torch.Tensor) -> torch.Tensor:
    """int32 [...] -> E2M1 values [..., 8] of k = 0..7 (nibble j)."""
    return E2M1[torch.stack([(words >> (4 * j)) & 0xF for j in range(8)], dim=-1).long()]


def _halves(pairs: torch.Tensor) -> torch.Tensor:
    """int32 fp16 pairs [...] -> fp32 [..., 2] (low half first)."""
    return pairs.contiguous().view(torch.int16).view(torch.float16).float().view(*pairs.shape, 2)


def _mma(a: list, b: list) -> torch.Tensor:
    """One warp's mma.m16n8k16 (row.col): a = 4 registers [8 g, 4 c, 2 halves] each, b = 2 -> D [16, 8]."""
    A = torch.zeros(16, 16)
    B = torch.zeros(16, 8)
    g, c = torch.arange(8)[:, None], torch.arange(4)[None, :]
    for h in range(2):
        A[g, 2 * c + h] = a[0][..., h]
        A[g + 8, 2 * c + h] = a[1][..., h]
        A[g, 2 * c + 8 + h] = a[2][..., h]
        A[g + 8, 2 * c + 8 + h] = a[3][..., h]
        B[2 * c + h, g] = b[0][..., h]
        B[2 * c + 8 + h, g] = b[1][..., h]
    return A @ B


def emulate(w, x: torch.Tensor) -> torch.Tensor:
    n, k = w.shape
    w1, w2, s12 = repack(w)
    shape = (n // 16, k // 256, 4, 8, 4, 2)  # (program, step, warp, g, c, tile)
    v1, v2 = _nibbles(w1.view(shape)), _nibbles(w2.view(shape))  # [..., 8]
    sb = s12.view(shape).to(torch.int32)
    s1 = (sb & 0xFF).to(torch.uint8).view(torch.float8_e4m3fn).float()[..., None]
    s2 = ((sb >> 8) & 0xFF).to(torch.uint8).view(torch.float8_e4m3fn).float()[..., None]
    v1, v2 = v1 * s1, v2 * s2  # exact in fp16 as in the kernel
    xf = _halves(x_fragments(x))  # [steps, 4, 256, 2]
    out = torch.zeros(n)
    for p in range(shape[0]):
        acc = torch.zeros(16, 8)
        for s in range(shape[1]):
            for wi in range(4):
                for t in range(2):
                    a1, a2 = v1[p, s, wi, :, :, t], v2[p, s, wi, :, :, t]  # [8, 4, 8]: k = 0..7 of each word
                    b = xf[s, :, :, :].view(4, 4, 8, 4, 2, 2)[:, wi, :, :, t, :]  # [4 regs, 8 g, 4 c, 2]
                    even = [a1[..., [0, 2]], a2[..., [0, 2]], a1[..., [4, 6]], a2[..., [4, 6]]]
                    odd = [a1[..., [1, 3]], a2[..., [1, 3]], a1[..., [5, 7]], a2[..., [5, 7]]]
                    acc += _mma(even, [b[0], b[1]]) + _mma(odd, [b[2], b[3]])
        out[16 * p:16 * p + 16] = acc[:, 0]  # column 0: x; the others are zero
        assert torch.count_nonzero(acc[:, 1:]) == 0
    return out * w.scale


def test_emulated_mma_gemv_is_dequantise_then_matmul():
    torch.manual_seed(0)
    n, k = 32, 512
    w = random_weight(n, k, "cpu")
    x = torch.randn(k).to(torch.bfloat16)
    expected = dequantize_nvfp4(w.packed, w.scales, w.scale, torch.float32) @ x.float()
    torch.testing.assert_close(emulate(w, x), expected, rtol=1e-5, atol=1e-5)


def test_x_fragments_are_zero_outside_column_zero():
    x = torch.arange(256, dtype=torch.float32)
    frags = _halves(x_fragments(x)).view(4, 4, 8, 4, 2, 2)  # [reg, warp, g, c, tile, half]
    assert torch.count_nonzero(frags[:, :, 1:]) == 0
    # warp 0, tile 0, lane c = 1: columns 8..15 of chunk 0 -> (8, 10), (12, 14), (9, 11), (13, 15)
    assert frags[:, 0, 0, 1, 0].tolist() == [[8, 10], [12, 14], [9, 11], [13, 15]]
