"""scripts/loadtest_report.py on a literal perf_analyzer profile export (the shape perf_analyzer 2.51
writes for the flint ensemble): each request a stream, tokens from num_output_tokens."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "loadtest_report.py"
MS = 1_000_000  # ns


def response(count):
    return {"text_output": " x", "num_output_tokens": count, "finish_reason": "", "tool_calls": "[]"}


def export(requests):
    return {"version": "2.51.0", "service_kind": "triton", "endpoint": "",
            "experiments": [{"experiment": {"mode": "concurrency", "value": 2}, "window_boundaries": [],
                             "requests": requests}]}


def run(tmp_path, data):
    path = tmp_path / "perf_analyzer_c2.json"
    path.write_text(json.dumps(data))
    return subprocess.run([sys.executable, str(SCRIPT), str(path), "--json", str(tmp_path / "rows.json")],
                          capture_output=True, text=True, timeout=60)


def test_rows_from_a_literal_export(tmp_path):
    t0 = 10_000 * MS
    requests = [  # sent at 0 ms: tokens at 50 (1), 60 (2), 80 (4); sent at 20 ms: tokens at 100 (1), 130 (2)
        {"timestamp": t0, "request_inputs": {}, "response_timestamps": [t0 + 50 * MS, t0 + 60 * MS, t0 + 80 * MS],
         "response_outputs": [response(1), response(2), response(4)]},
        {"timestamp": t0 + 20 * MS, "request_inputs": {}, "response_timestamps": [t0 + 100 * MS, t0 + 130 * MS],
         "response_outputs": [response(1), response([2])]},
    ]
    done = run(tmp_path, export(requests))
    assert done.returncode == 0, done.stderr
    (row,) = json.loads((tmp_path / "rows.json").read_text())
    assert (row["value"], row["streams"], row["output_tokens"], row["duration_s"]) == (2, 2, 6, 0.13)
    assert row["output_tok_s"] == round(6 / 0.13, 1)
    assert row["ttft_ms"] == {"p50": 80.0, "p90": 80.0, "p99": 80.0, "mean": 65.0}  # 50 and 100 - 20
    assert row["itl_ms"] == {"p50": 10.0, "p90": 30.0, "p99": 30.0, "mean": 15.0}  # 10, 10, 10, 30
    assert "| 2 | 2 | 46.2 | 80.000 / 80.000 / 80.000 | 10.000 / 30.000 / 30.000 |" in done.stdout


@pytest.mark.parametrize("change, message", [
    (lambda r: r.update(response_outputs=[{"text_output": " x"}]), "num_output_tokens: expected a number"),
    (lambda r: r.update(response_outputs=[]), "1 response_timestamps but 0 response_outputs"),
    (lambda r: r.update(timestamp="soon"), "timestamp: expected the send time in ns"),
])
def test_a_malformed_export_names_the_field(tmp_path, change, message):
    request = {"timestamp": 0, "response_timestamps": [5 * MS], "response_outputs": [response(1)]}
    change(request)
    done = run(tmp_path, export([request]))
    assert done.returncode != 0 and message in done.stderr
