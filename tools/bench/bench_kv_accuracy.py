#!/usr/bin/env python3
"""What an FP8 KV cache costs in accuracy, against BF16 KV on the same random weights (issue 46, item 3),
and how many long sequences each fits an H200 (item 4).

    python tools/bench/bench_kv_accuracy.py [--preset flint-small] [--quantization nvfp4] [--contexts 1024,32768]
    python tools/bench/bench_kv_accuracy.py --device cpu --preset flint-tiny
        [--kv-cache-dtype fp8] [--prompts 64] [--tokens 64] [--prompt-len 256] [--kl-prompts 4]
        [--kl-positions 64] [--kl-rows decode] [--cpu-threads 1] [--seed 0] [--out FILE]
    python tools/bench/bench_kv_accuracy.py --capacity [--capacity-tokens 100000]

Two engines with the same random weights (EngineArgs model null: preset, seed, quantization), model
dtype bfloat16 on every device, prefix caching off: the baseline with kv_cache_dtype "auto" (BF16 K/V)
and one with --kv-cache-dtype. They run one after the other (each takes the GPU's KV budget), the
first one's results kept on the host.

Greedy agreement: --prompts random prompts (ids uniform in [1, vocab), lengths uniform in
[0.75, 1.25] x --prompt-len), all added at once, --tokens greedy tokens each (ignore_eos). Per
prompt, the fraction of tokens equal before the first difference; reported: its mean, and the
fraction of prompts whose tokens are all equal.

Next-token distributions at long contexts: for each of --contexts, --kl-prompts random prompts of
that many tokens; the fp32 logits of their last --kl-positions positions, from the model driven
directly (the scheduler's steps, built as the runner builds an eager step: full distributions, not
prompt_logprobs' top 20). --kl-rows decode (the default): the prompt less those positions is
prefilled, then each position is its own decode step fed the prompt's next token (teacher forcing),
so every position reads the whole context from the KV cache as generation does; prefill: the whole
prompt prefilled in --chunk chunks, the rows taken from the prefill steps (FP8: a chunk reads its own
K/V quantised too, as qk_norm_rope hands them out). Reported: mean KL(p_bf16 || p_test) in nats over positions and
prompts, and the fraction of positions whose argmax agrees.

Defaults: CUDA flint-small (full per-layer shapes, 7 layers; weights built on the GPU), triton
kernels, contexts 1024,32768, chunk 8192; CPU flint-tiny, torch kernels, context 1024, chunk 512.

--capacity (no engine): sequences of --capacity-tokens tokens an H200 holds with flint-40b's NVFP4
weights, BF16 against FP8 KV. Assumed: 139 GiB usable of the 141 GB; weights as the NVFP4 GGUF
stores them (nvfp4_eligible tensors at 4.5 bits a weight: E2M1 codes + an E4M3 scale per 16; the
embedding and norms BF16, the routers and sinks fp32: 22.9 GB, the GGUF file 23.3 GB); the KV budget
kv_cache_memory_fraction (0.9) of what is left, ignoring the CUDA context and activations; of it
prefix_cache_window_fraction (0.1) to the prefix cache's window pages (a column without them too);
per sequence, ceil(tokens / block_size) blocks of the 14 full layers (4 KV heads x 128 x K and V
a token) and one ring row of the 35 sliding layers (513 positions).

Prints a markdown table and writes JSON (--out; by default
benchmarks/<gpu or cpu>/<date>-<commit>-kv-accuracy.json).
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root, run as a file

from flint_backend.config import FlintConfig  # noqa: E402
from flint_backend.engine.engine import LLMEngine  # noqa: E402
from flint_backend.engine.engine_args import KV_CACHE_DTYPES, EngineArgs  # noqa: E402
from flint_backend.engine.sampling_params import SamplingParams  # noqa: E402
from flint_backend.engine.step_batch import build_step_batch  # noqa: E402
from flint_backend.weights.schema import loaded_tensors, nvfp4_eligible, storage_dtype  # noqa: E402
from tools.bench.timing import command, commit, gpu_name, result_path, utc_now  # noqa: E402

BASELINE = "auto"                  # the model dtype, bfloat16: BF16 K/V
H200_USABLE_GIB = 139              # of the 141 GB an H200 has
LENGTH_SPREAD = 0.25               # greedy prompts: lengths uniform in prompt_len x [1 - s, 1 + s]


# ---------------------------------------------------------------- capacity (no engine)
def nvfp4_weight_bytes(config: FlintConfig) -> int:
    """Bytes of the weights as an NVFP4 GGUF stores them: eligible tensors as E2M1 codes (half a
    byte) + an E4M3 scale per 16 + an fp32 global scale per matrix; the rest in its storage dtype."""
    total = 0
    for t in loaded_tensors(config):
        n = math.prod(t.shape)
        if nvfp4_eligible(t.spec):
            total += n // 2 + n // 16 + 4 * math.prod(t.shape[:-2])
        else:
            total += n * storage_dtype(t.spec.kind, torch.bfloat16).itemsize
    return total


def capacity_rows(tokens: int) -> tuple[dict, list[dict]]:
    config, defaults = FlintConfig.preset("flint-40b"), EngineArgs()
    weights = nvfp4_weight_bytes(config)
    budget = defaults.kv_cache_memory_fraction * (H200_USABLE_GIB * 2**30 - weights)
    blocks = -(-tokens // defaults.block_size)
    elements = config.num_key_value_heads * config.head_dim * 2  # K and V of one layer, one position
    rows = []
    for name, nbytes in (("bfloat16", 2), ("fp8_e4m3", 1)):
        block = defaults.block_size * config.kv_bytes_per_token(nbytes)
        ring = len(config.sliding_attention_layers) * config.sliding_window * elements * nbytes
        page = len(config.sliding_attention_layers) * defaults.block_size * elements * nbytes
        pages = int(budget * defaults.prefix_cache_window_fraction) // page * page
        per_seq = blocks * block + ring
        rows.append({"kv_dtype": name, "kv_kib_per_token": config.kv_bytes_per_token(nbytes) / 1024,
                     "ring_row_mib": round(ring / 2**20, 1), "per_sequence_gib": round(per_seq / 2**30, 3),
                     "sequences": int((budget - pages) // per_seq),
                     "sequences_no_window_pages": int(budget // per_seq)})
    assumptions = {"gpu_usable_gib": H200_USABLE_GIB, "nvfp4_weight_gb": round(weights / 1e9, 2),
                   "kv_budget_gib": round(budget / 2**30, 2), "tokens": tokens, "block_size": defaults.block_size,
                   "kv_cache_memory_fraction": defaults.kv_cache_memory_fraction,
                   "prefix_cache_window_fraction": defaults.prefix_cache_window_fraction}
    return assumptions, rows


def print_capacity(tokens: int) -> None:
    a, rows = capacity_rows(tokens)
    print(f"\nflint-40b, NVFP4 weights {a['nvfp4_weight_gb']} GB (the GGUF's tensors) on an H200 "
          f"({a['gpu_usable_gib']} GiB usable): KV budget {a['kv_cache_memory_fraction']} x the rest = "
          f"{a['kv_budget_gib']} GiB ({a['prefix_cache_window_fraction']} of it window pages); sequences of "
          f"{tokens} tokens, {a['block_size']}-token blocks; CUDA context and activations not counted\n")
    cols = ["kv_dtype", "kv_kib_per_token", "ring_row_mib", "per_sequence_gib", "sequences",
            "sequences_no_window_pages"]
    print("| " + " | ".join(cols) + " |")
    print("|" + "---|" * len(cols))
    for row in rows:
        print("| " + " | ".join(str(row[c]) for c in cols) + " |")
    print(f"\n(more than max_num_seqs={EngineArgs().max_num_seqs}, the default, run at once only with it raised)")


# ---------------------------------------------------------------- measuring
def random_prompts(rng: np.random.Generator, lengths, vocab: int) -> list[list[int]]:
    return [rng.integers(1, vocab, size=int(n)).tolist() for n in lengths]


def engine_args(args, kv_dtype: str, max_model_len: int, num_kv_blocks: int | None) -> EngineArgs:
    return EngineArgs(preset=args.preset, quantization=args.quantization, seed=args.seed, dtype="bfloat16",
                      device=args.device, kernel_backend=args.kernel_backend, kv_cache_dtype=kv_dtype,
                      block_size=args.block_size, max_num_seqs=args.prompts, max_num_batched_tokens=args.chunk,
                      max_model_len=max_model_len, num_kv_blocks=num_kv_blocks, enable_prefix_caching=False,
                      enforce_eager=args.device == "cpu")


def greedy_outputs(engine: LLMEngine, prompts: list[list[int]], tokens: int) -> list[list[int]]:
    params = SamplingParams(temperature=0.0, max_tokens=tokens, ignore_eos=True)
    ids = {engine.add_request(p, params).request_id: [] for p in prompts}
    while engine.has_work():
        for out in engine.step():
            ids[out.request_id] += out.new_token_ids
    return list(ids.values())


def context_logits(engine: LLMEngine, prompts: list[list[int]], positions: int, decode: bool) -> list[torch.Tensor]:
    """fp32 logits [positions, V] of each prompt's last `positions` positions. The scheduler's steps
    run as the runner's eager path runs them (window copies, the step batch, the forward, then the
    prefix cache told what was computed), the head applied to the wanted rows only. decode: those
    positions are held back from the prompt and fed one a step once it is computed."""
    assert not engine.has_work(), "context_logits drives the model itself: the engine must be idle"
    held = positions if decode else 0
    params = SamplingParams(temperature=0.0, max_tokens=max(held, 1))
    seqs = {engine.add_request(p[:len(p) - held], params).request_id: p for p in prompts}
    got: dict[str, list[torch.Tensor]] = {rid: [] for rid in seqs}
    model = engine.runner.model
    while engine.has_work():
        scheduled = engine.scheduler.schedule()
        if scheduled.preempted:
            raise SystemExit("kv cache: a sequence was preempted; give the pool more blocks (--num-kv-blocks)")
        engine.runner.copy_windows(engine.prefix_cache.take_copies())
        batch = build_step_batch(scheduled.entries, engine.blocks.block_size, engine.config.sliding_window,
                                 engine.device)
        x, residual = model.hidden_states(batch, engine.runner.kv)  # [N, H]
        rows, owners, start = [], [], 0
        for seq, n in scheduled.entries:
            first = max(seq.num_computed, len(seqs[seq.request_id]) - positions)
            rows += [start + p - seq.num_computed for p in range(first, seq.num_computed + n)]
            owners += [seq.request_id] * max(0, seq.num_computed + n - first)
            start += n
        if rows:
            logits = model.logits_of_rows(x, residual, torch.tensor(rows, device=engine.device)).float().cpu()
            for rid, row in zip(owners, logits):
                got[rid].append(row)
        direct = not batch.decode_only  # a prefill-path step writes open pages (engine._step_sync)
        for seq, n in scheduled.entries:
            seq.num_computed += n
            engine.prefix_cache.computed(seq, seq.num_computed - n, n, direct)
            prompt = seqs[seq.request_id]
            if seq.num_computed == seq.num_tokens < len(prompt):
                seq.token_ids.append(prompt[seq.num_tokens])  # teacher forcing: the prompt's next token
            elif seq.num_computed == len(prompt):
                engine.abort(seq.request_id)
    return [torch.stack(got[rid]) for rid in seqs]


def run_engine(args, kv_dtype: str, greedy_prompts, kl_prompts: dict[int, list], max_model_len: int,
               num_kv_blocks: int | None) -> dict:
    """One engine: the greedy outputs and each context's logits; freed before returning."""
    cuda = args.device != "cpu"
    t0 = time.perf_counter()
    engine = LLMEngine(engine_args(args, kv_dtype, max_model_len, num_kv_blocks))
    spec = engine.runner.kv_spec
    result = {"build_s": round(time.perf_counter() - t0, 1), "pool_tokens": spec.num_blocks * spec.block_size}
    t0 = time.perf_counter()
    result["outputs"] = greedy_outputs(engine, greedy_prompts, args.tokens)
    result["greedy_s"] = round(time.perf_counter() - t0, 1)
    result["logits"] = {}
    for context, prompts in kl_prompts.items():
        t0 = time.perf_counter()
        result["logits"][context] = context_logits(engine, prompts, args.kl_positions, args.kl_rows == "decode")
        result[f"kl_{context}_s"] = round(time.perf_counter() - t0, 1)
        print(f"  kv {kv_dtype}: context {context} done in {result[f'kl_{context}_s']} s", flush=True)
    del engine
    gc.collect()
    if cuda:
        torch.cuda.empty_cache()
    return result


# ---------------------------------------------------------------- comparing
def prefix_fraction(a: list[int], b: list[int]) -> float:
    """Tokens equal before the first difference / tokens."""
    n = min(len(a), len(b))
    differ = next((i for i in range(n) if a[i] != b[i]), n)
    return differ / max(len(a), len(b))


def distribution_stats(ref: list[torch.Tensor], test: list[torch.Tensor]) -> dict:
    """Mean KL(p_ref || p_test) in nats and top-1 agreement over every prompt's positions."""
    p, q = torch.cat(ref).double(), torch.cat(test).double()  # [prompts * positions, V]
    logp, logq = p.log_softmax(-1), q.log_softmax(-1)
    kl = (logp.exp() * (logp - logq)).sum(-1)
    per_prompt = [round(float(k.mean()), 8) for k in kl.split([len(r) for r in ref])]
    return {"mean_kl_nats": float(kl.mean()), "max_kl_nats": float(kl.max()),
            "top1_agreement": float((p.argmax(-1) == q.argmax(-1)).double().mean()), "per_prompt_kl": per_prompt}


def compare(base: dict, test: dict) -> dict:
    fractions = [prefix_fraction(a, b) for a, b in zip(base["outputs"], test["outputs"])]
    return {"greedy": {"mean_prefix_fraction": float(np.mean(fractions)),
                       "identical_prompts": float(np.mean([f == 1.0 for f in fractions])),
                       "per_prompt_prefix_fraction": [round(f, 4) for f in fractions]},
            "contexts": {str(c): distribution_stats(base["logits"][c], test["logits"][c]) for c in base["logits"]}}


def print_table(results: dict) -> None:
    m, c = results["meta"], results["comparison"]
    print(f"\n{m['command']}\n{m['machine']}, {m['date']}, commit {m['commit']}; {m['model']}, kernels "
          f"{m['kernel_backend']}; greedy {m['prompts']} prompts x {m['tokens']} tokens (prompts ~{m['prompt_len']}); "
          f"KL over {m['kl_prompts']} prompts x last {m['kl_positions']} positions ({m['kl_rows']} rows), "
          f"KL(p_bf16 || p_{m['kv_cache_dtype']}) in nats; {m['total_s']} s\n")
    cols = ["model", "kv dtype", "greedy agreement (mean prefix fraction)", "identical prompts"]
    row = [m["model"], m["kv_cache_dtype"], f"{c['greedy']['mean_prefix_fraction']:.4f}",
           f"{c['greedy']['identical_prompts']:.4f}"]
    for context, stats in c["contexts"].items():
        cols += [f"mean KL @{context}", f"top-1 @{context}"]
        row += [f"{stats['mean_kl_nats']:.3e}", f"{stats['top1_agreement']:.4f}"]
    print("| " + " | ".join(cols) + " |")
    print("|" + "---|" * len(cols))
    print("| " + " | ".join(row) + " |")


# ---------------------------------------------------------------- main
def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--capacity", action="store_true", help="print the H200 capacity table and exit")
    parser.add_argument("--capacity-tokens", type=int, default=100_000)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--preset", help="default: flint-small on CUDA, flint-tiny on the CPU")
    parser.add_argument("--quantization", default=None, help="nvfp4: the random weights quantised")
    parser.add_argument("--kernel-backend", help="default: triton on CUDA, torch on the CPU")
    parser.add_argument("--kv-cache-dtype", default="fp8", help=f"against {BASELINE!r}: one of {KV_CACHE_DTYPES}")
    parser.add_argument("--prompts", type=int, default=64)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--prompt-len", type=int, default=256)
    parser.add_argument("--contexts", help="KL contexts in tokens; default 1024,32768 (CPU: 1024)")
    parser.add_argument("--kl-prompts", type=int, default=4)
    parser.add_argument("--kl-positions", type=int, default=64)
    parser.add_argument("--kl-rows", default="decode", choices=("decode", "prefill"))
    parser.add_argument("--chunk", type=int, help="max_num_batched_tokens; default 8192 (CPU: 512)")
    parser.add_argument("--block-size", type=int, default=64)
    parser.add_argument("--num-kv-blocks", type=int, help="default: what the runs need (CPU), the memory budget (CUDA)")
    parser.add_argument("--cpu-threads", type=int, default=1, help="CPU: torch threads (two on two busy cores ran "
                        "the greedy part up to 6x slower than one)")
    parser.add_argument("--seed", type=int, default=0, help="weights and prompts")
    parser.add_argument("--out", type=Path, help="default: benchmarks/<gpu>/<date>-<commit>-kv-accuracy.json")
    return parser.parse_args()


def check_args(args, config: FlintConfig, contexts: list[int]) -> None:
    if args.kv_cache_dtype not in KV_CACHE_DTYPES:
        raise SystemExit(f"--kv-cache-dtype: got {args.kv_cache_dtype!r}, expected one of {KV_CACHE_DTYPES}")
    if min(args.prompts, args.tokens, args.prompt_len, args.kl_prompts, args.kl_positions) < 1:
        raise SystemExit("--prompts, --tokens, --prompt-len, --kl-prompts and --kl-positions: expected >= 1")
    if min(contexts) <= args.kl_positions:
        raise SystemExit(f"--contexts: got {min(contexts)}, expected more than --kl-positions={args.kl_positions}")
    longest = max(max(contexts), math.ceil(args.prompt_len * (1 + LENGTH_SPREAD)) + args.tokens)
    if longest >= config.max_position_embeddings:
        raise SystemExit(f"--contexts / --prompt-len: {longest} tokens, expected fewer than {args.preset}'s "
                         f"context of {config.max_position_embeddings}")


def make_prompts(args, config: FlintConfig, contexts: list[int]) -> tuple[list, dict[int, list]]:
    """The greedy prompts and each context's KL prompts (random ids, seeded by --seed)."""
    rng = np.random.default_rng([args.seed, 1])
    lo, hi = round(args.prompt_len * (1 - LENGTH_SPREAD)), round(args.prompt_len * (1 + LENGTH_SPREAD))
    greedy = random_prompts(rng, rng.integers(lo, hi + 1, size=args.prompts), config.vocab_size)
    kl = {c: random_prompts(np.random.default_rng([args.seed, 2, c]), [c] * args.kl_prompts, config.vocab_size)
          for c in contexts}
    return greedy, kl


def main() -> None:
    args = parse_args()
    if args.capacity:
        print_capacity(args.capacity_tokens)
        return
    cpu = args.device == "cpu"
    if cpu:
        torch.set_num_threads(args.cpu_threads)
    args.preset = args.preset or ("flint-tiny" if cpu else "flint-small")
    args.kernel_backend = args.kernel_backend or ("torch" if cpu else "triton")
    args.chunk = args.chunk or (512 if cpu else 8192)
    contexts = [int(c) for c in (args.contexts or ("1024" if cpu else "1024,32768")).split(",")]
    config = FlintConfig.preset(args.preset)
    check_args(args, config, contexts)
    args.out = args.out or result_path("kv-accuracy", args.device)

    greedy_prompts, kl_prompts = make_prompts(args, config, contexts)
    max_model_len = max(max(contexts), max(map(len, greedy_prompts)) + args.tokens) + 1
    bs = args.block_size
    need = max(sum(-(-(len(p) + args.tokens) // bs) for p in greedy_prompts), args.kl_prompts * -(-max(contexts) // bs))
    num_kv_blocks = args.num_kv_blocks or (need + args.prompts + -(-max_model_len // bs) if cpu else None)
    t0 = time.perf_counter()
    base = run_engine(args, BASELINE, greedy_prompts, kl_prompts, max_model_len, num_kv_blocks)
    test = run_engine(args, args.kv_cache_dtype, greedy_prompts, kl_prompts, max_model_len, num_kv_blocks)

    settings = {k: v for k, v in vars(args).items() if k not in ("out", "capacity", "capacity_tokens")}
    meta = {"date": utc_now(), "machine": gpu_name(args.device) if not cpu else f"CPU, torch threads: "
            f"{torch.get_num_threads()}", "commit": commit(), "command": command(__file__), "torch": torch.__version__,
            "total_s": round(time.perf_counter() - t0, 1), "dtype": "bfloat16", "baseline_kv_cache_dtype": BASELINE,
            "model": f"{args.preset} (random weights, {args.quantization or 'bf16'})", **settings,
            "contexts": contexts, "max_model_len": max_model_len, "num_kv_blocks": num_kv_blocks,
            "unit": "greedy: fractions of tokens / prompts; KL(p_bf16 || p_test) in nats, mean over positions"}
    engines = {name: {k: v for k, v in r.items() if k not in ("outputs", "logits")}
               for name, r in (("baseline", base), ("test", test))}
    results = {"meta": meta, "engines": engines, "comparison": compare(base, test)}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    print_table(results)


if __name__ == "__main__":
    main()
