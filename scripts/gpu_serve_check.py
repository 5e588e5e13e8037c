#!/usr/bin/env python3
"""Serving overhead at batch 1: inter-token latency through tritonserver vs the engine's own step.

    gpu_serve_check.py engine --repository R --out engine.json       # LLMEngine in-process, no server
    gpu_serve_check.py client --url 127.0.0.1:18000 --metrics-url 127.0.0.1:18002 --out client.json
    gpu_serve_check.py report engine.json client.json --out gpu_serve_check.json

`engine` times each engine step of one greedy request (the first is the prefill); `client` streams
the same request through the `flint` ensemble with HTTP generate_stream (standard library only) and
times the gap between events per token, and reads the engine's own time per output token inside
the server from /metrics; `report` prints the table and writes the JSON.
"""

from __future__ import annotations

import argparse
import http.client
import json
import statistics
import time
import urllib.request
from pathlib import Path

WORDS = "the quick brown fox jumps over the lazy dog".split()


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


def summary(seconds: list[float]) -> dict:
    ms = [s * 1e3 for s in seconds]
    return {"median_ms": statistics.median(ms), "p90_ms": pct(ms, 0.9), "mean_ms": statistics.fmean(ms), "n": len(ms)}


def run_engine(args) -> dict:
    import torch

    from flint_backend.engine.engine import LLMEngine
    from flint_backend.engine.sampling_params import SamplingParams
    from flint_backend.serving.repository import engine_args_path, load_engine_args

    engine_args = load_engine_args(engine_args_path(args.repository))
    engine = LLMEngine(engine_args)
    prompt = [100 + i % 5000 for i in range(args.prompt_tokens)]

    def one(max_tokens: int) -> list[float]:
        engine.add_request(prompt, SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True))
        times = []
        while engine.has_work():
            start = time.perf_counter()
            engine.step()
            if engine.device.type == "cuda":
                torch.cuda.synchronize()
            times.append(time.perf_counter() - start)
        return times

    one(16)  # warm-up: kernel compilation, allocator
    steps = [one(args.tokens) for _ in range(args.runs)]
    decode = [t for run in steps for t in run[1:]]
    return {"device": torch.cuda.get_device_name() if engine.device.type == "cuda" else "cpu",
            "engine_args": engine_args.to_dict(), "prefill": summary([run[0] for run in steps]),
            "decode_step": summary(decode)}


def stream(url: str, body: dict) -> list[tuple[float, dict]]:
    host, port = url.split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=600)
    conn.request("POST", "/v2/models/flint/generate_stream", json.dumps(body), {"Content-Type": "application/json"})
    response = conn.getresponse()
    events = []
    while True:
        line = response.readline()
        if not line:
            break
        if line.startswith(b"data: "):
            events.append((time.perf_counter(), json.loads(line[6:])))
    conn.close()
    return events


def engine_tpot(metrics_url: str) -> tuple[float, float]:
    text = urllib.request.urlopen(f"http://{metrics_url}/metrics", timeout=10).read().decode()
    values = {}
    for line in text.splitlines():
        for key in ("sum", "count"):
            if line.startswith(f"flint:time_per_output_token_seconds_{key}"):
                values[key] = float(line.split()[-1])
    return values.get("sum", 0.0), values.get("count", 0.0)


def run_client(args) -> dict:
    prompt = " ".join(WORDS[i % len(WORDS)] for i in range(args.prompt_tokens))
    body = {"text_input": prompt, "max_tokens": args.tokens, "temperature": 0.0, "ignore_eos": True, "stream": True}
    stream(args.url, {**body, "max_tokens": 16})  # warm-up
    before = engine_tpot(args.metrics_url)
    itl, ttft, e2e, events_per_run = [], [], [], []
    for _ in range(args.runs):
        start = time.perf_counter()
        events = stream(args.url, body)
        if not events or events[-1][1].get("finish_reason") != "length":
            raise RuntimeError(f"stream did not finish normally: {events[-1:]}")
        ttft.append(events[0][0] - start)
        e2e.append(events[-1][0] - start)
        events_per_run.append(len(events))
        for (t0, a), (t1, b) in zip(events, events[1:]):
            tokens = b["num_output_tokens"] - a["num_output_tokens"]
            itl += [(t1 - t0) / tokens] * tokens if tokens > 0 else []
    after = engine_tpot(args.metrics_url)
    tpot = (after[0] - before[0]) / max(1.0, after[1] - before[1])
    return {"itl": summary(itl), "ttft": summary(ttft), "e2e": summary(e2e), "events_per_run": events_per_run,
            "engine_tpot_in_server_ms": tpot * 1e3, "tokens": args.tokens, "prompt_words": args.prompt_tokens}


def report(args) -> dict:
    engine = json.loads(Path(args.engine).read_text())
    client = json.loads(Path(args.client).read_text())
    step, itl = engine["decode_step"], client["itl"]
    rows = [("engine decode step, in-process (no server)", step["median_ms"], step["p90_ms"]),
            ("engine time per output token inside tritonserver", client["engine_tpot_in_server_ms"], None),
            ("inter-token latency through tritonserver (HTTP SSE)", itl["median_ms"], itl["p90_ms"]),
            ("serving overhead per token (ITL - step)", itl["median_ms"] - step["median_ms"], None),
            ("time to first token through tritonserver", client["ttft"]["median_ms"], client["ttft"]["p90_ms"])]
    print(f"GPU: {engine['device']}; batch 1, {client['tokens']} greedy tokens, "
          f"kernel_backend={engine['engine_args']['kernel_backend']}")
    print(f"| {'measure':<52} | median ms | p90 ms |\n|{'-' * 54}|-----------|--------|")
    for name, median, p90 in rows:
        print(f"| {name:<52} | {median:9.3f} | {'' if p90 is None else f'{p90:6.3f}':>6} |")
    result = {"date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "engine": engine, "client": client,
              "overhead_ms": itl["median_ms"] - step["median_ms"]}
    Path(args.out).write_text(json.dumps(result, indent=2))
    print(f"wrote {args.out}")
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="phase", required=True)
    for name in ("engine", "client"):
        p = sub.add_parser(name)
        p.add_argument("--prompt-tokens", type=int, default=32)
        p.add_argument("--tokens", type=int, default=128)
        p.add_argument("--runs", type=int, default=3)
        p.add_argument("--out", required=True)
    sub.choices["engine"].add_argument("--repository", required=True)
    sub.choices["client"].add_argument("--url", required=True)
    sub.choices["client"].add_argument("--metrics-url", required=True)
    p = sub.add_parser("report")
    p.add_argument("engine")
    p.add_argument("client")
    p.add_argument("--out", required=True)
    args = parser.parse_args()
    if args.phase == "report":
        report(args)
        return
    result = run_engine(args) if args.phase == "engine" else run_client(args)
    Path(args.out).write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
