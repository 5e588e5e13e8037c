#!/usr/bin/env python3
"""Per-op GPU time of one batch-1 decode layer at full size, each op replayed from a CUDA graph
(so launch overhead is what a graph pays, not Python's), with variants side by side.

    python tools/bench/bench_decode_ops.py [--context 100000] [--out FILE]

Prints a markdown table (us per call, GB/s, % of copy bandwidth) and writes JSON (--out; by default
benchmarks/<gpu>/<date>-<commit>-decode-ops.json). This is the
diagnostic behind docs/performance.md: which op of the decode step is far from its floor.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root, run as a file

from flint_backend.model import rope_cos_sin_cache  # noqa: E402
from flint_backend.weights.nvfp4_quantize import quantize_nvfp4  # noqa: E402
from flint_backend.weights.nvfp4 import concat_rows  # noqa: E402
from flint_kernels import decode_attention, moe, nvfp4_linear, qk_norm_rope, rms_norm, router, tuning  # noqa: E402
from tools.bench.timing import (GRAPH_REPS, command, copy_bandwidth, cycled, gpu_name, graph_us, nbytes,  # noqa: E402
                                result_path, utc_now)

H, HQ, HK, D, E, I, IS, K, V = 2048, 32, 4, 128, 256, 512, 1024, 6, 150144


def words(fn, flag: bool):
    """fn with tuning.FP4_GEMV_WORDS, FP4_MOE_WORDS and FP4_MOE_DOWN_WORDS set to `flag` for its
    launches (bytes or 32-bit words)."""
    names = ("FP4_GEMV_WORDS", "FP4_MOE_WORDS", "FP4_MOE_DOWN_WORDS")

    def call():
        saved = [getattr(tuning, name) for name in names]
        for name in names:
            setattr(tuning, name, flag)
        try:
            return fn()
        finally:
            for name, value in zip(names, saved):
                setattr(tuning, name, value)
    return call


def cases(context: int):
    dev, bf16 = "cuda", torch.bfloat16
    r = lambda *s, scale=1.0: (torch.randn(*s, device=dev) * scale).to(bf16)
    x, res = r(1, H), r(1, H)
    norm_w, dw = 1 + r(H, scale=0.1), 1 + r(D, scale=0.1)
    qkv = r((HQ + 2 * HK) * D, H, scale=H ** -0.5)
    qkv4 = concat_rows([quantize_nvfp4(p) for p in qkv.split([HQ * D, HK * D, HK * D])])
    o = r(H, HQ * D, scale=(HQ * D) ** -0.5)
    o4 = quantize_nvfp4(o)
    cos_sin = rope_cos_sin_cache(4096, D, 10000.0, dev)
    pos, slot = torch.tensor([100], device=dev), torch.tensor([100], device=dev)
    paged = [torch.randn(context // 64 + 2, 64, HK, D, device=dev).to(bf16) for _ in range(2)]
    ring = [torch.randn(1, 513, HK, D, device=dev).to(bf16) for _ in range(2)]
    tables = torch.arange(context // 64 + 2, device=dev, dtype=torch.int32)[None]
    lens = torch.tensor([context], device=dev, dtype=torch.int32)
    q, k, v = r(1, HQ, D), r(1, HK, D), r(1, HK, D)
    sinks = torch.zeros(HQ, device=dev)
    router_w = r(E, H, scale=H ** -0.5)
    w13, w2 = r(E, 2 * I, H, scale=H ** -0.5), r(E, H, I, scale=I ** -0.5)
    sw13, sw2 = r(2 * IS, H, scale=H ** -0.5), r(H, IS, scale=IS ** -0.5)
    w13_4, w2_4 = quantize_nvfp4(w13), quantize_nvfp4(w2)
    sw13_4, sw2_4 = quantize_nvfp4(sw13), quantize_nvfp4(sw2)
    ids, wts = router.router_topk(x, router_w, K, True)
    lm = r(V, H, scale=H ** -0.5)
    chosen = K / E
    yield "rms_norm +residual", lambda: rms_norm.rms_norm(x, norm_w, 1e-5, residual=res), nbytes(x, res, res)
    yield "qkv bf16 cuBLAS", lambda: F.linear(x, qkv), nbytes(qkv)
    for flag in (False, True):
        yield f"qkv nvfp4{' words' if flag else ''}", words(lambda: nvfp4_linear.nvfp4_linear(x, qkv4), flag), \
            nbytes(qkv4)
    # the qkv projection's output, made once: the op alone (this row once timed F.linear with it)
    qkv_out = F.linear(x, qkv)
    for heads in (None, 2, 4, HQ):  # HQ: all of a token's Q heads in one program, as before
        yield f"qk_norm_rope +write heads/program={heads or 'default'}", \
            lambda heads=heads: qk_norm_rope.qk_norm_rope(qkv_out, dw, dw, pos, cos_sin, 1e-5, HQ, HK, ring[0],
                                                          ring[1], slot, heads_per_program=heads), 0
    qkv64 = F.linear(r(64, H), qkv)
    pos64 = torch.arange(100, 164, device=dev)
    yield "qk_norm_rope +write N=64", lambda: qk_norm_rope.qk_norm_rope(
        qkv64, dw, dw, pos64, cos_sin, 1e-5, HQ, HK, ring[0], ring[1], pos64), 0
    for splits in (None, 32, 128):
        yield f"decode attn full ctx={context} splits={splits or 'default'}", \
            lambda s=splits: decode_attention.decode_attention(q, k, v, paged[0], paged[1], lens, sinks, D ** -0.5,
                                                               0, block_tables=tables, num_splits=s), \
            2 * context * HK * D * 2
    ring_len, ring_row = torch.tensor([512], device=dev, dtype=torch.int32), torch.zeros(1, device=dev, dtype=torch.int32)
    yield "decode attn ring 513", lambda: decode_attention.decode_attention(
        q, k, v, ring[0], ring[1], ring_len, sinks, D ** -0.5, 513, ring_rows=ring_row), 2 * 513 * HK * D * 2
    yield "o_proj bf16 cuBLAS", lambda: F.linear(q.view(1, -1), o), nbytes(o)
    for flag in (False, True):
        yield f"o_proj nvfp4{' words' if flag else ''}", \
            words(lambda: nvfp4_linear.nvfp4_linear(q.view(1, -1), o4), flag), nbytes(o4)
    yield "router", lambda: router.router_topk(x, router_w, K, True), nbytes(router_w)
    for tile in ((1, 1), (1, 4), (1, 8), (16, 16)):  # (tokens, experts) a program; default (1, 2)
        yield f"router tile={tile}", \
            lambda tile=tile: router.router_topk(x, router_w, K, True, tile=tile), nbytes(router_w)
    x8, x64 = r(8, H), r(64, H)
    yield "router T=8", lambda: router.router_topk(x8, router_w, K, True), nbytes(router_w)
    yield "router T=64", lambda: router.router_topk(x64, router_w, K, True), nbytes(router_w)
    yield "moe bf16 small", lambda: moe.fused_moe(x, ids, wts, w13, w2, sw13, sw2), \
        int(chosen * nbytes(w13, w2)) + nbytes(sw13, sw2)
    for flag in (False, True):
        yield f"moe nvfp4 small{' words' if flag else ''}", \
            words(lambda: moe.fused_moe(x, ids, wts, w13_4, w2_4, sw13_4, sw2_4), flag), \
            int(chosen * nbytes(w13_4, w2_4)) + nbytes(sw13_4, sw2_4)
    # L2-cold rows: COPIES weight sets (or expert choices) taken in turn, as the layers of a step do
    copies = 12
    qkv4s = [quantize_nvfp4(r((HQ + 2 * HK) * D, H, scale=H ** -0.5)) for _ in range(copies)]
    o4s = [quantize_nvfp4(r(H, HQ * D, scale=(HQ * D) ** -0.5)) for _ in range(copies)]
    choices = [router.router_topk(r(1, H), router_w, K, True) for _ in range(copies)]
    for flag in (False, True):
        name = " words" if flag else ""
        yield f"qkv nvfp4{name} L2-cold", words(cycled([lambda w=w: nvfp4_linear.nvfp4_linear(x, w)
                                                         for w in qkv4s]), flag), nbytes(qkv4)
        yield f"o_proj nvfp4{name} L2-cold", words(cycled([lambda w=w: nvfp4_linear.nvfp4_linear(q.view(1, -1), w)
                                                            for w in o4s]), flag), nbytes(o4)
        yield f"moe nvfp4 small{name} L2-cold", words(cycled(
            [lambda c=c: moe.fused_moe(x, c[0], c[1], w13_4, w2_4, sw13_4, sw2_4) for c in choices]), flag), \
            int(chosen * nbytes(w13_4, w2_4)) + nbytes(sw13_4, sw2_4)
    yield "moe bf16 small L2-cold", cycled([lambda c=c: moe.fused_moe(x, c[0], c[1], w13, w2, sw13, sw2)
                                           for c in choices]), int(chosen * nbytes(w13, w2)) + nbytes(sw13, sw2)
    yield "lm head bf16 cuBLAS", lambda: F.linear(x, lm), nbytes(lm)
    yield "argmax V", lambda: F.linear(x, lm).argmax(-1), nbytes(lm)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--context", type=int, default=100000)
    parser.add_argument("--out", type=Path, help="default: benchmarks/<gpu>/<date>-<commit>-decode-ops.json")
    args = parser.parse_args()
    args.out = args.out or result_path("decode-ops")
    bandwidth = copy_bandwidth()
    rows = []
    for name, fn, moved in cases(args.context):
        try:
            us = graph_us(fn)
        except Exception as e:  # report and go on: one broken variant must not hide the rest
            rows.append({"op": name, "error": f"{type(e).__name__}: {str(e)[:120]}"})
            print(f"{name}: {rows[-1]['error']}", flush=True)
            continue
        gbs = moved / us / 1e3
        rows.append({"op": name, "us": round(us, 2), "bytes": moved, "gb_s": round(gbs), "pct_copy":
                     round(100 * gbs * 1e9 / bandwidth, 1)})
        print(f"{name}: {us:.2f} us", flush=True)
    meta = {"gpu": gpu_name(), "date": utc_now(), "command": command(__file__, ["--context", str(args.context)]),
            "copy_tb_s": round(bandwidth / 1e12, 3), "reps_per_graph": GRAPH_REPS}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"meta": meta, "rows": rows}, indent=2) + "\n")
    print(f"\n{meta['command']} -- {meta['gpu']}, {meta['date']}, copy {meta['copy_tb_s']} TB/s\n")
    print("| op (batch 1, full size) | us | GB/s | % copy |\n|---|---:|---:|---:|")
    for row in rows:
        print(f"| {row['op']} | {row.get('us', row.get('error'))} | {row.get('gb_s', '')} | {row.get('pct_copy', '')} |")


if __name__ == "__main__":
    main()
