"""Where one flint_model instance runs: Triton's instance placement -> the engine's device.

Triton creates one Python stub process per instance of `instance_group` and tells each its
kind and device (`args["model_instance_kind"]`: "GPU", "CPU" or "MODEL";
`args["model_instance_device_id"]`). A Python model is placed only if it reads them: a
KIND_GPU instance builds its engine (weights, KV pool, CUDA graphs) on `cuda:<device_id>`,
a KIND_CPU instance on the CPU, and KIND_MODEL (the single-instance default) on
engine_args.json's `device`.
"""

from __future__ import annotations

from dataclasses import dataclass

from flint_backend.engine.engine_args import EngineArgsError

KINDS = ("GPU", "CPU", "MODEL")


@dataclass(frozen=True)
class InstancePlacement:
    name: str       # Triton's model instance name, e.g. "flint_model_0_1" (group 0, instance 1)
    kind: str       # one of KINDS
    device_id: int  # the CUDA ordinal for GPU; 0 otherwise

    @classmethod
    def from_args(cls, args: dict[str, str]) -> "InstancePlacement":
        kind = args.get("model_instance_kind", "MODEL").upper().removeprefix("KIND_")
        if kind not in KINDS:
            raise EngineArgsError(f"model_instance_kind: got {kind!r}, expected one of {KINDS}")
        name = args.get("model_instance_name") or args.get("model_name", "flint_model")
        return cls(name, kind, int(args.get("model_instance_device_id") or 0))

    def engine_device(self, configured: str) -> str:
        """The instance's device; engine_args.json's `device` may only agree with it."""
        if self.kind == "MODEL":
            return configured
        placed = f"cuda:{self.device_id}" if self.kind == "GPU" else "cpu"
        agreeing = ("auto", "cuda", placed) if self.kind == "GPU" else ("auto", "cpu")
        if configured not in agreeing:
            raise EngineArgsError(f"device: engine_args.json says {configured!r}, but Triton placed instance "
                                  f"{self.name} on KIND_{self.kind} ({placed}); expected one of {list(agreeing)}")
        return placed
