"""The scoreboard fields of sm_70+ SASS as cuobjdump prints it, and the view of a kernel's global
loads and the waits for them that `tools/bench/compile_kernels.py --waits` prints ("L9 W L3": 3
loads issued only after one of the first 9 returned); the synchronous loads inside its loops
(`--loop-loads`). Plain text parsing, no GPU and no Triton:
compile_kernels.py turns Triton's interpreter off when imported, so tests take these from here."""

from __future__ import annotations

import re


def sass_scoreboards(sass: str) -> list[tuple[str, int | None, int]]:
    """cuobjdump -sass text (sm_70+: each instruction printed with its two 64-bit words) after
    ACQBULK (all of it without PDL) -> [(opcode, write scoreboard or None, mask of the scoreboards
    it waits on)]. The control bits are the second word's top 23: stall 41-44, yield 45, write
    scoreboard 46-48 (7: none), read scoreboard 49-51, wait mask 52-57, reuse 58-61."""
    ops = []
    lines = sass[max(sass.find("ACQBULK"), 0):].splitlines()
    for line, following in zip(lines, lines[1:] + [""]):
        m = re.search(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9._]*)", line)
        if not m:
            continue
        control = re.search(r"^\s*/\* 0x([0-9a-f]{16}) \*/\s*$", following)
        bits = int(control.group(1), 16) >> 41 if control else 7 << 5
        write = (bits >> 5) & 7
        ops.append((m.group(1), None if write == 7 else write, (bits >> 11) & 0x3F))
    return ops


def load_waits(ops: list[tuple[str, int | None, int]]) -> str:
    """The global loads of sass_scoreboards' instructions and the waits for them, in issue order:
    "L9 W L3" is 9 loads, then an instruction that waits for one of them (its scoreboard still
    pending), then 3 more loads, which thus start a round trip after the first ones returned.
    Loads that need an earlier load's value (a pointer, an expert id) must come after a W; loads
    that ptxas sank below the first use of others (the activations a prefetching kernel reads
    after its PDL wait, in the PTX all issued at once) show the same way."""
    pending: set[int] = set()
    runs: list[list] = []
    for op, write, wait in ops:
        if any(wait >> b & 1 for b in pending):
            pending -= {b for b in range(6) if wait >> b & 1}
            runs.append(["W", 1])
        if op.startswith("LDG") and not op.startswith("LDGDEPBAR"):  # not cp.async's commit
            if runs and runs[-1][0] == "L":
                runs[-1][1] += 1
            else:
                runs.append(["L", 1])
            if write is not None:
                pending.add(write)
    return " ".join(op if n == 1 else f"{op}{n}" for op, n in runs) or "no loads"


def loop_loads(sass: str) -> list[str]:
    """Each loop of cuobjdump -sass text (a branch back to a lower address) -> "N instructions:
    its LDG opcodes" ("none"): loads into registers, which a K loop waits for in the step that
    issues them, where its cp.async copies (LDGSTS) arrive stages ahead."""
    code = [(int(at, 16), text) for at, text in re.findall(r"/\*([0-9a-f]{4,})\*/\s+([^;]*);", sass)]
    loops = []
    for at, text in code:
        back = re.search(r"\bBRA\s+(?:`\(\.L_x_\d+\)\s*)?0x([0-9a-f]+)", text)
        if back and int(back.group(1), 16) < at:
            body = [t for a, t in code if int(back.group(1), 16) <= a <= at]
            loads = [m.group(1) for t in body for m in [re.search(r"\b(LDG\.[A-Z0-9._]*|LDG)\s", t)] if m]
            loops.append(f"{len(body)} instructions: " + (" ".join(loads) or "none"))
    return loops
