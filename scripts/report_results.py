#!/usr/bin/env python3
"""Merge scripts/bench.py result files into benchmarks/results.json, a markdown table and a plot.

    python scripts/report_results.py RESULTS.json [MORE.json ...] [--out-dir benchmarks]

Each input is one `scripts/bench.py --out` file (one or more weight formats); the outputs keep
every input's GPU, date, commit and command next to its numbers.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

ANNOUNCED_GB200_MS = 2.06  # vLLM's day-0 figure: NVFP4, batch 1, 100K context, GB200
TARGETS = {"nvfp4": 2.06, "bf16": 2.5}


def load(paths: list[Path]) -> list[dict]:
    runs = []
    for path in paths:
        data = json.loads(path.read_text())
        for fmt in data["formats"]:
            runs.append({"meta": data["meta"], **fmt})
    return runs


def markdown(runs: list[dict]) -> str:
    lines = ["# End-to-end decode on one GPU (scripts/bench.py)", "",
             "Batch-1 decode, full-size flint-40b with random weights built on the GPU, CUDA graphs on;",
             "ms/token is the wall time of consecutive `engine.step()` calls over the tokens they delivered",
             "(forward + LM head + sampling + the Python that async scheduling does not hide); synced step",
             "ms is the median `engine.step()` between two device syncs (runs without it, before async",
             "scheduling, measured ms/token that way). floor = bytes one step must read / measured copy",
             "bandwidth.", ""]
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
        lines += ["", f"weights {run['weight_bytes_per_token'] / 1e9:.2f} GB read per token; peak GPU memory "
                  f"{run.get('peak_gpu_gib')} GiB; TTFT {run.get('ttft_s')} s; build {run['build_s']} s", ""]
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
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    several = len({run["meta"]["commit"] for run in runs}) > 1
    floors = set()  # one floor line per format: it depends on the bytes, not on the run
    for run in runs:
        ctx = [d["context"] for d in run["decode"]]
        date = run["meta"]["date"]
        tag = f" ({run['meta']['commit']}, {date[:10]} {date[11:16]} UTC)" if several else ""
        ax.plot(ctx, [d["ms_per_token"] for d in run["decode"]], "o-", label=f"{run['format']} measured{tag}")
        if run["format"] not in floors:
            floors.add(run["format"])
            ax.plot(ctx, [d["floor_ms"] for d in run["decode"]], "--", label=f"{run['format']} bandwidth floor")
    ax.axhline(ANNOUNCED_GB200_MS, color="gray", linestyle=":", label="vLLM GB200 NVFP4 @100K (2.06 ms)")
    ax.set_xscale("log")
    ax.set_xlabel("context (tokens)")
    ax.set_ylabel("ms / token (batch 1)")
    m = runs[0]["meta"]
    commits = ", ".join(dict.fromkeys(run["meta"]["commit"] for run in runs))
    dates = " to ".join(dict.fromkeys(run["meta"]["date"][:10] for run in (runs[0], runs[-1])))
    ax.set_title(f"flint-40b decode, {m['gpu']}, {dates}, commits {commits}", fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
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
