#!/usr/bin/env python3
"""Write a Flint checkpoint in the HF layout with deterministic random weights.

    python scripts/make_checkpoint.py --preset flint-tiny --out checkpoints/flint-tiny [--seed 0]

Writes the official layout, which transformers' FlintForCausalLM.from_pretrained loads as it is:
config.json (transformers' FlintConfig fields), generation_config.json, sharded *.safetensors
with model.safetensors.index.json under the Hub's tensor names (one tensor per routed expert,
`self_attn.softmax_offset`; sinks and router weights fp32), and the project's GLM-4.x
tokenizer files with the chat template.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

import torch

from flint_backend.config import PRESETS, FlintConfig
from flint_backend.tokenizer import STOP_TOKENS, TOKENIZER_DIR, load_tokenizer
from flint_backend.weights.random_init import random_weights
from flint_backend.weights.safetensors_writer import parse_size, write_sharded
from flint_backend.weights.schema import checkpoint_tensors

DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}


def make_checkpoint(preset: str, out: Path, seed: int = 0, shard_size: str = "5GB",
                    dtype: str = "bf16", force: bool = False, overrides: dict | None = None) -> FlintConfig:
    """overrides: FlintConfig fields over the preset's (e.g. fewer experts for a smaller file)."""
    if out.exists() and any(out.iterdir()) and not force:
        raise FileExistsError(f"--out: {out} exists and is not empty (pass --force to overwrite)")
    tokenizer = load_tokenizer()
    stop_ids = [tokenizer.convert_tokens_to_ids(t) for t in STOP_TOKENS]
    config = FlintConfig.preset(preset, **{"eos_token_id": stop_ids, "pad_token_id": stop_ids[0], **(overrides or {})})
    if config.vocab_size < len(tokenizer):
        raise ValueError(f"preset {preset}: vocab_size {config.vocab_size} < tokenizer size {len(tokenizer)}")
    out.mkdir(parents=True, exist_ok=True)
    for stale in out.glob("*.safetensors"):
        stale.unlink()
    config.to_json(out / "config.json")
    (out / "generation_config.json").write_text(json.dumps(
        {"eos_token_id": stop_ids, "pad_token_id": stop_ids[0]}, indent=2) + "\n")
    for path in TOKENIZER_DIR.iterdir():
        if path.suffix in (".json", ".jinja"):
            shutil.copy(path, out / path.name)
    count = sum(1 for _ in checkpoint_tensors(config))
    write_sharded(random_weights(config, seed, DTYPES[dtype]), out, parse_size(shard_size), total=count)
    return config


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", required=True, choices=sorted(PRESETS))
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--shard-size", default="5GB", help="largest shard, e.g. 5GB, 500MB")
    parser.add_argument("--dtype", default="bf16", choices=sorted(DTYPES))
    parser.add_argument("--force", action="store_true", help="overwrite a non-empty --out")
    args = parser.parse_args(argv)
    try:
        config = make_checkpoint(args.preset, args.out, args.seed, args.shard_size, args.dtype, args.force)
    except (FileExistsError, ValueError) as e:
        sys.exit(f"make_checkpoint: {e}")
    print(f"wrote {args.preset} ({config.num_parameters()}) to {args.out}")


if __name__ == "__main__":
    main()
