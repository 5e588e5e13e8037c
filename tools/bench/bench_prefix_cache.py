#!/usr/bin/env python3
"""Prefix caching for agents: multi-turn tool-calling sessions, caching on against off (issue 45).

    python tools/bench/bench_prefix_cache.py --preset flint-40b --quantization nvfp4 [--histories 1024,32768,100000]
    python tools/bench/bench_prefix_cache.py --device cpu --preset flint-tiny --histories 512,2048
        [--sessions 4] [--turns 4] [--tool-tokens 256] [--output-tokens 32] [--thinking] [--isolate] [--out FILE]

Each of --sessions conversations is rendered with the chat template as an agent client sends it:
a system prompt and three tools shared by all sessions, then a first user message carrying a
document of its own, so that the first prompt is --histories tokens long; every later turn appends
the same assistant tool call, a tool result of --tool-tokens tokens (its own text) and a user
message, and sends the whole conversation again. The sessions' turns go round-robin (session 0
turn 1, session 1 turn 1, ..., session 0 turn 2, ...) so their working sets interleave; each turn is
one greedy request of --output-tokens tokens (ignore_eos) run alone through the in-process engine.
TTFT: add_request to the step that returns the first token; decode: (last token - first) / (tokens
- 1). The greedy tokens of every request are compared between the modes (bf16 on the GPU: a prefill
chunked differently may round differently, so a near-tie can flip). Per turn: the median TTFT and decode ms/token over the sessions, the cached fraction (sum of
RequestOutput.num_cached_tokens / prompt tokens) and the reusable one (the longest common prefix
with any prompt the engine was sent before / prompt tokens: later turns reuse their session's
history, first turns only the shared system prompt and tools). Per history and overall: the
engine's hit rate (metrics.prefix_cache_hits / prefix_cache_queries, in tokens).

One engine per mode (EngineArgs.enable_prefix_caching false, then true), each running every
history in turn and freed before the next is built; its KV pool holds 1.25x (POOL_MARGIN) every
session's whole conversation (on the GPU the default memory fraction must cover that, on the CPU
the pool is sized to it). Before the timed sessions each engine runs one untimed session at the smallest
history (Triton compiles the kernels of a prefill after a cached prefix). A second engine in one
process may pay more host time a step (bench.py's docstring): --isolate runs each mode in a
process of its own. --thinking renders with enable_thinking (each prompt then ends
`<|assistant|><think>` where the next one has `</think>`: a divergence inside the last block).
Prints a markdown table and writes JSON (--out; by default
benchmarks/<gpu or cpu>/<date>-<commit>-prefix-cache.json).
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root, run as a file

from flint_backend.chat.chat_options import ANNOUNCED_OPTIONS  # noqa: E402
from flint_backend.chat.request import render_chat_request  # noqa: E402
from flint_backend.config import FlintConfig  # noqa: E402
from flint_backend.engine.engine import LLMEngine  # noqa: E402
from flint_backend.engine.engine_args import EngineArgs  # noqa: E402
from flint_backend.engine.sampling_params import SamplingParams  # noqa: E402
from flint_backend.tokenizer import load_tokenizer  # noqa: E402
from tools.bench.format_processes import without_flags  # noqa: E402
from tools.bench.timing import command, commit, gpu_name, result_path, utc_now  # noqa: E402

SYSTEM = ("You are a careful software agent. You read the documents the user gives you, call tools to look "
          "things up, and answer with short, exact statements that cite the section they come from.")
TOOLS = [{"type": "function", "function": {"name": name, "description": description, "parameters": {
    "type": "object", "properties": properties, "required": list(properties)[:1]}}}
    for name, description, properties in (
        ("search", "Full-text search over the project's documents.",
         {"query": {"type": "string"}, "limit": {"type": "integer"}}),
        ("read_file", "Read a file of the repository.", {"path": {"type": "string"}, "offset": {"type": "integer"}}),
        ("run_command", "Run a shell command in the sandbox.",
         {"command": {"type": "string"}, "timeout_s": {"type": "number"}}))]
TASK = "Here is the document for this task.\n\n{doc}\n\nList the open issues it describes, with their sections."
CALL = {"role": "assistant", "content": None, "tool_calls": [{"id": "call_0", "type": "function", "function": {
    "name": "search", "arguments": json.dumps({"query": "open issues", "limit": 5})}}]}
NEXT = "Go on: check the next open issue the same way."
WORDS = ("the report lists queue worker cache block request token layer window session tool result error "
         "latency memory kernel batch prefix hash table server client timeout retry budget value field "
         "schema index page ring graph stream step decode prefill shard expert router weight scale format "
         "file path line section issue fix test check run build load store read write open close").split()

MODES = {"off": False, "on": True}
MAX_NUM_SEQS = 8   # requests run one at a time; a few ring rows suffice
POOL_MARGIN = 1.25  # KV pool / every session's final conversation + outputs


def filler(tokenizer, tokens: int, rng: np.random.Generator) -> str:
    """Random prose of `tokens` tokens, as the tokenizer splits it alone (every word is >= 1 token)."""
    if tokens <= 0:
        return ""
    text = " ".join(rng.choice(WORDS, size=tokens))
    offsets = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True).offset_mapping
    return text[:offsets[tokens - 1][1]] if tokens < len(offsets) else text


def render(tokenizer, messages: list[dict], thinking: bool) -> list[int]:
    return render_chat_request(tokenizer, messages, TOOLS, "auto", {"enable_thinking": thinking},
                               ANNOUNCED_OPTIONS).prompt_ids


def session_prompts(tokenizer, args, history: int, session: int) -> list[list[int]]:
    """The prompt ids of each turn of one session: the first `history` tokens long (about: the
    document is cut alone, then rendered in place), each later one the whole conversation again."""
    rng = np.random.default_rng([args.seed, history, session + 1])  # session -1: the warm-up
    messages = [{"role": "system", "content": SYSTEM}]
    shared = len(render(tokenizer, messages + [{"role": "user", "content": TASK.format(doc="")}], args.thinking))
    if history <= shared:
        raise SystemExit(f"--histories: {history} tokens leave no room for a session's document after the "
                         f"{shared} tokens of the shared system prompt, tools and task")
    messages.append({"role": "user", "content": TASK.format(doc=filler(tokenizer, history - shared, rng))})
    prompts = [render(tokenizer, messages, args.thinking)]
    for _ in range(1, args.turns):
        result = {"role": "tool", "tool_call_id": "call_0", "content": filler(tokenizer, args.tool_tokens, rng)}
        messages += [CALL, result, {"role": "user", "content": NEXT}]
        prompts.append(render(tokenizer, messages, args.thinking))
    return prompts


def common_prefix(a: np.ndarray, b: np.ndarray) -> int:
    n = min(len(a), len(b))
    differ = np.flatnonzero(a[:n] != b[:n])
    return int(differ[0]) if len(differ) else n


def engine_args(args, caching: bool, max_model_len: int, pool_tokens: int) -> EngineArgs:
    cpu = args.device == "cpu"
    return EngineArgs(preset=args.preset, quantization=args.quantization, seed=args.seed,
                      dtype="float32" if cpu else "bfloat16", device=args.device, kernel_backend=args.kernel_backend,
                      block_size=args.block_size, max_num_seqs=MAX_NUM_SEQS, max_num_batched_tokens=args.chunk,
                      max_model_len=max_model_len, enable_prefix_caching=caching, enforce_eager=cpu,
                      num_kv_blocks=-(-pool_tokens // args.block_size) if cpu else None)


def run_turn(engine: LLMEngine, prompt: list[int], output_tokens: int, cuda: bool) -> dict:
    """One request alone, from add_request until it finishes."""
    if cuda:
        torch.cuda.synchronize()
    start = time.perf_counter()
    seq = engine.add_request(prompt, SamplingParams(max_tokens=output_tokens, temperature=0.0, ignore_eos=True))
    first = last = None
    cached, ids = 0, []
    while engine.has_work():
        outputs = [out for out in engine.step() if out.request_id == seq.request_id]
        now = time.perf_counter()
        for out in outputs:
            ids += out.new_token_ids
            cached = out.num_cached_tokens
            if first is None and out.new_token_ids:
                first = now
            if out.finished:
                last = now
    assert len(ids) == output_tokens and first is not None and last is not None, (len(ids), first, last)
    return {"prompt_tokens": len(prompt), "cached_tokens": cached, "ttft_s": first - start,
            "decode_ms": (last - first) / (len(ids) - 1) * 1e3, "output_ids": ids}


def hit_counts(engine: LLMEngine) -> tuple[int, int]:
    return engine.metrics.prefix_cache_queries, engine.metrics.prefix_cache_hits


def run_mode(args, mode: str, prompts: dict[int, list[list[list[int]]]], warmup: list[list[int]],
             max_model_len: int, pool_tokens: int) -> dict:
    """Every history's sessions, round-robin, through one engine with caching `mode`."""
    cuda = args.device != "cpu"
    t0 = time.perf_counter()
    engine = LLMEngine(engine_args(args, MODES[mode], max_model_len, pool_tokens))
    spec = engine.runner.kv_spec
    if spec.num_blocks * spec.block_size < pool_tokens:
        raise SystemExit(f"kv cache: {spec.num_blocks} blocks of {spec.block_size} tokens, fewer than the "
                         f"{pool_tokens} tokens of every session's conversation (x{POOL_MARGIN}); lower "
                         f"--sessions, --turns or --histories")
    result = {"build_s": round(time.perf_counter() - t0, 1), "pool_tokens": spec.num_blocks * spec.block_size,
              "histories": {}, "requests": []}
    seen = []  # every prompt the engine was sent, as arrays: what a cache could reuse
    for prompt in warmup:
        run_turn(engine, prompt, args.output_tokens, cuda)
        seen.append(np.array(prompt))
    start_counts = hit_counts(engine)
    for history, sessions in prompts.items():
        before = hit_counts(engine)
        for turn in range(args.turns):
            for session, turns in enumerate(sessions):
                ids = np.array(turns[turn])
                reusable = max((common_prefix(ids, s) for s in seen), default=0)
                record = run_turn(engine, turns[turn], args.output_tokens, cuda)
                result["requests"].append({"history": history, "session": session, "turn": turn + 1,
                                           "reusable_tokens": reusable, **record})
                seen.append(ids)
        queries, hits = (a - b for a, b in zip(hit_counts(engine), before))
        result["histories"][str(history)] = {"prefix_cache_queries": queries, "prefix_cache_hits": hits}
        print(f"  caching {mode}, history {history}: hits {hits} of {queries} tokens queried", flush=True)
    queries, hits = (a - b for a, b in zip(hit_counts(engine), start_counts))
    result.update(prefix_cache_queries=queries, prefix_cache_hits=hits, total_s=round(time.perf_counter() - t0, 1))
    del engine
    gc.collect()
    if cuda:
        torch.cuda.empty_cache()
    return result


def run_isolated(mode: str) -> dict:
    """run_mode in a child process: this script with the same arguments but --caching mode."""
    out = Path(tempfile.mkdtemp()) / f"{mode}.json"
    argv = [a for a in without_flags(sys.argv[1:], ("--caching", "--out")) if a != "--isolate"]
    subprocess.run([sys.executable, __file__, *argv, "--caching", mode, "--out", str(out)], check=True)
    return json.loads(out.read_text())["modes"][mode]


def turn_rows(modes: dict[str, dict]) -> list[dict]:
    """Per (history, turn): medians over the sessions, fractions of the summed prompt tokens."""
    rows = {}
    for mode, result in modes.items():
        groups: dict[tuple[int, int], list[dict]] = {}
        for r in result["requests"]:
            groups.setdefault((r["history"], r["turn"]), []).append(r)
        for (history, turn), reqs in groups.items():
            prompt = sum(r["prompt_tokens"] for r in reqs)
            row = rows.setdefault((history, turn), {
                "history": history, "turn": turn, "prompt_tokens": round(prompt / len(reqs)),
                "reusable": round(sum(r["reusable_tokens"] for r in reqs) / prompt, 4)})
            row[f"cached_{mode}"] = round(sum(r["cached_tokens"] for r in reqs) / prompt, 4)
            row[f"ttft_{mode}_s"] = round(statistics.median(r["ttft_s"] for r in reqs), 4)
            row[f"decode_{mode}_ms"] = round(statistics.median(r["decode_ms"] for r in reqs), 3)
    return list(rows.values())


def same_outputs(modes: dict[str, dict]) -> tuple[int, int] | None:
    """(requests whose greedy tokens are the same with caching on and off, requests), both modes run."""
    if set(modes) != set(MODES):
        return None
    pairs = list(zip(modes["off"]["requests"], modes["on"]["requests"]))
    return sum(a["output_ids"] == b["output_ids"] for a, b in pairs), len(pairs)


def print_table(results: dict) -> None:
    m, modes = results["meta"], results["modes"]
    print(f"\n{m['command']}\n{m['machine']}, {m['date']}, commit {m['commit']}; {m['sessions']} sessions x "
          f"{m['turns']} turns, tool results {m['tool_tokens']} tokens, {m['output_tokens']} output tokens\n")
    for mode, r in modes.items():
        per = ", ".join(f"{h}: {v['prefix_cache_hits']}/{v['prefix_cache_queries']}" for h, v in r["histories"].items())
        rate = r["prefix_cache_hits"] / r["prefix_cache_queries"] if r["prefix_cache_queries"] else 0.0
        print(f"caching {mode}: hit rate {rate:.1%} ({r['prefix_cache_hits']} of {r['prefix_cache_queries']} "
              f"tokens; by history {per}); pool {r['pool_tokens']} tokens, {r['total_s']} s")
    same = same_outputs(modes)
    if same is not None:
        print(f"greedy outputs the same with caching on and off: {same[0]} of {same[1]} requests")
    cols = ["history", "turn", "prompt_tokens", "reusable"]
    for what in ("cached_{}", "ttft_{}_s", "decode_{}_ms"):
        cols += [what.format(mode) for mode in modes]
    print("\n| " + " | ".join(cols) + " |")
    print("|" + "---|" * len(cols))
    for row in results["rows"]:
        print("| " + " | ".join(str(row[c]) for c in cols) + " |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--preset", default="flint-40b")
    parser.add_argument("--quantization", default=None, help="nvfp4: random weights quantised (flint-40b on one GPU)")
    parser.add_argument("--kernel-backend", help="default: triton on CUDA, torch on the CPU")
    parser.add_argument("--histories", help="first-turn prompt tokens; default 1024,32768,100000 (CPU: 512,2048)")
    parser.add_argument("--sessions", type=int, default=4)
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--tool-tokens", type=int, default=256, help="tokens of each tool result")
    parser.add_argument("--output-tokens", type=int, default=32)
    parser.add_argument("--thinking", action="store_true", help="render with enable_thinking")
    parser.add_argument("--caching", default="off,on", help="modes in the order run (the second engine of a "
                        "process may pay more host time a step: caching runs second)")
    parser.add_argument("--isolate", action="store_true", help="each mode in a process of its own")
    parser.add_argument("--block-size", type=int, default=64)
    parser.add_argument("--chunk", type=int, help="max_num_batched_tokens; default 8192 (CPU: 512, where the torch "
                        "attention's [chunk, context] scores made 8192 3x slower at 3K tokens)")
    parser.add_argument("--seed", type=int, default=0, help="weights and documents")
    parser.add_argument("--out", type=Path, help="default: benchmarks/<gpu>/<date>-<commit>-prefix-cache.json")
    args = parser.parse_args()
    cpu = args.device == "cpu"
    if cpu:
        torch.set_num_threads(1)  # steadier on a shared machine: two threads on two busy cores ran 2-10x slower
    args.kernel_backend = args.kernel_backend or ("torch" if cpu else "triton")
    args.chunk = args.chunk or (512 if cpu else 8192)
    histories = [int(h) for h in (args.histories or ("512,2048" if cpu else "1024,32768,100000")).split(",")]
    modes = args.caching.split(",")
    if args.output_tokens < 2 or args.turns < 1 or args.sessions < 1 or not set(modes) <= set(MODES):
        raise SystemExit("--output-tokens >= 2, --turns and --sessions >= 1, --caching of on/off expected")
    args.out = args.out or result_path("prefix-cache", args.device)

    tokenizer = load_tokenizer()
    prompts = {h: [session_prompts(tokenizer, args, h, s) for s in range(args.sessions)] for h in histories}
    warmup = session_prompts(tokenizer, args, min(histories), -1)
    longest = max(len(t[-1]) for sessions in prompts.values() for t in sessions) + args.output_tokens
    context = FlintConfig.preset(args.preset).max_position_embeddings
    if longest > context:
        raise SystemExit(f"--histories: the last turn of {max(histories)} is {longest} tokens with its output, "
                         f"more than {args.preset}'s context of {context}")
    working_set = max(sum(len(t[-1]) + args.output_tokens for t in sessions) for sessions in prompts.values())
    pool_tokens = math.ceil(working_set * POOL_MARGIN)

    machine = gpu_name(args.device) if not cpu else "CPU, 1 torch thread"
    meta = {"date": utc_now(), "machine": machine, "commit": commit(), "command": command(__file__),
            "torch": torch.__version__,
            "model": f"{args.preset} (random weights, {args.quantization or 'unquantised'})",
            "kernel_backend": args.kernel_backend, "sessions": args.sessions, "turns": args.turns,
            "tool_tokens": args.tool_tokens, "output_tokens": args.output_tokens, "thinking": args.thinking,
            "block_size": args.block_size, "chunk": args.chunk, "histories": histories,
            "max_model_len": longest, "working_set_tokens": working_set,
            "unit": "TTFT s and decode ms/token: medians over sessions; cached, reusable: fractions of prompt tokens"}
    results = {"meta": meta, "modes": {}, "rows": []}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    for mode in modes:
        isolate = args.isolate and len(modes) > 1
        results["modes"][mode] = (run_isolated(mode) if isolate
                                  else run_mode(args, mode, prompts, warmup, longest, pool_tokens))
        results["rows"] = turn_rows(results["modes"])
        results["same_outputs"] = same_outputs(results["modes"])
        args.out.write_text(json.dumps(results, indent=2) + "\n")
    print_table(results)


if __name__ == "__main__":
    main()
