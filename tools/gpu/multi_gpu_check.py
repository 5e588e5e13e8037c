#!/usr/bin/env python3
"""Scale-out check: N concurrent greedy streams through tritonserver, per-instance traffic and
per-GPU memory (tools/gpu/multi_gpu_check.sh runs it once per instance layout).

    multi_gpu_check.py load --url 127.0.0.1:18000 --metrics-url 127.0.0.1:18002 --streams 64 \
        --tokens 128 --label two --out two.json
    multi_gpu_check.py report one.json two.json --out multi_gpu_check.json

`load` sends `--streams` HTTP generate_stream requests at once (standard library, one thread
each), then times the wall clock until the last finishes: throughput = output tokens / wall.
It samples `nvidia-smi` during the run (peak memory per GPU) and reads each flint_model
instance's generated tokens from /metrics (label `instance`). `report` prints the table (one
row per layout, throughput relative to the first) and writes the JSON.
"""

from __future__ import annotations

import argparse
import http.client
import json
import re
import statistics
import subprocess
import threading
import time
import urllib.request
from collections import Counter
from pathlib import Path

PROMPTS = ["The quick brown fox", "Once upon a time", "Triton serves models", "def main():",
           "Flint is a mixture of experts", "1 2 3 4 5", "Hello world", "A long time ago"]


def stream(url: str, body: dict) -> tuple[float | None, str, dict]:
    """(seconds to the first event, the text, the last event) of one generate_stream request."""
    host, port = url.split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=1800)
    start = time.perf_counter()
    conn.request("POST", "/v2/models/flint/generate_stream", json.dumps(body), {"Content-Type": "application/json"})
    response = conn.getresponse()
    first, text, last = None, [], {}
    while line := response.readline():
        if line.startswith(b"data: "):
            first = first if first is not None else time.perf_counter() - start
            last = json.loads(line[6:])
            if "error" in last:
                raise RuntimeError(f"stream failed: {last['error']}")
            text.append(last.get("text_output", ""))
    conn.close()
    return first, "".join(text), last


def counted_tokens(metrics_url: str, before: Counter, expected: int, wait_s: float = 10.0) -> Counter:
    """Per-instance token counts since `before`, read until they add up to `expected`: a stream's
    last response can reach the client before its instance has counted the tokens."""
    deadline = time.monotonic() + wait_s
    while True:
        delta = instance_tokens(metrics_url) - before
        if sum(delta.values()) >= expected or time.monotonic() > deadline:
            return delta
        time.sleep(0.1)


def instance_tokens(metrics_url: str) -> Counter:
    text = urllib.request.urlopen(f"http://{metrics_url}/metrics", timeout=10).read().decode()
    tokens = Counter()
    for line in text.splitlines():
        match = re.match(r'^flint:generation_tokens_total\{([^}]*)\}\s+(\S+)$', line)
        if match:
            labels = dict(re.findall(r'(\w+)="([^"]*)"', match.group(1)))
            tokens[labels.get("instance", "?")] += float(match.group(2))
    return tokens


def gpu_memory() -> dict[str, dict]:
    out = subprocess.run(["nvidia-smi", "--query-gpu=index,name,memory.used,memory.total",
                          "--format=csv,noheader,nounits"], capture_output=True, text=True, check=True).stdout
    rows = [[c.strip() for c in line.split(",")] for line in out.strip().splitlines()]
    return {r[0]: {"name": r[1], "used_mib": float(r[2]), "total_mib": float(r[3])} for r in rows}


class MemorySampler(threading.Thread):
    def __init__(self, interval: float = 0.5):
        super().__init__(daemon=True)
        self.peak: dict[str, dict] = gpu_memory()
        self._done, self.interval = threading.Event(), interval

    def run(self) -> None:
        while not self._done.wait(self.interval):
            for index, row in gpu_memory().items():
                if row["used_mib"] > self.peak[index]["used_mib"]:
                    self.peak[index] = row

    def stop(self) -> dict[str, dict]:
        self._done.set()
        self.join()
        return self.peak


def run_load(args) -> dict:
    body = {"max_tokens": args.tokens, "temperature": 0.0, "ignore_eos": True, "stream": True}
    stream(args.url, {**body, "text_input": PROMPTS[0], "max_tokens": 16})  # warm-up: compile, allocator
    loaded = gpu_memory()
    before = instance_tokens(args.metrics_url)
    results: list = [None] * args.streams
    errors: list[str] = []

    def one(i: int) -> None:
        try:
            results[i] = stream(args.url, {**body, "text_input": PROMPTS[i % len(PROMPTS)]})
        except Exception as error:  # reported, not raised: the other streams go on
            errors.append(f"stream {i}: {error}")

    sampler = MemorySampler()
    sampler.start()
    threads = [threading.Thread(target=one, args=(i,)) for i in range(args.streams)]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - start
    peak = sampler.stop()
    if errors:
        raise RuntimeError("; ".join(errors[:5]))
    tokens = sum(r[2]["num_output_tokens"] for r in results)
    texts = {p: Counter(r[1] for i, r in enumerate(results) if PROMPTS[i % len(PROMPTS)] == p) for p in PROMPTS}
    return {"label": args.label, "streams": args.streams, "tokens_per_stream": args.tokens, "wall_s": wall,
            "output_tokens": tokens, "tokens_per_s": tokens / wall,
            "ttft_median_s": statistics.median(r[0] for r in results),
            "instance_tokens": dict(counted_tokens(args.metrics_url, before, tokens)),
            "gpu_memory_after_load": loaded, "gpu_memory_peak": peak,
            # greedy: one text per prompt, whatever instance or batch served it
            "texts_per_prompt": {p: len(c) for p, c in texts.items()},
            "texts": {p: c.most_common(1)[0][0] for p, c in texts.items()}}


def report(args) -> dict:
    runs = [json.loads(Path(p).read_text()) for p in args.runs]
    base = runs[0]["tokens_per_s"]
    print(f"{runs[0]['streams']} concurrent streams x {runs[0]['tokens_per_stream']} greedy tokens")
    print("| layout | tokens/s | vs first | TTFT median s | tokens per instance | peak GPU memory MiB |")
    print("|---|---|---|---|---|---|")
    for run in runs:
        instances = ", ".join(f"{k}: {int(v)}" for k, v in sorted(run["instance_tokens"].items()))
        memory = ", ".join(f"{i}: {int(m['used_mib'])}" for i, m in sorted(run["gpu_memory_peak"].items()))
        print(f"| {run['label']} | {run['tokens_per_s']:.1f} | {run['tokens_per_s'] / base:.2f}x | "
              f"{run['ttft_median_s']:.3f} | {instances} | {memory} |")
    same = {p: all(r["texts"][p] == runs[0]["texts"][p] for r in runs) for p in PROMPTS}
    print(f"greedy texts equal across layouts: {sum(same.values())}/{len(same)} prompts "
          "(bf16 batches of other sizes may break near-ties the other way)")
    result = {"date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "runs": runs, "same_text": same,
              "gpus": next(iter(runs[0]["gpu_memory_peak"].values()))["name"]}
    Path(args.out).write_text(json.dumps(result, indent=2))
    print(f"wrote {args.out}")
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="phase", required=True)
    load = sub.add_parser("load")
    load.add_argument("--url", required=True)
    load.add_argument("--metrics-url", required=True)
    load.add_argument("--streams", type=int, default=64)
    load.add_argument("--tokens", type=int, default=128)
    load.add_argument("--label", required=True)
    load.add_argument("--out", required=True)
    rep = sub.add_parser("report")
    rep.add_argument("runs", nargs="+")
    rep.add_argument("--out", required=True)
    args = parser.parse_args()
    if args.phase == "report":
        report(args)
        return
    Path(args.out).write_text(json.dumps(run_load(args), indent=2))


if __name__ == "__main__":
    main()
