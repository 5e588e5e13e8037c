#!/usr/bin/env python3
"""Scheduler + Python overhead per step: decode steps by batch size (what the GPU path must
hide), and a long prompt's prefill chunks (what the GPU waits for: prefill steps are synchronous).

    python tools/bench/bench_engine_overhead.py [--batch-sizes 1,2,4,8,16,32,64] [--prefill 100000:8192]
        [--out FILE]

Runs the flint-tiny engine on the CPU with every sequence decoding, and splits each step into
schedule, step-batch build (host lists -> tensors), model forward, sampling and bookkeeping.
Overhead = step time - forward time. --prefill PROMPT:CHUNK (empty: none) then times one prompt
of PROMPT tokens in chunks of CHUNK (flint-tiny's shapes, its context raised to fit; prefix
caching on, as served) with the forward replaced by zero logits, so each chunk's step is its
host time alone. Prints markdown tables and writes JSON (--out; by default
benchmarks/cpu/<date>-<commit>-engine-overhead.json).
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from datetime import date
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root, run as a file

from flint_backend.config import PRESETS  # noqa: E402
from flint_backend.engine import runner as runner_module  # noqa: E402
from flint_backend.engine.engine import LLMEngine  # noqa: E402
from flint_backend.engine.engine_args import EngineArgs  # noqa: E402
from flint_backend.engine.sampling_params import SamplingParams  # noqa: E402
from flint_backend.engine.step_batch import build_step_batch  # noqa: E402
from tools.bench.timing import command, commit, result_path  # noqa: E402


class Timers:
    def __init__(self):
        self.samples: dict[str, list[float]] = {}

    def wrap(self, name, fn):
        def timed(*args, **kwargs):
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.samples.setdefault(name, []).append(time.perf_counter() - start)
        return timed


def measure(batch: int, steps: int) -> dict:
    # eager steps (host lists -> tensors each step), so every phase is timed separately; the GPU's
    # graph path replaces build_batch with DecodeGraphs._fill over static buffers
    engine = LLMEngine(EngineArgs(dtype="float32", device="cpu", max_num_seqs=max(batch, 1), enforce_eager=True,
                                  max_num_batched_tokens=max(2048, batch), block_size=16, max_model_len=2048))
    params = SamplingParams(temperature=0.8, top_p=0.95, seed=0, max_tokens=steps + 50, ignore_eos=True)
    for i in range(batch):
        engine.add_request([1 + (i * 7 + j) % 8000 for j in range(32)], params)
    while any(not s.is_decoding for s in engine.scheduler.running) or engine.scheduler.waiting:
        engine.step()  # finish the prefills
    timers = Timers()
    engine.scheduler.schedule = timers.wrap("schedule", engine.scheduler.schedule)
    runner_module.build_step_batch = timers.wrap("build_batch", build_step_batch)
    engine.runner.model.forward = timers.wrap("forward", engine.runner.model.forward)
    engine.runner.sampler = timers.wrap("sample", engine.runner.sampler)
    step = timers.wrap("step", engine.step)
    try:
        for _ in range(steps):
            step()
    finally:
        runner_module.build_step_batch = build_step_batch
    med = {name: statistics.median(values) * 1e3 for name, values in timers.samples.items()}
    med["overhead"] = statistics.median(
        (s - f) * 1e3 for s, f in zip(timers.samples["step"], timers.samples["forward"]))
    med["bookkeeping"] = med["overhead"] - med["schedule"] - med["build_batch"] - med["sample"]
    return {"batch": batch, **{k: round(v, 4) for k, v in med.items()}}


def measure_prefill(prompt: int, chunk: int) -> dict:
    preset = f"flint-tiny:context-{prompt + 64}"
    PRESETS[preset] = {**PRESETS["flint-tiny"], "max_position_embeddings": prompt + 64}
    engine = LLMEngine(EngineArgs(preset=preset, dtype="float32", device="cpu", max_num_seqs=1, block_size=64,
                                  max_num_batched_tokens=chunk, max_model_len=prompt + 64,
                                  num_kv_blocks=prompt // 64 + 8, warmup=False))
    vocab = engine.config.vocab_size
    engine.runner.model.forward = lambda batch, kv: torch.zeros(len(batch.sample_seqs), vocab)  # [S, V]
    timers = Timers()
    engine.scheduler.schedule = timers.wrap("schedule", engine.scheduler.schedule)
    runner_module.build_step_batch = timers.wrap("build_batch", build_step_batch)
    step = timers.wrap("step", engine.step)
    engine.add_request([1 + j % (vocab - 1) for j in range(prompt)], SamplingParams(max_tokens=1, ignore_eos=True))
    try:
        while engine.has_work():
            step()
    finally:
        runner_module.build_step_batch = build_step_batch
    full = prompt // chunk  # the full chunks' steps
    med = {name: statistics.median(values[:full]) * 1e3 for name, values in timers.samples.items()}
    return {"prompt": prompt, "chunk": chunk, "chunks": len(timers.samples["step"]),  # step_total: every chunk
            "step_total": round(sum(timers.samples["step"]) * 1e3, 2), **{k: round(v, 4) for k, v in med.items()}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch-sizes", default="1,2,4,8,16,32,64")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--prefill", default="100000:8192", help="PROMPT:CHUNK tokens, or empty for none")
    parser.add_argument("--out", type=Path, help="default: benchmarks/cpu/<date>-<commit>-engine-overhead.json")
    args = parser.parse_args()
    prompt, _, chunk = args.prefill.partition(":")
    if args.prefill and not (prompt.isdigit() and chunk.isdigit() and 0 < int(chunk) <= int(prompt)):
        raise SystemExit(f"--prefill: got {args.prefill!r}, expected PROMPT:CHUNK with 0 < CHUNK <= PROMPT")
    args.out = args.out or result_path("engine-overhead", "cpu")
    torch.set_num_threads(1)
    rows = [measure(int(b), args.steps) for b in args.batch_sizes.split(",")]
    prefill = [measure_prefill(int(prompt), int(chunk))] if args.prefill else []
    meta = {"date": date.today().isoformat(), "machine": f"{platform.processor() or platform.machine()}, "
            f"{torch.get_num_threads()} torch thread", "commit": commit(),
            "command": command(__file__), "unit": "ms per step (median; prefill: over the full chunks)"}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"meta": meta, "rows": rows, "prefill": prefill}, indent=2) + "\n")
    print(f"\n{meta['command']}  ({meta['date']}, {meta['machine']}, commit {meta['commit']}; ms per step, median)\n")
    for table, cols in ((rows, ["batch", "overhead", "schedule", "build_batch", "sample", "bookkeeping", "forward",
                                "step"]),
                        (prefill, ["prompt", "chunk", "chunks", "schedule", "build_batch", "step", "step_total"])):
        if table:
            print("| " + " | ".join(cols) + " |")
            print("|" + "---|" * len(cols))
            for row in table:
                print("| " + " | ".join(f"{row[c]:.3f}" if isinstance(row[c], float) else str(row[c])
                                        for c in cols) + " |")
            print()


if __name__ == "__main__":
    main()
