"""Kernel benchmarks: each case is first checked against the kernel's torch version, then timed.

    python tools/bench/bench_kernels.py --out FILE                                # on the GPU
    python tools/bench/bench_kernels.py --smoke --out /tmp/bench.json             # tiny, CPU interpreter
    python tools/bench/bench_kernels.py --only decode_attention,rms_norm

Per case: median time (triton.testing.do_bench), bytes moved, GB/s and % of a measured
device-to-device copy, TFLOP/s for attention (from the replayed CUDA graph's time where a case
has one); a failed check is reported, not timed. The MoE, router and W4A16 cases take their
weights in turns (Rotation), so that they come from HBM as in a decode step, not from L2.
Prints a markdown table last and writes JSON. A kernel family adds one `bench_<family>`
function returning Case objects and registers it in SECTIONS.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

import torch

if not torch.cuda.is_available():  # must precede the first import of triton
    os.environ.setdefault("TRITON_INTERPRET", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root, run as a file

import triton  # noqa: E402

from tools.bench.knobs import with_knob  # noqa: E402
from tools.bench.timing import command, copy_bandwidth, gpu_name, graph_us, nbytes  # noqa: E402

# real Flint shapes (flint-40b); --smoke uses flint-tiny's (experts 64 wide, so NVFP4 applies)
FULL = dict(hidden=2048, hq=32, hk=4, d=128, window=513, block_size=64, experts=256, top_k=6, moe_inter=512,
            shared_inter=1024, dense_inter=6144, vocab=150144)
SMOKE = dict(hidden=64, hq=8, hk=2, d=16, window=9, block_size=4, experts=16, top_k=4, moe_inter=64,
             shared_inter=128, dense_inter=128, vocab=1000)
BF16_TOL = dict(rtol=2e-2, atol=2e-2)
MAX_REL_ERR = 2e-2  # max error / max |expected|: long contexts average outputs down to ~1/sqrt(L)
# MoE rounds 6 times to bf16 (gate, up, silu, product, expert output, combine); Triton's
# interpreter truncates there instead of rounding to nearest, a bias that adds up (in the
# elementwise tolerance too)
INTERPRETER_MOE_REL_ERR = 4e-2
INTERPRETER_MOE_TOL = dict(rtol=INTERPRETER_MOE_REL_ERR, atol=INTERPRETER_MOE_REL_ERR)
# a prefill chunk of 8192 tokens, as the kernel figures have been timed (the engine's chunk is 8448)
PREFILL_TOKENS = 8192


@dataclass
class Case:
    """One benchmarked call: `run` the kernel, `expected` its torch version's result."""
    section: str
    name: str
    run: Callable[[], torch.Tensor | tuple]
    reference: Callable[[], torch.Tensor | tuple]
    bytes: float = 0.0
    flops: float = 0.0
    graph: bool = False              # also time a replayed CUDA graph (launch overhead excluded)
    prepare: Callable[[], None] | None = None  # restores inputs a call mutates (not timed)
    max_rel_err: float = MAX_REL_ERR
    tol: dict = field(default_factory=lambda: BF16_TOL)  # elementwise (torch.testing.assert_close)


@dataclass
class Row:
    section: str
    name: str
    check: str
    rel_err: float  # max |kernel - torch| / max |torch|
    us: float | None = None
    graph_us: float | None = None
    gbs: float | None = None
    pct_copy: float | None = None
    tflops: float | None = None
    extra: dict = field(default_factory=dict)


# ----------------------------------------------------------------------------- timing
def time_us(fn, device) -> float:
    if device.type == "cuda":
        return triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median") * 1e3
    fn()
    samples = []
    for _ in range(3):
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples) * 1e6


GRAPH_MS = 100  # calls a graph holds: ~this many ms of them, so that a Rotation's sets wrap many times


# ----------------------------------------------------------------------------- sections
def bench_rms_norm(shape, device, smoke):
    from flint_kernels.rms_norm import rms_norm, rms_norm_torch
    h = shape["hidden"]
    cases = []
    for t in ([1, 5] if smoke else [1, 64, 8192]):
        x = torch.randn(t, h, device=device, dtype=torch.bfloat16)
        w = torch.randn(h, device=device, dtype=torch.bfloat16)
        res = torch.randn(t, h, device=device, dtype=torch.bfloat16)
        res_k, res_t = res.clone(), res.clone()
        cases.append(Case(
            "rms_norm", f"T={t} H={h} +residual",
            run=lambda x=x, w=w, r=res_k: rms_norm(x, w, 1e-5, residual=r),
            reference=lambda x=x, w=w, r=res_t: rms_norm_torch(x, w, 1e-5, residual=r),
            bytes=2 * (4 * t * h + h),  # read x, residual; write residual, out
            prepare=lambda res=res, a=res_k, b=res_t: (a.copy_(res), b.copy_(res))))
    return cases


def bench_qk_norm_rope(shape, device, smoke):
    from flint_kernels.qk_norm_rope import qk_norm_rope, qk_norm_rope_torch
    hq, hk, d = shape["hq"], shape["hk"], shape["d"]
    cases = []
    for n in ([1, 6] if smoke else [1, 8, 64, 8192]):
        qkv = torch.randn(n, (hq + 2 * hk) * d, device=device, dtype=torch.bfloat16)
        w = torch.ones(d, device=device, dtype=torch.bfloat16)
        pos = torch.randint(0, 4096, (n,), device=device)
        cos_sin = torch.randn(4096, d, device=device)
        slots = torch.randperm(2 * n, device=device)[:n]
        caches = [torch.zeros(2 * n, hk, d, device=device, dtype=torch.bfloat16) for _ in range(4)]
        cases.append(Case(
            "qk_norm_rope", f"N={n} rope+cache write",
            run=lambda qkv=qkv, w=w, p=pos, cs=cos_sin, s=slots, c=caches:
                qk_norm_rope(qkv, w, w, p, cs, 1e-5, hq, hk, c[0], c[1], s)[:2],
            reference=lambda qkv=qkv, w=w, p=pos, cs=cos_sin, s=slots, c=caches:
                qk_norm_rope_torch(qkv, w, w, p, cs, 1e-5, hq, hk, c[2], c[3], s)[:2],
            # read qkv + cos/sin rows, write q, k and the k/v cache rows
            bytes=n * (2 * (hq + 2 * hk) * d + 4 * d + 2 * (hq + hk) * d + 2 * 2 * hk * d)))
    return cases


def _paged_kv(contexts, shape, device, window=0):
    """Random bf16 cache: paged (block tables over shuffled blocks) or, with window, one ring row each."""
    hk, d, bs = shape["hk"], shape["d"], shape["block_size"]
    b = len(contexts)
    if window:
        rows, rows_per = b, window
        extra = dict(ring_rows=torch.randperm(b, device=device).to(torch.int32))
    else:
        per = [triton.cdiv(c + 1, bs) for c in contexts]
        rows, rows_per = sum(per), bs
        tables = torch.zeros(b, max(per), dtype=torch.int32, device=device)
        perm = torch.randperm(rows, device=device).to(torch.int32)
        start = 0
        for i, m in enumerate(per):
            tables[i, :m] = perm[start:start + m]
            start += m
        extra = dict(block_tables=tables)
    k_cache = torch.randn(rows, rows_per, hk, d, device=device, dtype=torch.bfloat16)
    v_cache = torch.randn_like(k_cache)
    return k_cache, v_cache, extra


def _visible(ctx, window):
    return min(ctx, window - 1) if window else ctx


def bench_decode_attention(shape, device, smoke):
    from flint_kernels.decode_attention import decode_attention, decode_attention_torch
    hq, hk, d, w = shape["hq"], shape["hk"], shape["d"], shape["window"]
    if smoke:
        configs = [(1, 70, 0), (3, 200, 0), (2, 30, w)]
    else:
        configs = [(1, c, 0) for c in (1024, 32768, 100_000, 262_143)]
        configs += [(8, 32768, 0), (64, 32768, 0), (1, 100_000, w), (8, 100_000, w), (64, 100_000, w)]
    cases = []
    for batch, ctx, window in configs:
        contexts = [ctx] * batch
        k_cache, v_cache, extra = _paged_kv(contexts, shape, device, window)
        q = torch.randn(batch, hq, d, device=device, dtype=torch.bfloat16)
        k, v = torch.randn(2, batch, hk, d, device=device, dtype=torch.bfloat16)
        lens = torch.tensor(contexts, dtype=torch.int32, device=device)
        sinks = torch.randn(hq, device=device)
        args = (q, k, v, k_cache, v_cache, lens, sinks, 1 / math.sqrt(d), window)
        keys = sum(_visible(c, window) + 1 for c in contexts)
        layout = f"ring W={window}" if window else f"paged bs={shape['block_size']}"
        cases.append(Case(
            "decode_attention", f"B={batch} ctx={ctx} {layout}",
            run=lambda a=args, e=extra: decode_attention(*a, **e),
            reference=lambda a=args, e=extra: decode_attention_torch(*a, **e),
            bytes=keys * hk * d * 2 * 2 + 2 * 2 * batch * hq * d,
            flops=4 * keys * hq * d, graph=True))
    return cases


def bench_prefill_attention(shape, device, smoke):
    from flint_kernels.prefill_attention import prefill_attention, prefill_attention_torch
    hq, hk, d, w = shape["hq"], shape["hk"], shape["d"], shape["window"]
    if smoke:
        configs = [([(0, 40)], 0), ([(0, 40)], w), ([(30, 17), (5, 1), (0, 9)], 0)]
    else:
        configs = [([(0, 8192)], 0), ([(0, 32768)], 0), ([(0, 8192)], w), ([(0, 32768)], w),
                   ([(30_000, 2048)] + [(30_000, 1)] * 63, 0)]  # a chunk mixed with 63 decodes
    cases = []
    for seqs, window in configs:
        contexts = [c for c, _ in seqs]
        n = sum(m for _, m in seqs)
        k_cache, v_cache, extra = _paged_kv([c + m for c, m in seqs], shape, device, window)
        q = torch.randn(n, hq, d, device=device, dtype=torch.bfloat16)
        k, v = torch.randn(2, n, hk, d, device=device, dtype=torch.bfloat16)
        qsl = torch.tensor([0] + [m for _, m in seqs], device=device).cumsum(0).to(torch.int32)
        lens = torch.tensor(contexts, dtype=torch.int32, device=device)
        sinks = torch.randn(hq, device=device)
        max_q = max(m for _, m in seqs)
        args = (q, k, v, qsl, lens, k_cache, v_cache, sinks, 1 / math.sqrt(d), window, max_q)
        pairs = sum(_visible(c + i, window) + 1 for c, m in seqs for i in range(m))  # (query, key) pairs
        cached = sum(min(c, window - 1 if window else c) for c, _ in seqs)
        name = f"{len(seqs)} seqs {n} tok ctx={max(contexts)}" if len(seqs) > 1 else f"{n} tok"
        cases.append(Case(
            "prefill_attention", name + (f" window={window}" if window else " causal"),
            run=lambda a=args, e=extra: prefill_attention(*a, **e),
            reference=lambda a=args, e=extra: prefill_attention_torch(*a, **e),
            bytes=2 * (2 * n * hq * d + 2 * n * hk * d + 2 * cached * hk * d),
            flops=4 * pairs * hq * d))
    return cases


def random_nvfp4(*shape, device):
    """Random NVFP4 weight [..., N, K]: any codes, block scales in [0.5, 1), global scale 1/64."""
    from flint_backend.weights.nvfp4 import NVFP4Weight
    *lead, n, k = shape
    packed = torch.randint(0, 256, (*lead, n, k // 2), dtype=torch.uint8, device=device)
    scales = (0.5 + 0.5 * torch.rand(*lead, n, k // 16, device=device)).to(torch.float8_e4m3fn)
    return NVFP4Weight(packed, scales, torch.full(tuple(lead), 1 / 64, device=device))


def _experts(shape, device, fmt):
    """-> (w13 [E, 2I, H], w2 [E, H, I], the shared expert's s13 [2Is, H], s2 [H, Is])."""
    e, h, i = shape["experts"], shape["hidden"], shape["moe_inter"]
    scale = h ** -0.5
    return (_weight(fmt, device, scale, e, 2 * i, h), _weight(fmt, device, scale, e, h, i)) + \
        _shared_expert(shape, device, fmt)


def _shared_expert(shape, device, fmt):
    h, i = shape["hidden"], shape["shared_inter"]
    return _weight(fmt, device, h ** -0.5, 2 * i, h), _weight(fmt, device, h ** -0.5, h, i)


def _weight(fmt, device, scale, *shape):
    """A random weight of `shape`: NVFP4, or bf16 normal times scale."""
    if fmt == "nvfp4":
        return random_nvfp4(*shape, device=device)
    return torch.randn(*shape, device=device, dtype=torch.bfloat16) * scale


def _routing(t, shape, device, experts=None):
    """ids [t, top_k] int32 (random, or token 0's `experts` given), router weights [t, top_k]."""
    ids = torch.rand(t, shape["experts"], device=device).topk(shape["top_k"], dim=-1).indices.to(torch.int32)
    if experts is not None:
        ids[0] = experts
    weights = torch.softmax(torch.randn(t, shape["top_k"], device=device), -1)
    return ids, weights


class Rotation:
    """Argument sets a case takes in turn, one a call, so that its weights come from HBM as in a
    decode step (whose layers each read other experts), not from the L2 the call before filled."""

    def __init__(self, sets: list):
        self.sets, self.calls = sets, 0

    def reset(self):
        self.calls = 0

    def next(self):
        args = self.sets[self.calls % len(self.sets)]
        self.calls += 1
        return args


def _cold_sets(bytes_per_call: float, device, smoke: bool) -> int:
    """How many argument sets read twice the L2 between two uses of one (2 on the CPU, at most 32)."""
    if smoke or device.type != "cuda":
        return 2
    l2 = torch.cuda.get_device_properties(device).L2_cache_size
    return max(2, min(32, math.ceil(2 * l2 / bytes_per_call)))


def bench_moe(shape, device, smoke):
    """MoE layer (both kernel paths at decode sizes): bytes = the chosen experts' weights (each
    distinct expert once, + the shared expert) + activations, the minimum any kernel must read.
    Calls take turns over argument sets (Rotation) whose weights read twice the L2 between two
    uses of one: other experts (token 0's disjoint from the other sets') and another shared
    expert each, as a decode step's layers do; `experts read` is a call's mean."""
    from flint_kernels import tuning
    from flint_kernels.moe import SMALL_BATCH_TOKENS, fused_moe, fused_moe_torch
    h, k, e = shape["hidden"], shape["top_k"], shape["experts"]
    cases = []
    for fmt in ("bf16", "nvfp4"):
        w13, w2, s13, s2 = _experts(shape, device, fmt)
        per_expert = nbytes(w13, w2) / e
        shared = nbytes(s13, s2)
        for t in ([1, 3, 20] if smoke else [1, 8, 64, 256]):
            x = torch.randn(t, h, device=device, dtype=torch.bfloat16)
            per_call = min(e, t * k) * per_expert + shared
            n = min(_cold_sets(per_call, device, smoke), e // k)
            groups = torch.randperm(e, device=device)[:n * k].to(torch.int32).view(n, k)
            routings = [_routing(t, shape, device, experts=g) for g in groups]
            shareds = [(s13, s2)] + [_shared_expert(shape, device, fmt) for _ in range(n - 1)]
            sets = [(x, ids, weights, w13, w2, s13_, s2_) for (ids, weights), (s13_, s2_) in zip(routings, shareds)]
            chosen = sum(len(torch.unique(ids)) for ids, _ in routings) / n
            paths = ["small", "grouped"] if t <= 64 else ["grouped"]
            # the grouped path's NVFP4 tiles decoded to bf16 through fp32 (tuning.FP4_MMA_F16 off) beside
            variants = [(path, None) for path in paths] + ([("grouped", False)] if fmt == "nvfp4" and t > 8 else [])
            for path, f16 in variants:
                tag = " (default)" if (path == "small") == (t <= SMALL_BATCH_TOKENS) and f16 is None else ""
                tag += " bf16 tiles" if f16 is False else ""
                turns = Rotation(sets)
                run = (lambda turns=turns, p=path: fused_moe(*turns.next(), path=p)) if f16 is None else (
                    lambda turns=turns, p=path: with_knob(tuning, "FP4_MMA_F16", False,
                                                          lambda: fused_moe(*turns.next(), path=p)))
                cases.append(Case(
                    "moe", f"{fmt} T={t} {path}{tag} experts read={chosen:g}+1, {n} sets",
                    run=run, reference=lambda a=sets[0]: fused_moe_torch(*a), prepare=turns.reset,
                    bytes=chosen * per_expert + shared + 2 * 2 * t * h, graph=True,
                    max_rel_err=INTERPRETER_MOE_REL_ERR if smoke else MAX_REL_ERR,
                    tol=INTERPRETER_MOE_TOL if smoke else BF16_TOL))
    return cases


def bench_moe_grouped(shape, device, smoke):
    """Grouped MoE GEMMs at prefill sizes: FLOPs of the routed + shared experts (6 H I per pair)."""
    from flint_kernels.moe import fused_moe, fused_moe_torch
    h, i, k = shape["hidden"], shape["moe_inter"], shape["top_k"]
    cases = []
    for fmt in ("bf16", "nvfp4"):
        w13, w2, s13, s2 = _experts(shape, device, fmt)
        for t in ([40] if smoke else [8192, 32768]):
            x = torch.randn(t, h, device=device, dtype=torch.bfloat16)
            ids, weights = _routing(t, shape, device)
            args = (x, ids, weights, w13, w2, s13, s2)
            cases.append(Case(
                "moe_grouped", f"{fmt} T={t}", run=lambda a=args: fused_moe(*a, path="grouped"),
                reference=lambda a=args: fused_moe_torch(*a),
                bytes=nbytes(w13, w2, s13, s2) + 2 * 2 * t * h,
                flops=6 * t * (k + 1) * h * i, max_rel_err=INTERPRETER_MOE_REL_ERR if smoke else MAX_REL_ERR,
                tol=INTERPRETER_MOE_TOL if smoke else BF16_TOL))
    return cases


def bench_router(shape, device, smoke):
    from flint_kernels.router import router_topk, router_topk_torch
    h, e, k = shape["hidden"], shape["experts"], shape["top_k"]
    weights = [torch.randn(e, h, device=device, dtype=torch.bfloat16) / h ** 0.5
               for _ in range(_cold_sets(2 * e * h, device, smoke))]  # taken in turns: from HBM
    cases = []
    for t in ([1, 20] if smoke else [1, 8, 64, 8192]):
        x = torch.randn(t, h, device=device, dtype=torch.bfloat16)
        turns = Rotation(weights)
        cases.append(Case(
            "router", f"T={t} E={e} top-{k}, {len(weights)} weights",
            run=lambda x=x, turns=turns: router_topk(x, turns.next(), k, True),
            reference=lambda x=x: router_topk_torch(x, weights[0], k, True), prepare=turns.reset,
            bytes=2 * e * h + 2 * t * h + 8 * t * k, flops=2 * t * e * h, graph=True))
    return cases


def bench_w4a16(shape, device, smoke, prefill_tokens=PREFILL_TOKENS):
    """NVFP4 linears of the real projections: bytes = packed weights + block scales + x + y. At
    a prefill chunk's size (prefill_tokens; not the LM head, which a prefill applies to its last
    token only) each GEMM also runs as the BF16 matmul of the dequantised weight ("bf16 linear"),
    the rate a BF16 checkpoint's prefill gets, and in nvfp4_linear's other forms: the tiles that
    decode the weight in their K loop ("decoding tiles", tuning.FP4_DEQUANT_MIN_TOKENS None) and the
    decoded weight's GEMM in 128 x 256 tiles (tuning.FP4_DEQUANT_GEMM_TILES)."""
    from flint_backend.weights.nvfp4 import dequantize_nvfp4
    from flint_kernels import tuning
    from flint_kernels.nvfp4_linear import nvfp4_linear, nvfp4_linear_torch
    h, q, kv = shape["hidden"], shape["hq"] * shape["d"], shape["hk"] * shape["d"]
    shapes = {"qkv": (q + 2 * kv, h), "o_proj": (h, q), "mlp gate_up": (2 * shape["dense_inter"], h),
              "mlp down": (h, shape["dense_inter"]), "lm_head": (shape["vocab"], h)}
    cases = []
    for name, (n, k) in shapes.items():
        w = random_nvfp4(n, k, device=device)
        ws = [w] + [random_nvfp4(n, k, device=device) for _ in range(_cold_sets(w.nbytes(), device, smoke) - 1)]
        for t in ([1, 5] if smoke else ([1, 4, 8, 64, 256, prefill_tokens] if name != "lm_head" else [1, 8, 64])):
            x = torch.randn(t, k, device=device, dtype=torch.bfloat16)
            turns = Rotation(ws)  # the weights from HBM, as in a step
            cases.append(Case(
                "w4a16", f"{name} {k}->{n} T={t}, {len(ws)} weights",
                run=lambda x=x, turns=turns: nvfp4_linear(x, turns.next()),
                reference=lambda x=x, w=w: nvfp4_linear_torch(x, w), prepare=turns.reset,
                bytes=w.nbytes() + 2 * t * (k + n), flops=2 * t * n * k, graph=True))
            if t == 64:  # the decoding tiles in bf16 through fp32 (tuning.FP4_MMA_F16 off)
                cases.append(Case(
                    "w4a16", f"{name} {k}->{n} T={t} bf16 tiles",
                    run=lambda x=x, turns=turns: with_knob(tuning, "FP4_MMA_F16", False, lambda: (
                        nvfp4_linear(x, turns.next()))),
                    reference=lambda x=x, w=w: nvfp4_linear_torch(x, w), prepare=turns.reset,
                    bytes=w.nbytes() + 2 * t * (k + n), flops=2 * t * n * k, graph=True))
            if t == prefill_tokens:  # the prefill GEMM's other forms (its tuning switches)
                for label, knob, value in [("decoding tiles", "FP4_DEQUANT_MIN_TOKENS", None),
                                           ("128x256 tiles", "FP4_DEQUANT_GEMM_TILES", (128, 256, 8, 3))]:
                    cases.append(Case(
                        "w4a16", f"{name} {k}->{n} T={t} {label}",
                        run=lambda x=x, turns=turns, a=(knob, value): with_knob(tuning, *a, lambda: (
                            nvfp4_linear(x, turns.next()))),
                        reference=lambda x=x, w=w: nvfp4_linear_torch(x, w), prepare=turns.reset,
                        bytes=w.nbytes() + 2 * t * (k + n), flops=2 * t * n * k, graph=True))
                wd = dequantize_nvfp4(w.packed, w.scales, w.scale, torch.bfloat16)
                cases.append(Case(
                    "w4a16", f"{name} {k}->{n} T={t} bf16 linear",
                    run=lambda x=x, wd=wd: x @ wd.T, reference=lambda x=x, w=w: nvfp4_linear_torch(x, w),
                    bytes=2 * n * k + 2 * t * (k + n), flops=2 * t * n * k, graph=True))
    return cases


def bench_sampling(shape, device, smoke):
    """Fused sampling, temperature + top-p 0.95 (typical) and + top-k 50; bytes = one read of the logits."""
    from flint_kernels.sampling import sample, sample_torch
    v = shape["vocab"]
    cases = []
    for rows in ([1, 8] if smoke else [1, 8, 64]):
        logits = 4 * torch.randn(rows, v, device=device)
        for label, top_k, top_p in [("top-p 0.95", 0, 0.95), ("top-k 50 + top-p 0.95", 50, 0.95), ("greedy", 0, 1.0)]:
            temperature = torch.full((rows,), 0.0 if label == "greedy" else 0.8, device=device)
            args = (logits, temperature, torch.full((rows,), top_k, dtype=torch.int32, device=device),
                    torch.full((rows,), top_p, device=device), torch.zeros(rows, device=device),
                    torch.arange(rows, device=device), torch.zeros(rows, dtype=torch.int64, device=device))
            cases.append(Case(
                "sampling", f"S={rows} V={v} {label}", run=lambda a=args: sample(*a),
                reference=lambda a=args: sample_torch(*a), bytes=4 * rows * v, graph=True))
    return cases


SECTIONS = {
    "rms_norm": bench_rms_norm,
    "qk_norm_rope": bench_qk_norm_rope,
    "decode_attention": bench_decode_attention,
    "prefill_attention": bench_prefill_attention,
    "moe": bench_moe,
    "moe_grouped": bench_moe_grouped,
    "router": bench_router,
    "w4a16": bench_w4a16,
    "sampling": bench_sampling,
}


# ----------------------------------------------------------------------------- driver
def check(case: Case) -> tuple[str, float]:
    """-> (status, max error / max |expected|): both the case's elementwise tolerance (bf16's
    unless it says) and its max_rel_err of the output scale (2%)."""
    if case.prepare:
        case.prepare()
    got, expected = case.run(), case.reference()
    got = got if isinstance(got, tuple) else (got,)
    expected = expected if isinstance(expected, tuple) else (expected,)
    err = max(float((a.float() - b.float()).abs().max()) for a, b in zip(got, expected))
    rel = err / max(float(b.float().abs().max()) for b in expected)
    try:
        for a, b in zip(got, expected):
            torch.testing.assert_close(a, b, **case.tol)
    except AssertionError as e:
        return "FAIL: " + str(e).splitlines()[0], rel
    return ("ok" if rel <= case.max_rel_err else f"FAIL: relative error {rel:.2e}"), rel


def measure(case: Case, device, copy: float) -> Row:
    status, err = check(case)
    row = Row(case.section, case.name, status, err)
    if status != "ok":
        return row
    row.us = time_us(case.run, device)
    if case.graph and device.type == "cuda":
        row.graph_us = graph_us(case.run, reps=max(1, round(GRAPH_MS * 1e3 / row.us)))
    us = row.graph_us or row.us  # a replayed graph's time has no host launch overhead in it
    if case.bytes:
        row.gbs = case.bytes / us / 1e3
        row.pct_copy = 100 * row.gbs / copy
    if case.flops:
        row.tflops = case.flops / us / 1e6
    return row


def markdown(rows: list[Row], copy: float) -> str:
    fmt = lambda x, spec: "" if x is None else format(x, spec)  # noqa: E731
    lines = [f"copy bandwidth: {copy:.0f} GB/s", "",
             "GB/s, % copy and TFLOP/s from the graph's time where a case has one, else the median's", "",
             "| kernel | case | check | rel err | µs (median) | µs (graph) | GB/s | % copy | TFLOP/s |",
             "| --- | --- | --- | --- | ---: | ---: | ---: | ---: | ---: |"]
    for r in rows:
        lines.append(f"| {r.section} | {r.name} | {r.check} | {r.rel_err:.2e} | {fmt(r.us, '.1f')} | "
                     f"{fmt(r.graph_us, '.1f')} | {fmt(r.gbs, '.0f')} | {fmt(r.pct_copy, '.0f')} | "
                     f"{fmt(r.tflops, '.1f')} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--smoke", action="store_true", help="tiny shapes (runs on the CPU interpreter)")
    parser.add_argument("--only", default="", help=f"comma-separated sections of {list(SECTIONS)}")
    parser.add_argument("--out", default="", help="write the results as JSON here")
    args = parser.parse_args(argv)
    names = [s for s in args.only.split(",") if s] or list(SECTIONS)
    unknown = [s for s in names if s not in SECTIONS]
    if unknown:
        parser.error(f"--only: unknown section(s) {unknown}, expected some of {list(SECTIONS)}")
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    torch.manual_seed(0)
    shape = SMOKE if args.smoke else FULL
    copy = copy_bandwidth(device, 1 << 19 if args.smoke else 1 << 29) / 1e9  # GB/s of a 1 MiB / 1 GiB copy
    rows = []
    for name in names:
        for case in SECTIONS[name](shape, device, args.smoke):
            rows.append(measure(case, device, copy))
            print(f"{case.section:18s} {case.name:40s} {rows[-1].check[:40]:40s} "
                  f"{rows[-1].us or float('nan'):10.1f} us", flush=True)
    print(markdown(rows, copy))
    if args.out:
        meta = dict(device=gpu_name(device) if device.type == "cuda" else "cpu (interpreter)",
                    date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                    command=command(__file__, argv), torch=torch.__version__, triton=triton.__version__,
                    copy_gbs=copy, shapes=shape)
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(dict(meta=meta, rows=[asdict(r) for r in rows]), indent=2))
    return 0 if all(r.check == "ok" for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
