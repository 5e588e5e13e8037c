"""FlintConfig: the model's hyperparameters, read from and written to an HF-style config.json.

Every field has a documented default; the defaults are the full-size model (preset
`flint-40b`). `from_dict`/`from_json` are strict: the fields that fix the tensor shapes
must be present, unknown keys are an error, and every error names the field.

    python -m flint_backend.config flint-40b     # prints the parameter counts
"""

from __future__ import annotations

import dataclasses
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

SLIDING = "sliding_attention"
FULL = "full_attention"
MODEL_TYPE = "flint"

# Keys HF writes into every config.json; accepted and not stored (values checked where they matter).
_HF_METADATA_KEYS = {
    "architectures", "model_type", "torch_dtype", "dtype", "transformers_version", "use_cache",
    "hidden_act", "attention_bias", "initializer_range", "auto_map", "attention_dropout",
}
_EXPECTED_METADATA = {"hidden_act": "silu", "attention_bias": False, "model_type": MODEL_TYPE}


class ConfigError(ValueError):
    pass


def default_layer_types(num_layers: int) -> list[str]:
    """Layer i attends to the whole context when i % 7 is 3 or 6, else to a sliding window."""
    return [FULL if i % 7 in (3, 6) else SLIDING for i in range(num_layers)]


class ParameterCount(NamedTuple):
    total: int
    active: int  # read per token by the forward pass (one embedding row, top-k + shared experts)

    def __str__(self) -> str:
        return f"total {_human(self.total)} parameters, active {_human(self.active)} per token"


def _human(n: int) -> str:
    return f"{n / 1e9:.2f}B" if n >= 1e9 else f"{n / 1e6:.2f}M"


@dataclass
class FlintConfig:
    # --- shapes: required in config.json ---
    vocab_size: int = 151552               # GLM-4.x vocabulary (untied embedding and LM head)
    hidden_size: int = 2048
    num_hidden_layers: int = 49
    num_attention_heads: int = 32          # query heads
    num_key_value_heads: int = 4           # GQA: 8 query heads share one KV head
    head_dim: int = 128                    # q_proj 2048->4096, k/v_proj 2048->512, o_proj 4096->2048
    intermediate_size: int = 10240         # dense SwiGLU of layers < first_k_dense_replace
    moe_intermediate_size: int = 512       # each routed expert, and the shared expert per unit
    n_routed_experts: int = 256
    num_experts_per_tok: int = 6           # top-k
    # --- optional in config.json: documented defaults ---
    n_shared_experts: int = 1              # shared expert intermediate = n_shared * moe_intermediate
    first_k_dense_replace: int = 2         # layers 0..k-1 dense MLP, the rest MoE
    routed_scaling_factor: float = 2.5     # normalised top-k weights are multiplied by this
    norm_topk_prob: bool = True            # normalise the chosen sigmoid scores to sum 1
    sliding_window: int = 513              # a sliding-layer token sees itself and the 512 before it
    layer_types: list[str] = field(default_factory=list)  # empty -> default_layer_types()
    rope_theta: float = 10000.0            # RoPE base, sliding layers only (full layers are NoPE)
    rms_norm_eps: float = 1e-5
    max_position_embeddings: int = 262144  # context length
    tie_word_embeddings: bool = False      # must stay False: Flint's LM head is untied
    bos_token_id: int | None = None        # filled from the tokenizer by make_checkpoint
    eos_token_id: list[int] | None = None  # stop tokens: <|endoftext|>, <|user|>, <|observation|>
    pad_token_id: int | None = None

    REQUIRED = (
        "vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
        "num_key_value_heads", "head_dim", "intermediate_size", "moe_intermediate_size",
        "n_routed_experts", "num_experts_per_tok",
    )

    def __post_init__(self):
        if not self.layer_types:
            self.layer_types = default_layer_types(self.num_hidden_layers)
        self.layer_types = list(self.layer_types)
        if isinstance(self.eos_token_id, int):
            self.eos_token_id = [self.eos_token_id]
        self.validate()

    # ---------------------------------------------------------------- validation
    def validate(self) -> None:
        for name in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                     "num_key_value_heads", "head_dim", "intermediate_size", "moe_intermediate_size",
                     "n_routed_experts", "num_experts_per_tok", "sliding_window",
                     "max_position_embeddings"):
            _check(isinstance(getattr(self, name), int) and not isinstance(getattr(self, name), bool)
                   and getattr(self, name) > 0, name, getattr(self, name), "a positive integer")
        for name in ("n_shared_experts", "first_k_dense_replace"):
            value = getattr(self, name)
            _check(isinstance(value, int) and value >= 0, name, value, "an integer >= 0")
        for name in ("rope_theta", "rms_norm_eps", "routed_scaling_factor"):
            value = getattr(self, name)
            _check(isinstance(value, (int, float)) and value > 0, name, value, "a positive number")
        _check(self.num_attention_heads % self.num_key_value_heads == 0, "num_key_value_heads",
               self.num_key_value_heads, f"a divisor of num_attention_heads={self.num_attention_heads}")
        _check(self.head_dim % 2 == 0, "head_dim", self.head_dim, "an even number (RoPE rotates halves)")
        _check(self.num_experts_per_tok <= self.n_routed_experts, "num_experts_per_tok",
               self.num_experts_per_tok, f"at most n_routed_experts={self.n_routed_experts}")
        _check(self.first_k_dense_replace <= self.num_hidden_layers, "first_k_dense_replace",
               self.first_k_dense_replace, f"at most num_hidden_layers={self.num_hidden_layers}")
        _check(len(self.layer_types) == self.num_hidden_layers, "layer_types",
               f"a list of {len(self.layer_types)} entries",
               f"one entry per layer (num_hidden_layers={self.num_hidden_layers})")
        for i, kind in enumerate(self.layer_types):
            _check(kind in (SLIDING, FULL), f"layer_types[{i}]", kind, f"'{SLIDING}' or '{FULL}'")
        _check(self.tie_word_embeddings is False, "tie_word_embeddings", self.tie_word_embeddings,
               "false (Flint's LM head is untied)")

    # ---------------------------------------------------------------- json
    @classmethod
    def from_dict(cls, data: dict) -> "FlintConfig":
        names = {f.name for f in dataclasses.fields(cls)}
        for key, expected in _EXPECTED_METADATA.items():
            if key in data:
                _check(data[key] == expected, key, data[key], repr(expected))
        unknown = sorted(set(data) - names - _HF_METADATA_KEYS)
        if unknown:
            raise ConfigError(f"config: unknown field(s) {unknown}; known fields are {sorted(names)}")
        missing = [k for k in cls.REQUIRED if k not in data]
        if missing:
            raise ConfigError(f"config: missing required field(s) {missing}")
        return cls(**{k: v for k, v in data.items() if k in names})

    @classmethod
    def from_json(cls, path: str | Path) -> "FlintConfig":
        path = Path(path)
        if path.is_dir():
            path = path / "config.json"
        try:
            data = json.loads(path.read_text())
        except FileNotFoundError:
            raise ConfigError(f"config: {path} does not exist") from None
        except json.JSONDecodeError as e:
            raise ConfigError(f"config: {path} is not valid JSON ({e})") from None
        try:
            return cls.from_dict(data)
        except ConfigError as e:
            raise ConfigError(f"{path}: {e}") from None

    def to_dict(self) -> dict:
        data = {"model_type": MODEL_TYPE, "architectures": ["FlintForCausalLM"],
                "hidden_act": "silu", "attention_bias": False}
        data.update(dataclasses.asdict(self))
        return data

    def to_json(self, path: str | Path) -> None:
        path = Path(path)
        if path.is_dir():
            path = path / "config.json"
        path.write_text(json.dumps(self.to_dict(), indent=2) + "\n")

    # ---------------------------------------------------------------- presets
    @classmethod
    def preset(cls, name: str, **overrides) -> "FlintConfig":
        if name not in PRESETS:
            raise ConfigError(f"preset: unknown preset {name!r}; expected one of {sorted(PRESETS)}")
        return cls(**{**PRESETS[name], **overrides})

    # ---------------------------------------------------------------- derived
    def is_full_attention(self, layer: int) -> bool:
        return self.layer_types[layer] == FULL

    def is_moe_layer(self, layer: int) -> bool:
        return layer >= self.first_k_dense_replace

    @property
    def full_attention_layers(self) -> list[int]:
        return [i for i in range(self.num_hidden_layers) if self.is_full_attention(i)]

    @property
    def sliding_attention_layers(self) -> list[int]:
        return [i for i in range(self.num_hidden_layers) if not self.is_full_attention(i)]

    @property
    def shared_intermediate_size(self) -> int:
        return self.n_shared_experts * self.moe_intermediate_size

    def kv_bytes_per_token(self, dtype_bytes: int = 2) -> int:
        """Full-context KV cache per token: only the full-attention layers keep the whole sequence."""
        return len(self.full_attention_layers) * self.num_key_value_heads * self.head_dim * 2 * dtype_bytes

    def num_parameters(self) -> ParameterCount:
        h, v = self.hidden_size, self.vocab_size
        q, kv = self.num_attention_heads * self.head_dim, self.num_key_value_heads * self.head_dim
        attn = h * q + 2 * h * kv + q * h + 2 * self.head_dim + self.num_attention_heads
        norms = 2 * h
        dense = 3 * h * self.intermediate_size
        expert = 3 * h * self.moe_intermediate_size
        router = self.n_routed_experts * h + self.n_routed_experts
        shared = 3 * h * self.shared_intermediate_size
        n_moe = self.num_hidden_layers - self.first_k_dense_replace
        n_dense = self.first_k_dense_replace
        layers = self.num_hidden_layers * (attn + norms) + n_dense * dense
        total = 2 * v * h + h + layers + n_moe * (router + shared + self.n_routed_experts * expert)
        active = h + v * h + h + layers + n_moe * (router + shared + self.num_experts_per_tok * expert)
        return ParameterCount(total, active)


def _check(ok: bool, name: str, value, expected: str) -> None:
    if not ok:
        raise ConfigError(f"config field {name!r}: got {value!r}, expected {expected}")


_FLINT_40B: dict = {}  # the dataclass defaults are the full-size model

PRESETS: dict[str, dict] = {
    "flint-40b": _FLINT_40B,
    # Full per-layer shapes, 7 layers (2 dense, 5 MoE; full attention at 3 and 6): GPU kernel checks.
    "flint-small": {**_FLINT_40B, "num_hidden_layers": 7},
    # Same structure at toy size for CPU tests: window 9 so short prompts cross it.
    "flint-tiny": {
        "vocab_size": 8192, "hidden_size": 64, "num_hidden_layers": 7,
        "num_attention_heads": 8, "num_key_value_heads": 2, "head_dim": 32,
        "intermediate_size": 128, "moe_intermediate_size": 64,
        "n_routed_experts": 16, "num_experts_per_tok": 4, "n_shared_experts": 1,
        "sliding_window": 9, "max_position_embeddings": 4096,
    },
}


def main(argv: list[str]) -> None:
    names = argv or sorted(PRESETS)
    for name in names:
        config = FlintConfig.preset(name)
        count = config.num_parameters()
        print(f"{name}: {count} ({count.total:,} / {count.active:,}); "
              f"KV cache {config.kv_bytes_per_token() / 1024:.0f} KiB per token")


if __name__ == "__main__":
    main(sys.argv[1:])
