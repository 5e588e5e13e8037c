"""The NVFP4 decodes' inline PTX text itself, run on the CPU by ptx_eval (the Triton interpreter
takes the fp32 decodes instead): every value of every byte of a word, against E2M1 (times the
block scale) over the decode's unit, bit for bit."""

import numpy as np
import torch

import ptx_eval
from flint_backend.weights.nvfp4 import E2M1_MAGNITUDES
from flint_kernels import nvfp4


def _e2m1(code: np.ndarray) -> np.ndarray:
    """code -> value, code 8 as -0.0 (the sign bit kept, as the decodes keep it)."""
    return np.where(code & 8, -1.0, 1.0) * np.array(E2M1_MAGNITUDES)[code & 7]


def test_tile_ptx_gives_e2m1_times_scale_over_the_unit():
    """The fp16 tiles' PTX (weight_halves_f16) itself: every value of every byte of a word, with
    every finite E4M3 block scale (zero and subnormals included), gives E2M1 * scale /
    F16_TILE_UNIT bit for bit, as (byte 0, byte 1) and (byte 2, byte 3) pairs of low nibbles, then
    of high ones."""
    i = np.arange(256)[:, None]
    c = np.arange(127)[None, :]  # E4M3 codes 0 (zero) .. 126 (448)
    every = torch.arange(127, dtype=torch.uint8).view(torch.float8_e4m3fn).float().numpy().astype(np.float64)
    byte = [(i + 67 * j) % 256 + 0 * c for j in range(4)]  # [256, 127] each: every value in every byte
    scale = [every[(c + 37 * j) % 127] + 0 * i for j in range(4)]
    word = sum(b.astype(np.uint32) << np.uint32(8 * j) for j, b in enumerate(byte))

    def f16x2(lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
        return (lo.astype(np.float16).view(np.uint16).astype(np.uint32)
                | hi.astype(np.float16).view(np.uint16).astype(np.uint32) << np.uint32(16))

    out = ptx_eval.run(nvfp4._FP4_BYTES_SCALED_F16_PTX.value, {4: word, 5: f16x2(scale[0], scale[1]),
                                                              6: f16x2(scale[2], scale[3])})
    unit = nvfp4.F16_TILE_UNIT.value
    for n, nibble, pair in ((0, 0, (0, 1)), (1, 0, (2, 3)), (2, 4, (0, 1)), (3, 4, (2, 3))):
        exact = [_e2m1(byte[j] >> nibble & 15) * scale[j] / unit for j in pair]
        assert all(np.array_equal(e.astype(np.float16).astype(np.float64), e) for e in exact)  # fp16 holds them
        assert np.array_equal(out[n], f16x2(*exact)), f"${n}"


def _every_byte_words() -> np.ndarray:
    """[256] words whose four bytes each take every value."""
    i = np.arange(256)
    return sum(((i + 67 * j) % 256).astype(np.uint32) << np.uint32(8 * j) for j in range(4))


def test_gemv_word_decode_gives_e2m1_over_its_unit():
    """fp4_word_nibbles' PTX (tuning.FP4_PTX): a word's 8 codes as fp16 E2M1 / FP4_PTX_UNIT, in
    its output order k = 0, 2, 4, 6, 1, 3, 5, 7."""
    word = _every_byte_words()
    out = ptx_eval.run(nvfp4._FP4_WORD_TO_FP16_PTX.value, {8: word})
    for n, j in enumerate((0, 2, 4, 6, 1, 3, 5, 7)):
        expected = (_e2m1(word >> np.uint32(4 * j) & 15) / nvfp4.FP4_PTX_UNIT.value).astype(np.float16)
        assert np.array_equal(out[n].astype(np.uint16), expected.view(np.uint16)), f"k = {j}"
