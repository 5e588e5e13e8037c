#!/usr/bin/env python3
"""Output tokens/s, TTFT and ITL percentiles per concurrency, from the profile exports that
perf_analyzer writes (--profile-export-file; scripts/loadtest.sh writes one a concurrency).

    python scripts/loadtest_report.py build/loadtest/perf_analyzer_c*.json [--json build/loadtest/summary.json]

Each request of the export is a stream: its send time, then each response's arrival and the
tokens it adds (the steps of its `num_output_tokens`, which the flint ensemble puts in every
response). They are counted as tools/gpu/serve_concurrency.py counts its streams
(tools/bench/stream_stats.py), over the whole run of one concurrency (first send to last
response): so a row here reads beside the serve check's "served flint" column, whose first
column is the in-process engine on the same requests (`tools/gpu/gpu_serve_check.sh
--concurrency N`).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tools.gpu, run as a file

from tools.bench.stream_stats import Stream, run_statistics  # noqa: E402


def output_tokens(output: dict, where: str) -> int:
    """A response's num_output_tokens, however the export spells the tensor (a number, a list, text)."""
    value = output.get("num_output_tokens")
    while isinstance(value, list) and value:
        value = value[0]
    try:
        return int(value)
    except (TypeError, ValueError):
        raise ValueError(f"{where}: response_outputs[].num_output_tokens: expected a number, got {value!r} "
                         "(the flint ensemble sends it in every response)") from None


def sent_at(request: dict, where: str) -> int:
    if not isinstance(request.get("timestamp"), int):
        raise ValueError(f"{where}: timestamp: expected the send time in ns, got {request.get('timestamp')!r}")
    return request["timestamp"]


def experiment_streams(experiment: dict, where: str) -> list[Stream]:
    """The experiment's requests as streams, times in s from its first send."""
    requests = experiment.get("requests") or []
    if not requests:
        raise ValueError(f"{where}: requests: none recorded")
    t0 = min(sent_at(r, f"{where}, request {i}") for i, r in enumerate(requests))
    streams = []
    for i, request in enumerate(requests):
        times = [int(t) for t in request.get("response_timestamps", [])]
        counts = [output_tokens(o, f"{where}, request {i}") for o in request.get("response_outputs", [])]
        if len(counts) != len(times):
            raise ValueError(f"{where}, request {i}: {len(times)} response_timestamps but {len(counts)} "
                             "response_outputs")
        steps = [b - a for a, b in zip([0] + counts, counts)]
        streams.append(Stream((request["timestamp"] - t0) / 1e9,
                              [((t - t0) / 1e9, n) for t, n in zip(times, steps)]))
    return streams


def summarize(path: Path) -> list[dict]:
    export = json.loads(path.read_text())
    rows = []
    for experiment in export.get("experiments", []):
        setting = experiment.get("experiment", {})
        where = f"{path.name}, {setting.get('mode', '?')} {setting.get('value', '?')}"
        rows.append({"mode": setting.get("mode"), "value": setting.get("value"),
                     **run_statistics(experiment_streams(experiment, where))})
    return rows


def table(rows: list[dict]) -> str:
    lines = ["| concurrency | requests | output tok/s | TTFT p50 / p90 / p99 ms | ITL p50 / p90 / p99 ms |",
             "|---:|---:|---:|---|---|"]
    pcts = lambda d: " / ".join(f"{d[q]:.3f}" for q in ("p50", "p90", "p99"))  # noqa: E731
    for r in rows:
        lines.append(f"| {r['value']} | {r['streams']} | {r['output_tok_s']:.1f} | {pcts(r['ttft_ms'])} | "
                     f"{pcts(r['itl_ms'])} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("exports", nargs="+", type=Path, help="perf_analyzer --profile-export-file outputs")
    parser.add_argument("--json", type=Path, help="also write the rows here")
    args = parser.parse_args()
    try:
        rows = sorted((r for path in args.exports for r in summarize(path)), key=lambda r: r["value"] or 0)
    except (OSError, ValueError) as error:
        sys.exit(f"loadtest_report.py: {error}")
    print(table(rows))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
