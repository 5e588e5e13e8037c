"""tools/gpu/gpu_serve_check.py's timing summaries, without a server: a text stream whose run came as
one event has no inter-token gap, and the report says n/a instead of failing."""

import argparse
import json

from tools.gpu.gpu_serve_check import print_summary, summary


def test_summary_of_gaps_in_ms():
    assert summary([0.003, 0.001, 0.002, 0.004]) == {"median_ms": 2.5, "p90_ms": 4.0, "mean_ms": 2.5, "n": 4}


def test_summary_of_no_gaps_is_none():
    assert summary([]) == {"median_ms": None, "p90_ms": None, "mean_ms": None, "n": 0}


def test_report_summary_says_na_for_an_untimed_text_stream(tmp_path, capsys):
    timed = {"median_ms": 2.0, "p90_ms": 2.5, "mean_ms": 2.1, "n": 126}
    case = {"case": "random_bf16", "checks": {"tokens_equal": True, "ok": True}, "itl_over_step": 0.9,
            "engine": {"decode_step": {"median_ms": 2.2, "p90_ms": 2.3}},
            "client": {"flint_model": {"itl": timed},
                       "flint": {"itl": summary([]), "itl_mean_ms": None}}}
    results = tmp_path / "all.json"
    results.write_text(json.dumps({"cases": [case]}))
    assert print_summary(argparse.Namespace(results=str(results))) == 0
    row = capsys.readouterr().out.splitlines()[-1]
    assert row == "| random_bf16 | 2.200 / 2.300 | n/a | 2.000 / 2.500 | 0.900 | n/a | n/a / n/a / n/a | yes |"


def test_report_summary_gives_itl_over_the_unsynced_ms_per_token(tmp_path, capsys):
    """A case written since the engine phase also times bench.py's ms/token (steps unsynced)."""
    timed = {"median_ms": 1.49, "p90_ms": 1.65, "mean_ms": 1.5, "n": 126}
    case = {"case": "random_nvfp4", "checks": {"tokens_equal": True, "ok": True}, "itl_over_step": 0.814,
            "itl_over_ms_per_token": 1.0342,
            "engine": {"decode_step": {"median_ms": 1.83, "p90_ms": 1.88}, "ms_per_token_unsynced": 1.4403},
            "client": {"flint_model": {"itl": timed},
                       "flint": {"itl": timed, "itl_mean_ms": 1.495}}}
    results = tmp_path / "all.json"
    results.write_text(json.dumps({"cases": [case]}))
    assert print_summary(argparse.Namespace(results=str(results))) == 0
    row = capsys.readouterr().out.splitlines()[-1]
    assert row == ("| random_nvfp4 | 1.830 / 1.880 | 1.440 | 1.490 / 1.650 | 0.814 | 1.034 | "
                   "1.490 / 1.650 / 1.495 | yes |")
