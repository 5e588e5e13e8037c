#!/usr/bin/env python3
"""The serve check's concurrency mode: N streams at once, in-process vs through tritonserver, on the
same requests (tools/gpu/gpu_serve_check.sh --concurrency N runs it; batch 1 is gpu_serve_check.py).

    serve_concurrency.py engine --repository R --streams 64 --prompt-tokens 1024 --tokens 512 --out engine.json
    serve_concurrency.py client --url 127.0.0.1:18000 --engine engine.json [--server-pid PID] --out client.json
    serve_concurrency.py report --case NAME engine.json client.json --into serve-check-c64.json [--target 0.9]
    serve_concurrency.py summary serve-check-c64.json

`engine` builds the engine from the repository's engine_args.json (the server's settings), makes N
prompts of about --prompt-tokens tokens each (different corpus text per stream, tokenised as
flint_tokenizer does), runs them until each has its first token and aborts them (every step that
prefills, which Triton compiles the kernels of: tools/bench/bench.py's prefill_warm_up), then
submits the N requests at once (greedy, ignore_eos, --tokens each) and records each output's
arrival. `client` sends the same requests for as many tokens as that warm-up's longest stream
had, plus one, then the same N requests concurrently, one thread and HTTP generate_stream each
(standard library only), to `flint_model` with the engine's prompt ids and to the `flint`
ensemble with the prompt text (tokenizer, engine and postprocessor); with --server-pid it also
reads each server process's CPU time and Triton's model statistics around each run
(server_probes.py). `report` prints output tokens/s, TTFT and ITL percentiles side by side
(tools/bench/stream_stats.py), the served / in-process ratio of tokens/s, and each stage's host
cost a token; it exits 1 when a ratio is below --target.

The ensemble streams text: a step whose tokens decode to no new text sends no event, so with
random weights over a vocabulary larger than the tokenizer's (flint-40b) its events carry several
tokens and its TTFT is that of the first text. Its tokens/s is exact; flint_model's TTFT and ITL
are the token-level ones. The server's prefix cache must be off (the .sh configures it so): the
runs send the same prompts one after another.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # tools.*, run as a file

from tools.gpu.gpu_serve_check import add_case, corpus_words, listed, stream  # noqa: E402
from tools.bench.stream_stats import Stream, run_statistics, served_ratio, side_by_side  # noqa: E402

SERVED = ("flint_model", "flint")  # the timed runs through tritonserver, in this order
PROMPT_STRIDE = 97  # corpus words between two streams' first words
MAX_MISSES = 32  # words in a row that overshoot the prompt's length end it


# -------------------------------------------------------------------------------------- requests
def stream_prompts(tokenizer, streams: int, prompt_tokens: int) -> list[dict]:
    """One prompt a stream: {"text", "prompt_ids"}, the ids as flint_tokenizer encodes the text (a
    raw text_input)."""
    from flint_backend.chat.request import encode_text_input

    prompts = []
    for i in range(streams):
        text = fill_prompt(tokenizer, prompt_tokens, start=i * PROMPT_STRIDE)
        prompts.append({"text": text, "prompt_ids": encode_text_input(tokenizer, text)})
    return prompts


def fill_prompt(tokenizer, n_tokens: int, start: int) -> str:
    """The longest run of corpus words from word `start` on (round the corpus) that encodes to at
    most n_tokens ids, then the words after it that still fit, skipping those that do not (a CJK
    sentence is one word of dozens of tokens): n_tokens ids or a few less."""
    from flint_backend.chat.request import encode_text_input

    words = corpus_words()
    fits = lambda chosen: len(encode_text_input(tokenizer, " ".join(chosen))) <= n_tokens  # noqa: E731
    run = lambda k: [words[(start + i) % len(words)] for i in range(k)]  # noqa: E731
    low, high = 0, 1
    while fits(run(high)):
        low, high = high, 2 * high
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (middle, high) if fits(run(middle)) else (low, middle)
    chosen, misses = run(low), 0
    for i in range(start + low, start + low + len(words)):
        if misses == MAX_MISSES:
            break
        if fits(chosen + [words[i % len(words)]]):
            chosen, misses = chosen + [words[i % len(words)]], 0
        else:
            misses += 1
    if not chosen:
        raise SystemExit(f"serve_concurrency.py: --prompt-tokens {n_tokens} is shorter than any corpus word")
    return " ".join(chosen)


def greedy(max_tokens: int) -> dict:
    return {"temperature": 0.0, "max_tokens": max_tokens, "ignore_eos": True}


def request_body(model: str, prompt: dict, max_tokens: int) -> dict:
    """The generate_stream body of one stream: token ids to flint_model, the text to the ensemble."""
    if model == "flint_model":
        return {"prompt_ids": prompt["prompt_ids"], "sampling_params": json.dumps(greedy(max_tokens))}
    return {"text_input": prompt["text"], "stream": True, "exclude_input_in_output": True, **greedy(max_tokens)}


def check_sizes(streams: int, prompt_tokens: int, tokens: int) -> None:
    for name, value in (("--streams", streams), ("--prompt-tokens", prompt_tokens), ("--tokens", tokens)):
        if value < 1:
            raise SystemExit(f"serve_concurrency.py: {name} must be a positive integer, got {value}")


# ---------------------------------------------------------------------------------------- engine
def engine_run(engine, prompts: list[dict], max_tokens: int) -> tuple[list[Stream], list[list[int]], float]:
    """The prompts submitted at once, stepped to the end. -> streams, output ids, CPU s of this process."""
    from flint_backend.engine.sampling_params import SamplingParams
    from tools.bench.bench import sync

    sync()
    t0, cpu0 = time.perf_counter(), time.process_time()
    seqs = [engine.add_request(p["prompt_ids"], SamplingParams(**greedy(max_tokens))) for p in prompts]
    events: dict[str, list[tuple[float, int]]] = {s.request_id: [] for s in seqs}
    while engine.has_work():
        outputs = engine.step()
        now = time.perf_counter() - t0
        for out in outputs:
            if out.new_token_ids or out.finished:
                events[out.request_id].append((now, len(out.new_token_ids)))
    cpu = time.process_time() - cpu0
    return [Stream(0.0, events[s.request_id]) for s in seqs], [list(s.output_ids) for s in seqs], cpu


def run_engine(args) -> dict:
    import torch

    from flint_backend.engine.engine import LLMEngine
    from flint_backend.serving.repository import engine_args_path, load_engine_args, tokenizer_dir
    from flint_backend.tokenizer import load_tokenizer
    from tools.bench.bench import prefill_warm_up

    check_sizes(args.streams, args.prompt_tokens, args.tokens)
    engine_args = load_engine_args(engine_args_path(args.repository))
    if engine_args.max_num_seqs < args.streams:
        raise SystemExit(f"serve_concurrency.py: --streams {args.streams} is more than the repository's "
                         f"max_num_seqs {engine_args.max_num_seqs}: the streams would not run at once")
    start = time.perf_counter()
    engine = LLMEngine(engine_args)
    build_s = time.perf_counter() - start
    tokenizer = load_tokenizer(tokenizer_dir(engine_args))
    prompts = stream_prompts(tokenizer, args.streams, args.prompt_tokens)
    warmup_tokens = min(args.tokens, 1 + prefill_warm_up(engine, [p["prompt_ids"] for p in prompts], args.tokens))
    streams, outputs, cpu_s = engine_run(engine, prompts, args.tokens)
    stats = run_statistics(streams)
    cuda = engine.device.type == "cuda"
    return {"device": torch.cuda.get_device_name() if cuda else "cpu", "engine_args": engine_args.to_dict(),
            "build_s": build_s, "max_tokens": args.tokens, "warmup_tokens": warmup_tokens, "prompts": prompts,
            "streams": [s.to_dict() for s in streams], "outputs": outputs,
            "texts": [tokenizer.decode(o, skip_special_tokens=True) for o in outputs],
            "stats": stats, "cpu_ms_per_token": round(cpu_s / stats["output_tokens"] * 1e3, 4)}


# ---------------------------------------------------------------------------------------- client
def new_tokens(model: str, events: list[dict]) -> list[int]:
    """Output tokens each event adds: flint_model's token ids, the ensemble's num_output_tokens steps."""
    if model == "flint_model":
        return [len(listed(e.get("token_ids", []))) for e in events]
    counts = [int(e.get("num_output_tokens", 0)) for e in events]
    return [b - a for a, b in zip([0] + counts, counts)]


def served_run(url: str, model: str, bodies: list[dict]) -> tuple[list[Stream], list]:
    """Every body sent at once (a thread each, released together). -> streams, what each streamed."""
    gate = threading.Barrier(len(bodies))
    results: list = [None] * len(bodies)

    def one(i: int) -> None:
        try:
            gate.wait()
            start = time.perf_counter()
            results[i] = (start, stream(url, model, bodies[i]))
        except Exception as error:  # noqa: BLE001  (re-raised below, naming the stream)
            results[i] = error

    threads = [threading.Thread(target=one, args=(i,), daemon=True) for i in range(len(bodies))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    failed = [(i, r) for i, r in enumerate(results) if isinstance(r, Exception)]
    if failed:
        raise RuntimeError(f"{model}: {len(failed)} of {len(bodies)} streams failed; stream {failed[0][0]}: "
                           f"{failed[0][1]}")
    t0 = min(start for start, _ in results)
    streams, outputs = [], []
    for start, timed in results:
        events = [e for _, e in timed]
        streams.append(Stream(start - t0, [(t - t0, n) for (t, _), n in zip(timed, new_tokens(model, events))]))
        if model == "flint_model":
            outputs.append([int(t) for e in events for t in listed(e.get("token_ids", []))])
        else:
            outputs.append("".join(e.get("text_output", "") for e in events))
    return streams, outputs


def check_ended(model: str, streams: list[Stream], max_tokens: int) -> None:
    short = [i for i, s in enumerate(streams) if s.tokens != max_tokens]
    if short:
        raise RuntimeError(f"{model}: stream {short[0]} gave {streams[short[0]].tokens} tokens, not {max_tokens} "
                           f"({len(short)} streams short)")


def run_client(args) -> dict:
    from tools.gpu import server_probes

    engine = json.loads(Path(args.engine).read_text())
    max_tokens = engine["max_tokens"]
    served_run(args.url, "flint", [request_body("flint", p, engine["warmup_tokens"]) for p in engine["prompts"]])
    result = {}
    for model in SERVED:
        bodies = [request_body(model, p, max_tokens) for p in engine["prompts"]]
        before = (server_probes.process_cpu(args.server_pid) if args.server_pid else {},
                  server_probes.model_stats(args.url))
        cpu0 = time.process_time()
        streams, outputs = served_run(args.url, model, bodies)
        client_cpu = time.process_time() - cpu0
        after = (server_probes.process_cpu(args.server_pid) if args.server_pid else {},
                 server_probes.model_stats(args.url))
        check_ended(model, streams, max_tokens)
        stats = run_statistics(streams)
        cpu = {**server_probes.difference(after[0], before[0]), "client": client_cpu}
        result[model] = {"streams": [s.to_dict() for s in streams], "outputs": outputs, "stats": stats,
                         **server_probes.per_token(cpu, server_probes.difference(after[1], before[1]),
                                                   stats["output_tokens"])}
    return result


# ---------------------------------------------------------------------------------------- report
def same_outputs(engine: dict, model: str, outputs: list) -> int:
    """Streams whose served output is the engine's (ids for flint_model, text for the ensemble).
    Informational: the batches' make-up differs in and out of the server, and bf16 sums with it."""
    expected = engine["outputs"] if model == "flint_model" else engine["texts"]
    return sum(a == b for a, b in zip(expected, outputs))


def case_result(case: str, engine: dict, client: dict, target: float) -> dict:
    served = {m: {"stats": client[m]["stats"], "ratio": served_ratio(engine["stats"], client[m]["stats"]),
                  "same_outputs": same_outputs(engine, m, client[m]["outputs"]),
                  "cpu_ms_per_token": client[m]["cpu_ms_per_token"], "models": client[m]["models"]}
              for m in SERVED if m in client}
    return {"case": case, "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "device": engine["device"],
            "engine_args": engine["engine_args"], "build_s": engine["build_s"],
            "streams": len(engine["prompts"]), "prompt_tokens": [len(p["prompt_ids"]) for p in engine["prompts"]],
            "max_tokens": engine["max_tokens"], "target": target,
            "engine": {"stats": engine["stats"], "cpu_ms_per_token": engine["cpu_ms_per_token"]},
            "served": served, "ok": all(s["ratio"] >= target for s in served.values())}


def cost_table(result: dict) -> str:
    """Host CPU ms a token by process, and Triton's per-execution times of each model."""
    served = result["served"]
    roles = sorted({r for s in served.values() for r in s["cpu_ms_per_token"]})
    lines = ["| host CPU ms / output token | in-process | " + " | ".join(served) + " |",
             "|---|---:|" + "---:|" * len(served),
             f"| engine process (in-process run) | {result['engine']['cpu_ms_per_token']:.4f} |" + " |" * len(served)]
    lines += [f"| {role} | |" + "".join(f" {s['cpu_ms_per_token'].get(role, 0):.4f} |" for s in served.values())
              for role in roles]
    lines += ["", "| model: requests / token, queued / computing us per execution | "
              + " | ".join(served) + " |", "|---|" + "---:|" * len(served)]
    for model in sorted({m for s in served.values() for m in s["models"]}):
        cells = [s["models"].get(model) for s in served.values()]
        lines.append(f"| {model} | " + " | ".join(
            "" if c is None else f"{c['requests_per_token']:.3f}, {c['queue_us_per_execution']:.0f} / "
            f"{c['compute_us_per_execution']:.0f}" for c in cells) + " |")
    return "\n".join(lines)


def report(args) -> int:
    engine = json.loads(Path(args.engine).read_text())
    client = json.loads(Path(args.client).read_text())
    result = case_result(args.case, engine, client, args.target)
    e = result["engine_args"]
    weights = e["model"] or f"random {e['preset']} seed {e['seed']}" + (f" {e['quantization']}" if e["quantization"] else "")
    prompts = result["prompt_tokens"]
    print(f"\n{args.case}: {result['device']}; {weights}; {result['streams']} streams at once, prompts "
          f"{min(prompts)}-{max(prompts)} tokens, {result['max_tokens']} greedy tokens each; "
          f"kernel_backend={e['kernel_backend']}, max_num_seqs {e['max_num_seqs']}; engine built in "
          f"{result['build_s']:.1f} s")
    runs = {"in-process": result["engine"]["stats"]}
    runs.update({f"served {m}": s["stats"] for m, s in result["served"].items()})
    print(side_by_side(runs))
    print()
    print(cost_table(result))
    for model, s in result["served"].items():
        print(f"{model}: served / in-process output tok/s {s['ratio']:.3f} (target {args.target}); "
              f"streams with the engine's {'tokens' if model == 'flint_model' else 'text'}: "
              f"{s['same_outputs']} of {result['streams']}")
    add_case(Path(args.into), result)
    return 0 if result["ok"] else 1


def print_summary(args) -> int:
    cases = json.loads(Path(args.results).read_text())["cases"]
    print("\n| case | streams | in-process tok/s | flint_model tok/s (ratio) | flint tok/s (ratio) | "
          "TTFT p50 ms in / model / flint | ITL p50 ms in / model / flint |\n|---|---:|---:|---:|---:|---|---|")
    for c in cases:
        served = c["served"]
        runs = [c["engine"]["stats"]] + [served[m]["stats"] for m in SERVED if m in served]
        cells = [f"{served[m]['stats']['output_tok_s']} ({served[m]['ratio']:.3f})" if m in served else "n/a"
                 for m in SERVED]
        p50 = [" / ".join(str(r[key]["p50"]) for r in runs) for key in ("ttft_ms", "itl_ms")]
        print(f"| {c['case']} | {c['streams']} | {runs[0]['output_tok_s']} | {' | '.join(cells)} | "
              f"{' | '.join(p50)} |")
    return 0 if all(c["ok"] for c in cases) else 1


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="phase", required=True)
    p = sub.add_parser("engine")
    p.add_argument("--repository", required=True)
    p.add_argument("--streams", type=int, default=64)
    p.add_argument("--prompt-tokens", type=int, default=1024)
    p.add_argument("--tokens", type=int, default=512)
    p.add_argument("--out", required=True)
    p = sub.add_parser("client")
    p.add_argument("--url", required=True)
    p.add_argument("--engine", required=True, help="the engine phase's JSON: the prompts, the tokens to compare")
    p.add_argument("--server-pid", type=int, help="tritonserver's pid: CPU time of it and its stubs (same machine)")
    p.add_argument("--out", required=True)
    p = sub.add_parser("report")
    p.add_argument("engine")
    p.add_argument("client")
    p.add_argument("--case", required=True)
    p.add_argument("--into", required=True, help="JSON file of all cases; this case is added (or replaced)")
    p.add_argument("--target", type=float, default=0.9, help="least served / in-process tok/s (exit 1 below)")
    sub.add_parser("summary").add_argument("results")
    args = parser.parse_args()
    if args.phase == "report":
        sys.exit(report(args))
    if args.phase == "summary":
        sys.exit(print_summary(args))
    result = run_engine(args) if args.phase == "engine" else run_client(args)
    Path(args.out).write_text(json.dumps(result))


if __name__ == "__main__":
    main()
