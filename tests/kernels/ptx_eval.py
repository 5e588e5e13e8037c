"""A tiny evaluator of the straight-line integer and fp16x2 PTX that nvfp4's inline asm uses,
on numpy arrays (one lane an element): the decodes' PTX text itself runs on the CPU, where the
Triton interpreter takes the fp32 decode instead.

Supported: .reg lines and braces (skipped); shl.b32, shr.u32, and.b32, lop3.b32, mov.b32
{lo, hi} (a split into .b16 halves), cvt.rn.f16x2.e4m3x2 and mul.rn.f16x2. Operands: $N (the
asm's operands), named registers, decimal or hex immediates."""

import re

import numpy as np
import torch

U32 = np.uint32


def _f16(bits: np.ndarray) -> np.ndarray:
    return (bits & 0xFFFF).astype(np.uint16).view(np.float16)


def _f16_bits(values: np.ndarray) -> np.ndarray:
    return values.astype(np.float16).view(np.uint16).astype(U32)


def _e4m3_to_f16_bits(byte: np.ndarray) -> np.ndarray:
    as_e4m3 = torch.from_numpy(byte.astype(np.uint8)).view(torch.float8_e4m3fn)
    return _f16_bits(as_e4m3.to(torch.float32).numpy())


def _lop3(a, b, c, lut: int):
    out = np.zeros_like(a)
    for i in range(8):  # minterm i: a's bit is i's bit 2, b's bit 1, c's bit 0 (a = 0xF0, b = 0xCC, c = 0xAA)
        if lut >> i & 1:
            out |= (a if i & 4 else ~a) & (b if i & 2 else ~b) & (c if i & 1 else ~c)
    return out


def run(ptx: str, operands: dict[int, np.ndarray]) -> dict[int, np.ndarray]:
    """Evaluate `ptx` with $N = operands[N] (uint32 arrays of one shape); -> every $N after it."""
    regs = {f"${n}": v.astype(U32) for n, v in operands.items()}

    def val(token: str) -> np.ndarray:
        token = token.strip()
        if token in regs:
            return regs[token]
        return U32(int(token, 0))

    for line in ptx.splitlines():
        line = line.strip().rstrip(";")
        if not line or line in "{}" or line.startswith(".reg"):
            continue
        op, rest = line.split(None, 1)
        if op == "mov.b32" and rest.startswith("{"):
            lo, hi, src = re.fullmatch(r"\{\s*([\w$]+)\s*,\s*([\w$]+)\s*\}\s*,\s*(\S+)", rest).groups()
            regs[lo], regs[hi] = val(src) & U32(0xFFFF), val(src) >> U32(16)
            continue
        dst, *args = [t.strip() for t in rest.split(",")]
        a = [val(t) for t in args]
        if op == "shl.b32":
            out = (a[0] << a[1]) & U32(0xFFFFFFFF)
        elif op == "shr.u32":
            out = a[0] >> a[1]
        elif op == "and.b32":
            out = a[0] & a[1]
        elif op == "lop3.b32":
            out = _lop3(a[0], a[1], a[2], int(args[3], 0))
        elif op == "cvt.rn.f16x2.e4m3x2":
            out = _e4m3_to_f16_bits(a[0] & U32(0xFF)) | (_e4m3_to_f16_bits(a[0] >> U32(8)) << U32(16))
        elif op == "mul.rn.f16x2":  # the product of two fp16 is exact in fp32: one rounding, as the GPU's
            lo = _f16(a[0]).astype(np.float32) * _f16(a[1]).astype(np.float32)
            hi = _f16(a[0] >> U32(16)).astype(np.float32) * _f16(a[1] >> U32(16)).astype(np.float32)
            out = _f16_bits(lo) | (_f16_bits(hi) << U32(16))
        else:
            raise NotImplementedError(f"ptx_eval: {op}")
        regs[dst] = np.broadcast_to(out, np.broadcast(*[np.asarray(x) for x in a]).shape).astype(U32)
    return {int(k[1:]): v for k, v in regs.items() if k.startswith("$")}
