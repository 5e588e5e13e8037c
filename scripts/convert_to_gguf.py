"""Convert a BF16 HF checkpoint directory to a Flint GGUF (BF16 or NVFP4: the official layout,
LM head NVFP4, embedding and router unquantised).

    python scripts/convert_to_gguf.py checkpoints/flint-tiny flint-tiny-nvfp4.gguf --outtype nvfp4
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from collections import Counter

from flint_backend.weights.convert import convert_checkpoint
from flint_backend.weights.gguf_writer import OUTTYPES


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("src", help="HF directory: config.json + *.safetensors (+ index)")
    parser.add_argument("out", help="output .gguf file")
    parser.add_argument("--outtype", choices=OUTTYPES, required=True)
    parser.add_argument("--force", action="store_true", help="overwrite an existing output file")
    parser.add_argument("--device", default="cpu", help="where to quantise, e.g. cuda (default cpu)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s")
    start = time.perf_counter()
    try:
        plan = convert_checkpoint(args.src, args.out, outtype=args.outtype, force=args.force, device=args.device)
    except (FileExistsError, ValueError) as e:  # CheckpointError is a ValueError
        print(f"error: {e}", file=sys.stderr)
        return 1
    types = Counter(p.qtype.name for p in plan)
    print(f"wrote {args.out} in {time.perf_counter() - start:.1f} s: {dict(types)} tensors")
    return 0


if __name__ == "__main__":
    sys.exit(main())
