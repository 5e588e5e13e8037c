"""Every kernel launch of the real shapes compiles for sm_90 (H200) without a GPU: Triton's
NVIDIA backend plus the bundled ptxas, within shared-memory limits (tools/bench/compile_kernels.py);
with programmatic dependent launch the PTX waits for the previous grid before any global access."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from flint_kernels import tuning
from flint_kernels.registers import SM90_REGISTERS, program_registers

ROOT = Path(__file__).resolve().parents[2]


def compile_output(*args) -> str:
    """stdout of tools/bench/compile_kernels.py --arch 90 ARGS (exit 0 asserted)."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    script = ROOT / "tools" / "bench" / "compile_kernels.py"
    result = subprocess.run([sys.executable, str(script), "--arch", "90", *args],
                            capture_output=True, text=True, env=env, timeout=600)
    if "ptxas" in result.stderr and "No such file" in result.stderr:
        pytest.skip("Triton's bundled ptxas is missing")
    assert result.returncode == 0, result.stdout + result.stderr[-3000:]
    return result.stdout


def compile_rows(*args) -> list[list[str]]:
    """The table rows of compile_output(ARGS), split into cells."""
    return [[cell.strip() for cell in line.split("|")[1:-1]]
            for line in compile_output(*args).splitlines() if line.startswith("| ") and "_kernel" in line]


def test_kernels_compile_for_sm90():
    rows = compile_rows()
    assert len(rows) >= 55, rows  # attention, norms, MoE, W4A16, sampling launches
    assert {row[-1] for row in rows} == {"2"}, rows  # griddepcontrol.wait + launch_dependents in every kernel


def test_without_pdl_no_griddepcontrol():
    rows = compile_rows("--no-pdl", "--only", "rms_norm")
    assert rows and {row[-1] for row in rows} == {"0"}, rows


def test_activations_load_in_one_round_trip_after_the_wait():
    """--chains: the batch-1 MoE down launch (NVFP4 words) loads the token's SwiGLU outputs as
    one block, two 16-byte loads a thread, before any barrier after its PDL wait (they were eight
    stride-8 loads, each behind the previous one's shared-memory conversion), and nothing after;
    the gate/up launch loads x with the router's logits, before its expert pick."""
    out = compile_output("--chains", "--only", "moe small routed nvfp4 T=1")
    chains = dict(line.split(": ", 1) for line in out.splitlines() if ": " in line)
    down = chains["moe small routed nvfp4 T=1 | _moe_down_words_kernel"].split()
    assert down[0] == "LDG.E.128x2" and not any(op.startswith("LDG") for op in down[1:]), down
    # gate/up (H in two word steps: x read first): x's two 16-byte blocks a thread issue with the logits
    # load, before the top-k's first barrier; after the pick only weight loads follow (no x load
    # behind a barrier: no 2-byte LDG.E.U16 and no cp.async loop)
    gate_up = chains["moe small routed nvfp4 T=1 | _moe_gate_up_kernel"].split()
    assert gate_up[:2] == ["LDG.E.128x2", "LDG.E.64.STRONG.GPU"], gate_up
    assert not any(op.startswith(("LDG.E.U16", "LDGSTS")) for op in gate_up), gate_up
    # the rows' offsets come before the PDL wait, so the routing
    # handoff's atomic is followed by the weight loads, no barrier between
    handoff = gate_up.index("ATOMG")
    assert gate_up[handoff + 1].startswith("LDG.E.128"), gate_up


def test_nvfp4_products_need_no_conversion_a_nibble():
    """nvfp4.fp4_dot_loaded: a step's products as one [R, KW, 8] tensor, x's block broadcast once, so the
    batch-1 o_proj GEMV (4 steps) has a few barriers after its PDL wait (63 nibble by nibble: a
    layout conversion of x's column each), and the MoE down launch few too (20 before)."""
    def barriers(case, kernel):  # --barriers: "N file:line" pairs of the kernel's PTX after its wait
        out = compile_output("--barriers", "--only", case)
        counts = dict(line.split(": ", 1) for line in out.splitlines() if ": " in line)[f"{case} | {kernel}"]
        return sum(int(n) for n in counts.split()[::2]) if counts != "none" else 0
    assert barriers("nvfp4_linear o T=1", "_nvfp4_gemv_kernel") <= 16
    assert barriers("moe small routed nvfp4 T=1", "_moe_down_words_kernel") <= 10


def test_f16_products_take_fewer_instructions():
    """tuning.FP4_GEMV_F16: the batch-1 o_proj GEMV forms and sums each word's products in
    fp16 pairs, in fewer sm_90 instructions after its PDL wait than with fp32 products (the
    "other products" case), with no more barriers (--counts)."""
    out = compile_output("--counts", "--only", "nvfp4_linear o T=1")
    counts = {line.split(" | ")[0]: [int(n) for n in re.findall(r"(\d+) (?:instructions|BAR)", line)]
              for line in out.splitlines() if " | _nvfp4_gemv_kernel: " in line}
    f16 = counts["nvfp4_linear o T=1" + ("" if tuning.FP4_GEMV_F16 else " other products")]
    fp32 = counts["nvfp4_linear o T=1" + (" other products" if tuning.FP4_GEMV_F16 else "")]
    assert f16[0] < 0.9 * fp32[0] and f16[1] <= fp32[1], (f16, fp32)


def test_occupancy_of_the_batch1_bf16_launches():
    """The occupancy columns (flint_kernels/registers.py): ptxas's own register choice leaves the
    batch-1 BF16 qkv GEMV (640 programs, four an SM) more programs than the 132 SMs hold at once
    (capping its registers to fit one wave spilled and measured slower on the H200, 2026-12-05:
    BF16 2.754 -> 2.877 ms a token). The MoE down launch (8 slots: 6 routed experts and the shared
    expert of 1024 as two slots of 512) runs four warps a program (moe_gemv.DOWN_DENSE_WARPS):
    no spill, three programs an SM, 1.29 waves; at two warps it fits one wave but spills 66-98
    bytes a thread, and measured slower (H100 2026-12-06: 22.9 against 20.1 us at T=1)."""
    rows = {(row[0], row[1]): row for row in compile_rows("--only", "bf16 T=1") + compile_rows("--only", "qkv T=1")}
    def occupancy(case, kernel):  # (registers, spilled bytes, programs, an SM, waves)
        row = rows[(case, kernel)]
        return int(row[6]), int(row[7]), int(row[8]), int(row[9]), float(row[10])
    regs, spilled, programs, per_sm, waves = occupancy("dense_gemv + rms_norm qkv T=1", "_dense_gemv_kernel")
    assert programs == 640 and waves > 1 and waves == pytest.approx(programs / (per_sm * 132), abs=0.01), \
        (regs, per_sm, waves)
    assert SM90_REGISTERS // program_registers(regs, 4) == per_sm  # bound by registers
    regs, spilled, programs, per_sm, waves = occupancy("moe small routed bf16 T=1", "_moe_down_dense_kernel")
    assert rows[("moe small routed bf16 T=1", "_moe_down_dense_kernel")][3] == "4"  # warps
    assert programs == 512 and per_sm == 3 and 1 < waves < 1.3 and spilled == 0, (regs, spilled, per_sm, waves)
    assert SM90_REGISTERS // program_registers(regs, 4) == per_sm  # bound by registers


def test_set_compiles_with_a_knob_changed():
    """--set module.ATTR=value (as bench_step_timeline.py --variant): the MoE down at 2 warps a
    program takes four an SM, one wave."""
    (row,) = [row for row in compile_rows("--only", "moe small routed bf16 T=1",
                                          "--set", "flint_kernels.moe_gemv.DOWN_DENSE_WARPS=2")
              if row[1] == "_moe_down_dense_kernel"]
    assert (row[3], row[9], row[10]) == ("2", "4", "0.97"), row


def _sass_line(address: int, text: str, write: int | None = None, wait: tuple = ()) -> str:
    """One instruction as cuobjdump -sass prints it on sm_90: the text with its first word, then
    the second word, whose top bits hold the control fields (scoreboard numbers 0-5, 7: none)."""
    control = (sum(1 << b for b in wait) << 11) | ((7 if write is None else write) << 5) | (7 << 8) | 1
    return (f"        /*{address:04x}*/                   {text} ;        /* 0x000000000000000 */\n"
            f"                                                        /* 0x{control << 41:016x} */\n")


def test_load_waits_reads_the_scoreboards():
    """sass_scoreboards.load_waits (compile_kernels.py --waits) over hand-made SASS: two loads on
    scoreboards 2 and 3, an instruction waiting on 2 (pending: a W), two more loads and a cp.async
    commit (not a load), a wait on 3 (pending), a wait on 5 that no load set (no W). Imported from
    its own module: compile_kernels.py turns Triton's interpreter off when imported."""
    from tools.bench.sass_scoreboards import load_waits, sass_scoreboards
    sass = "".join([
        _sass_line(0x10, "LDG.E.128 R4, desc[UR4][R2.64]", write=0),  # before the PDL wait: not counted
        _sass_line(0x20, "ACQBULK"),
        _sass_line(0x30, "LDG.E.128 R8, desc[UR4][R2.64]", write=2),
        _sass_line(0x40, "@P0 LDG.E.128 R12, desc[UR4][R6.64]", write=3),
        _sass_line(0x50, "PRMT R20, R8, 0x7632, R20", wait=(2,)),
        _sass_line(0x60, "LDG.E.128 R24, desc[UR4][R2.64+0x200]", write=2),
        _sass_line(0x70, "LDG.E.64 R28, desc[UR4][R2.64+0x400]", write=4),
        _sass_line(0x78, "LDGDEPBAR"),  # cp.async's commit: not a load
        _sass_line(0x80, "FFMA R1, R12, R13, R1", wait=(3,)),
        _sass_line(0x90, "LDS.128 R32, [R0]", write=5),
        _sass_line(0xa0, "FADD R1, R32, R1", wait=(5,)),
    ])
    ops = sass_scoreboards(sass)
    assert ops[0] == ("LDG.E.128", 2, 0) and ops[2] == ("PRMT", None, 0b100)  # from after the wait
    assert load_waits(ops) == "L2 W L2 W"


def test_loop_loads_reads_the_backward_branches():
    """sass_scoreboards.loop_loads (compile_kernels.py --loop-loads) over hand-made SASS: a loop
    holding a cp.async copy (not a load into registers) and a predicated byte load, then a
    forward branch and a loop with no load."""
    from tools.bench.sass_scoreboards import loop_loads
    sass = "".join(_sass_line(at, text) for at, text in [
        (0x10, "LDG.E.128 R4, desc[UR4][R2.64]"),  # before any loop
        (0x20, "LDGSTS.E.BYPASS.128 [R10], desc[UR12][R8.64]"),
        (0x30, "@!P4 LDG.E.U8 R57, desc[UR12][R52.64]"),
        (0x40, "@!P6 BRA 0x20"),
        (0x50, "BRA 0x80"),
        (0x60, "FADD R1, R1, R2"),
        (0x70, "@P0 BRA 0x60"),
    ])
    assert loop_loads(sass) == ["3 instructions: LDG.E.U8", "2 instructions: none"]


def test_activations_after_the_wait_issue_together():
    """--waits on the batch-1 launches whose activations load after their PDL wait: the NVFP4
    GEMVs (qkv with the RMSNorm folded, o_proj) and the BF16 qkv issue every x load before the
    first wait for one. ptxas sinks the BF16 o_proj's x steps 2-4 below step 1's use (its PTX
    issues all four at once; forcing them together measured slower on the H200, 2026-12-05):
    a recorded state, asserted so that a change to it is seen."""
    out = compile_output("--waits", "--only", "T=1")
    waits = dict(line.split(": ", 1) for line in out.splitlines() if ": " in line)
    for case in ("nvfp4_linear + rms_norm qkv T=1 | _nvfp4_gemv_kernel", "nvfp4_linear o T=1 | _nvfp4_gemv_kernel",
                 "dense_gemv + rms_norm qkv T=1 | _dense_gemv_kernel"):
        first = waits[case].split()
        assert first[0].startswith("L") and not any(op.startswith("L") for op in first[1:]), (case, first)
    assert waits["dense_gemv o T=1 | _dense_gemv_kernel"] == "L W L3 W W W"
