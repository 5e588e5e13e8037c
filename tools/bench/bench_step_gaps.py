#!/usr/bin/env python3
"""What a batch-1 decode step costs on the GPU outside its CUDA graph replay, in the engine's loop.

    python tools/bench/bench_step_gaps.py --formats nvfp4,bf16 --context 100000 [--out FILE]

bench.py's ms/token (consecutive engine.step() calls) exceeds one graph replay's time; this says
by what. The engine's own decode loop (async scheduling: the host-to-device input copies, the
input-id gather, the graph replay, sampling and the tokens' copy back, all on one stream) runs
under torch.profiler, and the device trace is cut into steps at each replay's kernels (those
launched by one cudaGraphLaunch). For each step: its period (one replay's first kernel to the
next's), the replay's span, every device op between two replays (name, duration) and the time
the GPU ran nothing; and how far ahead of the device the host launched the replay (a lead near
zero means the host, not the GPU, sets the pace). Prints markdown, writes JSON (--out; by default
benchmarks/<gpu>/<date>-<commit>-step-gaps.json).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root, run as a file

from flint_backend.engine.engine import LLMEngine  # noqa: E402
from flint_backend.engine.engine_args import EngineArgs  # noqa: E402
from tools.bench.bench import start_at_context  # noqa: E402
from tools.bench.format_processes import each_format  # noqa: E402
from tools.bench.timing import copy_bandwidth, result_path, run_meta  # noqa: E402

DEVICE_CATS = ("kernel", "gpu_memcpy", "gpu_memset")


def short(name: str) -> str:
    name = name.split("(")[0].split("<")[0]
    return name if len(name) < 56 else name[:53] + "..."


def trace_steps(events: list[dict]) -> list[dict]:
    """Chrome-trace events of the profiled loop -> one dict per replay (the last has no period)."""
    launches = {e["args"]["correlation"]: e for e in events
                if e.get("cat") == "cuda_runtime" and e.get("name") == "cudaGraphLaunch"}
    device = sorted((e for e in events if e.get("cat") in DEVICE_CATS and e.get("ph") == "X"),
                    key=lambda e: e["ts"])
    replays: dict[int, list[dict]] = defaultdict(list)
    outside: list[dict] = []
    for e in device:
        corr = e.get("args", {}).get("correlation")
        (replays[corr] if corr in launches else outside).append(e)
    spans = sorted((min(e["ts"] for e in ks), max(e["ts"] + e["dur"] for e in ks), corr)
                   for corr, ks in replays.items())
    steps = []
    for i, (start, end, corr) in enumerate(spans):
        step = {"replay_us": end - start, "kernels": len(replays[corr]),
                "host_lead_us": start - launches[corr]["ts"]}  # graph launch call -> its first kernel
        if i + 1 < len(spans):
            nxt = spans[i + 1][0]
            ops = [e for e in outside if end <= e["ts"] < nxt]
            busy = _union_us([(e["ts"], e["ts"] + e["dur"]) for e in ops])
            step.update(period_us=nxt - start, between_us=nxt - end, busy_between_us=busy,
                        idle_between_us=nxt - end - busy,
                        ops=[[short(e["name"]), round(e["ts"] - end, 2), round(e["dur"], 2)] for e in ops])
        steps.append(step)
    return steps


def _union_us(intervals: list[tuple[float, float]]) -> float:
    total, cur_end = 0.0, None
    for a, b in sorted(intervals):
        if cur_end is None or a > cur_end:
            total += b - a
            cur_end = b
        elif b > cur_end:
            total += b - cur_end
            cur_end = b
    return total


def profile_loop(engine: LLMEngine, context: int, steps: int) -> list[dict]:
    seq = start_at_context(engine, context, steps + 10)
    for _ in range(3):
        engine.step()  # warm-up: graphs replayed, a step in flight
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                            torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            engine.step()
        torch.cuda.synchronize()
    engine.abort(seq.request_id)
    path = Path(tempfile.mkdtemp()) / "trace.json"
    prof.export_chrome_trace(str(path))
    return trace_steps(json.loads(path.read_text())["traceEvents"])


def summarize(steps: list[dict]) -> dict:
    full = [s for s in steps if "period_us" in s][1:]  # the first replay follows the untimed warm-up
    ops: dict[str, list[float]] = defaultdict(list)
    for s in full:
        for name, _, dur in s["ops"]:
            ops[name].append(dur)

    def median(key):
        return round(statistics.median(s[key] for s in full), 2)

    return {"steps": len(full), "period_us": median("period_us"), "replay_us": median("replay_us"),
            "between_us": median("between_us"), "busy_between_us": median("busy_between_us"),
            "idle_between_us": median("idle_between_us"), "host_lead_us": median("host_lead_us"),
            "ops": sorted(([name, len(d) / len(full), round(statistics.median(d), 2)] for name, d in ops.items()),
                          key=lambda r: -r[1] * r[2]),
            "example": full[len(full) // 2]["ops"]}


def run_format(fmt: str, args) -> dict:
    engine = LLMEngine(EngineArgs(preset=args.preset, quantization="nvfp4" if fmt == "nvfp4" else None,
                                  dtype="bfloat16", device="cuda", kernel_backend="triton", block_size=64,
                                  max_num_seqs=64, max_model_len=args.max_model_len,
                                  kv_cache_memory_fraction=args.kv_fraction))
    steps = profile_loop(engine, args.context, args.steps)
    out = {"format": fmt, "context": args.context, **summarize(steps)}
    print(f"  {fmt}: period {out['period_us']} us, replay {out['replay_us']}, between {out['between_us']} "
          f"(busy {out['busy_between_us']}, idle {out['idle_between_us']}), host lead {out['host_lead_us']}",
          flush=True)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="flint-40b")
    parser.add_argument("--formats", default="nvfp4,bf16")
    parser.add_argument("--context", type=int, default=100000)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--kv-fraction", type=float, default=0.5)
    parser.add_argument("--max-model-len", type=int, default=262144)
    parser.add_argument("--out", type=Path, help="default: benchmarks/<gpu>/<date>-<commit>-step-gaps.json")
    parser.add_argument("--one-format", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    args.out = args.out or result_path("step-gaps")
    results = {"meta": run_meta(__file__, copy_bandwidth() / 1e12)}
    results["formats"] = each_format(args.formats, args.one_format, lambda fmt: run_format(fmt, args),
                                     "tools.bench.bench_step_gaps")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    print_tables(results)


def print_tables(results: dict) -> None:
    m = results["meta"]
    print(f"\n{m['command']}\n{m['gpu']}, {m['date']}, commit {m['commit']}\n")
    print("| format | context | step period us | replay us | between replays us | busy | idle | host lead us |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for f in results["formats"]:
        print(f"| {f['format']} | {f['context']} | {f['period_us']} | {f['replay_us']} | {f['between_us']} | "
              f"{f['busy_between_us']} | {f['idle_between_us']} | {f['host_lead_us']} |")
    for f in results["formats"]:
        print(f"\n{f['format']}: device ops between two replays (per step, median us): " + ", ".join(
            f"{name} x{n:.2g} {dur}" for name, n, dur in f["ops"]))
        print("  one step (name, start after the replay us, duration us): " + ", ".join(
            f"{name} +{at}/{dur}" for name, at, dur in f["example"]))


if __name__ == "__main__":
    main()
