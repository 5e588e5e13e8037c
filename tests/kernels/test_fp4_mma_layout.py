"""tools/bench/bench_fp4_mma.py's repacked weight and x fragments, run through a torch emulation of
what its inline PTX does (E2M1 pairs of each word scaled by their block scale, two
mma.m16n8k16 per lane's word pair, with the PTX ISA's fragment layouts): the emulated GEMV
must equal dequantise-then-matmul. The PTX itself runs only on the GPU (the benchmark checks
its output there); this pins the layout the kernel relies on."""

import pytest
import torch

from flint_backend.weights.nvfp4 import dequantize_nvfp4
from tools.bench.bench_fp4_mma import LAYOUTS, fields, random_weight, repack, x_fragments

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


def emulate(w, x: torch.Tensor, layout: str) -> torch.Tensor:
    """The MMA kernel of `layout` in torch: for each 16-row program and 32-column chunk, the 32
    elements that fields() names for it as the warp's lanes, two MMAs, accumulated."""
    n, k = w.shape
    chunk, g, c = fields(k, layout)
    w1, w2, s12 = (t.view(n // 16, k) for t in repack(w, layout))
    v1, v2 = _nibbles(w1), _nibbles(w2)  # [P, K, 8]
    s12 = s12.to(torch.int32)
    v1 = v1 * (s12 & 0xFF).to(torch.uint8).view(torch.float8_e4m3fn).float()[..., None]  # exact in fp16
    v2 = v2 * ((s12 >> 8) & 0xFF).to(torch.uint8).view(torch.float8_e4m3fn).float()[..., None]
    b = _halves(x_fragments(x, layout))  # [4, K, 2]
    out = torch.zeros(n)
    for p in range(n // 16):
        acc = torch.zeros(16, 8)
        for q in range(k // 32):
            lanes = torch.nonzero(chunk == q)[:, 0]
            order = lanes[torch.argsort(g[lanes] * 4 + c[lanes])]  # lane 4 g + c
            assert torch.equal(g[order] * 4 + c[order], torch.arange(32))
            a1, a2 = v1[p, order].view(8, 4, 8), v2[p, order].view(8, 4, 8)  # [g, c, k = 0..7 of the word]
            bq = b[:, order].view(4, 8, 4, 2)
            even = [a1[..., [0, 2]], a2[..., [0, 2]], a1[..., [4, 6]], a2[..., [4, 6]]]
            odd = [a1[..., [1, 3]], a2[..., [1, 3]], a1[..., [5, 7]], a2[..., [5, 7]]]
            acc += _mma(even, [bq[0], bq[1]]) + _mma(odd, [bq[2], bq[3]])
        out[16 * p:16 * p + 16] = acc[:, 0]  # column 0: x; the others are zero
        assert torch.count_nonzero(acc[:, 1:]) == 0
    return out * w.scale


@pytest.mark.parametrize("layout", LAYOUTS)
def test_emulated_mma_gemv_is_dequantise_then_matmul(layout):
    torch.manual_seed(0)
    n, k = 32, 1024
    w = random_weight(n, k, "cpu")
    x = torch.randn(k).to(torch.bfloat16)
    expected = dequantize_nvfp4(w.packed, w.scales, w.scale, torch.float32) @ x.float()
    torch.testing.assert_close(emulate(w, x, layout), expected, rtol=1e-5, atol=1e-5)


def test_x_fragments_are_zero_outside_column_zero():
    x = torch.arange(256, dtype=torch.float32)
    frags = _halves(x_fragments(x, "loop")).view(4, 4, 8, 4, 2, 2)  # [reg, warp, g, c, tile, half]
    assert torch.count_nonzero(frags[:, :, 1:]) == 0
    # warp 0, tile 0, lane c = 1: columns 8..15 of chunk 0 -> (8, 10), (12, 14), (9, 11), (13, 15)
    assert frags[:, 0, 0, 1, 0].tolist() == [[8, 10], [12, 14], [9, 11], [13, 15]]
    x = torch.arange(2048, dtype=torch.float32)
    frags = _halves(x_fragments(x, "upfront")).view(4, 4, 4, 8, 4, 4, 2)  # [reg, r, warp, g, c, j, half]
    assert torch.count_nonzero(frags[:, :, :, 1:]) == 0
    # r 1, warp 2, lane c = 3, j 1: chunk (4 + 2) * 4 + 1 = 25, columns 800 + 24 ..
    assert frags[:, 1, 2, 0, 3, 1].tolist() == [[824, 826], [828, 830], [825, 827], [829, 831]]
