#!/usr/bin/env python3
"""Where a replayed decode step's time goes, kernel by kernel, on the critical path.

    python -m tools.bench.bench_step_timeline --formats nvfp4,bf16 --context 100000 \
        --variant flint_kernels.tuning.HEAD_FOLD_NORM=0 [--batch 64] [--out FILE]
    python -m tools.bench.bench_step_timeline --formats nvfp4 --prefill 8192 --context 98304

Eager per-kernel sums (bench.py's breakdown) overstate under PDL: a kernel's time includes its
wait for the one before. Here one CUDA graph of the decode step (--batch sequences, each at --context;
default 1) is replayed under torch.profiler and each kernel is charged end(i) - end(i-1): what the step would lose without
it (with PDL a kernel cannot complete before its predecessor, so these sum to the step's span).
Rows group kernels by name. Each --variant sets module attributes (the launchers read their
switches, flint_kernels/tuning.py, at each call) and recaptures the graph, so variants compare
in one process; the table
also gives each variant's replay time without the profiler. Prints markdown, writes JSON (--out;
by default benchmarks/<gpu>/<date>-<commit>-timeline.json).

--prefill N: one eager prefill chunk of N tokens whose first token is at position --context
(the K/V before it random), profiled the same way (no graph: prefill runs eagerly).

--ncu: no timeline; each variant's graph is replayed once between cudaProfilerStart and Stop, for
Nsight Compute to profile that replay's kernels one by one (`tools/gpu/gpu_run.sh ncu` runs it so).
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root, run as a file

from flint_backend.config import PRESETS, FlintConfig  # noqa: E402
from flint_backend.engine.engine import LLMEngine  # noqa: E402
from flint_backend.engine.engine_args import EngineArgs  # noqa: E402
from flint_backend.engine.step_batch import build_step_batch  # noqa: E402
from tools.bench.bench import kv_bytes_per_token, start_at_context, weight_bytes_per_token  # noqa: E402
from tools.bench.format_processes import each_format  # noqa: E402
from tools.bench.timing import copy_bandwidth, result_path, run_meta  # noqa: E402

REPLAYS = 20
PROFILED = 3


def parse_variant(text: str) -> list[tuple[str, str, str]]:
    """"pkg.module.ATTR=value[,pkg.module.ATTR=value]" -> [(module, attr, value)]; "" is the default."""
    out = []
    for item in filter(None, text.split(",")):
        target, _, value = item.partition("=")
        module, _, attr = target.rpartition(".")
        if not module or not _:
            raise ValueError(f"--variant: got {item!r}, expected module.ATTR=value")
        out.append((module, attr, value))
    return out


def set_variant(settings: list[tuple[str, str, str]]) -> dict:
    """Sets the attributes (values parsed as the attribute's current type; "a:b:c" a tuple of
    ints) -> the old values."""
    old = {}
    for module, attr, value in settings:
        mod = importlib.import_module(module)
        current = getattr(mod, attr)
        old[(module, attr)] = current
        if ":" in value:  # a tuple knob: "8:128:128:64:4:3"
            typed = tuple(None if v == "None" else int(v) for v in value.split(":"))
        elif current is None or isinstance(current, int) and not isinstance(current, bool):
            typed = None if value == "None" else int(value)  # ints, and int knobs that default to None
        elif isinstance(current, bool):
            typed = value in ("1", "true", "True")
        else:
            typed = type(current)(value)
        setattr(mod, attr, typed)
    return old


def capture(engine: LLMEngine, seqs: list) -> torch.cuda.CUDAGraph:
    graphs = engine.runner.graphs
    bucket = graphs.bucket_for(len(seqs))
    graphs._fill(seqs, bucket, 0)
    torch.cuda.synchronize()  # the inputs' copy (a side stream)
    batch, forward = graphs._batch(bucket, 0), graphs.model.forward
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        forward(batch, engine.runner.kv)  # compiles what the variant launches
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        forward(batch, engine.runner.kv)
    torch.cuda.synchronize()
    return graph


class PrefillChunk:
    """replay() runs one eager prefill chunk (a graph's stand-in for replay_ms and timeline)."""

    def __init__(self, engine: LLMEngine, seq, tokens: int):
        self.model, self.kv = engine.runner.model, engine.runner.kv
        self.batch = build_step_batch([(seq, tokens)], engine.blocks.block_size, engine.config.sliding_window,
                                      engine.device)
        self.replay()  # compiles
        torch.cuda.synchronize()

    def replay(self) -> None:
        self.model.forward(self.batch, self.kv)


def replay_ms(graph: torch.cuda.CUDAGraph) -> float:
    for _ in range(3):
        graph.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(REPLAYS):
        graph.replay()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / REPLAYS


def profiled_replay(graph: torch.cuda.CUDAGraph) -> None:
    """One replay (after two unprofiled) inside cudaProfilerStart/Stop: what `ncu
    --profile-from-start off` profiles."""
    for _ in range(2):
        graph.replay()
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStart()
    graph.replay()
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStop()


def short(name: str) -> str:
    name = name.split("(")[0]
    return name if len(name) < 48 else name[:45] + "..."


def timeline(graph: torch.cuda.CUDAGraph) -> dict:
    """Profiles PROFILED replays, each in a profiler session of its own (a prefill chunk's host
    syncs leave gaps inside it) -> per-kernel-name critical-path time of the median replay."""
    graph.replay()
    torch.cuda.synchronize()
    replays = []
    for _ in range(PROFILED):
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            graph.replay()
            torch.cuda.synchronize()
        path = Path(tempfile.mkdtemp()) / "trace.json"
        prof.export_chrome_trace(str(path))
        replays.append(sorted((e for e in json.loads(path.read_text())["traceEvents"]
                               if e.get("cat") == "kernel" and e.get("ph") == "X"), key=lambda e: e["ts"]))
    spans = []
    for ks in replays:
        rows: dict[str, list[float]] = defaultdict(lambda: [0.0, 0, 0.0])
        sequence, prev_end = [], ks[0]["ts"]
        for k in ks:
            end = k["ts"] + k["dur"]
            critical = max(0.0, end - prev_end)
            row = rows[short(k["name"])]
            row[0] += critical
            row[1] += 1
            row[2] += k["dur"]
            sequence.append([short(k["name"]), round(critical, 2), round(k["dur"], 2)])
            prev_end = max(prev_end, end)
        spans.append((prev_end - ks[0]["ts"], rows, sequence))
    span, rows, sequence = sorted(spans, key=lambda s: s[0])[len(spans) // 2]
    table = [{"kernel": name, "calls": n, "critical_us": round(c, 1), "critical_us_per_call": round(c / n, 2),
              "duration_us": round(d, 1)} for name, (c, n, d) in rows.items()]
    return {"span_us": round(span, 1), "kernels_per_step": len(sequence), "replays_seen": len(replays),
            "rows": sorted(table, key=lambda r: -r["critical_us"]),
            "sequence": sequence}  # [kernel, critical us, duration us] in launch order


def run_format(fmt: str, args) -> dict:
    engine = LLMEngine(EngineArgs(preset=args.preset, quantization="nvfp4" if fmt == "nvfp4" else None,
                                  dtype="bfloat16", device="cuda", kernel_backend="triton", block_size=64,
                                  max_num_seqs=max(64, args.batch), max_graph_batch=max(64, args.batch),
                                  max_num_batched_tokens=max(2048, args.prefill),
                                  max_model_len=args.max_model_len, kv_cache_memory_fraction=args.kv_fraction))
    # a prefill chunk: one sequence with --context positions cached and --prefill more to compute
    seqs = [start_at_context(engine, args.context + (args.prefill or 1) - 1, 10) for _ in range(args.batch)]
    if args.prefill:
        seqs[0].num_computed = args.context
    for r, seq in enumerate(seqs):  # distinct input tokens: a batch's tokens route to different experts
        seq.token_ids[seq.num_computed] = 1 + (r * 7919) % (engine.config.vocab_size - 1)
    result = {"format": fmt, "preset": args.preset, "layers": engine.config.num_hidden_layers, "context": args.context,
              "batch": args.batch, "prefill": args.prefill,
              "weight_bytes_per_token": weight_bytes_per_token(engine),
              "kv_bytes": kv_bytes_per_token(engine.config, args.context), "variants": []}
    for text in [""] + args.variant:
        old = set_variant(parse_variant(text))
        graph = PrefillChunk(engine, seqs[0], args.prefill) if args.prefill else capture(engine, seqs)
        if args.ncu:
            profiled_replay(graph)
            row = {"variant": text or "default", "ncu": True}
            print(f"  {fmt} {row['variant']}: one replay between cudaProfilerStart and Stop", flush=True)
        else:
            ms = replay_ms(graph)
            row = {"variant": text or "default", "replay_ms": round(ms, 4), **timeline(graph)}
            print(f"  {fmt} {row['variant']}: replay {ms:.3f} ms, profiled span {row['span_us'] / 1e3:.3f} ms, "
                  f"{row['kernels_per_step']} kernels", flush=True)
        result["variants"].append(row)
        del graph
        for (module, attr), value in old.items():
            setattr(importlib.import_module(module), attr, value)
    return result


def with_layers(preset: str, layers: int) -> str:
    """A preset of `preset`'s per-layer shapes with its first `layers` layers (their layer types
    too), registered under a new name."""
    full = FlintConfig.preset(preset)
    total = full.num_hidden_layers
    if not 0 < layers <= total:
        raise SystemExit(f"--layers: got {layers}, expected 1 to {total} ({preset}'s layers)")
    name = f"{preset}:{layers}-layers"
    PRESETS[name] = {**PRESETS[preset], "num_hidden_layers": layers, "layer_types": full.layer_types[:layers],
                     "mlp_only_layers": [i for i in full.mlp_only_layers if i < layers]}
    return name


def print_tables(results: dict, top: int = 20) -> None:
    for fmt in results["formats"]:
        for v in fmt["variants"]:
            what = f"prefill of {fmt['prefill']} tokens" if fmt.get("prefill") else f"batch {fmt.get('batch', 1)}"
            print(f"\n### {fmt['format']} at {fmt['context']}, {what}: {v['variant']} (replay {v['replay_ms']:.3f} ms, "
                  f"profiled span {v['span_us'] / 1e3:.3f} ms, {v['kernels_per_step']} kernels)\n")
            print("| kernel | calls | critical us | us/call | kernel duration us |")
            print("| --- | ---: | ---: | ---: | ---: |")
            for r in v["rows"][:top]:
                print(f"| {r['kernel']} | {r['calls']} | {r['critical_us']} | {r['critical_us_per_call']} | "
                      f"{r['duration_us']} |")
            mid = len(v["sequence"]) // 2  # one stretch of the step in launch order: a layer or two
            stretch = ", ".join(f"{k} {c}/{d}" for k, c, d in v["sequence"][mid:mid + 18])
            print(f"\nin order from kernel {mid} (critical/duration us): {stretch}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="flint-40b")
    parser.add_argument("--layers", type=int, default=0,
                        help="the preset's first N layers (0: all); e.g. flint-40b in BF16 on a 78 GiB GPU")
    parser.add_argument("--formats", default="nvfp4,bf16")
    parser.add_argument("--context", type=int, default=100000)
    parser.add_argument("--batch", type=int, default=1, help="decode sequences in the step, each at --context")
    parser.add_argument("--prefill", type=int, default=0,
                        help="profile one eager prefill chunk of this many tokens after --context cached ones")
    parser.add_argument("--variant", action="append", default=[],
                        help="module.ATTR=value[,...]: another graph with these knobs (repeatable)")
    parser.add_argument("--kv-fraction", type=float, default=0.5)
    parser.add_argument("--max-model-len", type=int, default=262144)
    parser.add_argument("--out", type=Path, help="default: benchmarks/<gpu>/<date>-<commit>-timeline.json")
    parser.add_argument("--ncu", action="store_true",
                        help="no timeline: one replay a variant inside cudaProfilerStart/Stop (tools/gpu/gpu_run.sh ncu)")
    parser.add_argument("--one-format", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.batch < 1 or (args.prefill and args.batch != 1):
        raise SystemExit("--batch: expected >= 1, and 1 with --prefill")
    for text in args.variant:
        parse_variant(text)
    if args.layers:
        args.preset = with_layers(args.preset, args.layers)
    args.out = args.out or result_path("timeline")
    results = {"meta": run_meta(__file__, copy_bandwidth() / 1e12)}
    results["formats"] = each_format(args.formats, args.one_format, lambda fmt: run_format(fmt, args),
                                     "tools.bench.bench_step_timeline")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    if not args.ncu:
        print_tables(results)


if __name__ == "__main__":
    main()
