"""L2 prefetch: a program asks for rows it will load after its PDL wait to be brought from HBM
into L2 before it, without holding them in registers.

`cp.async.bulk.prefetch.L2` has the SM's TMA unit fetch a contiguous range into L2: no
registers, nothing to wait for, no result to check. A hint: it changes no result; it runs on
sm_90+ only, not under the Triton interpreter (no PTX there), and the launcher decides with
`can_prefetch`.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from . import pdl

INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"

_BULK_PREFETCH_PTX = tl.constexpr(
    "{ .reg .pred p; setp.gt.s32 p, $2, 0; @p cp.async.bulk.prefetch.L2.global [$1], $2; mov.u32 $0, 0; }")


def can_prefetch(device: torch.device) -> bool:
    """Whether the bulk L2 prefetch runs on `device`: sm_90+, not under the interpreter (and on
    CPU tensors when scripts/compile_kernels.py compiles what an H200 launches: pdl.ON_HOST)."""
    if INTERPRET:
        return False
    if device.type != "cuda":
        return pdl.ON_HOST
    return torch.cuda.get_device_capability(device)[0] >= 9


@triton.jit
def l2_prefetch_rows(ptr, first_row, n_rows, row_stride, THREADS: tl.constexpr):
    """Brings rows [first_row, first_row + n_rows) of a row-major tensor (ptr: its first element,
    row_stride in elements; n_rows * row_stride elements contiguous, 16-byte aligned) into L2:
    one bulk request, from the first of the program's THREADS (= 32 * num_warps) threads."""
    lane = tl.arange(0, THREADS)  # one element a thread: lane 0 issues, the others skip
    start = (ptr + first_row.to(tl.int64) * row_stride).to(tl.int64, bitcast=True)
    nbytes = n_rows * row_stride * (ptr.dtype.element_ty.primitive_bitwidth // 8)
    size = tl.where(lane == 0, nbytes, 0).to(tl.int32)
    tl.inline_asm_elementwise(_BULK_PREFETCH_PTX, "=r,l,r", [start + lane * 0, size], dtype=tl.int32,
                              is_pure=False, pack=1)
