"""Does a decode batch of B rows launch every kernel as the graph bucket that replays it does?

A decode graph replays a step of B sequences in the smallest bucket >= B (decode_graphs.py:
powers of two), the rows past B padding. The replay gives the eager step's bits only if every
launch of the step takes the same config at B rows as at the bucket's: the same constexprs,
launch options and grid beyond the token axis (rows a program, splits, tiles), so that each row
is summed in the same order. This records the launches of one decode layer of each kind at
flint-40b's real shapes, BF16 and NVFP4, as on a 132-SM H200 (recorded, not run:
compile_kernels.record), and prints each launch whose config differs between B and its bucket.
Exit status 1 if any does.

    python tools/bench/bucket_configs.py [--rows 3]

Rows 3 (bucket 4) is the case the GEMV launches take (T <= 4); larger batches reach cuBLAS
(BF16) and the tiled GEMM, outside this check.
"""

from __future__ import annotations

import argparse
import importlib
import pkgutil
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root, run as a file

import tools.bench.compile_kernels as ck  # noqa: E402  (first: compiles for the GPU, not the interpreter)

import torch  # noqa: E402

import flint_kernels  # noqa: E402
from flint_backend import ops as ops_module  # noqa: E402
from flint_backend.engine.decode_graphs import BUCKETS  # noqa: E402
from flint_kernels import split_k  # noqa: E402

H, I_DENSE, I_MOE, I_SHARED, EXPERTS, TOP_K = 2048, 6144, 512, 1024, 256, 6
HQ, HK, D, WINDOW, BLOCK = 32, 4, 128, 513, 64
VOCAB = 150144
KERNEL_MODULES = tuple(importlib.import_module(f"flint_kernels.{m.name}")
                       for m in pkgutil.iter_modules(flint_kernels.__path__))


def layer_calls(t: int, fp4: bool) -> dict:
    """One decode layer's ops (ops.py, the triton backend) at t rows, each a thunk: the calls
    model.py makes in a decode step, with zero weights of the real shapes."""
    ops, bf16 = ops_module.get_ops("triton"), torch.bfloat16

    def weight(*shape, fused=False):
        return ck.nvfp4(*shape, per_row=fused) if fp4 else torch.zeros(*shape, dtype=bf16)

    x, res, norm_w = torch.randn(t, H, dtype=bf16), torch.randn(t, H, dtype=bf16), torch.randn(H, dtype=bf16)
    qkv = torch.randn(t, (HQ + 2 * HK) * D, dtype=bf16)
    q, k = torch.randn(t, HQ, D, dtype=bf16), torch.randn(t, HK, D, dtype=bf16)
    paged, ring = torch.zeros(8, BLOCK, HK, D, dtype=bf16), torch.zeros(t, WINDOW, HK, D, dtype=bf16)
    lens, slots = torch.full((t,), 300, dtype=torch.int32), torch.arange(t)
    tables, rows = torch.zeros(t, 8, dtype=torch.int32), torch.arange(t, dtype=torch.int32)
    attention = dict(query_start_loc=torch.arange(t + 1, dtype=torch.int32), context_lens=lens,
                     sinks=torch.zeros(HQ), sm_scale=D ** -0.5, decode_only=True, max_query_len=1)
    router_w = torch.randn(EXPERTS, H, dtype=bf16)
    experts = (weight(EXPERTS, 2 * I_MOE, H, fused=True), weight(EXPERTS, H, I_MOE),
               weight(2 * I_SHARED, H, fused=True), weight(H, I_SHARED))
    return {
        "qkv": lambda: ops.norm_linear(x, res, norm_w, 1e-5, weight((HQ + 2 * HK) * D, H, fused=True)),
        "qk_norm_rope": lambda: ops.qk_norm_rope(qkv, torch.ones(D, dtype=bf16), torch.ones(D, dtype=bf16), slots,
                                                 torch.randn(4096, D), 1e-5, HQ, HK, paged, paged, slots),
        "attention full": lambda: ops.attention(q, k, k, k_cache=paged, v_cache=paged, window=0,
                                                block_tables=tables, **attention),
        "attention sliding": lambda: ops.attention(q, k, k, k_cache=ring, v_cache=ring, window=WINDOW,
                                                   ring_rows=rows, **attention),
        "o_proj": lambda: ops.linear(torch.randn(t, HQ * D, dtype=bf16), weight(H, HQ * D)),
        "dense gate/up": lambda: ops.norm_linear(x, res, norm_w, 1e-5, weight(2 * I_DENSE, H, fused=True)),
        "dense down": lambda: ops.silu_linear(torch.randn(t, 2 * I_DENSE, dtype=bf16), weight(H, I_DENSE)),
        "moe": lambda: ops.norm_moe(x, res, norm_w, 1e-5, router_w, TOP_K, True, *experts),
        "head": lambda: ops.norm_logits(x, res, norm_w, 1e-5, torch.zeros(VOCAB, H, dtype=bf16),
                                        torch.zeros(t, dtype=torch.int64)),
    }


def launch_configs(call) -> list[tuple]:
    """(kernel, its non-tensor arguments but T, grid past the token axis) of each launch."""
    out = []
    for fn, kwargs, grid in ck.record(KERNEL_MODULES, call):
        args = {key: value for key, value in kwargs.items() if not isinstance(value, torch.Tensor) and key != "T"}
        out.append((fn.__name__, args, tuple(grid)[1:]))
    return out


def differences(rows: int) -> list[str]:
    bucket = next(b for b in BUCKETS if b >= rows)  # DecodeGraphs.bucket_for at the largest max batch
    found = []
    for fmt in ("bf16", "nvfp4"):
        at_rows, at_bucket = layer_calls(rows, fmt == "nvfp4"), layer_calls(bucket, fmt == "nvfp4")
        for name in at_rows:
            a, b = launch_configs(at_rows[name]), launch_configs(at_bucket[name])
            if not a:
                raise RuntimeError(f"{fmt} {name}: no kernel launch recorded (a torch op, not a kernel?)")
            if [fn for fn, _, _ in a] != [fn for fn, _, _ in b]:
                found.append(f"{fmt} {name}: launches {[fn for fn, _, _ in a]} at {rows} rows, "
                             f"{[fn for fn, _, _ in b]} at {bucket}")
                continue
            for (fn, args_a, grid_a), (_, args_b, grid_b) in zip(a, b):
                changed = {key: (args_a.get(key), args_b.get(key)) for key in sorted(set(args_a) | set(args_b))
                           if args_a.get(key) != args_b.get(key)}
                if changed or grid_a != grid_b:
                    found.append(f"{fmt} {name}: {fn} at {rows} rows vs {bucket}: {changed or ''} "
                                 f"grid {grid_a} vs {grid_b}")
    return found


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", default="3", help="comma-separated batch sizes (default 3)")
    args = parser.parse_args(argv)
    split_k.HOST_SMS = ck.H200_SMS  # grids as the GPU launcher would size them
    found = []
    for rows in (int(r) for r in args.rows.split(",")):
        found += differences(rows)
    print("\n".join(found) or "every launch takes its bucket's config")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
