"""Write a random-weight NVFP4 GGUF of a preset, load it onto the device, report time and memory.

    python tools/bench/bench_load.py --preset flint-40b --out /tmp/flint-bench --device cuda
    python tools/bench/bench_load.py --preset flint-tiny --out /tmp/flint-bench --device cpu

Weights are generated tensor by tensor on `--device` (flint_backend.weights.random_init) and
quantised there, so neither the host nor the GPU holds the whole BF16 model; flint-40b is a
~22 GB file. The load reads the file right after it was written, so it is probably served from
the page cache: a cold-cache load is slower. Prints a table and writes JSON (`--json`).
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import resource
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root, run as a file

from flint_backend.config import PRESETS, FlintConfig  # noqa: E402
from flint_backend.weights.gguf_writer import write_gguf  # noqa: E402
from flint_backend.weights.loader import load_checkpoint  # noqa: E402
from flint_backend.weights.nvfp4 import NVFP4Weight  # noqa: E402
from flint_backend.weights.random_init import random_tensor  # noqa: E402
from flint_backend.weights.schema import checkpoint_tensors, storage_dtype  # noqa: E402


def random_source(config: FlintConfig, seed: int, device: str):
    """HF name -> the deterministic random tensor a BF16 checkpoint would store, made on `device`."""
    specs = {name: (shape, spec) for name, shape, spec in checkpoint_tensors(config)}

    def source(name: str) -> torch.Tensor:
        shape, spec = specs[name]
        return random_tensor(name, shape, spec.kind, seed, device).to(storage_dtype(spec.kind, torch.bfloat16))

    return source


def _sync(device: str) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def bench(preset: str, out: Path, device: str, seed: int, keep: bool) -> dict:
    config = FlintConfig.preset(preset)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{preset}-nvfp4.gguf"
    start = time.perf_counter()
    write_gguf(path, config, random_source(config, seed, device), outtype="nvfp4", device=device)
    _sync(device)
    write_s = time.perf_counter() - start
    cuda = torch.device(device).type == "cuda"
    if cuda:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
    start = time.perf_counter()
    ckpt = load_checkpoint(path, device=device)
    _sync(device)
    load_s = time.perf_counter() - start
    weight_bytes = sum(v.nbytes() if isinstance(v, NVFP4Weight) else v.numel() * v.element_size()
                       for v in ckpt.tensors.values())
    file_bytes = path.stat().st_size
    result = {
        "preset": preset, "device": device,
        "device_name": torch.cuda.get_device_name(torch.device(device)) if cuda else platform.processor() or "cpu",
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": " ".join(sys.argv),
        "parameters": config.num_parameters().total,
        "nvfp4_tensors": sum(isinstance(v, NVFP4Weight) for v in ckpt.tensors.values()),
        "file_bytes": file_bytes, "write_s": round(write_s, 3), "load_s": round(load_s, 3),
        "load_GB_per_s": round(file_bytes / load_s / 1e9, 3),
        "weight_bytes_on_device": weight_bytes,
        "gpu_allocated_bytes": torch.cuda.memory_allocated() - base if cuda else None,
        "gpu_peak_bytes_during_load": torch.cuda.max_memory_allocated() - base if cuda else None,
        # counts the touched pages of the memory-mapped GGUF too (file cache, not a host copy)
        "host_peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
    }
    if not keep:
        path.unlink()
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="flint-40b", choices=sorted(PRESETS))
    parser.add_argument("--out", type=Path, required=True, help="directory for the GGUF (deleted after, see --keep)")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path, help="result file (default OUT/bench_load-PRESET.json)")
    parser.add_argument("--keep", action="store_true", help="keep the GGUF file")
    args = parser.parse_args(argv)
    result = bench(args.preset, args.out, args.device, args.seed, args.keep)
    json_path = args.json or args.out / f"bench_load-{args.preset}.json"
    json_path.write_text(json.dumps(result, indent=2) + "\n")
    width = max(len(k) for k in result)
    for key, value in result.items():
        print(f"{key:<{width}}  {value}")
    print(f"wrote {json_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
