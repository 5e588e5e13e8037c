"""A launch's register budget: how many programs of a kernel an SM holds at once.

A decode GEMV loads its weights into registers before its PDL wait (pdl.py), so the programs
resident at once bound what it can prefetch: a launch of more programs than the SMs hold runs a
second, partial wave that starts loading only as the first wave's programs retire. ptxas takes up
to 255 registers a thread (capping them with .maxnreg spilled, and measured slower on the H200,
2026-12-05: BF16 2.754 -> 2.877 ms a token at 100K).

sm_90 (H100, H200) limits, from the CUDA occupancy rules: 65536 registers, 64 warps, 32 programs
and 228 KB of shared memory (1 KB reserved a program) an SM; registers are allocated a warp at a
time in units of 256, a thread's count rounded up to a multiple of 8.
"""

from __future__ import annotations

SM90_REGISTERS = 65536
SM90_WARPS = 64
SM90_PROGRAMS = 32
SM90_SHARED = 233472   # bytes an SM
SM90_SHARED_RESERVED = 1024  # bytes an SM reserves a program


def program_registers(registers: int, warps: int) -> int:
    """Registers of an SM's file one program takes, given its registers a thread and warps."""
    per_thread = -(-max(registers, 1) // 8) * 8
    return -(-per_thread * 32 // 256) * 256 * warps


def programs_per_sm(registers: int, warps: int, shared: int) -> int:
    """Programs of a kernel one sm_90 SM holds at once, given its registers a thread, warps a
    program and shared memory a program (bytes)."""
    by_registers = SM90_REGISTERS // program_registers(registers, warps)
    by_shared = SM90_SHARED // (shared + SM90_SHARED_RESERVED)
    return min(by_registers, SM90_WARPS // warps, by_shared, SM90_PROGRAMS)
