"""HF BF16 directory -> Flint GGUF (`scripts/convert_to_gguf.py` is the command line)."""

from __future__ import annotations

from pathlib import Path

import torch

from flint_backend.config import FlintConfig
from flint_backend.weights.gguf_writer import PlannedTensor, write_gguf
from flint_backend.weights.safetensors_loader import SafetensorsCheckpoint


def convert_checkpoint(src: str | Path, out: str | Path, *, outtype: str, force: bool = False, device: str | torch.device = "cpu",
                       progress: bool = True) -> list[PlannedTensor]:
    """Checks `src` against the schema, then writes `out` via `<out>.partial` (renamed when complete)."""
    src, out = Path(src), Path(out)
    if out.exists() and not force:
        raise FileExistsError(f"output {out} exists; pass --force (force=True) to overwrite it")
    checkpoint = SafetensorsCheckpoint(src, FlintConfig.from_json(src))
    partial = out.with_name(out.name + ".partial")
    try:
        plan = write_gguf(partial, checkpoint.config, checkpoint.get, outtype=outtype, device=device,
                          progress=progress)
    except BaseException:
        partial.unlink(missing_ok=True)
        raise
    partial.replace(out)
    return plan
