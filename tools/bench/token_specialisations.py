#!/usr/bin/env python3
"""The kernel specialisations an eager step of T tokens launches, for every T, on the CPU.

    python tools/bench/token_specialisations.py [--preset flint-40b] [--layers 3] [--tokens 2-8192]
        [--sms 132] [--compile] [--out FILE]

Builds the preset's first --layers layers (random weights, NVFP4 as served; flint-40b's first 3
hold a dense MLP, a MoE, full and sliding attention) on the CPU, then runs the forward of one
sequence's step of T new tokens for each T with every Triton kernel recorded instead of launched
(compile_kernels.record: the launchers choose their tiles as on a GPU of --sms SMs). A launch's
specialisation is what Triton compiles a kernel for: its constexpr values, each int argument's
class (== 1, divisible by 16, neither; do_not_specialize: none), each pointer's 16-byte
alignment, its launch options. Prints how many distinct specialisations each kernel has over the
range and which of its arguments differ among them, and a greedy cover: token
counts whose steps together launch every one of them, i.e. what an engine's warm-up would have to
run for no request to meet a compile; and those the engine's warm-up steps (engine.py's
warmup_step_tokens for a cap of the range's end) miss, each with the token counts that launch it.
--compile: the seconds compiling the warm-up's specialisations takes for sm_90 with an empty
Triton cache (Triton's NVIDIA backend and ptxas, as a GPU's first launch; one thread). Writes
JSON with --out.
"""

from __future__ import annotations

import argparse
import collections
import importlib
import json
import os
import pkgutil
import sys
import tempfile
import time
from pathlib import Path

os.environ.pop("TRITON_INTERPRET", None)  # the launchers' GPU tiles, not the interpreter's
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root, run as a file


import flint_kernels  # noqa: E402
from flint_backend.engine.engine import LLMEngine, warmup_step_tokens  # noqa: E402
from flint_backend.engine.engine_args import EngineArgs  # noqa: E402
from flint_backend.engine.sampling_params import SamplingParams  # noqa: E402
from flint_backend.engine.step_batch import build_step_batch  # noqa: E402
from flint_kernels import pdl, split_k, tuning  # noqa: E402
from tools.bench.bench_step_timeline import with_layers  # noqa: E402
from tools.bench.compile_kernels import compile_launch, launch_signature, record  # noqa: E402

def specialisation(fn, kwargs: dict) -> tuple:
    """(kernel name, ((argument or launch option, what Triton compiles for it), ...)): a constexpr
    or a constant argument (1, None) by its value, an int or a pointer by its type and whether it
    is taken as divisible by 16 ("i32/16"), an option by its value (compile_kernels.launch_signature)."""
    signature, constexprs, attrs, options = launch_signature(fn, kwargs)
    divisible = {fn.params[path[0]].name for path in attrs}
    keys = tuple((name, f"={constexprs[name]!r}" if kind == "constexpr" else kind + "/16" * (name in divisible))
                 for name, kind in signature.items())
    return fn.__name__, keys + tuple((name, f"={value!r}") for name, value in options.items())


def varying(specialisations) -> dict[str, dict[str, list[str]]]:
    """{kernel: {argument: its distinct keys}} for the arguments whose keys differ among a
    kernel's specialisations: what multiplies them."""
    keys = collections.defaultdict(lambda: collections.defaultdict(set))
    for name, items in specialisations:
        for arg, key in items:
            keys[name][arg].add(key)
    return {name: {arg: sorted(k) for arg, k in args.items() if len(k) > 1} for name, args in keys.items()}


def step_launches(engine: LLMEngine, modules: tuple, tokens: int) -> dict[tuple, tuple]:
    """{specialisation: (fn, kwargs) of a launch of it} for every specialisation the forward of
    one sequence's first `tokens` tokens launches."""
    seq = engine.add_request([1 + i % 1000 for i in range(tokens + 1)],
                             SamplingParams(max_tokens=2, temperature=0.0, ignore_eos=True))
    engine.scheduler.waiting.remove(seq)
    engine.blocks.grow(seq, tokens + 1)
    try:
        batch = build_step_batch([(seq, tokens)], engine.blocks.block_size, engine.config.sliding_window,
                                 engine.device)
        model, kv = engine.runner.model, engine.runner.kv
        launches = record(modules, lambda: model.forward(batch, kv))
        return {specialisation(fn, kwargs): (fn, kwargs) for fn, kwargs, _ in launches}
    finally:
        engine.blocks.free(seq)


def compile_seconds(launches: list[tuple]) -> list[tuple[float, str]]:
    """(seconds, kernel) of compiling each launch for sm_90 with an empty Triton cache, slowest first."""
    with tempfile.TemporaryDirectory() as cache:
        os.environ["TRITON_CACHE_DIR"] = cache
        times = []
        for fn, kwargs in launches:
            t0 = time.perf_counter()
            compile_launch(fn, kwargs, 90)
            times.append((time.perf_counter() - t0, fn.__name__))
    return sorted(times, reverse=True)


def greedy_cover(by_tokens: dict[int, frozenset]) -> list[int]:
    """Token counts whose steps launch every specialisation, picked greedily (most new ones first,
    the smaller count on a tie)."""
    left, cover = set().union(*by_tokens.values()), []
    while left:
        t = max(by_tokens, key=lambda t: (len(by_tokens[t] & left), -t))
        cover.append(t)
        left -= by_tokens[t]
    return sorted(cover)


def token_ranges(counts: list[int]) -> str:
    """"2-4 9 17-21": runs of consecutive counts."""
    runs = []
    for t in counts:
        if runs and t == runs[-1][1] + 1:
            runs[-1][1] = t
        else:
            runs.append([t, t])
    return " ".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)


def token_range(text: str) -> range:
    lo, _, hi = text.partition("-")
    if not lo.isdigit() or not hi.isdigit() or not 1 <= int(lo) <= int(hi):
        raise SystemExit(f"--tokens: got {text!r}, expected LO-HI with 1 <= LO <= HI")
    return range(int(lo), int(hi) + 1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="flint-40b")
    parser.add_argument("--layers", type=int, default=3, help="the preset's first layers (their shapes and types)")
    parser.add_argument("--quantization", default="nvfp4", choices=("nvfp4", "none"))
    parser.add_argument("--tokens", default="2-8192", help="LO-HI: the step sizes (one sequence's new tokens)")
    parser.add_argument("--sms", type=int, default=132, help="SMs of the GPU the launchers size grids for")
    parser.add_argument("--compile", action="store_true",
                        help="also compile the warm-up's specialisations for sm_90 (an empty Triton cache) and time it")
    parser.add_argument("--out", help="JSON: every distinct specialisation and the cover")
    args = parser.parse_args()
    tokens = token_range(args.tokens)
    split_k.HOST_SMS = args.sms
    pdl.ON_HOST = tuning.PDL = True  # launched with PDL, as on sm_90
    t0 = time.perf_counter()
    engine = LLMEngine(EngineArgs(preset=with_layers(args.preset, args.layers), dtype="bfloat16",
                                  quantization=None if args.quantization == "none" else args.quantization,
                                  device="cpu", kernel_backend="triton", block_size=64, max_num_seqs=8,
                                  max_graph_batch=8, max_num_batched_tokens=tokens[-1],
                                  max_model_len=tokens[-1] + 64, num_kv_blocks=tokens[-1] // 64 + 4, warmup=False,
                                  enable_prefix_caching=False))
    print(f"built {args.preset} ({args.layers} layers: {engine.config.layer_types}) in "
          f"{time.perf_counter() - t0:.0f} s", flush=True)
    modules = tuple(importlib.import_module(f"flint_kernels.{m.name}")
                    for m in pkgutil.iter_modules(flint_kernels.__path__))
    examples, by_tokens = {}, {}  # a launch of each specialisation; those of each step size
    for t in [*tokens, *(t for t in warmup_step_tokens(tokens[-1]) if t not in tokens)]:
        launches = step_launches(engine, modules, t)
        by_tokens[t] = frozenset(launches)
        for spec, launch in launches.items():
            examples.setdefault(spec, launch)
    steps = {t: by_tokens[t] for t in tokens}
    every = set().union(*steps.values())
    per_kernel = collections.Counter(s[0] for s in every)
    differ = varying(every)
    cover = greedy_cover(steps)
    warm_steps = warmup_step_tokens(tokens[-1])
    warm = set().union(*(by_tokens[t] for t in warm_steps))
    missed = [f"{s[0]} at {token_ranges([t for t in tokens if s in steps[t]])}"
              for s in sorted(every - warm)]
    print(f"token counts {tokens[0]}-{tokens[-1]}: {len(every)} distinct kernel specialisations; "
          f"a warm-up meeting all of them needs {len(cover)} steps")
    print(f"the engine's warm-up steps ({len(warm_steps)}: {' '.join(map(str, warm_steps))}) miss {len(missed)}"
          + "".join(f"\n  {m}" for m in missed))
    print("| kernel | specialisations | what differs (distinct values) |\n| --- | ---: | --- |")
    for name, n in per_kernel.most_common():
        print(f"| {name} | {n} | {' '.join(f'{arg} ({len(k)})' for arg, k in differ[name].items())} |")
    print("cover:", " ".join(map(str, cover)))
    compiled = None
    if args.compile:
        compiled = compile_seconds([examples[s] for s in sorted(warm)])
        print(f"compiling the warm-up's {len(compiled)} specialisations for sm_90, cold: "
              f"{sum(t for t, _ in compiled):.1f} s; slowest " + ", ".join(f"{n} {t:.1f} s" for t, n in compiled[:3]))
    if args.out:
        Path(args.out).write_text(json.dumps({
            "preset": args.preset, "layers": args.layers, "quantization": args.quantization, "sms": args.sms,
            "tokens": [tokens[0], tokens[-1]], "specialisations": len(every), "per_kernel": dict(per_kernel),
            "varying": differ, "cover": cover, "warmup_steps": warm_steps, "warmup_missed": missed,
            "warmup_compile_s": None if compiled is None else round(sum(t for t, _ in compiled), 1)}, indent=1))


if __name__ == "__main__":
    main()
