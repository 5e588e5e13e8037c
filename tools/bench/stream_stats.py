"""Output tokens/s, TTFT and ITL of N streams started together, counted one way for bench.py's
in-process throughput runs, the serve check's concurrency mode (tools/gpu/serve_concurrency.py:
the engine and tritonserver's clients) and scripts/loadtest_report.py.

A stream is its start and its events: (arrival, new output tokens) in seconds from the run's
start. Output tokens/s is every stream's tokens over the run (start to the last arrival); TTFT is a
stream's first event with tokens less its start; an event after it that brings k tokens a gap g
after the one before with tokens counts g / k as the ITL of each of its k tokens (the first
event's extra tokens have no gap). An event without tokens (a final response alone) only ends
its stream.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass


@dataclass
class Stream:
    start: float                          # s from the run's start
    events: list[tuple[float, int]]       # (arrival s, new output tokens), in arrival order

    @property
    def tokens(self) -> int:
        return sum(n for _, n in self.events)

    @classmethod
    def from_dict(cls, d: dict) -> "Stream":
        return cls(float(d["start"]), [(float(t), int(n)) for t, n in d["events"]])

    def to_dict(self) -> dict:
        return {"start": self.start, "events": [[t, n] for t, n in self.events]}


def percentiles(seconds: list[float]) -> dict:
    """p50 / p90 / p99 and the mean, in ms (None without values)."""
    if not seconds:
        return {"p50": None, "p90": None, "p99": None, "mean": None}
    ordered = sorted(seconds)
    pick = lambda q: round(ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1e3, 3)  # noqa: E731
    return {"p50": pick(0.5), "p90": pick(0.9), "p99": pick(0.99), "mean": round(statistics.fmean(ordered) * 1e3, 3)}


def run_statistics(streams: list[Stream]) -> dict:
    """Output tokens/s over the run, TTFT and ITL percentiles (ms), events per stream."""
    empty = sum(not s.tokens for s in streams)
    if not streams or empty:
        raise ValueError(f"streams: every stream needs a token; {empty} of {len(streams)} have none")
    duration = max(s.events[-1][0] for s in streams)
    tokens = sum(s.tokens for s in streams)
    ttft, itl = [], []
    for s in streams:
        arrivals = [(t, n) for t, n in s.events if n]
        ttft.append(arrivals[0][0] - s.start)
        for (t0, _), (t1, n) in zip(arrivals, arrivals[1:]):
            itl += [(t1 - t0) / n] * n
    return {"streams": len(streams), "output_tokens": tokens, "duration_s": round(duration, 4),
            "output_tok_s": round(tokens / duration, 1), "ttft_ms": percentiles(ttft), "itl_ms": percentiles(itl),
            "events_per_stream": round(sum(len(s.events) for s in streams) / len(streams), 1)}


def served_ratio(engine: dict, served: dict) -> float:
    """Served output tokens/s over the in-process engine's (the target: >= 0.9 at 64 streams)."""
    return round(served["output_tok_s"] / engine["output_tok_s"], 3)


def side_by_side(runs: dict[str, dict]) -> str:
    """A markdown table, one column per run (`runs`: name -> run_statistics; the first is the
    in-process engine), with each run's tokens/s over the first's."""
    names = list(runs)
    base = runs[names[0]]
    rows = [("output tok/s", "{:.1f}", [r["output_tok_s"] for r in runs.values()]),
            ("over in-process", "{:.3f}", [None] + [served_ratio(base, r) for r in list(runs.values())[1:]])]
    for key, label in (("ttft_ms", "TTFT"), ("itl_ms", "ITL")):
        for q in ("p50", "p90", "p99"):
            rows.append((f"{label} {q} ms", "{:.3f}", [r[key][q] for r in runs.values()]))
    rows += [("output tokens", "{}", [r["output_tokens"] for r in runs.values()]),
             ("events per stream", "{:.1f}", [r["events_per_stream"] for r in runs.values()])]
    lines = ["| measure | " + " | ".join(names) + " |", "|---|" + "---:|" * len(names)]
    lines += [f"| {label} | " + " | ".join("" if v is None else form.format(v) for v in values) + " |"
              for label, form, values in rows]
    return "\n".join(lines)
