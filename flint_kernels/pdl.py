"""Programmatic dependent launch (PDL): a kernel starts while the one before it finishes.

A decode step replays ~490 small kernels from a CUDA graph; each costs at least ~1 us of launch
gap even when empty (H200). Launched with the PDL attribute (`launch_pdl=True`:
CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION), a kernel's programs may be scheduled
before the previous kernel in the stream has completed, so its launch overlaps that kernel's tail.

The contract, kept by every kernel in this package: `pdl_prologue(PDL)` comes before any store
and before any load of memory that another kernel of a step writes. It runs
`griddepcontrol.wait` (blocks until the preceding grid has completed and its memory is visible:
then every earlier kernel has too, as each waited for its own predecessor) and then
`griddepcontrol.launch_dependents` (the next PDL kernel may be scheduled once every program of
this grid got here or exited). Before it a kernel may only load weights ("prefetch": the GEMVs,
the router and the MoE down launch load their weight tiles first, so their HBM read overlaps
the previous kernel; the MoE down launches also read the router's expert ids, written two or
three kernels back: a program runs only after every program of the kernel before it has passed
its wait, i.e. after the router completed), and the step's metadata that the host copies in before
the step and no kernel writes (context lengths, positions, cache slots, block tables: the
decode-attention launches). The attention reduce reads more on that ground: the new token's
q, k, v, written before the split launch (decode_attention._decode_reduce_kernel). Two launches
poll a flag instead: the routed MoE down launch reads the expert ids the gate/up launch just
before it publishes (moe_gemv._token_routing: an acquire load, polled until set; every gate/up
program is resident or done by then, as below); the grouped MoE's down launch at decode sizes
(moe_grouped HANDOFF) polls a count of its block's gate/up tiles before loading what they
stored, and comes to its prologue after its K loop, before its stores and atomics (both:
poll_at_least). A program runs only after the kernel before it passed its wait, so every launch
and copy before that kernel has completed. A kernel launched without the attribute, e.g. a
torch op, waits for the previous kernel to complete as usual; one launched after such a kernel
starts at its completion.

On when the launch is on a CUDA device of compute capability >= 9 (the instructions are sm_90+),
not under the Triton interpreter (it cannot run inline PTX), and tuning.PDL is (FLINT_PDL, on by
default). Launchers read it at each launch, so a benchmark can flip it between CUDA graph captures.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from . import tuning

# PDL for launches on CPU tensors: tools/bench/compile_kernels.py sets it to compile what an H200 launches
ON_HOST = False


def enabled(device: torch.device) -> bool:
    """Whether kernels launched on `device` use PDL now."""
    if not tuning.PDL or tuning.INTERPRET:
        return False
    if device.type != "cuda":
        return ON_HOST
    return _major(device.index if device.index is not None else torch.cuda.current_device()) >= 9


@functools.lru_cache(maxsize=None)
def _major(index: int) -> int:
    return torch.cuda.get_device_capability(index)[0]


def launch_args(device: torch.device) -> dict:
    """Keyword arguments of a launch on `device`: the kernel's PDL constexpr and, when on, the
    launch option (the interpreter drops it; the JIT takes it as an option, not an argument)."""
    if not enabled(device):
        return {"PDL": False}
    return {"PDL": True, "launch_pdl": True}


@triton.jit
def pdl_prologue(PDL: tl.constexpr):
    """Wait for the previous grid, then let the next one launch: before any store, and before any
    load of what other kernels write (only weight loads may come first)."""
    if PDL:
        gdc_wait()
        gdc_launch_dependents()


# polls of a handoff flag before a program gives up (never, if sound): it then goes on with what
# it read (a wrong output, not an out-of-bounds read or a hang)
SPIN_LIMIT = tl.constexpr(1 << 24)
# an acquire load (no atomic: the PDL contract keeps atomics after the wait); masked lanes read 1
_LD_ACQUIRE_PTX = tl.constexpr(
    "{ .reg .pred p; setp.ne.s32 p, $2, 0; mov.u32 $0, 1; @p ld.acquire.gpu.global.b32 $0, [$1]; }")


@triton.jit
def load_acquire(ptrs, mask, PTX: tl.constexpr):
    """int32 values at ptrs (1 where masked), each load ordered before the program's later loads
    (ld.acquire.gpu); under the interpreter, which runs launches one program at a time, a load."""
    if PTX:
        return tl.inline_asm_elementwise(_LD_ACQUIRE_PTX, "=r,l,r", [ptrs.to(tl.int64, bitcast=True), mask.to(tl.int32)],
                                         dtype=tl.int32, is_pure=False, pack=1)
    return tl.load(ptrs, mask=mask, other=1, volatile=True)


@triton.jit
def poll_at_least(ptrs, mask, at_least, PTX: tl.constexpr):
    """load_acquire(ptrs, mask), again until every value is >= at_least (or SPIN_LIMIT polls):
    a handoff flag set by a launch still running. -> the values last read."""
    values = load_acquire(ptrs, mask, PTX)
    spins = 0
    while (tl.min(values) < at_least) & (spins < SPIN_LIMIT):
        values = load_acquire(ptrs, mask, PTX)
        spins += 1
    return values
