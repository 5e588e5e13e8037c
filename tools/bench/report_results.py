#!/usr/bin/env python3
"""Merge tools/bench/bench.py result files into benchmarks/results.json, a markdown table and a plot.

    python tools/bench/report_results.py RESULTS.json [MORE.json ...] [--out-dir benchmarks]

Each input is one `tools/bench/bench.py --out` file (one or more weight formats), kept as
benchmarks/<gpu>/<date>-<commit>-bench*.json (gpu: h100 or h200, from the file's meta.gpu); the
outputs keep every input's GPU, date, commit and command next to its numbers. The plot draws the
last input of each format as "latest" and every input, in the order given, as the history (so the
run to show as latest goes last). benchmarks/results.* are made by

    python tools/bench/report_results.py benchmarks/h200/2026-12-05-bce6bfe-bench-ttft-throughput.json \
        benchmarks/h200/2026-12-05-bce6bfe-bench-nvfp4-repeat[12].json \
        benchmarks/h200/2026-12-05-bce6bfe-bench.json benchmarks/h100/2026-12-05-b923e06-bench-nvfp4.json \
        benchmarks/h100/2026-12-06-c81b1b9-bench-nvfp4-100k.json benchmarks/h100/2026-12-06-b9e4ca6-bench-nvfp4-100k.json \
        benchmarks/h100/2026-12-06-12862c8-bench-nvfp4.json
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

ANNOUNCED_GB200_MS = 2.06  # vLLM's day-0 figure: NVFP4, batch 1, 100K context, GB200
TARGETS = {"nvfp4": 2.06, "bf16": 2.5}
# runs made with the corrected clock before bench.py recorded meta.clock
COUNTED_AFTER_CLOCK = {"60cf369", "e57e415"}


def load(paths: list[Path]) -> list[dict]:
    runs = []
    for path in paths:
        data = json.loads(path.read_text())
        for fmt in data["formats"]:
            runs.append({"meta": data["meta"], **fmt})
    return runs


def undercounted_steps(run: dict) -> int | None:
    """Async-scheduling runs of bench.py before 60cf369 counted, in ms_per_token, the token of a
    step made before the clock started: their ms/token is (N - 1) / N of the step period, N the
    --steps of the run. -> N for such a run, else None."""
    m = run["meta"]
    if not m.get("async_scheduling") or "clock" in m or m["commit"] in COUNTED_AFTER_CLOCK:
        return None
    match = re.search(r"--steps[ =](\d+)", m["command"])
    return int(match.group(1)) if match else 40  # bench.py's default


def step_period_ms(run: dict, d: dict) -> float:
    """ms/token as bench.py measures it now (the step period), for every run."""
    n = undercounted_steps(run)
    return d["ms_per_token"] if n is None else d["ms_per_token"] * n / (n - 1)


def gpu_name(run: dict) -> str:
    """'NVIDIA H100 80GB HBM3' -> 'H100': the card, as the plot's ticks name it."""
    return run["meta"]["gpu"].removeprefix("NVIDIA ").split()[0]


def seconds(ttft) -> str:
    """bench.py's ttft_s: {prompt tokens: s} ("6.15 s at 100000 tokens"), a number, or None."""
    if isinstance(ttft, dict):
        return ", ".join(f"{s} s at {tokens} tokens" for tokens, s in ttft.items()) or "none"
    return "none" if ttft is None else f"{ttft} s"


def markdown(runs: list[dict]) -> str:
    lines = ["# End-to-end decode on one GPU (tools/bench/bench.py)", "",
             "Batch-1 decode, full-size flint-40b with random weights built on the GPU, CUDA graphs on;",
             "ms/token is the wall time of consecutive `engine.step()` calls over the tokens they delivered",
             "(forward + LM head + sampling + the Python that async scheduling does not hide); synced step",
             "ms is the median `engine.step()` between two device syncs (runs without it, before async",
             "scheduling, measured ms/token that way). floor = bytes one step must read / measured copy",
             "bandwidth.", "",
             "Runs with async scheduling before commit 60cf369 (2026-12-04) counted in ms/token one token",
             "made before the clock started, so their ms/token is (N - 1)/N of the step period (N: the run's",
             "--steps; 3% low at 30 steps); under each such run the period is given, and the plot shows it.", ""]
    for run in runs:
        m = run["meta"]
        lines += [f"## {run['format']}: {m['gpu']}, {m['date']}, commit {m['commit']}",
                  f"`{m['command']}` (copy bandwidth {m['copy_tb_s']} TB/s)", "",
                  "| context | ms/token | synced step ms | tokens/s | graph replay ms | eager ms/token | floor ms "
                  "| of floor speed | target |",
                  "|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for d in run["decode"]:
            target = TARGETS[run["format"]] if d["context"] == 100000 else ""
            lines.append(f"| {d['context']} | {d['ms_per_token']} | {d.get('synced_step_ms', '')} | "
                         f"{d['tokens_per_s']} | {d['graph_replay_ms']} | "
                         f"{run['eager_ms_per_token'][str(d['context'])]} | {d['floor_ms']} | "
                         f"{d['roofline_fraction']:.0%} | {target} |")
        n = undercounted_steps(run)
        if n is not None:
            periods = ", ".join(f"{step_period_ms(run, d):.3f} at {d['context']}" for d in run["decode"])
            lines += ["", f"ms/token above counts a token made before the clock ({n} steps): the step period "
                      f"was ms/token x {n}/{n - 1} = {periods} ms."]
        lines += ["", f"weights {run['weight_bytes_per_token'] / 1e9:.2f} GB read per token; peak GPU memory "
                  f"{run.get('peak_gpu_gib')} GiB; TTFT {seconds(run.get('ttft_s'))}"
                  + (f" (the first such prompt, compiling its kernels: {seconds(run['ttft_first_s'])})"
                     if run.get("ttft_first_s") else "") + f"; build {run['build_s']} s", ""]
        if run.get("throughput"):
            lines += ["| streams | prompt | output | output tok/s (whole run) | decode tok/s | ms/step |",
                      "|---:|---:|---:|---:|---:|---:|"]
            lines += [f"| {t['streams']} | {t['prompt']} | {t['output']} | {t['output_tok_s']} | {t['decode_tok_s']} | "
                      f"{t['ms_per_step']} |" for t in run["throughput"]]
            lines.append("")
        lines += [f"Kernels of one eager batch-1 decode step at {run['breakdown_context']} tokens (device us, summed):",
                  "", "| us | calls | kernel |", "|---:|---:|---|"]
        lines += [f"| {k['us']} | {k['calls']} | `{k['kernel']}` |" for k in run["breakdown"][:12]]
        lines.append("")
    return "\n".join(lines)


def plot(runs: list[dict], path: Path) -> None:
    """Left: the latest run of each format, ms/token against context, with its bandwidth floor and
    target. Right: every run's ms/token at its longest context, in input order (the history)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (now, history) = plt.subplots(1, 2, figsize=(12, 5), gridspec_kw=dict(width_ratios=[1, 1.3]))
    formats = list(dict.fromkeys(run["format"] for run in runs))
    colors = dict(zip(formats, ("tab:blue", "tab:orange", "tab:green", "tab:red")))
    latest = {run["format"]: run for run in runs}  # the last input of each format
    for fmt, run in latest.items():
        ctx = [d["context"] for d in run["decode"]]
        now.plot(ctx, [d["ms_per_token"] for d in run["decode"]], "o-", color=colors[fmt], label=f"{fmt} measured")
        now.plot(ctx, [d["floor_ms"] for d in run["decode"]], "--", color=colors[fmt],
                 label=f"{fmt} bandwidth floor")
        if fmt in TARGETS:
            now.plot([max(ctx)], [TARGETS[fmt]], "*", color=colors[fmt], markersize=12,
                     label=f"{fmt} target @{max(ctx) // 1000}K ({TARGETS[fmt]} ms)")
    now.axhline(ANNOUNCED_GB200_MS, color="gray", linestyle=":", label="vLLM GB200 NVFP4 @100K (2.06 ms)")
    now.set_xscale("log")
    now.set_ylim(bottom=0)
    now.set_xlabel("context (tokens)")
    now.set_ylabel("ms / token (batch 1)")
    m = runs[-1]["meta"]
    now.set_title(f"latest: commit {m['commit']}, {m['date'][:16].replace('T', ' ')} UTC", fontsize=9)
    now.legend(fontsize=7, loc="lower right")

    for fmt in formats:
        points = [(i, run) for i, run in enumerate(runs) if run["format"] == fmt]
        xs = [i for i, _ in points]
        history.plot(xs, [step_period_ms(run, max(run["decode"], key=lambda d: d["context"])) for _, run in points],
                     "o-", color=colors[fmt], label=f"{fmt} measured (step period)")
        if fmt in TARGETS:
            history.axhline(TARGETS[fmt], color=colors[fmt], linestyle=":", label=f"{fmt} target ({TARGETS[fmt]} ms)")
    first = {}  # (commit, day, GPU) -> the index of its first run: one tick each
    for i, run in enumerate(runs):
        first.setdefault((run["meta"]["commit"], run["meta"]["date"][:10], gpu_name(run)), i)
    history.set_xticks(list(first.values()), [f"{c}\n{d[5:]}\n{g}" for c, d, g in first], fontsize=6, rotation=60)
    history.set_ylim(bottom=0)
    history.set_ylabel("step period ms at the longest context")
    history.set_title("every run (commit, date, GPU)", fontsize=9)
    history.legend(fontsize=7, loc="lower left")
    dates = " to ".join(dict.fromkeys(run["meta"]["date"][:10] for run in (runs[0], runs[-1])))
    gpus = ", ".join(dict.fromkeys(run["meta"]["gpu"] for run in runs))
    fig.suptitle(f"flint-40b batch-1 decode, {gpus}, {dates} (latest: {m['gpu']})", fontsize=10)
    fig.text(0.01, 0.01, f"latest command: {m['command']}", fontsize=6, color="dimgray")
    fig.tight_layout(rect=(0, 0.03, 1, 1))
    fig.savefig(path, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("inputs", nargs="+", type=Path)
    parser.add_argument("--out-dir", type=Path, default=Path("benchmarks"))
    args = parser.parse_args()
    runs = load(args.inputs)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    (args.out_dir / "results.json").write_text(json.dumps({"runs": runs}, indent=2) + "\n")
    (args.out_dir / "results.md").write_text(markdown(runs) + "\n")
    plot(runs, args.out_dir / "results.png")
    print(markdown(runs))


if __name__ == "__main__":
    main()
