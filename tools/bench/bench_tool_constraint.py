#!/usr/bin/env python3
"""What holding tool calls to their grammar costs a decode step (serving.tool_constraint).

    python tools/bench/bench_tool_constraint.py [--batch-sizes 1,64] [--steps 40] [--device cpu] [--out FILE]

The flint-tiny engine decodes a batch of chat requests with two tools, tool_choice "auto" (free
text, calls held to the tools: the grammar's bitmask is filled and applied every step), in three
batches of the same size: none constrained, all constrained, and one constrained among
unconstrained ones. Reports the median step time of each and the cost a constrained token adds
((all - none) / batch); "one" against "none" is what a constrained request costs its neighbours.
Prints a markdown table and writes JSON (--out; by default benchmarks/<device>/<date>-<commit>-tool-constraint.json).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from datetime import date
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root, run as a file

from flint_backend.chat.chat_options import ANNOUNCED_OPTIONS  # noqa: E402
from flint_backend.engine.engine import LLMEngine  # noqa: E402
from flint_backend.engine.engine_args import EngineArgs  # noqa: E402
from flint_backend.engine.sampling_params import SamplingParams  # noqa: E402
from flint_backend.serving.preprocess import Preprocessor  # noqa: E402
from flint_backend.tokenizer import load_tokenizer  # noqa: E402
from tools.bench.timing import command, commit, gpu_name, result_path  # noqa: E402

TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}, "required": ["city"]}}},
    {"type": "function", "function": {"name": "set_alarm", "parameters": {
        "type": "object", "properties": {"hour": {"type": "integer"}, "loud": {"type": "boolean"}}}}}]


WARM_STEPS = 10


def chat_params(preprocess: Preprocessor, constrained: bool, steps: int, seed: int) -> tuple[list[int], SamplingParams]:
    def text(value) -> np.ndarray:
        return np.array([[json.dumps(value).encode()]], dtype=np.object_)

    inputs = {"messages": text([{"role": "user", "content": "Plan my week."}]), "tools": text(TOOLS),
              "tool_choice": text("auto" if constrained else "none"),
              "chat_template_kwargs": text({"enable_thinking": False}),
              "sampling_parameters": text({"max_tokens": steps + 8, "seed": seed, "ignore_eos": True})}
    p = preprocess(inputs)
    params = SamplingParams.from_dict(json.loads(p.sampling_json))
    assert (params.structural_tag is not None) == constrained
    return p.prompt_ids, params


def step_ms(device: str, batch: int, constrained: int, steps: int, preprocess: Preprocessor) -> float:
    """Median decode-step time with `constrained` of `batch` requests held to the grammar."""
    engine = LLMEngine(EngineArgs(dtype="float32" if device == "cpu" else "bfloat16", device=device,
                                  max_num_seqs=batch, max_num_batched_tokens=max(2048, batch), block_size=16,
                                  max_model_len=1024, enforce_eager=device == "cpu"))
    for i in range(batch):
        engine.add_request(*chat_params(preprocess, i < constrained, steps + WARM_STEPS, seed=i))
    while any(not s.is_decoding for s in engine.scheduler.running) or engine.scheduler.waiting:
        engine.step()  # the prefills
    for _ in range(WARM_STEPS):
        engine.step()  # warm: the grammar compiled, matchers made, kernels compiled and graphs captured
    times = []
    for _ in range(steps):
        if device != "cpu":
            torch.cuda.synchronize()
        start = time.perf_counter()
        engine.step()
        if device != "cpu":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch-sizes", default="1,64")
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--out", type=Path, help="default: benchmarks/<device>/<date>-<commit>-tool-constraint.json")
    args = parser.parse_args()
    args.out = args.out or result_path("tool-constraint", args.device)
    if args.device == "cpu":
        torch.set_num_threads(1)
    preprocess = Preprocessor(load_tokenizer(), ANNOUNCED_OPTIONS)
    rows = []
    for batch in (int(b) for b in args.batch_sizes.split(",")):
        none = step_ms(args.device, batch, 0, args.steps, preprocess)
        every = step_ms(args.device, batch, batch, args.steps, preprocess)
        one = step_ms(args.device, batch, 1, args.steps, preprocess) if batch > 1 else every
        rows.append({"batch": batch, "none_ms": round(none, 3), "all_ms": round(every, 3), "one_ms": round(one, 3),
                     "per_constrained_token_ms": round((every - none) / batch, 4),
                     "one_vs_none": round(one / none, 3)})
    machine = gpu_name(args.device) if args.device != "cpu" else "CPU, 1 torch thread"
    meta = {"date": date.today().isoformat(), "machine": machine, "commit": commit(), "command": command(__file__),
            "unit": "ms per decode step (median)", "model": "flint-tiny (random weights)"}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"meta": meta, "rows": rows}, indent=2) + "\n")
    cols = ["batch", "none_ms", "all_ms", "one_ms", "per_constrained_token_ms", "one_vs_none"]
    print(f"\n{meta['command']}  ({meta['date']}, {machine}, commit {meta['commit']}; ms per step, median)\n")
    print("| " + " | ".join(cols) + " |")
    print("|" + "---|" * len(cols))
    for row in rows:
        print("| " + " | ".join(str(row[c]) for c in cols) + " |")


if __name__ == "__main__":
    main()
