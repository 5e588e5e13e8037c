"""tools/gpu/serve_concurrency.py without a server: its statistics and report from literal streams,
and that the in-process engine, flint_model and the flint ensemble get the same requests (the
same prompt ids through flint_tokenizer's own step, the same greedy sampling)."""

import argparse
import dataclasses
import json
from types import SimpleNamespace

import numpy as np
import pytest

from flint_backend.engine.engine import RequestOutput
from flint_backend.engine.sampling_params import SamplingParams
from flint_backend.serving.preprocess import Preprocessor
from flint_backend.tokenizer import load_tokenizer
from tools.gpu.serve_concurrency import (case_result, engine_run, new_tokens, print_summary, report, request_body,
                                         stream_prompts)
from tools.bench.stream_stats import Stream, run_statistics, served_ratio

# stream 0: first token at 0.5 s, then 1 token after 0.1 s and 2 tokens after 0.2 s (0.1 s each);
# stream 1 starts at 0.1 s: first token at 0.7 s, one more 0.3 s later, then a final event alone
STREAMS = [Stream(0.0, [(0.5, 1), (0.6, 1), (0.8, 2)]), Stream(0.1, [(0.7, 1), (1.0, 1), (1.0, 0)])]


def test_statistics_of_literal_streams():
    stats = run_statistics(STREAMS)
    assert stats["output_tokens"] == 6 and stats["duration_s"] == 1.0 and stats["output_tok_s"] == 6.0
    assert stats["ttft_ms"] == {"p50": 600.0, "p90": 600.0, "p99": 600.0, "mean": 550.0}  # 0.5 and 0.7 - 0.1
    assert stats["itl_ms"] == {"p50": 100.0, "p90": 300.0, "p99": 300.0, "mean": 150.0}  # 0.1 x 3, 0.3
    assert stats["events_per_stream"] == 3.0


def test_a_stream_without_tokens_is_an_error_naming_the_field():
    with pytest.raises(ValueError, match="streams: every stream needs a token; 1 of 2"):
        run_statistics([STREAMS[0], Stream(0.0, [(0.3, 0)])])


def test_tokens_per_event_of_each_model():
    events = [{"token_ids": [7]}, {"token_ids": [8, 9]}, {"token_ids": 10}, {}]
    assert new_tokens("flint_model", events) == [1, 2, 1, 0]
    text = [{"num_output_tokens": 1}, {"num_output_tokens": 4}, {"num_output_tokens": 4}]
    assert new_tokens("flint", text) == [1, 3, 0]


def stats(tok_s, p50=10.0):
    pcts = {"p50": p50, "p90": 2 * p50, "p99": 3 * p50, "mean": p50}
    return {"streams": 2, "output_tokens": 8, "duration_s": 1.0, "output_tok_s": tok_s, "ttft_ms": pcts,
            "itl_ms": pcts, "events_per_stream": 4.0}


def literal_case():
    engine = {"device": "cpu", "engine_args": {"model": "ckpt", "kernel_backend": "torch", "max_num_seqs": 2},
              "build_s": 1.0, "max_tokens": 4, "prompts": [{"prompt_ids": [1, 2, 3]}, {"prompt_ids": [4, 5]}],
              "outputs": [[7, 8, 9, 10], [11, 12, 13, 14]], "texts": ["a", "b"], "stats": stats(4000.0),
              "cpu_ms_per_token": 0.5}
    served = {"cpu_ms_per_token": {"flint_postprocess": 0.25, "tritonserver": 0.125}, "models": {
        "flint_postprocess": {"requests_per_token": 0.25, "queue_us_per_execution": 10.0,
                              "compute_us_per_execution": 300.0}}}
    client = {"flint_model": {"stats": stats(3700.0), "outputs": [[7, 8, 9, 10], [11, 12, 0, 0]], **served},
              "flint": {"stats": stats(3400.0), "outputs": ["a", "b"], **served}}
    return engine, client


def test_ratio_and_target_from_literal_runs():
    engine, client = literal_case()
    assert served_ratio(engine["stats"], client["flint_model"]["stats"]) == 0.925
    result = case_result("tiny", engine, client, target=0.9)
    assert {m: s["ratio"] for m, s in result["served"].items()} == {"flint_model": 0.925, "flint": 0.85}
    assert {m: s["same_outputs"] for m, s in result["served"].items()} == {"flint_model": 1, "flint": 2}
    assert result["prompt_tokens"] == [3, 2] and not result["ok"]
    assert case_result("tiny", engine, client, target=0.8)["ok"]


def test_report_prints_both_side_by_side_and_keeps_the_json(tmp_path, capsys):
    engine, client = literal_case()
    (tmp_path / "engine.json").write_text(json.dumps(engine))
    (tmp_path / "client.json").write_text(json.dumps(client))
    into = tmp_path / "all.json"
    args = argparse.Namespace(engine=str(tmp_path / "engine.json"), client=str(tmp_path / "client.json"),
                              case="tiny", into=str(into), target=0.9)
    assert report(args) == 1  # the ensemble is below the target
    out = capsys.readouterr().out
    assert "| measure | in-process | served flint_model | served flint |" in out
    assert "| output tok/s | 4000.0 | 3700.0 | 3400.0 |" in out
    assert "| over in-process |  | 0.925 | 0.850 |" in out
    assert "| ITL p99 ms | 30.000 | 30.000 | 30.000 |" in out
    assert "| flint_postprocess | | 0.2500 | 0.2500 |" in out
    assert "| flint_postprocess | 0.250, 10 / 300 | 0.250, 10 / 300 |" in out
    assert json.loads(into.read_text())["cases"][0]["served"]["flint"]["ratio"] == 0.85
    assert print_summary(argparse.Namespace(results=str(into))) == 1
    row = capsys.readouterr().out.splitlines()[-1]
    assert row == "| tiny | 2 | 4000.0 | 3700.0 (0.925) | 3400.0 (0.850) | 10.0 / 10.0 / 10.0 | 10.0 / 10.0 / 10.0 |"


class ScriptedEngine:
    """Records what it is given; each request gets token 100 + i at its i-th step."""

    def __init__(self):
        self.added, self.seqs = [], []

    def add_request(self, prompt_ids, params):
        seq = SimpleNamespace(request_id=f"r{len(self.seqs)}", output_ids=[], max_tokens=params.max_tokens)
        self.added.append((list(prompt_ids), params))
        self.seqs.append(seq)
        return seq

    def has_work(self):
        return any(len(s.output_ids) < s.max_tokens for s in self.seqs)

    def step(self):
        outputs = []
        for s in (s for s in self.seqs if len(s.output_ids) < s.max_tokens):
            s.output_ids.append(100 + len(s.output_ids))
            done = len(s.output_ids) == s.max_tokens
            outputs.append(RequestOutput(s.request_id, [s.output_ids[-1]], [None], done, "length" if done else None,
                                         3, len(s.output_ids)))
        return outputs


def triton_inputs(body: dict) -> dict:
    """A generate body as the tensors flint_tokenizer receives ([1, 1] each, the ensemble's types)."""
    kinds = {str: lambda v: np.array([[v.encode()]], np.object_), bool: lambda v: np.array([[v]], np.bool_),
             int: lambda v: np.array([[v]], np.int32), float: lambda v: np.array([[v]], np.float32)}
    return {name: kinds[type(value)](value) for name, value in body.items()}


def test_the_engine_flint_model_and_the_ensemble_get_the_same_requests():
    tokenizer = load_tokenizer()
    prompts = stream_prompts(tokenizer, 3, 48)
    assert len({tuple(p["prompt_ids"]) for p in prompts}) == 3  # a different prompt a stream
    assert all(44 <= len(p["prompt_ids"]) <= 48 for p in prompts)
    engine = ScriptedEngine()
    streams, outputs, _ = engine_run(engine, prompts, 5)
    assert [s.tokens for s in streams] == [5, 5, 5] and outputs == [[100, 101, 102, 103, 104]] * 3
    tokenizer_step = Preprocessor(tokenizer)
    for prompt, (engine_ids, engine_params) in zip(prompts, engine.added):
        direct, ensemble = request_body("flint_model", prompt, 5), request_body("flint", prompt, 5)
        served = tokenizer_step(triton_inputs(ensemble))
        assert engine_ids == prompt["prompt_ids"] == direct["prompt_ids"] == served.prompt_ids
        for sampling in (json.loads(direct["sampling_params"]), json.loads(served.sampling_json)):
            params = SamplingParams.from_dict(sampling)
            assert (params.temperature, params.max_tokens, params.ignore_eos) == (0.0, 5, True)
            # all else alike, but the tokenizer's fallback for requests that give no max_tokens
            assert dataclasses.replace(params, default_max_tokens=None) == engine_params
