#!/usr/bin/env python3
"""Serving overhead at batch 1: inter-token latency through tritonserver vs the engine's own decode
step, and the served greedy tokens vs the in-process engine's (tools/gpu/gpu_serve_check.sh runs it).

    gpu_serve_check.py engine --repository R --out engine.json        # LLMEngine in-process, no server
    gpu_serve_check.py client --url 127.0.0.1:18000 --metrics-url 127.0.0.1:18002 --engine engine.json --out client.json
    gpu_serve_check.py report --case NAME engine.json client.json --into gpu_serve_check.json
    gpu_serve_check.py summary gpu_serve_check.json

`engine` builds the engine from the repository's engine_args.json (the server's own settings),
tokenises a prompt of about --prompt-tokens tokens as flint_tokenizer does, and times each
engine step of greedy requests (the first step is the prefill), each between two device syncs,
then bench.py's ms/token: consecutive steps with no sync between them, as a server runs them. `client` sends the same
request through tritonserver twice over (HTTP generate_stream, standard library only):
to `flint_model` with the engine's prompt ids (one event per engine step, token ids: Triton and
the Python backend) and to the `flint` ensemble with the prompt text (tokenizer, engine and
postprocessor: what clients use), and reads the engine's own time per output token inside the
server from /metrics. `report` compares the served tokens and text with the engine's, prints
the case's table and adds it to the JSON file; it exits 1 when they differ. Many streams at once
(in-process vs served tokens/s, TTFT and ITL at N concurrent streams): serve_concurrency.py, run by
gpu_serve_check.sh --concurrency N.

Random weights over the 8192-id project tokenizer: a model with a larger vocabulary (flint-40b
has 151552) mostly emits ids that decode to nothing, and the postprocessor sends no empty
text, so ensemble events carry several tokens each; their per-token ITL is the event gap over
its tokens, and `mean` (first event to last, per token) is exact either way.
"""

from __future__ import annotations

import argparse
import http.client
import json
import statistics
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # tools.bench, run as a file
CORPUS = ROOT / "scripts" / "tokenizer_corpus.txt"


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


def summary(seconds: list[float]) -> dict:
    """Median, p90 and mean in ms; None for each when there is no value (a text stream whose run
    came as one event has no gap to time)."""
    ms = [s * 1e3 for s in seconds]
    if not ms:
        return {"median_ms": None, "p90_ms": None, "mean_ms": None, "n": 0}
    return {"median_ms": statistics.median(ms), "p90_ms": pct(ms, 0.9), "mean_ms": statistics.fmean(ms), "n": len(ms)}


def corpus_words() -> list[str]:
    return " ".join(line for line in CORPUS.read_text().splitlines() if not line.startswith("#")).split()


def make_prompt(tokenizer, n_tokens: int, start: int = 0) -> str:
    """The longest run of corpus words from word `start` on (round the corpus) that tokenises to
    at most n_tokens tokens."""
    from flint_backend.chat.request import encode_text_input

    words = corpus_words()
    text = lambda k: " ".join(words[(start + i) % len(words)] for i in range(k))  # noqa: E731
    count = lambda k: len(encode_text_input(tokenizer, text(k)))  # noqa: E731
    k = max(1, n_tokens * n_tokens // count(n_tokens))
    while k > 1 and count(k) > n_tokens:
        k -= 1
    while count(k + 1) <= n_tokens:
        k += 1
    return text(k)


# ---------------------------------------------------------------------------------------- engine
def run_engine(args) -> dict:
    import torch

    from flint_backend.chat.request import encode_text_input
    from flint_backend.engine.engine import LLMEngine
    from flint_backend.engine.sampling_params import SamplingParams
    from flint_backend.serving.repository import engine_args_path, load_engine_args, tokenizer_dir
    from flint_backend.tokenizer import load_tokenizer
    from tools.bench.bench import unsynced_steps

    engine_args = load_engine_args(engine_args_path(args.repository))
    start = time.perf_counter()
    engine = LLMEngine(engine_args)  # weights (loaded, or random on the device), KV cache, CUDA graphs
    build_s = time.perf_counter() - start
    cuda = engine.device.type == "cuda"
    tokenizer = load_tokenizer(tokenizer_dir(engine_args))
    prompt = make_prompt(tokenizer, args.prompt_tokens)
    prompt_ids = encode_text_input(tokenizer, prompt)

    def one(max_tokens: int) -> tuple[list[float], list[int]]:
        seq = engine.add_request(prompt_ids, SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True))
        times = []
        while engine.has_work():
            start = time.perf_counter()
            engine.step()
            if cuda:
                torch.cuda.synchronize()
            times.append(time.perf_counter() - start)
        return times, seq.output_ids

    def unsynced_ms_per_token(steps: int) -> float:
        """bench.py's ms/token (bench.unsynced_steps): consecutive engine.step() calls with no
        device sync between them, as a server makes them, over the tokens they delivered."""
        seq = engine.add_request(prompt_ids, SamplingParams(temperature=0.0, max_tokens=2 * steps + 5,
                                                            ignore_eos=True))
        for _ in range(2):
            engine.step()  # the prefill, a decode step
        ms_per_token, _ = unsynced_steps(engine, steps)
        engine.abort(seq.request_id)
        while engine.has_work():
            engine.step()
        return ms_per_token

    one(16)  # warm-up: kernel compilation, allocator
    runs = [one(args.tokens) for _ in range(args.runs)]
    tokens = runs[0][1]
    ms_per_token = statistics.median(unsynced_ms_per_token(args.tokens) for _ in range(args.runs))
    result = {"device": torch.cuda.get_device_name() if cuda else "cpu", "engine_args": engine_args.to_dict(),
              "build_s": build_s, "prompt": prompt, "prompt_ids": prompt_ids, "tokens": tokens,
              "text": tokenizer.decode(tokens, skip_special_tokens=True),
              "runs_repeat_tokens": all(t == tokens for _, t in runs),
              "prefill": summary([times[0] for times, _ in runs]),
              "decode_step": summary([t for times, _ in runs for t in times[1:]]),
              "ms_per_token_unsynced": ms_per_token}
    if cuda:
        free, total = torch.cuda.mem_get_info()
        result["gpu_gib"] = {"allocated": torch.cuda.memory_allocated() / 2**30,
                             "peak": torch.cuda.max_memory_allocated() / 2**30, "used": (total - free) / 2**30}
    return result


# ---------------------------------------------------------------------------------------- client
def stream(url: str, model: str, body: dict) -> list[tuple[float, dict]]:
    """(arrival time, event) of each server-sent event of one generate_stream request."""
    host, port = url.split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=600)
    conn.request("POST", f"/v2/models/{model}/generate_stream", json.dumps(body), {"Content-Type": "application/json"})
    response = conn.getresponse()
    if response.status != 200:
        raise RuntimeError(f"{model}: HTTP {response.status}: {response.read()[:2000]!r}")
    events = []
    while True:
        line = response.readline()
        if not line:
            break
        if line.startswith(b"data: "):
            events.append((time.perf_counter(), json.loads(line[6:])))
    conn.close()
    for _, event in events:
        if event.get("error"):  # Triton's error event, or flint_model's error output
            raise RuntimeError(f"{model}: {event}")
    return events


def listed(value) -> list:
    return value if isinstance(value, list) else [value]


def timed_runs(url: str, model: str, body: dict, runs: int) -> dict:
    """ITL per token (an event's gap over its new tokens), TTFT, and what the first run streamed.
    The ensemble streams text: a step whose tokens decode to no new text (random weights pick
    many ids the tokenizer prints as nothing) sends no event, so its ITL can have fewer values
    than tokens, or none (itl n 0, itl_mean_ms None)."""
    itl, ttft, mean, events_per_run, outputs = [], [], [], [], []
    for _ in range(runs):
        start = time.perf_counter()
        events = stream(url, model, body)
        if not events or events[-1][1].get("finish_reason") != "length":
            raise RuntimeError(f"{model}: the stream did not end at max_tokens: {events[-1:]}")
        counts = [int(e["num_output_tokens"]) for _, e in events]
        ttft.append(events[0][0] - start)
        events_per_run.append(len(events))
        for (t0, _), (t1, _), n0, n1 in zip(events, events[1:], counts, counts[1:]):
            itl += [(t1 - t0) / (n1 - n0)] * (n1 - n0)
        if counts[-1] > counts[0]:
            mean.append((events[-1][0] - events[0][0]) / (counts[-1] - counts[0]))
        if model == "flint_model":
            outputs.append([int(t) for _, e in events for t in listed(e.get("token_ids", []))])
        else:
            outputs.append("".join(e.get("text_output", "") for _, e in events))
    return {"itl": summary(itl), "itl_mean_ms": statistics.fmean(mean) * 1e3 if mean else None, "ttft": summary(ttft),
            "events_per_run": events_per_run, "output": outputs[0],
            "runs_repeat_output": all(o == outputs[0] for o in outputs),
            "num_input_tokens": int(events[0][1].get("num_input_tokens", -1)), "num_output_tokens": counts[-1]}


def engine_tpot(metrics_url: str) -> tuple[float, float]:
    text = urllib.request.urlopen(f"http://{metrics_url}/metrics", timeout=10).read().decode()
    values = {"sum": 0.0, "count": 0.0}
    for line in text.splitlines():
        for key in values:
            if line.startswith(f"flint:time_per_output_token_seconds_{key}"):
                values[key] += float(line.split()[-1])
    return values["sum"], values["count"]


def run_client(args) -> dict:
    engine = json.loads(Path(args.engine).read_text())
    n = len(engine["tokens"])
    direct = {"prompt_ids": engine["prompt_ids"],
              "sampling_params": json.dumps({"temperature": 0.0, "max_tokens": n, "ignore_eos": True})}
    ensemble = {"text_input": engine["prompt"], "max_tokens": n, "temperature": 0.0, "ignore_eos": True,
                "stream": True, "exclude_input_in_output": True}
    stream(args.url, "flint_model", {**direct, "sampling_params": json.dumps({"temperature": 0.0, "max_tokens": 16})})
    stream(args.url, "flint", {**ensemble, "max_tokens": 16})  # warm-ups
    before = engine_tpot(args.metrics_url)
    result = {"flint_model": timed_runs(args.url, "flint_model", direct, args.runs),
              "flint": timed_runs(args.url, "flint", ensemble, args.runs)}
    after = engine_tpot(args.metrics_url)
    result["engine_tpot_in_server_ms"] = (after[0] - before[0]) / max(1.0, after[1] - before[1]) * 1e3
    return result


# ---------------------------------------------------------------------------------------- report
def compare(engine: dict, client: dict) -> dict:
    tokens, served = engine["tokens"], client["flint_model"]["output"]
    first_diff = next((i for i, (a, b) in enumerate(zip(tokens, served)) if a != b), None)
    if first_diff is None and len(tokens) != len(served):
        first_diff = min(len(tokens), len(served))
    checks = {"tokens_equal": served == tokens, "first_token_difference": first_diff,
              "text_equal": client["flint"]["output"] == engine["text"],
              "prompt_tokens_equal": client["flint"]["num_input_tokens"] == len(engine["prompt_ids"]),
              "repeatable": engine["runs_repeat_tokens"] and all(client[m]["runs_repeat_output"]
                                                                 for m in ("flint_model", "flint"))}
    checks["ok"] = checks["tokens_equal"] and checks["text_equal"] and checks["prompt_tokens_equal"]
    return checks


def report(args) -> int:
    engine = json.loads(Path(args.engine).read_text())
    client = json.loads(Path(args.client).read_text())
    step, direct, ensemble = engine["decode_step"], client["flint_model"], client["flint"]
    checks = compare(engine, client)
    e = engine["engine_args"]
    weights = e["model"] or f"random {e['preset']} seed {e['seed']}" + (f" {e['quantization']}" if e["quantization"] else "")
    print(f"\n{args.case}: {engine['device']}; {weights}; batch 1, prompt {len(engine['prompt_ids'])} tokens, "
          f"{len(engine['tokens'])} greedy tokens; kernel_backend={e['kernel_backend']}, "
          f"CUDA graphs {'off' if e['enforce_eager'] or engine['device'] == 'cpu' else 'on'}; "
          f"engine built in {engine['build_s']:.1f} s")
    per_token = engine.get("ms_per_token_unsynced")  # absent in cases written before 2026-12-05
    rows = [("engine decode step, in-process (no server)", step["median_ms"], step["p90_ms"], step["mean_ms"]),
            ("engine ms/token in-process, steps unsynced (bench.py)", per_token, None, None),
            ("engine time per output token inside tritonserver", None, None, client["engine_tpot_in_server_ms"]),
            ("ITL, flint_model stream (token ids)", direct["itl"]["median_ms"], direct["itl"]["p90_ms"],
             direct["itl_mean_ms"]),
            ("ITL, flint ensemble stream (text)", ensemble["itl"]["median_ms"], ensemble["itl"]["p90_ms"],
             ensemble["itl_mean_ms"]),
            ("TTFT, flint ensemble", ensemble["ttft"]["median_ms"], ensemble["ttft"]["p90_ms"], None)]
    cell = lambda v: "" if v is None else f"{v:.3f}"  # noqa: E731
    print(f"| {'measure':<50} | median ms | p90 ms | mean ms |\n|{'-' * 52}|-----------|--------|---------|")
    for name, median, p90, mean in rows:
        print(f"| {name:<50} | {cell(median):>9} | {cell(p90):>6} | {cell(mean):>7} |")
    ratio = direct["itl"]["median_ms"] / step["median_ms"]
    per_token_ratio = None if per_token is None else direct["itl"]["median_ms"] / per_token
    print(f"served ITL / engine step (medians, flint_model): {ratio:.3f}; served ITL / engine ms/token: "
          f"{cell(per_token_ratio) or 'n/a'}; ensemble events per run "
          f"{ensemble['events_per_run']}; served tokens {'==' if checks['tokens_equal'] else '!='} engine tokens"
          + ("" if checks["tokens_equal"] else f" (first difference at {checks['first_token_difference']})")
          + f"; ensemble text {'==' if checks['text_equal'] else '!='} engine text")
    case = {"case": args.case, "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "checks": checks,
            "itl_over_step": ratio, "itl_over_ms_per_token": per_token_ratio,
            "engine": {k: v for k, v in engine.items() if k not in ("prompt", "prompt_ids")}, "client": client}
    add_case(Path(args.into), case)
    return 0 if checks["ok"] else 1


def add_case(into: Path, case: dict) -> None:
    """Adds (or replaces, by name) a case in the results file `into`."""
    cases = json.loads(into.read_text())["cases"] if into.exists() else []
    into.write_text(json.dumps({"cases": [c for c in cases if c["case"] != case["case"]] + [case]}, indent=2))
    print(f"added {case['case']} to {into}")


def print_summary(args) -> int:
    cases = json.loads(Path(args.results).read_text())["cases"]
    print("\n| case | engine step ms (median / p90) | engine ms/token unsynced | flint_model ITL ms (median / p90) | "
          "ITL / step | ITL / ms/token | flint ITL ms (median / p90 / mean) | tokens equal |\n"
          "|---|---|---|---|---|---|---|---|")
    ms = lambda v: "n/a" if v is None else f"{v:.3f}"  # noqa: E731
    for c in cases:
        s, d, f = c["engine"]["decode_step"], c["client"]["flint_model"]["itl"], c["client"]["flint"]
        per_token = c["engine"].get("ms_per_token_unsynced")  # absent in cases written before 2026-12-05
        print(f"| {c['case']} | {s['median_ms']:.3f} / {s['p90_ms']:.3f} | {ms(per_token)} | "
              f"{d['median_ms']:.3f} / {d['p90_ms']:.3f} | {c['itl_over_step']:.3f} | "
              f"{ms(c.get('itl_over_ms_per_token'))} | {ms(f['itl']['median_ms'])} / {ms(f['itl']['p90_ms'])} / "
              f"{ms(f['itl_mean_ms'])} | {'yes' if c['checks']['tokens_equal'] else 'NO'} |")
    return 0 if all(c["checks"]["ok"] for c in cases) else 1


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="phase", required=True)
    for name in ("engine", "client"):
        p = sub.add_parser(name)
        p.add_argument("--runs", type=int, default=3)
        p.add_argument("--out", required=True)
    p = sub.choices["engine"]
    p.add_argument("--repository", required=True)
    p.add_argument("--prompt-tokens", type=int, default=1000)
    p.add_argument("--tokens", type=int, default=128)
    p = sub.choices["client"]
    p.add_argument("--url", required=True)
    p.add_argument("--metrics-url", required=True)
    p.add_argument("--engine", required=True, help="the engine phase's JSON: prompt, tokens to compare")
    p = sub.add_parser("report")
    p.add_argument("engine")
    p.add_argument("client")
    p.add_argument("--case", required=True)
    p.add_argument("--into", required=True, help="JSON file of all cases; this case is added (or replaced)")
    sub.add_parser("summary").add_argument("results")
    args = parser.parse_args()
    if args.phase == "report":
        sys.exit(report(args))
    if args.phase == "summary":
        sys.exit(print_summary(args))
    result = run_engine(args) if args.phase == "engine" else run_client(args)
    Path(args.out).write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
