"""Programmatic dependent launch (PDL): a kernel starts while the one before it finishes.

A decode step replays ~490 small kernels from a CUDA graph; each costs at least ~1 us of launch
gap even when empty (H200). Launched with the PDL attribute (`launch_pdl=True`:
CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION), a kernel's programs may be scheduled
before the previous kernel in the stream has completed, so its launch overlaps that kernel's tail.

The contract, kept by every kernel in this package: `pdl_prologue(PDL)` is the first statement,
before any load or store. It runs `griddepcontrol.wait` (blocks until the preceding grid has
completed and its memory is visible: then every earlier kernel has too, as each waited for its
own predecessor) and then `griddepcontrol.launch_dependents` (the next PDL kernel may be
scheduled once every program of this grid got here or exited). A kernel launched without the
attribute, e.g. a torch op, waits for the previous kernel to complete as usual; one launched
after such a kernel starts at its completion.

On when the launch is on a CUDA device of compute capability >= 9 (the instructions are sm_90+),
not under the Triton interpreter (it cannot run inline PTX), and `ENABLED`: FLINT_PDL=1 at import
sets it (off by default: it measured slower on the H200, see below); launchers read it at each
launch, so a benchmark can flip it between CUDA graph captures.
"""

from __future__ import annotations

import functools
import os

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

# Off by default: on the H200 it made a batch-1 NVFP4 decode step at 100K slower (graph replay
# 3.904 ms with PDL, 3.736 without; benchmarks/NOTES.md §9). FLINT_PDL=1 turns it on.
ENABLED = os.environ.get("FLINT_PDL", "0") == "1"
INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
# PDL for launches on CPU tensors: scripts/compile_kernels.py sets it to compile what an H200 launches
ON_HOST = False


def enabled(device: torch.device) -> bool:
    """Whether kernels launched on `device` use PDL now."""
    if not ENABLED or INTERPRET:
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
    if enabled(device):
        return {"PDL": True, "launch_pdl": True}
    return {"PDL": False}


@triton.jit
def pdl_prologue(PDL: tl.constexpr):
    """The first statement of every kernel: wait for the previous grid, then let the next one launch."""
    if PDL:
        gdc_wait()
        gdc_launch_dependents()
