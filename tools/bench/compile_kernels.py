"""Compile every kernel launch of the real-shape cases for an NVIDIA GPU, on a machine without one.

    python tools/bench/compile_kernels.py                 # sm_90 (H200): table, exit 1 on failure
    python tools/bench/compile_kernels.py --arch 100 --ptx-stats
    python tools/bench/compile_kernels.py --only "moe small routed nvfp4 T=1" --chains
    python tools/bench/compile_kernels.py --only "nvfp4_linear o T=1" --barriers
    python tools/bench/compile_kernels.py --only "nvfp4_linear o T=1" --counts
    python tools/bench/compile_kernels.py --only "dense_gemv o T=1" --waits
    python tools/bench/compile_kernels.py --only "moe small routed bf16 T=1" --set flint_kernels.moe_gemv.DOWN_DENSE_WARPS=4

The public launchers run on small CPU tensors of the real dtypes and constexprs (head_dim 128,
GQA 32/4, block size 64, ring 513; H 2048, 256 experts of 512 and a shared expert of 1024,
top-6, dense MLP 6144, vocab 150144), as on a
132-SM H200 (grid-sizing heuristics see that SM count); their kernel launches are recorded instead of run, then
compiled by Triton's NVIDIA backend (the same path as a first launch on the GPU, with its
16-byte alignment specialisation) and assembled with the bundled ptxas for registers and
spills. This catches what the CPU interpreter cannot: compiled-mode typing, shared-memory
overflow, register spills, and whether loads are vectorised and dots use tensor cores. The
table's occupancy columns (sm_90): the launch's programs, how many an SM holds at once
(flint_kernels/registers.py: registers, warps, shared memory) and the waves they take over
132 SMs; a decode GEMV's programs beyond one wave load their weights only as the first retire.
Launches use programmatic dependent launch as on an H200 (flint_kernels/pdl.py; --no-pdl: without):
a kernel fails unless its PTX waits (griddepcontrol.wait) before its first global store or
atomic when PDL is on (weight loads may come first), and has no griddepcontrol instruction when
it is off.
--barriers prints, instead of the table, each kernel's bar.sync count after its PDL wait by
source line (a layout conversion through shared memory costs two or more).
--chains prints, instead of the table, each kernel's SASS after its PDL wait (ACQBULK) reduced to
its global loads, cp.async copies, barriers, shuffles, stores and atomics, repeats counted
("LDG.E.128x2 BARx21 ..."): a load behind a BAR.SYNC waits for the values before it, so each
such run is one more round trip to memory after the wait.
--loop-loads prints, instead of the table, each kernel's loops (SASS, by their backward branches)
with the global loads into registers inside them: a K loop waits for those in the step that
issues them, where its cp.async copies arrive stages ahead.
--counts prints, instead of the table, each kernel's SASS instructions and BAR.SYNCs from its PDL
wait on, and the index of its first global atomic.
--waits prints, instead of the table, each kernel's global loads after its PDL wait and the
scoreboard waits between them ("L9 W L3": 3 loads issued only after one of the first 9 returned),
from the SASS control bits.
"""

from __future__ import annotations

import argparse
import functools
import math
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

os.environ.pop("TRITON_INTERPRET", None)  # compile for the GPU, whatever the caller set
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root, run as a file

import torch  # noqa: E402
import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource, make_backend  # noqa: E402
from triton.runtime.jit import create_function_from_signature  # noqa: E402

from flint_kernels.registers import programs_per_sm  # noqa: E402
from tools.bench.knobs import with_knob  # noqa: E402
from tools.bench.sass_scoreboards import load_waits, loop_loads, sass_scoreboards  # noqa: E402

MAX_SHARED = 232448  # bytes per block on sm_90
H200_SMS = 132
BACKEND = make_backend(GPUTarget("cuda", 90, 32))  # (its argument specialisation is every arch's)


class Recorder:
    """Stands in for a @triton.jit kernel inside its module: `kernel[grid](**kwargs)` is recorded."""

    def __init__(self, fn, log):
        self.fn, self.log = fn, log

    def __getitem__(self, grid):
        return lambda **kwargs: self.log.append((self.fn, kwargs, grid))


def record(modules, call) -> list:
    """Run `call()` with every jit kernel of `modules` (one or a tuple) replaced by a Recorder;
    -> [(fn, kwargs, grid)]."""
    log = []
    swapped = []
    for module in modules if isinstance(modules, tuple) else (modules,):
        for name, fn in vars(module).items():
            if isinstance(fn, triton.runtime.JITFunction) and name.endswith("_kernel"):
                swapped.append((module, name, fn))
    for module, name, fn in swapped:
        setattr(module, name, Recorder(fn, log))
    try:
        call()
    finally:
        for module, name, fn in swapped:
            setattr(module, name, fn)
    return log


def launch_signature(fn, kwargs) -> tuple[dict, dict, dict, dict]:
    """What Triton specialises a launch of `fn` with `kwargs` on: (signature, constexprs, attrs,
    options) as triton.compile takes them, from the JIT's own binder (its specialisation of 1 and
    None, of divisibility by 16, and do_not_specialize)."""
    options = {k: kwargs[k] for k in ("num_warps", "num_stages", "launch_pdl", "maxnreg") if kwargs.get(k) is not None}
    _, specialization, _ = _binder(fn)(**{param.name: kwargs[param.name] for param in fn.params})
    signature, constexprs, attrs = {}, {}, {}
    for i, (param, (kind, attr)) in enumerate(zip(fn.params, specialization)):
        signature[param.name] = kind
        if kind == "constexpr":
            constexprs[param.name] = kwargs[param.name]
        elif attr:  # "D": divisible by 16
            attrs[(i,)] = BACKEND.parse_attr(attr)
    return signature, constexprs, attrs, options


@functools.cache
def _binder(fn):
    return create_function_from_signature(fn.signature, fn.params, BACKEND)


def compile_launch(fn, kwargs, arch: int):
    signature, constexprs, attrs, options = launch_signature(fn, kwargs)
    src = ASTSource(fn=fn, signature=signature, constexprs=constexprs, attrs=attrs)
    return triton.compile(src, target=GPUTarget("cuda", arch, 32), options=options)


def ptxas_stats(ptx: str, arch: int) -> dict:
    ptxas = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "ptxas"
    with tempfile.NamedTemporaryFile("w", suffix=".ptx") as f:
        f.write(ptx)
        f.flush()
        out = subprocess.run([str(ptxas), "-v", f"--gpu-name=sm_{arch}a", f.name, "-o", os.devnull],
                             capture_output=True, text=True, check=True).stderr
    regs = re.search(r"Used (\d+) registers", out)
    spills = re.search(r"(\d+) bytes spill stores", out)
    return dict(regs=int(regs.group(1)) if regs else -1, spills=int(spills.group(1)) if spills else 0)


_CHAIN_OPS = ("LDG", "LDGSTS", "BAR.SYNC", "ATOMG", "RED", "STG", "SHFL", "EXIT")


def barrier_lines(ptx: str) -> str:
    """The PTX's bar.sync instructions after griddepcontrol.wait (all of them without PDL),
    counted by the source line they come from (the `.loc` before each): "12 nvfp4.py:312 ...",
    most first. A layout conversion through shared memory costs two or more."""
    files = dict(re.findall(r'\.file\s+(\d+)\s+"([^"]+)"', ptx))
    counts: dict[str, int] = {}
    where, waited = "?", "griddepcontrol.wait" not in ptx
    for line in ptx.splitlines():
        line = line.strip()
        loc = re.match(r"\.loc\s+(\d+)\s+(\d+)", line)
        if loc:
            where = f"{Path(files.get(loc.group(1), '?')).name}:{loc.group(2)}"
        waited = waited or line.startswith("griddepcontrol.wait")
        if waited and line.startswith("bar.sync"):
            counts[where] = counts.get(where, 0) + 1
    return " ".join(f"{n} {at}" for at, n in sorted(counts.items(), key=lambda kv: -kv[1])) or "none"


def sass_after_wait(cubin: bytes) -> list[str]:
    """The opcodes of the kernel's SASS from griddepcontrol.wait (ACQBULK) on, in program order
    (all of them without PDL)."""
    return [op for op, _, _ in sass_scoreboards(_cuobjdump_sass(cubin))]


def _cuobjdump_sass(cubin: bytes) -> str:
    cuobjdump = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        return subprocess.run([str(cuobjdump), "-sass", f.name], capture_output=True, text=True, check=True).stdout


def sass_chain(cubin: bytes) -> str:
    """The kernel's instructions after griddepcontrol.wait (sass_after_wait), reduced to memory,
    barrier and shuffle operations, consecutive repeats counted."""
    runs: list[list] = []
    for op in sass_after_wait(cubin):
        if not op.startswith(_CHAIN_OPS):
            continue
        op = op if op.startswith("LDG") else op.split(".")[0]
        if runs and runs[-1][0] == op:
            runs[-1][1] += 1
        else:
            runs.append([op, 1])
    return " ".join(op if n == 1 else f"{op}x{n}" for op, n in runs)


def sass_counts(cubin: bytes) -> str:
    """How many SASS instructions and BAR.SYNCs the kernel has from its PDL wait on, and where
    its first global atomic is (the routed MoE gate/up's publish of the picks)."""
    ops = sass_after_wait(cubin)
    atom = next((i for i, op in enumerate(ops) if op.startswith("ATOMG")), None)
    bars = sum(op.startswith("BAR.SYNC") for op in ops)
    return f"{len(ops)} instructions, {bars} BAR.SYNC" + (f", first ATOMG at {atom}" if atom is not None else "")


def ptx_counts(ptx: str) -> dict:
    return dict(
        mma=len(re.findall(r"\bmma\.sync", ptx)), wgmma=len(re.findall(r"wgmma\.mma_async", ptx)),
        ld_v4=len(re.findall(r"ld\.global(?:\.\w+)*\.v4", ptx)),
        ld_scalar=len(re.findall(r"ld\.global(?:\.(?:nc|L1::\w+|L2::\w+|b16|b32|u16|u32))+\s", ptx)),
        cp_async=len(re.findall(r"cp\.async\.(?:cg|ca)", ptx)),
        griddep=len(re.findall(r"griddepcontrol\.(?:wait|launch_dependents)", ptx)))


def pdl_prologue_ok(ptx: str, on: bool) -> bool:
    """PDL on: griddepcontrol.wait, then launch_dependents, precede every global store and atomic
    (loads may come first: weight prefetch, flint_kernels/pdl.py); off: neither."""
    if not on:
        return "griddepcontrol" not in ptx
    wait, launch = ptx.find("griddepcontrol.wait"), ptx.find("griddepcontrol.launch_dependents")
    first = re.search(r"\b(?:st|atom|red)\.global", ptx)
    return 0 <= wait < launch and (first is None or launch < first.start())


# ----------------------------------------------------------------------------- launches
def launches() -> list[tuple[str, object, object]]:
    """(case name, kernel module, call) at real shapes with small sizes."""
    from flint_kernels import decode_attention, kv_write, prefill_attention, qk_norm_rope, rms_norm
    hq, hk, d, bf16 = 32, 4, 128, torch.bfloat16
    x = torch.randn(4, 2048, dtype=bf16)
    w = torch.randn(2048, dtype=bf16)
    qkv = torch.randn(4, (hq + 2 * hk) * d, dtype=bf16)
    dw = torch.randn(d, dtype=bf16)
    cos_sin = torch.randn(64, d)
    q, k = torch.randn(4, hq, d, dtype=bf16), torch.randn(4, hk, d, dtype=bf16)
    v_view = qkv[:, (hq + hk) * d:].view(4, hk, d)  # as qk_norm_rope returns it
    paged = torch.zeros(8, 64, hk, d, dtype=bf16)
    ring = torch.zeros(4, 513, hk, d, dtype=bf16)
    tables = torch.zeros(4, 2, dtype=torch.int32)
    rows = torch.arange(4, dtype=torch.int32)
    lens = torch.full((4,), 70, dtype=torch.int32)
    qsl = torch.arange(5, dtype=torch.int32)
    sinks = torch.zeros(hq)
    slots = torch.arange(4)
    scale = d ** -0.5
    return [
        ("rms_norm H=2048 +residual", rms_norm, lambda: rms_norm.rms_norm(x, w, 1e-5, residual=x.clone())),
        ("rms_norm H=2048", rms_norm, lambda: rms_norm.rms_norm(x, w, 1e-5)),
        ("qk_norm_rope rope+cache", qk_norm_rope,
         lambda: qk_norm_rope.qk_norm_rope(qkv, dw, dw, slots, cos_sin, 1e-5, hq, hk, paged, paged, slots)),
        ("qk_norm_rope nope", qk_norm_rope, lambda: qk_norm_rope.qk_norm_rope(qkv, dw, dw, slots, None, 1e-5, hq, hk)),
        ("qk_norm_rope prefill blocks", qk_norm_rope, lambda: qk_norm_rope.qk_norm_rope(
            qkv, dw, dw, slots, cos_sin, 1e-5, hq, hk, paged, paged, slots, heads_per_program=hq)),
        ("decode paged", decode_attention, lambda: decode_attention.decode_attention(
            q, k, v_view, paged, paged, lens, sinks, scale, 0, block_tables=tables)),
        ("decode ring", decode_attention, lambda: decode_attention.decode_attention(
            q, k, v_view, ring, ring, lens, sinks, scale, 513, ring_rows=rows)),
        ("prefill paged", prefill_attention, lambda: prefill_attention.prefill_attention(
            q, k, v_view, qsl, lens, paged, paged, sinks, scale, 0, 4096, block_tables=tables)),
        ("prefill paged pages", prefill_attention, lambda: prefill_attention.prefill_attention(
            q, k, v_view, qsl, lens, paged, paged, sinks, scale, 0, 4096, block_tables=tables, kv_in_cache=True)),
        ("kv_write ring", kv_write, lambda: kv_write.kv_write(k, v_view, ring, ring, slots)),
        ("prefill ring", prefill_attention, lambda: prefill_attention.prefill_attention(
            q, k, v_view, qsl, lens, ring, ring, sinks, scale, 513, 4096, ring_rows=rows)),
        ("prefill decode-rows", prefill_attention, lambda: prefill_attention.prefill_attention(
            q, k, v_view, qsl, lens, paged, paged, sinks, scale, 0, 1, block_tables=tables)),
        ("decode B=1", decode_attention, lambda: decode_attention.decode_attention(  # 66 splits: batch-1 decode
            q[:1], k[:1], v_view[:1], paged, paged, lens[:1], sinks, scale, 0, block_tables=tables[:1])),
        # ints equal to 1 become constexprs: one sequence, one split, one-block tables
        ("decode B=1 one split", decode_attention, lambda: decode_attention.decode_attention(
            q[:1], k[:1], v_view[:1], paged, paged, lens[:1], None, scale, 0, block_tables=tables[:1, :1].contiguous(),
            num_splits=1)),
        ("prefill B=1", prefill_attention, lambda: prefill_attention.prefill_attention(
            q, k, v_view, qsl[:2], lens[:1], ring, ring, None, scale, 513, 4096, ring_rows=rows[:1])),
    ] + moe_launches() + w4a16_launches() + sampling_launches()


def nvfp4(*shape, per_row=False):
    """A zero NVFP4 weight [..., N, K] (per-row global scale for fused weights)."""
    from flint_backend.weights.nvfp4 import NVFP4Weight
    *lead, n, k = shape
    return NVFP4Weight(torch.zeros(*lead, n, k // 2, dtype=torch.uint8),
                       torch.zeros(*lead, n, k // 16, dtype=torch.float8_e4m3fn),
                       torch.ones(tuple(lead) + ((n,) if per_row else ())))


def moe_launches() -> list:
    from flint_kernels import halves, moe_gemv, moe_grouped, moe_sort, router, swiglu, tuning
    from flint_kernels import nvfp4_linear as lin
    from tools.bench.knobs import with_knob
    e, h, i, i_s, k, bf16 = 256, 2048, 512, 1024, 6, torch.bfloat16

    def args(t, fp4):
        x = torch.randn(t, h, dtype=bf16)
        ids = torch.randint(0, e, (t, k), dtype=torch.int32)
        if fp4:
            return x, ids, torch.rand(t, k), nvfp4(e, 2 * i, h, per_row=True), nvfp4(e, h, i), \
                nvfp4(2 * i_s, h, per_row=True), nvfp4(h, i_s)
        return x, ids, torch.rand(t, k), torch.zeros(e, 2 * i, h, dtype=bf16), torch.zeros(e, h, i, dtype=bf16), \
            torch.zeros(2 * i_s, h, dtype=bf16), torch.zeros(h, i_s, dtype=bf16)

    router_w = torch.randn(e, h, dtype=torch.float32)  # the checkpoint's fp32 router
    cases = [(f"router T={t}", router, lambda t=t: router.router_topk(torch.randn(t, h, dtype=bf16), router_w, k, True))
             for t in (1, 64, 8192)]
    hw = torch.randn(h, dtype=bf16)
    cases += [(f"router + rms_norm T={t}", router, lambda t=t: router.rms_norm_router_topk(
        torch.randn(t, h, dtype=bf16), torch.randn(t, h, dtype=bf16), hw, 1e-5, router_w, k, True))
        for t in (1, 8)]
    cases += [("router logits + rms_norm T=1", router, lambda: router.rms_norm_router_logits(
        torch.randn(1, h, dtype=bf16), torch.randn(1, h, dtype=bf16), hw, 1e-5, router_w))]
    for fmt, fp4 in [("bf16", False), ("nvfp4", True)]:
        cases += [(f"moe small {fmt} T={t}", moe_gemv, lambda t=t, fp4=fp4: moe_gemv.moe_gemv(*args(t, fp4)))
                  for t in (1, 8, 16)]
        # the top-k picked in the expert launches from the router's logits (ops.norm_moe at decode sizes)
        cases += [(f"moe small routed {fmt} T={t}", moe_gemv, lambda t=t, fp4=fp4: moe_gemv.moe_gemv_routed(
            args(t, fp4)[0], torch.randn(t, e), torch.zeros(t, router.ROUTING_WORDS, dtype=torch.int32), k, True,
            *args(t, fp4)[3:])) for t in (1, 8)]
        if fp4:
            cases += [(f"moe small {fmt} T={t} other decode", moe_gemv,
                       lambda t=t: other_decode(lambda: moe_gemv.moe_gemv(*args(t, True)))) for t in (1, 16)]
        cases += [(f"moe grouped {fmt} T={t}", (moe_sort, halves, moe_grouped, swiglu, lin),
                   lambda t=t, fp4=fp4: moe_grouped.moe_grouped(*args(t, fp4))) for t in (64, 8192)]
        if fp4:  # the decode tiles' blocks straight from the ids (tuning.MOE_UNSORTED_MAX_TOKENS)
            cases.append((f"moe grouped {fmt} T=64 unsorted", (halves, moe_grouped, swiglu, lin),
                          lambda: with_knob(tuning, "MOE_UNSORTED_MAX_TOKENS", 64,
                                            lambda: moe_grouped.moe_grouped(*args(64, True)))))
    # an fp32 model (the GPU tests' exact oracle runs): fp32 tiles at each tile class, on small
    # experts (the tiles follow the rows an expert, 3 of 8 experts + the shared one 2I wide)
    def fp32_args(t):
        f32, es, hs, ii = torch.float32, 8, 64, 32
        return (torch.randn(t, hs, dtype=f32), torch.randint(0, es, (t, 3), dtype=torch.int32), torch.rand(t, 3),
                torch.zeros(es, 2 * ii, hs, dtype=f32), torch.zeros(es, hs, ii, dtype=f32),
                torch.zeros(4 * ii, hs, dtype=f32), torch.zeros(hs, 2 * ii, dtype=f32))
    cases += [(f"moe grouped fp32 T={t}", (moe_sort, halves, moe_grouped, swiglu, lin),
               lambda t=t: with_knob(tuning, "MOE_SHARED_DENSE_MIN_TOKENS", None,
                                     lambda: moe_grouped.moe_grouped(*fp32_args(t)))) for t in (5, 40, 300)]
    cases.append(("silu_mul I=6144", swiglu, lambda: swiglu.silu_mul(torch.randn(4, 12288, dtype=bf16))))
    return cases


def w4a16_launches() -> list:
    from flint_kernels import greedy
    from flint_kernels import nvfp4_linear as lin
    from flint_kernels import tuning
    bf16 = torch.bfloat16
    shapes = {"qkv": (5120, 2048), "o": (2048, 4096), "gate_up": (12288, 2048), "down": (2048, 6144),
              "lm_head": (150144, 2048)}
    cases = []
    for name, (n, k) in shapes.items():
        w = nvfp4(n, k, per_row=name in ("qkv", "gate_up"))
        for t in ((1, 4, 64) if name != "lm_head" else (1,)):
            cases.append((f"nvfp4_linear {name} T={t}", lin,
                          lambda t=t, k=k, w=w: lin.nvfp4_linear(torch.randn(t, k, dtype=bf16), w)))
    # o_proj's x handed over in fp16 by decode attention (tuning.FP4_GEMM_F16_ACTIVATIONS)
    w = nvfp4(*shapes["o"])
    cases.append(("nvfp4_linear o T=64 x fp16", lin, lambda w=w: lin.nvfp4_linear(
        torch.randn(64, 4096, dtype=torch.float16), w, out_dtype=bf16)))
    # the LM head of a 64-sequence decode batch (fp32 logits, _gemm_tiles' wide-N tiles), its
    # greedy argmax packed in the tiles
    w = nvfp4(*shapes["lm_head"])
    cases.append(("nvfp4_logits lm_head T=64", lin, lambda w=w: lin.nvfp4_logits(torch.randn(64, 2048, dtype=bf16), w)))
    cases.append(("nvfp4_logits lm_head T=64 + greedy", lin, lambda w=w: lin.nvfp4_logits(
        torch.randn(64, 2048, dtype=bf16), w, greedy=torch.full((64,), greedy.EMPTY, dtype=torch.int64))))
    cases.append(("nvfp4_linear qkv T=8192", lin,
                  lambda: lin.nvfp4_linear(torch.randn(8192, 2048, dtype=bf16), nvfp4(5120, 2048, per_row=True))))
    # the GEMV's other NVFP4 decode (bytes when words are the default, and the other way round)
    w = nvfp4(5120, 2048, per_row=True)
    cases.append(("nvfp4_linear qkv T=1 other decode", lin, lambda w=w: other_decode(
        lambda: lin.nvfp4_linear(torch.randn(1, 2048, dtype=bf16), w))))  # (w bound now: later loops rebind it)
    from flint_kernels import dense_gemv as gemv
    for name, (n, k) in shapes.items():
        if name != "lm_head":
            dense = torch.randn(n, k, dtype=bf16)
            cases.append((f"dense_gemv {name} T=1", gemv,
                          lambda k=k, dense=dense: gemv.dense_gemv(torch.randn(1, k, dtype=bf16), dense)))
    # the LM head storing fp32 logits (ops.logits); the step's first launch, the embedding gather
    from flint_kernels import embedding
    n, k = shapes["lm_head"]
    head = torch.empty(n, k, dtype=bf16)
    cases.append(("dense_gemv lm_head fp32 logits T=1", gemv, lambda: gemv.dense_gemv(
        torch.randn(1, k, dtype=bf16), head, out_dtype=torch.float32)))
    cases.append(("embedding T=1", embedding, lambda: embedding.embedding(head, torch.zeros(1, dtype=torch.int64))))
    # what a decode graph runs: the final RMSNorm, the LM head and the greedy argmax in one launch;
    # the embedding taking the previous step's token from its argmax slot
    slots = torch.zeros(2, 1, dtype=torch.int64)
    cases.append(("dense_gemv + rms_norm lm_head fp32 logits + greedy T=1", gemv, lambda: gemv.rms_norm_dense_gemv(
        torch.randn(1, k, dtype=bf16), torch.randn(1, k, dtype=bf16), torch.randn(k, dtype=bf16), 1e-5, head,
        out_dtype=torch.float32, greedy=slots[0])))
    # the NVFP4 GGUF's LM head: the same launch as a W4A16 GEMV with fp32 logits
    w_head = nvfp4(n, k)
    cases.append(("nvfp4 + rms_norm lm_head fp32 logits + greedy T=1", lin, lambda: lin.rms_norm_nvfp4_logits(
        torch.randn(1, k, dtype=bf16), torch.randn(1, k, dtype=bf16), torch.randn(k, dtype=bf16), 1e-5, w_head,
        greedy=slots[0])))
    cases.append(("decode_embedding T=1", embedding, lambda: embedding.decode_embedding(
        head, torch.zeros(1, dtype=torch.int64), torch.zeros(1, dtype=torch.int64), slots[0], slots[1])))
    # the residual add + RMSNorm folded into the GEMVs after a norm (qkv, dense MLP gate/up)
    hw = torch.randn(2048, dtype=bf16)
    for name in ("qkv", "gate_up"):
        n, k = shapes[name]
        w, dense = nvfp4(n, k, per_row=True), torch.randn(n, k, dtype=bf16)
        for t in (1, 4):
            x = torch.randn(t, k, dtype=bf16)
            cases.append((f"nvfp4_linear + rms_norm {name} T={t}", lin,
                          lambda x=x, w=w: lin.rms_norm_nvfp4_linear(x, x.clone(), hw, 1e-5, w)))
            cases.append((f"dense_gemv + rms_norm {name} T={t}", gemv,
                          lambda x=x, dense=dense: gemv.rms_norm_dense_gemv(x, x.clone(), hw, 1e-5, dense)))
    # the NVFP4 dense MLP's SwiGLU folded into its down GEMV (ops.silu_linear)
    down_n, down_k = shapes["down"]  # (the LM head's lambdas above read k and n late)
    w = nvfp4(down_n, down_k)
    for t in (1, 4):
        gate_up = torch.randn(t, 2 * down_k, dtype=bf16)
        cases.append((f"nvfp4_linear + silu_mul down T={t}", lin,
                      lambda gate_up=gate_up, w=w: lin.silu_nvfp4_linear(gate_up, w)))
    # the other products of the GEMV's prefetching splits (fp16 or fp32: tuning.FP4_GEMV_F16 flipped)
    other_products = lambda call: with_knob(tuning, "FP4_GEMV_F16", not tuning.FP4_GEMV_F16, call)
    gate_up = torch.randn(1, 2 * down_k, dtype=bf16)
    x_o, w_o = torch.randn(1, shapes["o"][1], dtype=bf16), nvfp4(*shapes["o"])
    x_qkv, w_qkv = torch.randn(1, 2048, dtype=bf16), nvfp4(*shapes["qkv"], per_row=True)
    cases += [("nvfp4_linear o T=1 other products", lin,
               lambda: other_products(lambda: lin.nvfp4_linear(x_o, w_o))),
              ("nvfp4_linear + rms_norm qkv T=1 other products", lin, lambda: other_products(
                  lambda: lin.rms_norm_nvfp4_linear(x_qkv, x_qkv.clone(), hw, 1e-5, w_qkv))),
              ("nvfp4_linear + silu_mul down T=1 other products", lin,
               lambda: other_products(lambda: lin.silu_nvfp4_linear(gate_up, w)))]
    return cases


def other_decode(call):
    """Runs call() with the NVFP4 decode switches (tuning.FP4_GEMV_WORDS, FP4_MOE_WORDS,
    FP4_MOE_DOWN_WORDS) flipped."""
    from flint_kernels import tuning
    names = ("FP4_GEMV_WORDS", "FP4_MOE_WORDS", "FP4_MOE_DOWN_WORDS")
    saved = [getattr(tuning, name) for name in names]
    for name, flag in zip(names, saved):
        setattr(tuning, name, not flag)
    try:
        return call()
    finally:
        for name, flag in zip(names, saved):
            setattr(tuning, name, flag)


def sampling_launches() -> list:
    from flint_kernels import sampling
    v = 150144

    def call(rows):
        return sampling.sample(torch.randn(rows, v), torch.ones(rows), torch.zeros(rows, dtype=torch.int32),
                               torch.ones(rows), torch.zeros(rows), torch.zeros(rows, dtype=torch.int64),
                               torch.zeros(rows, dtype=torch.int64))
    return [(f"sample V={v} S={rows}", sampling, lambda rows=rows: call(rows)) for rows in (1, 64)]


def tiles(kwargs: dict) -> str:
    """The launch's tile and split constexprs, e.g. BLOCK_N=8 BLOCK_K=512 SPLIT=2."""
    keys = [k for k in kwargs if k.startswith(("BLOCK_", "SPLIT", "NUM_STAGES", "TILE_"))]
    return " ".join(f"{k}={kwargs[k]}" for k in keys)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--arch", type=int, default=90, help="compute capability, e.g. 90 (H100/H200)")
    parser.add_argument("--only", default="", help="substring of the case names to compile")
    parser.add_argument("--pdl", action=argparse.BooleanOptionalAction, default=True,
                        help="launch with programmatic dependent launch, as on sm_90+ by default (tuning.PDL; default on)")
    parser.add_argument("--chains", action="store_true",
                        help="print each kernel's SASS after its PDL wait as runs of loads, barriers and stores")
    parser.add_argument("--counts", action="store_true",
                        help="print each kernel's SASS instruction and BAR.SYNC counts from its PDL wait on")
    parser.add_argument("--waits", action="store_true",
                        help="print each kernel's global loads after its PDL wait and the waits for them (L9 W L3)")
    parser.add_argument("--loop-loads", action="store_true",
                        help="print each kernel's loops with the loads into registers inside them (LDG)")
    parser.add_argument("--barriers", action="store_true",
                        help="print each kernel's barriers after its PDL wait by source line (PTX .loc)")
    parser.add_argument("--set", action="append", default=[], metavar="module.ATTR=value[,...]",
                        help="set module values first, as bench_step_timeline.py --variant does "
                             "(e.g. flint_kernels.moe_gemv.DOWN_DENSE_WARPS=4, flint_kernels.tuning.FP4_PTX=0)")
    args = parser.parse_args(argv)
    if args.set:
        from tools.bench.bench_step_timeline import parse_variant, set_variant
        set_variant([setting for text in args.set for setting in parse_variant(text)])
    from flint_kernels import pdl, split_k, tuning
    split_k.HOST_SMS = H200_SMS  # grids as the GPU launcher would size them
    pdl.ON_HOST = tuning.PDL = args.pdl  # as on an sm_90 GPU (host tensors have no compute capability)
    failures = 0
    if not (args.chains or args.barriers or args.counts or args.waits or args.loop_loads):
        print("| case | kernel | tiles | warps | stages | shared B | regs | spill B | programs | an SM | waves | mma | "
              "wgmma | ld.v4 | ld scalar | cp.async | griddep |")
        print("| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: "
              "| ---: |")
    for name, module, call in launches():
        if args.only not in name:
            continue
        for fn, kwargs, grid in record(module, call):
            try:
                compiled = compile_launch(fn, kwargs, args.arch)
                if args.chains:
                    print(f"{name} | {fn.__name__}: {sass_chain(compiled.asm['cubin'])}", flush=True)
                    continue
                if args.counts:
                    print(f"{name} | {fn.__name__}: {sass_counts(compiled.asm['cubin'])}", flush=True)
                    continue
                if args.waits:
                    waits = load_waits(sass_scoreboards(_cuobjdump_sass(compiled.asm["cubin"])))
                    print(f"{name} | {fn.__name__}: {waits}", flush=True)
                    continue
                if args.loop_loads:
                    loops = loop_loads(_cuobjdump_sass(compiled.asm["cubin"]))
                    print(f"{name} | {fn.__name__}: {' / '.join(loops) or 'no loop'}", flush=True)
                    continue
                if args.barriers:
                    print(f"{name} | {fn.__name__}: {barrier_lines(compiled.asm['ptx'])}", flush=True)
                    continue
                stats = ptxas_stats(compiled.asm["ptx"], args.arch)
            except Exception as e:  # noqa: BLE001  (report every case, then fail)
                failures += 1
                print(f"| {name} | {fn.__name__} | FAILED: {type(e).__name__}: {str(e).splitlines()[0][:200]} |")
                continue
            shared = compiled.metadata.shared
            c = ptx_counts(compiled.asm["ptx"])
            bad = shared > MAX_SHARED or stats["regs"] < 0
            bad_pdl = not pdl_prologue_ok(compiled.asm["ptx"], kwargs["PDL"])
            failures += bad or bad_pdl
            programs = math.prod(grid)
            per_sm = programs_per_sm(stats["regs"], kwargs.get("num_warps", 4), shared) if args.arch == 90 else 0
            waves = f"{programs / (per_sm * H200_SMS):.2f}" if per_sm else ""
            print(f"| {name} | {fn.__name__} | {tiles(kwargs)} | {kwargs.get('num_warps', 4)} | {kwargs.get('num_stages', '')} | "
                  f"{shared} | {stats['regs']} | {stats['spills']} | {programs} | {per_sm or ''} | {waves} | "
                  f"{c['mma']} | {c['wgmma']} | {c['ld_v4']} | "
                  f"{c['ld_scalar']} | {c['cp_async']} | {c['griddep']} |" + (" **over limits**" if bad else "") +
                  (" **PDL prologue missing or misplaced**" if bad_pdl else ""), flush=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
