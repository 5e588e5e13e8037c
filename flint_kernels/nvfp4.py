"""NVFP4 weights as the W4A16 kernels read them: the Triton tile decoder every W4A16 kernel
shares. The format (E2M1 tables, group size, the plain-torch dequantisation) is documented and
owned by `flint_backend.weights.nvfp4`; kernels take any object with `.packed`, `.scales` and
`.scale`, and their plain-torch references call its `.dequantize(dtype)` (duck-typed: kernels
know no model package).

    packed  uint8          [..., N, K/2]   low nibble = even k, high nibble = odd k
    scales  float8_e4m3fn  [..., N, K/16]  block scale of k in [16 g, 16 g + 16)
    scale   float32        [...] or [..., N]   global scale: per tensor (per expert), or per
                                               output row (fused q/k/v or gate/up weights)

    W[..., n, k] = (E2M1(nibble(n, k)) * float(scales[..., n, k // 16])) * scale[...(, n)]

In a kernel the first product is formed per weight, in fp32, and is exact (E2M1 has 2
significant bits, E4M3 4); it is also exact in bf16, so tensor-core tiles see the true value.
The global scale multiplies each output once, after the reduction over k: with a one-hot
activation the output is bit-identical to the line above; otherwise it differs from
dequantise-then-matmul by fp32 rounding of the accumulation only.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import tuning
from .rms_norm import norm_weight, residual_add, step_activations
from .swiglu import silu_mul_at

GROUP = 16  # weights per E4M3 block scale: the decoders' tile unit; check_nvfp4 refuses any other
# A code's magnitude bits placed in an fp16's exponent/mantissa give E2M1 / 2**14 exactly
# (subnormals included); the 2**14 is folded into the block scale.
FP16_E2M1_UNIT = tl.constexpr(16384.0)


def is_nvfp4(w) -> bool:
    return all(hasattr(w, name) for name in ("packed", "scales", "scale"))


def check_nvfp4(where: str, w) -> tuple[int, int]:
    """Validates a duck-typed NVFP4 weight (without reading device values) -> (N, K)."""
    p, s, g = w.packed, w.scales, w.scale
    lead = tuple(p.shape[:-2])
    ok = (p.dtype == torch.uint8 and s.dtype == torch.float8_e4m3fn and g.dtype == torch.float32
          and p.dim() >= 2 and s.shape[:-1] == p.shape[:-1] and s.shape[-1] * GROUP == p.shape[-1] * 2
          and tuple(g.shape) in (lead, lead + (p.shape[-2],))
          and p.stride(-1) == 1 and s.stride(-1) == 1)
    if not ok:
        raise ValueError(
            f"{where}: NVFP4 weight with packed {p.dtype} {tuple(p.shape)}, scales {s.dtype} {tuple(s.shape)}, "
            f"scale {g.dtype} {tuple(g.shape)}; expected uint8 [..., N, K/2], float8_e4m3fn [..., N, K/16] "
            f"(unit stride in K) and float32 [...] or [..., N]")
    return p.shape[-2], p.shape[-1] * 2


def scale_strides(w) -> tuple[int, int]:
    """Strides of the global scale over (leading expert dim, output row): 0 where it is broadcast."""
    g, per_row = w.scale, w.scale.dim() == w.packed.dim() - 1
    stride_n = g.stride(-1) if per_row else 0
    stride_e = (g.stride(0) if g.dim() > (1 if per_row else 0) else 0) if w.packed.dim() == 3 else 0
    return stride_e, stride_n


@triton.jit
def weight_tile(w_ptr, scales_ptr, rows, row_mask, k0, K, stride_wn, stride_sn,
                BLOCK_K: tl.constexpr, MASK_K: tl.constexpr, FP4: tl.constexpr):
    """[BLOCK_N, BLOCK_K] tile, k in [k0, k0 + BLOCK_K), of rows `rows` of a dense matrix (in its
    dtype) or of an NVFP4 one (fp32 E2M1 * block scale, exact; global scale not applied).

    w_ptr / scales_ptr point at the matrix (expert applied): dense values or packed bytes, block
    scales; rows [BLOCK_N] int, row_mask [BLOCK_N]; masked rows (and k >= K when MASK_K) read as
    0. NVFP4 needs BLOCK_K % 32 == 0: weight_tile_f16's values (exact in fp16) as fp32, the unit
    multiplied back."""
    if FP4:
        return weight_tile_f16(w_ptr, scales_ptr, rows, row_mask, k0, K, stride_wn, stride_sn, BLOCK_K, MASK_K,
                               False).to(tl.float32) * F16_TILE_UNIT
    else:
        cols = k0 + tl.arange(0, BLOCK_K)
        mask = row_mask[:, None]
        if MASK_K:
            mask = mask & (cols[None, :] < K)
        return tl.load(w_ptr + rows[:, None] * stride_wn + cols[None, :], mask=mask, other=0.0)


# fp32 bits of an E2M1 code: with the code at bits 31..28 of an int32, an arithmetic shift
# right by 6 moves the magnitude to bits 24..22 (the exponent's low 2 bits and the mantissa's
# top bit) and copies the sign down to bit 25; masking bits 31 and 24..22 leaves
# E2M1 * 2**-126 exactly (0.5 as the fp32 denormal 2**-127). GEMV kernels multiply x and the
# block scale each by 2**63 to cancel it: products stay normal for |x| > 2**-60.
E2M1_F32_MASK = tl.constexpr(-2118123520)  # 0x81C00000 as an int32
F32_E2M1_HALF_UNIT = tl.constexpr(9223372036854775808.0)  # 2**63
# The NVFP4 decode of the batch-1 kernels (tuning.FP4_GEMV_WORDS, FP4_MOE_WORDS,
# FP4_MOE_DOWN_WORDS, FP4_PTX; same results either way): bytes and a nibble join (weight_tile),
# or 32-bit words (fp4_dot_words), whose codes the PTX decode turns to fp16 (never under the
# interpreter). A word step's products are one [.., KW, 8] tensor (the word's 8 weights joined
# in-thread, x's [KW, 8] block broadcast over the rows) summed over the 8 as a tree: picking x's
# column j out of the block nibble by nibble cost a layout conversion through shared memory a
# nibble (sm_90 barriers after the PDL wait 63 -> 7 in o_proj, 20 -> 8 in the MoE down; H200
# 2026-12-04, NVFP4 2.161 -> 2.112 ms a token at 100K).


# The PTX decode of fp4_dot_words (tuning.FP4_PTX): a word's E2M1 codes become FP8 E4M3
# bytes four at a time (a code's sign to bit 7, its magnitude bits to bits 4..2: E2M1 * 2**-6
# exactly, E4M3 subnormals included), which the hardware converts to fp16 pairs (sm_89+, one
# instruction a pair): 7 integer instructions for 8 weights instead of 24. Outputs: the fp16
# weights of k = 8 w + (0, 2, 4, 6, 1, 3, 5, 7).
def e2m1_word_to_f16x2_ptx(word: str, out: tuple[str, str, str, str]) -> str:
    """PTX lines decoding the 32-bit word in register `word` into four fp16 pairs in the .b32
    registers `out`: (k0, k2), (k4, k6), (k1, k3), (k5, k7), each E2M1 / 64, low half first.
    Uses scratch registers t0..t3, lo, hi (.b32) and b0..b3 (.b16), declared by the caller."""
    return f"""
shl.b32 t0, {word}, 4;
shl.b32 t1, {word}, 2;
and.b32 t0, t0, 0x80808080;
lop3.b32 lo, t1, 0x1C1C1C1C, t0, 0xEA;
shr.u32 t2, {word}, 2;
and.b32 t3, {word}, 0x80808080;
lop3.b32 hi, t2, 0x1C1C1C1C, t3, 0xEA;
mov.b32 {{b0, b1}}, lo;
mov.b32 {{b2, b3}}, hi;
cvt.rn.f16x2.e4m3x2 {out[0]}, b0;
cvt.rn.f16x2.e4m3x2 {out[1]}, b1;
cvt.rn.f16x2.e4m3x2 {out[2]}, b2;
cvt.rn.f16x2.e4m3x2 {out[3]}, b3;
"""


_FP4_WORD_TO_FP16_PTX = tl.constexpr("""
{
.reg .b32 t<4>, lo, hi, f<4>;
.reg .b16 b<4>;""" + e2m1_word_to_f16x2_ptx("$8", ("f0", "f1", "f2", "f3")) + """mov.b32 {$0, $1}, f0;
mov.b32 {$2, $3}, f1;
mov.b32 {$4, $5}, f2;
mov.b32 {$6, $7}, f3;
}
""")
FP4_PTX_UNIT = tl.constexpr(64.0)  # the PTX decode's weights are E2M1 / 64
# fp4_dot_loaded's F16 products: sum over j of weight j * x_j of one word, x as the f16x2 pairs
# (x0, x2), (x4, x6), (x1, x3), (x5, x7) ($2..$5, low half first: the decode's pair order) ->
# fp32 ($0): one mul and three fma.rn.f16x2, then the two halves widened and added
_FP4_WORD_DOT_F16_PTX = tl.constexpr("""
{
.reg .b32 t<4>, lo, hi, f<4>, acc;
.reg .b16 b<4>, h<2>;
.reg .f32 s<2>;""" + e2m1_word_to_f16x2_ptx("$1", ("f0", "f1", "f2", "f3")) + """mul.rn.f16x2 acc, f0, $2;
fma.rn.f16x2 acc, f1, $3, acc;
fma.rn.f16x2 acc, f2, $4, acc;
fma.rn.f16x2 acc, f3, $5, acc;
mov.b32 {h0, h1}, acc;
cvt.f32.f16 s0, h0;
cvt.f32.f16 s1, h1;
add.f32 $0, s0, s1;
}
""")


F16_BLOCK_K = 128  # K a step of weight_tile_f16's tiles on a GPU (tuning.FP4_MMA_F16): 64 bytes a row
# weight_tile_f16's values are the weights / F16_TILE_UNIT: the PTX decode's E2M1 / 64 times the
# block scale in fp16, exactly (at most 6 significant bits, 2**-16 <= |w| / 64 <= 42: its last bit
# at least fp16's subnormal 2**-24). Their users multiply the unit back in fp32 with the global
# scale, so no instruction scales the block scale (an HMUL2 a scale in each K step).
F16_TILE_UNIT = tl.constexpr(64.0)
# weight_tile_f16's PTX, four packed bytes at a time ($4: a 32-bit word; $5, $6: the four bytes'
# block scales as two f16x2 pairs): the codes decoded (E2M1 / 64, e2m1_word_to_f16x2_ptx) and
# multiplied by their scales in four mul.rn.f16x2 -> E2M1 * scale / 64 exactly. Outputs: the low
# nibbles of bytes 0..3 ($0, $1) and the high nibbles ($2, $3), each byte's result from that
# byte alone (elementwise for any packing)
_FP4_BYTES_SCALED_F16_PTX = tl.constexpr("""
{
.reg .b32 t<4>, lo, hi, f<4>;
.reg .b16 b<4>;""" + e2m1_word_to_f16x2_ptx("$4", ("f0", "f1", "f2", "f3")) + """mul.rn.f16x2 $0, f0, $5;
mul.rn.f16x2 $1, f1, $6;
mul.rn.f16x2 $2, f2, $5;
mul.rn.f16x2 $3, f3, $6;
}
""")


@triton.jit
def weight_tile_f16(w_ptr, scales_ptr, rows, row_mask, k0, K, stride_wn, stride_sn,
                    BLOCK_K: tl.constexpr, MASK_K: tl.constexpr, PTX: tl.constexpr):
    """weight_tile's NVFP4 tile in fp16 ([BLOCK_N, BLOCK_K], same arguments): E2M1 * block scale
    / F16_TILE_UNIT, exact, the global scale not applied. For tensor-core tiles whose activations
    are converted to fp16 (tuning.FP4_MMA_F16). PTX: each byte's two codes decoded and scaled in ~4
    instructions (_FP4_BYTES_SCALED_F16_PTX); else through fp32 (the interpreter; weight_tile)."""
    lo, hi = weight_halves_f16(w_ptr, scales_ptr, rows, row_mask, k0, K, stride_wn, stride_sn, BLOCK_K, MASK_K, PTX)
    return tl.reshape(tl.join(lo, hi), [rows.shape[0], BLOCK_K])  # (even, odd) pairs: k order


@triton.jit
def weight_halves_f16(w_ptr, scales_ptr, rows, row_mask, k0, K, stride_wn, stride_sn,
                      BLOCK_K: tl.constexpr, MASK_K: tl.constexpr, PTX: tl.constexpr):
    """weight_tile_f16's tile as its even and its odd columns ([BLOCK_N, BLOCK_K / 2] each: k0 +
    2 c and k0 + 2 c + 1, the low and the high nibble of byte c): a dot of each half with the
    activations' even or odd columns needs no pairing of the two (tensor-core operands hold
    pairs of adjacent columns, here two bytes' low or high nibbles, as the decode leaves them)."""
    bytes_ = k0 // 2 + tl.arange(0, BLOCK_K // 2)
    groups = k0 // 16 + tl.arange(0, BLOCK_K // 16)
    p_mask = row_mask[:, None]
    s_mask = row_mask[:, None]
    if MASK_K:
        p_mask = p_mask & (bytes_[None, :] < K // 2)
        s_mask = s_mask & (groups[None, :] < K // 16)
    n: tl.constexpr = rows.shape[0]
    p = tl.load(w_ptr + rows[:, None] * stride_wn + bytes_[None, :], mask=p_mask, other=0)
    s = tl.load(scales_ptr + rows[:, None] * stride_sn + groups[None, :], mask=s_mask, other=0.0)
    if PTX:
        s = s.to(tl.float16)  # exact; converted once a group, before its broadcast to the bytes
    else:
        s = s.to(tl.float32) * (FP16_E2M1_UNIT / F16_TILE_UNIT)
    s = tl.reshape(tl.broadcast_to(s[:, :, None], [n, BLOCK_K // 16, 8]), [n, BLOCK_K // 2])  # a byte's scale
    if PTX:
        lo, hi = tl.inline_asm_elementwise(_FP4_BYTES_SCALED_F16_PTX, "=r,=r,=r,=r,r,r,r", [p, s],
                                           dtype=(tl.float16, tl.float16), is_pure=True, pack=4)
    else:
        codes = p.to(tl.int32)
        scale = s
        lo = ((((codes & 7) << 9) | ((codes & 8) << 12)).to(tl.int16).to(tl.float16, bitcast=True)
              .to(tl.float32) * scale).to(tl.float16)
        hi = ((((codes & 0x70) << 5) | ((codes & 0x80) << 8)).to(tl.int16).to(tl.float16, bitcast=True)
              .to(tl.float32) * scale).to(tl.float16)
    return lo, hi


@triton.jit
def fp4_word_nibbles(words, PTX: tl.constexpr):
    """The 8 weights of each 32-bit word (k = 8 w + j in nibble j) -> 8 fp32 tensors shaped like
    `words`, E2M1 exactly up to a power of two: times fp4_x_unit(PTX) * fp4_scale_unit(PTX)
    (applied to x and to the block scale by the caller) gives E2M1. PTX: the inline-PTX decode
    above (E2M1 / 64); else two shifts and a mask a weight (E2M1 * 2**-126, see E2M1_F32_MASK)."""
    if PTX:
        d0, d2, d4, d6, d1, d3, d5, d7 = tl.inline_asm_elementwise(
            _FP4_WORD_TO_FP16_PTX, "=h,=h,=h,=h,=h,=h,=h,=h,r", [words], dtype=(tl.float16,) * 8,
            is_pure=True, pack=1)
        return (d0.to(tl.float32), d1.to(tl.float32), d2.to(tl.float32), d3.to(tl.float32),
                d4.to(tl.float32), d5.to(tl.float32), d6.to(tl.float32), d7.to(tl.float32))
    return (_nibble_f32(words, 0), _nibble_f32(words, 1), _nibble_f32(words, 2), _nibble_f32(words, 3),
            _nibble_f32(words, 4), _nibble_f32(words, 5), _nibble_f32(words, 6), _nibble_f32(words, 7))


@triton.jit
def by_column(c0, c1, c2, c3, c4, c5, c6, c7):
    """Eight tensors of one shape S, joined in-thread -> S + [2, 2, 2], whose reshape to S + [8]
    has c_j at column j (tl.join adds the last dim: j = 4 a + 2 b + c at [.., a, b, c])."""
    return tl.join(tl.join(tl.join(c0, c4), tl.join(c2, c6)), tl.join(tl.join(c1, c5), tl.join(c3, c7)))


@triton.jit
def _f16_pair(lo, hi):
    """fp32 tensors -> int32 of their fp16 pair (lo in the low half)."""
    return tl.inline_asm_elementwise("cvt.rn.f16x2.f32 $0, $2, $1;", "=r,f,f", [lo, hi], dtype=tl.int32,
                                     is_pure=True, pack=1)


@triton.jit
def fp4_x_pairs(xs):
    """A step's x block [..., 8] (fp32, column j for nibble j) -> the four f16x2 pairs of
    _FP4_WORD_DOT_F16_PTX, each [...] int32: (x0, x2), (x4, x6), (x1, x3), (x5, x7)."""
    x8 = tl.reshape(xs, xs.shape[:-1] + [2, 2, 2])  # [..., a, b, c]: column 4 a + 2 b + c
    even, odd = tl.split(x8)            # c = 0: columns 0, 2, 4, 6; c = 1: 1, 3, 5, 7
    e0, e1 = tl.split(even)             # b = 0: columns 0, 4; b = 1: 2, 6
    o0, o1 = tl.split(odd)              # b = 0: columns 1, 5; b = 1: 3, 7
    x0, x4 = tl.split(e0)
    x2, x6 = tl.split(e1)
    x1, x5 = tl.split(o0)
    x3, x7 = tl.split(o1)
    return _f16_pair(x0, x2), _f16_pair(x4, x6), _f16_pair(x1, x3), _f16_pair(x5, x7)


@triton.jit
def fp4_word_dots_f16(words, p0, p1, p2, p3):
    """Each word's sum over its 8 weights (E2M1 / 64) times x (fp4_x_pairs, broadcast to
    words' shape), in fp16 (_FP4_WORD_DOT_F16_PTX) -> fp32 like words."""
    return tl.inline_asm_elementwise(_FP4_WORD_DOT_F16_PTX, "=f,r,r,r,r,r", [words, p0, p1, p2, p3],
                                     dtype=tl.float32, is_pure=True, pack=1)


@triton.jit
def fp4_word_columns(words, PTX: tl.constexpr):
    """fp4_word_nibbles joined in-thread (by_column): shape(words) + [2, 2, 2], nibble j at
    column j of its reshape to shape(words) + [8]."""
    n = fp4_word_nibbles(words, PTX)
    return by_column(n[0], n[1], n[2], n[3], n[4], n[5], n[6], n[7])


@triton.jit
def load_by_column(ptrs, mask):
    """Values at ptrs + j for j < 8 (eight stride-8 loads when ptrs steps by 8) -> by_column of
    them: shape(ptrs) + [2, 2, 2], value j at column j of its reshape to shape(ptrs) + [8]."""
    return by_column(tl.load(ptrs, mask=mask, other=0.0), tl.load(ptrs + 1, mask=mask, other=0.0),
                     tl.load(ptrs + 2, mask=mask, other=0.0), tl.load(ptrs + 3, mask=mask, other=0.0),
                     tl.load(ptrs + 4, mask=mask, other=0.0), tl.load(ptrs + 5, mask=mask, other=0.0),
                     tl.load(ptrs + 6, mask=mask, other=0.0), tl.load(ptrs + 7, mask=mask, other=0.0))


@triton.jit
def _nibble_f32(words, j: tl.constexpr):
    return (((words << (28 - 4 * j)) >> 6) & E2M1_F32_MASK).to(tl.float32, bitcast=True)  # E2M1 * 2**-126


@triton.jit
def fp4_x_unit(PTX: tl.constexpr):
    """What x is multiplied by before meeting fp4_word_nibbles' weights (keeps products normal)."""
    return 1.0 if PTX else F32_E2M1_HALF_UNIT


@triton.jit
def fp4_scale_unit(PTX: tl.constexpr):
    """What block scales are multiplied by after the sums of fp4_word_nibbles' weights times x."""
    return FP4_PTX_UNIT if PTX else F32_E2M1_HALF_UNIT


@triton.jit
def fp4_dot_words(x_ptr, words_ptr, scales_ptr, rows, row_mask, kw0, n_words, stride_wn, stride_sn,
                  KW: tl.constexpr, MASK_K: tl.constexpr, PTX: tl.constexpr = False,
                  res_ptr=None, norm_w_ptr=None, rstd=1.0, NORM: tl.constexpr = False,
                  HAS_RESIDUAL: tl.constexpr = False, X_BLOCK: tl.constexpr = False, SILU: tl.constexpr = False):
    """GEMV step of an NVFP4 matrix read as 32-bit words (8 weights each, k = 8 w + j in nibble
    j): -> [BLOCK_N, KW / 2] fp32, for rows `rows` and words [kw0, kw0 + KW), the sums over
    each 16-weight block of E2M1 * block scale * x[k]; the global scale is not applied. Sum
    over axis 1 (and over steps) for the dot product.

    x_ptr: x[0] of one token (any float dtype); words_ptr: the packed bytes viewed as int32
    [N, K/8] (stride_wn in words); scales_ptr: block scales [N, K/16]. Each weight costs its
    decode (fp4_word_nibbles) and one FMA; each x value serves all the rows; the block scale
    multiplies each block's sum once. (fp4_load_words then fp4_dot_loaded: the two halves.)
    NORM: x is rms_norm(residual + x) folded in; X_BLOCK: x read as one block (fp4_dot_loaded);
    SILU: x is silu(gate) * up of the gate | up row at x_ptr."""
    words, s = fp4_load_words(words_ptr, scales_ptr, rows, row_mask, kw0, n_words, stride_wn, stride_sn, KW, MASK_K)
    nw = fp4_norm_weight(norm_w_ptr, kw0, n_words, KW, NORM)
    return fp4_dot_loaded(x_ptr, words, s, kw0, n_words, KW, MASK_K, PTX, res_ptr, nw, rstd, NORM,
                          HAS_RESIDUAL, X_BLOCK, None, SILU)


@triton.jit
def fp4_load_words(words_ptr, scales_ptr, rows, row_mask, kw0, n_words, stride_wn, stride_sn,
                   KW: tl.constexpr, MASK_K: tl.constexpr):
    """The weight half of fp4_dot_words: -> (words [BLOCK_N, KW] int32, block scales
    [BLOCK_N, KW / 2]); masked rows (and words >= n_words when MASK_K) read as 0. A kernel may
    issue it before waiting for the previous kernel (pdl.py): it reads weights only."""
    kw = kw0 + tl.arange(0, KW)
    mask = row_mask[:, None]
    if MASK_K:
        mask = mask & (kw < n_words)[None, :]
    words = tl.load(words_ptr + rows[:, None] * stride_wn + kw[None, :], mask=mask, other=0)  # int32
    groups = kw0 // 2 + tl.arange(0, KW // 2)
    s_mask = row_mask[:, None]
    if MASK_K:
        s_mask = s_mask & (groups[None, :] < n_words // 2)
    s = tl.load(scales_ptr + rows[:, None] * stride_sn + groups[None, :], mask=s_mask, other=0.0)
    return words, s


@triton.jit
def fp4_norm_weight(norm_w_ptr, kw0, n_words, KW: tl.constexpr, NORM: tl.constexpr):
    """The norm weight of a step's [KW, 8] columns (words [kw0, kw0 + KW)) for fp4_dot_loaded's
    NORM, 0 without it: a weight, so a kernel may load it before its PDL wait (pdl.py)."""
    kw = kw0 + tl.arange(0, KW)
    j8 = tl.arange(0, 8)[None, :]
    return norm_weight(norm_w_ptr, kw[:, None] * 8 + j8, (kw < n_words)[:, None] & (j8 < 8), NORM)


@triton.jit
def fp4_x_block(x_ptr, res_ptr, kw0, n_words, KW: tl.constexpr, HAS_RESIDUAL: tl.constexpr,
                SILU: tl.constexpr = False):
    """A step's activations as one [KW, 8] block, a word's 8 values a row (residual + x, rounded,
    when HAS_RESIDUAL; silu(gate) * up of the gate | up row at x_ptr with SILU): what
    fp4_dot_loaded loads itself with X_BLOCK, NORM or SILU, for a kernel that issues all its
    steps' loads at once and passes them in (its xa)."""
    kw = kw0 + tl.arange(0, KW)
    j8 = tl.arange(0, 8)[None, :]
    offs = kw[:, None] * 8 + j8
    mask = (kw < n_words)[:, None] & (j8 < 8)
    if SILU:
        return silu_mul_at(x_ptr, offs, mask, n_words * 8)
    return residual_add(x_ptr, res_ptr, offs, mask, HAS_RESIDUAL)


@triton.jit
def fp4_dot_loaded(x_ptr, words, s, kw0, n_words, KW: tl.constexpr, MASK_K: tl.constexpr, PTX: tl.constexpr,
                   res_ptr=None, nw=None, rstd=1.0, NORM: tl.constexpr = False,
                   HAS_RESIDUAL: tl.constexpr = False, X_BLOCK: tl.constexpr = False, xa=None,
                   SILU: tl.constexpr = False, F16: tl.constexpr = False):
    """The activation half of fp4_dot_words, on what fp4_load_words returned. NORM: the
    activation is rms_norm(residual + x) with the norm weight nw of the step's columns
    (fp4_norm_weight), computed here from the row's rstd (rms_norm.folded_rstd) once for the
    step's [KW, 8] columns (rms_norm.step_activations), then multiplied by the words' 8 weights
    joined in-thread. SILU: the activation is silu(gate) * up of the gate | up row at
    x_ptr (also as a block). xa: that block already loaded (fp4_x_block; NORM, X_BLOCK or SILU).
    F16 (PTX, x of bf16 values): a word's 8 products formed and summed in fp16 pairs
    inside the decode's PTX (_FP4_WORD_DOT_F16_PTX), then widened: about half the instructions
    a word and row. x converts to fp16 exactly for 2**-14 <= |x| < 65504 (bf16's 8 significant
    bits fit fp16's 11); the products with E2M1 / 64 (2 bits) are exact while above 2**-14 (below,
    fp16 subnormals: an absolute error under 2**-25 each); a half's sum of four rounds to 11 bits;
    |x| >= 65504 overflows. For activations of bounded scale (tuning.FP4_GEMV_F16)."""
    kw = kw0 + tl.arange(0, KW)
    k_mask = kw < n_words
    if NORM or X_BLOCK or SILU:  # the step's x as one [KW, 8] block (vector loads), a word's 8 values a row
        if xa is None:
            xa = fp4_x_block(x_ptr, res_ptr, kw0, n_words, KW, HAS_RESIDUAL, SILU)
        xs = step_activations(xa, nw, rstd, NORM)
    else:  # x read with stride 8, column j of the block from load j
        xs = tl.reshape(load_by_column(x_ptr + kw * 8, k_mask), [KW, 8])
    # [R, KW, 8] products, summed over the word's 8
    if F16 and PTX:  # x broadcast over the rows first (one conversion), paired per word
        p0, p1, p2, p3 = fp4_x_pairs(tl.broadcast_to(xs.to(tl.float32)[None, :, :], [words.shape[0], KW, 8]))
        part = fp4_word_dots_f16(words, p0, p1, p2, p3)
    else:
        w8 = tl.reshape(fp4_word_columns(words, PTX), [words.shape[0], KW, 8])
        part = tl.sum(w8 * (xs.to(tl.float32) * fp4_x_unit(PTX))[None, :, :], axis=2)
    block = tl.sum(tl.reshape(part, [words.shape[0], KW // 2, 2]), axis=2)  # the two words of a block
    return block * (s.to(tl.float32) * fp4_scale_unit(PTX))


def ptx_decode() -> bool:
    """fp4_dot_words' PTX flag for a launch now: tuning.FP4_PTX, off under the interpreter."""
    return tuning.FP4_PTX and not tuning.INTERPRET


def packed_words(w) -> torch.Tensor:
    """The packed bytes of an NVFP4 weight [..., N, K/2] viewed as int32 words [..., N, K/8]."""
    if w.packed.shape[-1] % 4 or any(st % 4 for st in w.packed.stride()[:-1]) or w.packed.data_ptr() % 4:
        raise ValueError(f"NVFP4 weight with packed shape {tuple(w.packed.shape)} strides {w.packed.stride()}: "
                         "expected K % 8 == 0 and 4-byte aligned rows")
    return w.packed.view(torch.int32)


def weight_args(name: str, w, words: bool = False) -> dict:
    """Kernel arguments for a dense or NVFP4 weight [E, N, K] or [N, K] (unit stride in K):
    pointers `{name}_ptr` (dense values, or packed bytes: int32 words with `words`),
    `{name}_scales_ptr`, `{name}_scale_ptr` and strides `{name}_se`/`_sn` (values, in elements
    of the pointer), `_sse`/`_ssn` (block scales), `_sge`/`_sgn` (global scale) over (expert,
    row); a dense weight passes itself for the unused pointers."""
    if is_nvfp4(w):
        data, scales, scale = packed_words(w) if words else w.packed, w.scales, w.scale
        sge, sgn = scale_strides(w)
    else:
        data = scales = scale = w
        sge = sgn = 0
    lead = data.dim() == 3
    return {f"{name}_ptr": data, f"{name}_scales_ptr": scales, f"{name}_scale_ptr": scale,
            f"{name}_se": data.stride(0) if lead else 0, f"{name}_sn": data.stride(-2),
            f"{name}_sse": scales.stride(0) if lead and scales is not data else 0,
            f"{name}_ssn": scales.stride(-2) if scales is not data else 0,
            f"{name}_sge": sge, f"{name}_sgn": sgn}


def weight_shape(where: str, w, dims: int) -> tuple[int, ...]:
    """Logical shape of a dense or NVFP4 weight with `dims` dims, checked (no device reads)."""
    if is_nvfp4(w):
        n, k = check_nvfp4(where, w)
        shape = (*w.packed.shape[:-2], n, k)
    else:
        if w.dtype not in (torch.bfloat16, torch.float16, torch.float32) or w.stride(-1) != 1:
            raise ValueError(f"{where}: dense weight is {w.dtype} with strides {w.stride()}, expected "
                             "bfloat16/float16/float32 with unit stride in K")
        shape = tuple(w.shape)
    if len(shape) != dims:
        raise ValueError(f"{where}: weight of shape {shape}, expected {dims} dims")
    return shape
