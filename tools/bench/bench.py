#!/usr/bin/env python3
"""End-to-end decode benchmark of the full-size model on one GPU (random weights built on the GPU).

    python tools/bench/bench.py --formats bf16,nvfp4 --contexts 1024,32768,100000 [--out FILE]
    python tools/bench/bench.py --formats nvfp4,nvfp4/fp8 ...    (WEIGHTS/KV: an FP8 KV cache)

For each weight format: batch-1 decode ms/token end to end (consecutive engine.step() calls: forward
+ LM head + sampling + the Python that async scheduling does not hide) at each context, with CUDA
graphs and eagerly, and the median of one step between two syncs; the GPU time of one graph
replay; a per-kernel breakdown of one decode step; the roofline floor (bytes one step must read /
measured copy bandwidth) and the achieved fraction; throughput at each --streams count for each
--workloads prompt:output pair (default 1, 8, 64, 128, 256 streams of 1K in / 512 out and 8K in /
1K out; after an untimed run of the same requests that compiles their kernels), with TTFT and ITL
percentiles; TTFT of each --ttft prompt length (the second such prompt: the first, which may still
compile, is reported apart); GPU memory. Long contexts are set up by filling the KV cache with random values (decode speed does
not depend on what the cache holds); the TTFT run prefills for real. With several formats each
runs in its own process (on the H200 the BF16 engine built after the NVFP4 one in the same
process spent 0.49-0.62 ms a step outside the graph replay, 0.30 in a process of its own).
Prints markdown tables and writes JSON (--out; by default benchmarks/<gpu>/<date>-<commit>-bench.json).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root, run as a file

from flint_backend.config import FlintConfig  # noqa: E402
from flint_backend.engine.engine import LLMEngine  # noqa: E402
from flint_backend.engine.engine_args import EngineArgs  # noqa: E402
from flint_backend.engine.sampling_params import SamplingParams  # noqa: E402
from flint_backend.engine.sequence import SequenceStatus  # noqa: E402
from flint_backend.engine.step_batch import build_step_batch  # noqa: E402
from flint_kernels import tuning  # noqa: E402
from flint_kernels.fp8_kv import index_copy_rows  # noqa: E402
from tools.bench.format_processes import run_in_child  # noqa: E402
from tools.bench.jit_compiles import JitCompiles, describe, difference  # noqa: E402
from tools.bench.stream_stats import Stream, run_statistics  # noqa: E402
from tools.bench.timing import copy_bandwidth, nbytes, result_path, run_meta  # noqa: E402

GREEDY = dict(temperature=0.0, ignore_eos=True)


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def weight_bytes_per_token(engine: LLMEngine) -> int:
    """Weight bytes a batch-1 decode step reads: every dense weight, the chosen + shared experts, one
    embedding row, the LM head."""
    c, total = engine.config, 0
    m = engine.runner.model
    total += c.hidden_size * m.embed.element_size() + nbytes(m.lm_head) + nbytes(m.norm)
    for layer in m.layers:
        a = layer.self_attn
        total += sum(nbytes(w) for w in (a.qkv_proj, a.o_proj, a.q_norm, a.k_norm, a.sinks,
                                         layer.input_norm, layer.post_norm))
        mlp = layer.mlp
        if hasattr(mlp, "router"):
            share = c.num_experts_per_tok / c.num_experts
            total += nbytes(mlp.router) + nbytes(mlp.shared_w13) + nbytes(mlp.shared_w2)
            total += int(share * (nbytes(mlp.w13) + nbytes(mlp.w2)))
        else:
            total += nbytes(mlp.gate_up) + nbytes(mlp.down)
    return total


def kv_bytes_per_token(config: FlintConfig, context: int, element_bytes: int = 2) -> int:
    per_pos = config.num_key_value_heads * config.head_dim * 2 * element_bytes  # K and V
    return per_pos * (len(config.full_attention_layers) * context
                      + len(config.sliding_attention_layers) * min(context, config.sliding_window))


def start_at_context(engine: LLMEngine, context: int, max_tokens: int):
    """A running sequence whose first `context` positions are in the cache (random K/V)."""
    seq = engine.add_request([1 + i % 1000 for i in range(context + 1)],
                             SamplingParams(max_tokens=max_tokens, **GREEDY))
    sched = engine.scheduler
    sched.waiting.remove(seq)
    engine.blocks.grow(seq, context + 1)
    seq.status = SequenceStatus.RUNNING
    sched.running.append(seq)
    bs = engine.blocks.block_size
    blocks = torch.tensor(seq.block_table, device=engine.device)
    for cache in (c for kv in engine.runner.kv.full.values() for c in kv):
        index_copy_rows(cache, blocks, torch.randn((len(blocks), *cache.shape[1:]), device=cache.device,
                                                   dtype=torch.bfloat16).to(cache.dtype))
    kv = engine.runner.kv
    for ring in (kv.ring_k, kv.ring_v):
        row = ring[:, seq.ring_row]  # a basic index: a view, filled in place
        row.copy_(torch.randn(row.shape, device=row.device, dtype=torch.bfloat16).to(row.dtype))
    seq.num_computed = context
    assert len(seq.block_table) * bs >= context + 1
    return seq


def decode_ms(engine: LLMEngine, context: int, steps: int) -> dict:
    """One sequence decoding at `context`. ms_per_token: the wall time of `steps` consecutive
    engine.step() calls, no sync between them (as a client sees them: with async scheduling the
    host work of a step overlaps the device's next one), over the tokens they delivered. The clock
    starts when the first of them returns and counts the tokens of the others: under async
    scheduling the first call only launches a step and returns the token of the warm-up step
    already done before it (counting that token, as bench.py did until 2026-12-04, put
    ms_per_token (steps - 1) / steps of the step period, 3% low at 30 steps).
    synced_step_ms: the median wall time of one engine.step() between two device syncs, so that no
    step overlaps another (what ms_per_token measured before async scheduling)."""
    seq = start_at_context(engine, context, 2 * steps + 5)
    for _ in range(2):
        engine.step()  # warm-up (compiles any eager variant); with async scheduling a step is now in flight
    ms_per_token, gaps = unsynced_steps(engine, steps)
    slowest = max(range(steps), key=gaps.__getitem__)
    times = []
    for _ in range(steps):
        sync()
        t0 = time.perf_counter()
        engine.step()
        sync()
        times.append(time.perf_counter() - t0)
    engine.abort(seq.request_id)
    return {"ms_per_token": ms_per_token, "synced_step_ms": statistics.median(times) * 1e3,
            # where a one-off stall falls in the unsynced run (the first context an engine measures)
            "slowest_step": slowest, "slowest_step_ms": gaps[slowest] * 1e3}


def unsynced_steps(engine: LLMEngine, steps: int) -> tuple[float, list[float]]:
    """decode_ms's ms/token, for a running sequence with `steps` + 1 steps still to make: after a
    sync, one engine.step() (async: launches a step, returns the previous one's token; sync: one
    whole step), then the clock over `steps` calls with no sync between them.
    -> (ms per delivered token, each timed call's wall time in s, host side)"""
    sync()
    engine.step()
    t0 = time.perf_counter()
    ends, tokens = [], 0
    for _ in range(steps):
        tokens += sum(len(out.new_token_ids) for out in engine.step())
        ends.append(time.perf_counter())
    return (ends[-1] - t0) / tokens * 1e3, [b - a for a, b in zip([t0] + ends, ends)]


def graph_replay_ms(engine: LLMEngine, context: int) -> float | None:
    graphs = engine.runner.graphs
    if graphs is None or not graphs.graphs:
        return None
    seq = start_at_context(engine, context, 10)
    graphs._fill([seq], 1, 0)
    sync()  # the inputs' copy (a side stream)
    g = graphs.graphs[1, 0]
    for _ in range(3):
        g.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(20):
        g.replay()
    end.record()
    end.synchronize()
    engine.abort(seq.request_id)
    return start.elapsed_time(end) / 20


def kernel_breakdown(engine: LLMEngine, context: int) -> list[dict]:
    """CUDA time per kernel name for one eager decode step at `context` (torch.profiler)."""
    seq = start_at_context(engine, context, 10)
    batch = build_step_batch([(seq, 1)], engine.blocks.block_size, engine.config.sliding_window, engine.device)
    model, kv = engine.runner.model, engine.runner.kv
    forward = model.forward  # what batch 1 runs (the regular path, replayed or eager)
    forward(batch, kv)
    sync()
    cuda = engine.device.type == "cuda"
    activity = torch.profiler.ProfilerActivity.CUDA if cuda else torch.profiler.ProfilerActivity.CPU
    with torch.profiler.profile(activities=[activity]) as prof:
        forward(batch, kv)
        sync()
    engine.abort(seq.request_id)
    totals: dict[str, list[float]] = defaultdict(lambda: [0.0, 0])
    kind = torch.autograd.DeviceType.CUDA if cuda else torch.autograd.DeviceType.CPU
    for event in prof.events():
        if event.device_type == kind:
            name = event.name if len(event.name) < 60 else event.name[:57] + "..."
            totals[name][0] += event.device_time_total if cuda else event.self_cpu_time_total
            totals[name][1] += 1
    rows = [{"kernel": k, "us": round(v[0], 1), "calls": v[1]} for k, v in totals.items()]
    return sorted(rows, key=lambda r: -r["us"])


def throughput(engine: LLMEngine, streams: int, prompt_len: int = 1024, out_len: int = 512,
               warmup: bool = True, seen: JitCompiles | None = None) -> dict:
    """Output tokens/s of `streams` requests submitted at once, over the whole run and over its
    decode part (from the step that gave every stream its first token), and the TTFT and ITL
    percentiles in ms (stream_stats.run_statistics). warmup: the same requests run first through
    every step that prefills (prefill_warm_up), untimed: Triton compiles a kernel for each new
    specialisation on its first launch, and the engine's start-up warm-up (LLMEngine.warm_up)
    covers a prefill chunk and a short prompt, not every batch of prompts; a compile would
    otherwise land in the timed run. jit_compiles: the kernel specialisations the timed run still
    met for the first time, each with what sets it apart from the closest one `seen` recorded
    before it."""
    prompts = [[1 + (i * 31 + j) % 5000 for j in range(prompt_len)] for i in range(streams)]
    if warmup:
        prefill_warm_up(engine, prompts, out_len)
    seqs = [engine.add_request(p, SamplingParams(max_tokens=out_len, **GREEDY)) for p in prompts]
    events: dict[str, list[tuple[float, int]]] = {s.request_id: [] for s in seqs}
    sync()
    t0 = time.perf_counter()
    first = None
    earlier = list(seen.specs) if seen is not None else []
    with JitCompiles() as compiles:
        while engine.has_work():
            outputs = engine.step()
            now = time.perf_counter()
            for out in outputs:
                events[out.request_id].append((now - t0, len(out.new_token_ids)))
            if first is None and all(s.num_output_tokens > 0 for s in seqs):
                first = now
    decode = time.perf_counter() - first
    run = run_statistics([Stream(0.0, e) for e in events.values()])
    new = [{"specialisation": describe(spec), "vs_earlier": difference(spec, earlier)} for spec in compiles.specs]
    return {"streams": streams, "prompt": prompt_len, "output": out_len, "output_tok_s": run["output_tok_s"],
            "decode_tok_s": round(streams * (out_len - 1) / decode, 1),
            "ms_per_step": round(decode / (out_len - 1) * 1e3, 3),
            "ttft_ms": run["ttft_ms"], "itl_ms": run["itl_ms"], "jit_compiles": new}


def prefill_warm_up(engine: LLMEngine, prompts: list[list[int]], max_tokens: int) -> int:
    """Runs `prompts` (greedy, max_tokens each, all at once) until every one has its first token,
    then aborts them. A run of the same requests from an idle engine schedules the same steps (the
    scheduler sees only lengths), so every step of it that prefills has run here, with the same
    token and sequence counts; the all-decode steps after are CUDA graphs captured at start.
    (A shorter run of them would not do: streams that end early change the later steps' counts.)
    -> the output tokens of the longest stream by then, the number of steps that prefilled."""
    seqs = [engine.add_request(p, SamplingParams(max_tokens=max_tokens, **GREEDY)) for p in prompts]
    while any(s.num_output_tokens == 0 for s in seqs):
        engine.step()
    steps = max(s.num_output_tokens for s in seqs)
    for s in seqs:
        engine.abort(s.request_id)
    while engine.has_work():
        engine.step()
    return steps


def ttft(engine: LLMEngine, prompt_len: int) -> float:
    seq = engine.add_request([1 + i % 5000 for i in range(prompt_len)], SamplingParams(max_tokens=1, **GREEDY))
    sync()
    t0 = time.perf_counter()
    while seq.num_output_tokens == 0:
        engine.step()
    return time.perf_counter() - t0


def bench_format(fmt: str, args, bandwidth: float) -> dict:
    with JitCompiles() as seen:  # every kernel specialisation of the process, from the engine's build on
        return measure_format(fmt, args, bandwidth, seen)


def measure_format(fmt: str, args, bandwidth: float, seen: JitCompiles) -> dict:
    cuda = args.device == "cuda"
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    weights_format, _, kv_dtype = fmt.partition("/")  # "nvfp4/fp8": NVFP4 weights, an FP8 KV cache
    engine_args = dict(preset=args.preset, quantization="nvfp4" if weights_format == "nvfp4" else None,
                       dtype="bfloat16", kv_cache_dtype=kv_dtype or "auto",
                       device=args.device, kernel_backend=args.kernel_backend, block_size=args.block_size,
                       max_num_seqs=max([64, *args.streams]), max_graph_batch=max([64, *args.streams]),
                       max_num_batched_tokens=args.chunk, max_num_batched_tokens_with_decodes=args.chunk_with_decodes,
                       max_model_len=args.max_model_len,
                       kv_cache_memory_fraction=args.kv_fraction,
                       async_scheduling=not args.no_async_scheduling, warmup=False if args.no_engine_warmup else None,
                       # the timed runs repeat their warm-up's prompts: a prefix cache would serve them
                       enable_prefix_caching=args.prefix_caching)
    engine = LLMEngine(EngineArgs(**engine_args))
    sync()
    build_s = time.perf_counter() - t0
    weights = weight_bytes_per_token(engine)
    # the engine's warm-up (in build_s) and the kernel specialisations the build and it met: each a
    # compile on a cold Triton cache, a disk read on a warm one
    result = {"format": fmt, "build_s": round(build_s, 1),
              "warmup_s": None if engine.warmup_s is None else round(engine.warmup_s, 1),
              "build_specialisations": len(seen.specs), "weight_bytes_per_token": weights,
              "weights_gib": round(torch.cuda.memory_allocated() / 2**30, 2) if cuda else None, "decode": []}
    print(f"  {fmt} built in {build_s:.1f} s (warm-up {result['warmup_s']} s, {len(seen.specs)} kernel "
          f"specialisations met)", flush=True)
    for context in args.contexts:
        kv = kv_bytes_per_token(engine.config, context, engine.runner.kv.dtype.itemsize)
        timed = decode_ms(engine, context, args.steps)
        ms = timed["ms_per_token"]
        replay = graph_replay_ms(engine, context)
        floor = (weights + kv) / bandwidth * 1e3
        result["decode"].append({"context": context, "ms_per_token": round(ms, 3),
                                 "synced_step_ms": round(timed["synced_step_ms"], 3),
                                 "slowest_step": timed["slowest_step"],
                                 "slowest_step_ms": round(timed["slowest_step_ms"], 3),
                                 "tokens_per_s": round(1e3 / ms, 1),
                                 "graph_replay_ms": None if replay is None else round(replay, 3),
                                 "bytes": weights + kv, "floor_ms": round(floor, 3),
                                 "roofline_fraction": round(floor / ms, 3)})
        print(f"  {fmt} context {context}: {ms:.3f} ms/token (synced step {timed['synced_step_ms']:.3f} ms, "
              f"graph replay {replay}, slowest step {timed['slowest_step']}: {timed['slowest_step_ms']:.1f} ms), "
              f"floor {floor:.3f} ms", flush=True)
    result["breakdown_context"] = args.contexts[-1]
    result["breakdown"] = kernel_breakdown(engine, args.contexts[-1])[:40]
    if not args.skip_throughput:
        result["throughput"] = []
        for prompt_len, out_len in args.workloads:
            for streams in args.streams:
                row = throughput(engine, streams, prompt_len, out_len, seen=seen)
                print(f"  {fmt} {streams} streams of {prompt_len} in / {out_len} out: {row['output_tok_s']} "
                      f"output tok/s ({row['decode_tok_s']} decoding, {row['ms_per_step']} ms a step), "
                      f"TTFT p50 {row['ttft_ms']['p50']} ms, ITL p50 {row['itl_ms']['p50']} ms", flush=True)
                for spec in row["jit_compiles"]:
                    print(f"    first specialised in the timed run: {spec['specialisation']} "
                          f"({spec['vs_earlier']})", flush=True)
                result["throughput"].append(row)
    # the first prompt of each length compiles what its prefill has not met: timed apart
    result["ttft_first_s"], result["ttft_s"] = {}, {}
    for length in args.ttft:
        result["ttft_first_s"][str(length)] = round(ttft(engine, length), 3)
        result["ttft_s"][str(length)] = round(ttft(engine, length), 3)
        print(f"  {fmt} TTFT of {length} tokens: {result['ttft_s'][str(length)]} s "
              f"(first {result['ttft_first_s'][str(length)]} s)", flush=True)
    if args.ttft_chunks:  # a lone prompt's chunk (max_num_batched_tokens), set on the running engine
        result["ttft_by_chunk_s"] = {}
        for chunk in args.ttft_chunks:
            engine.scheduler.max_num_batched_tokens = chunk
            for length in args.ttft:
                ttft(engine, length)  # compiles the chunk's shapes
                result["ttft_by_chunk_s"][f"{chunk}:{length}"] = seconds = round(ttft(engine, length), 3)
                print(f"  {fmt} chunk {chunk}: TTFT of {length} tokens {seconds} s", flush=True)
        engine.scheduler.max_num_batched_tokens = args.chunk
    graphs, engine.runner.graphs = engine.runner.graphs, None  # the same engine, eager steps
    result["eager_ms_per_token"] = {str(c): round(decode_ms(engine, c, args.steps // 2)["ms_per_token"], 3)
                                    for c in args.contexts}
    engine.runner.graphs = graphs
    if cuda:
        result["peak_gpu_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 2)
        free, total = torch.cuda.mem_get_info()
        result["gpu_used_gib"] = round((total - free) / 2**30, 2)
    del engine
    if cuda:
        torch.cuda.empty_cache()
    return result


def print_tables(results: dict) -> None:
    m = results["meta"]
    print(f"\n{m['command']}\n{m['gpu']}, {m['date']}, commit {m['commit']}, "
          f"copy bandwidth {m['copy_tb_s']} TB/s\n")
    print("| format | context | ms/token (graphs) | synced step ms | tok/s | eager ms/token | graph replay ms "
          "| floor ms | roofline |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in results["formats"]:
        for d in r["decode"]:
            print(f"| {r['format']} | {d['context']} | {d['ms_per_token']} | {d['synced_step_ms']} | "
                  f"{d['tokens_per_s']} | "
                  f"{r['eager_ms_per_token'][str(d['context'])]} | {d['graph_replay_ms']} | {d['floor_ms']} | "
                  f"{d['roofline_fraction']:.0%} |")
    for r in results["formats"]:
        print(f"\n{r['format']}: weights {r['weights_gib']} GiB, peak {r.get('peak_gpu_gib')} GiB, "
              f"build {r['build_s']} s, TTFT s {r.get('ttft_s')} (first {r.get('ttft_first_s')})")
        if r.get("throughput"):
            print("\n| streams | in / out | output tok/s | decode tok/s | ms a step | TTFT p50 / p99 ms "
                  "| ITL p50 / p99 ms |\n|---|---|---|---|---|---|---|")
            for t in r["throughput"]:
                print(f"| {t['streams']} | {t['prompt']} / {t['output']} | {t['output_tok_s']} | {t['decode_tok_s']} | "
                      f"{t['ms_per_step']} | {t['ttft_ms']['p50']} / {t['ttft_ms']['p99']} | "
                      f"{t['itl_ms']['p50']} / {t['itl_ms']['p99']} |")
        print(f"top kernels of one eager decode step at {r['breakdown_context']} tokens (us):")
        for k in r["breakdown"][:12]:
            print(f"  {k['us']:9.1f}  x{k['calls']:<4} {k['kernel']}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="flint-40b")
    parser.add_argument("--formats", default="bf16,nvfp4")
    parser.add_argument("--contexts", default="1024,32768,100000")
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--chunk", type=int, default=EngineArgs.max_num_batched_tokens,
                        help="max_num_batched_tokens, a step's budget (default: the engine's)")
    parser.add_argument("--chunk-with-decodes", type=int, default=EngineArgs.max_num_batched_tokens_with_decodes,
                        help="max_num_batched_tokens_with_decodes, a decoding step's budget (default: the engine's; "
                             "0: --chunk)")
    parser.add_argument("--ttft", default="8192,32768,100000", help="prompt lengths for TTFT (0: none)")
    parser.add_argument("--ttft-chunks", default="", help="also TTFT at each of these chunk sizes (e.g. 2048,8192)")
    parser.add_argument("--streams", default="1,8,64,128,256", help="concurrent requests of each throughput run")
    parser.add_argument("--workloads", default="1024:512,8192:1024",
                        help="throughput runs' prompt:output token counts")
    parser.add_argument("--skip-throughput", action="store_true")
    parser.add_argument("--prefix-caching", action="store_true",
                        help="the engine's prefix cache on (off by default: each timed run repeats its warm-up's prompts)")
    parser.add_argument("--no-engine-warmup", action="store_true",
                        help="the engine skips its start-up warm-up (EngineArgs.warmup false): ttft_first_s "
                             "then includes compiling the chunk's prefill kernels")
    parser.add_argument("--block-size", type=int, default=64, help="tokens a paged KV block (EngineArgs.block_size)")
    parser.add_argument("--kv-fraction", type=float, default=0.5)
    parser.add_argument("--max-model-len", type=int, default=262144)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--kernel-backend", default="triton")
    parser.add_argument("--no-async-scheduling", action="store_true",
                        help="every step synchronous (the engine default launches decode steps ahead)")
    parser.add_argument("--out", type=Path, help="default: benchmarks/<gpu>/<date>-<commit>-bench.json")
    args = parser.parse_args()
    args.contexts = [int(c) for c in args.contexts.split(",")]
    args.ttft = [int(n) for n in args.ttft.split(",") if int(n)]
    args.streams = [int(n) for n in args.streams.split(",")]
    args.ttft_chunks = [int(n) for n in args.ttft_chunks.split(",") if n]
    args.chunk_with_decodes = args.chunk_with_decodes or None
    args.workloads = [tuple(int(n) for n in w.split(":")) for w in args.workloads.split(",")]
    if any(n < 1 for n in args.streams) or any(len(w) != 2 or min(w) < 1 for w in args.workloads):
        raise SystemExit("--streams: expected counts >= 1; --workloads: expected PROMPT:OUTPUT pairs, e.g. 1024:512")
    args.out = args.out or result_path("bench", args.device)
    bandwidth = copy_bandwidth(args.device, 1 << 30 if args.device == "cuda" else 1 << 24)
    results = {"meta": {**run_meta(__file__, bandwidth / 1e12, args.device),
                        "async_scheduling": not args.no_async_scheduling,
                        # ms_per_token's clock starts after a step() that only launches (decode_ms);
                        # runs without this key counted a token made before the clock
                        "clock": "after-first-step", "steps": args.steps,
                        # the step budgets: max_num_batched_tokens, and a decoding step's
                        "chunk": args.chunk, "chunk_with_decodes": args.chunk_with_decodes,
                        # every tuning switch as this run had it (the environment sets them:
                        # flint_kernels/tuning.py)
                        "tuning": tuning.snapshot()},
               "formats": []}
    formats = args.formats.split(",")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    for fmt in formats:
        if len(formats) == 1:
            results["formats"].append(bench_format(fmt, args, bandwidth))
        else:  # each format in a fresh process: the second engine must not inherit the first's allocator
            results["formats"].append(run_in_child([__file__], fmt))
        args.out.write_text(json.dumps(results, indent=2) + "\n")
    print_tables(results)


if __name__ == "__main__":
    main()
