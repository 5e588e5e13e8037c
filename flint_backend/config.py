"""FlintConfig: the model's hyperparameters, as the official config.json names them.

The fields and defaults are those of transformers' `FlintConfig` (`RecursiveSI/flint`): the
defaults are the full-size model (preset `flint-40b`). `from_dict` also reads what vLLM's Flint
config adds (`no_rope_layer_indices`, `router_score_function`, `use_sliding_window`, a legacy
`rope_theta`) and accepts the metadata keys every HF config carries; a value the model cannot
be served with is an error naming the field.

    python -m flint_backend.config flint-40b     # prints the parameter counts
"""

from __future__ import annotations

import dataclasses
import json
import logging
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

SLIDING = "sliding_attention"
FULL = "full_attention"
MODEL_TYPE = "flint"
ROPE_DEFAULT = {"rope_type": "default", "rope_theta": 10000.0}

# transformers' FlintConfig fields that change nothing at inference: written with these values,
# read and not stored (transformers' defaults).
_TRAINING_FIELDS = {
    "initializer_range": 0.02, "attention_dropout": 0.0, "use_cache": True,
    "router_aux_loss_coef": 0.0005, "output_router_logits": False,
}
# Fields whose only value Flint has: written so, any other value refused.
_FIXED_FIELDS = {"hidden_act": "silu", "attention_bias": False, "model_type": MODEL_TYPE,
                 "router_score_function": "sigmoid", "use_sliding_window": True,
                 "tie_word_embeddings": False}
# Keys every transformers config carries (PreTrainedConfig's), and older spellings of them.
_HF_METADATA_KEYS = {
    "_name_or_path", "architectures", "chunk_size_feed_forward", "dtype", "torch_dtype", "id2label",
    "is_encoder_decoder", "label2id", "output_attentions", "output_hidden_states", "problem_type",
    "return_dict", "transformers_version", "auto_map", "tokenizer_class", "task_specific_params",
}

log = logging.getLogger(__name__)


class ConfigError(ValueError):
    pass


def default_layer_types(num_layers: int) -> list[str]:
    """transformers' rule: full attention on the first two layers, every fourth (i % 4 == 1) and
    the last; a sliding window elsewhere."""
    return [FULL if i < 2 or i % 4 == 1 or i == num_layers - 1 else SLIDING for i in range(num_layers)]


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
    vocab_size: int = 150144               # untied embedding and LM head
    hidden_size: int = 2048
    num_hidden_layers: int = 49
    num_attention_heads: int = 32          # query heads
    num_key_value_heads: int = 4           # GQA: 8 query heads share one KV head
    head_dim: int = 128                    # q_proj 2048->4096, k/v_proj 2048->512, o_proj 4096->2048
    intermediate_size: int = 6144          # dense SwiGLU of the mlp_only_layers
    moe_intermediate_size: int = 512       # each routed expert
    num_experts: int = 256                 # routed experts of a MoE layer
    num_experts_per_tok: int = 6           # top-k
    # --- optional in config.json: transformers' defaults ---
    shared_expert_intermediate_size: int = 1024  # the shared expert, added ungated to the routed ones
    mlp_only_layers: list[int] = field(default_factory=lambda: [0, 1])  # dense SwiGLU layers
    decoder_sparse_step: int = 1           # a layer not in mlp_only_layers is MoE when (i + 1) % step == 0
    norm_topk_prob: bool = True            # renormalise the chosen sigmoid scores to sum 1
    sliding_window: int = 513              # a sliding-layer token sees itself and the 512 before it
    layer_types: list[str] = field(default_factory=list)  # empty -> default_layer_types()
    rope_parameters: dict = field(default_factory=lambda: dict(ROPE_DEFAULT))  # RoPE of the sliding layers
    no_rope_layer_indices: list[int] | None = None  # vLLM's: the layers without RoPE (the full ones)
    rms_norm_eps: float = 1e-6
    max_position_embeddings: int = 262144  # context length
    bos_token_id: int | None = None        # filled from the tokenizer by make_checkpoint
    eos_token_id: list[int] | None = None  # stop tokens: <|endoftext|>, <|user|>, <|observation|>
    pad_token_id: int | None = None

    REQUIRED = (
        "vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
        "num_key_value_heads", "head_dim", "intermediate_size", "moe_intermediate_size",
        "num_experts", "num_experts_per_tok",
    )

    def __post_init__(self):
        if not self.layer_types:
            self.layer_types = default_layer_types(self.num_hidden_layers)
        self.layer_types = list(self.layer_types)
        self.mlp_only_layers = list(self.mlp_only_layers)
        self.rope_parameters = dict(self.rope_parameters)
        if isinstance(self.eos_token_id, int):
            self.eos_token_id = [self.eos_token_id]
        self.validate()

    # ---------------------------------------------------------------- validation
    def validate(self) -> None:
        for name in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                     "num_key_value_heads", "head_dim", "intermediate_size", "moe_intermediate_size",
                     "num_experts", "num_experts_per_tok", "sliding_window", "max_position_embeddings",
                     "shared_expert_intermediate_size", "decoder_sparse_step"):
            value = getattr(self, name)
            _check(isinstance(value, int) and not isinstance(value, bool) and value > 0, name, value,
                   "a positive integer")
        _check(isinstance(self.rms_norm_eps, (int, float)) and self.rms_norm_eps > 0, "rms_norm_eps",
               self.rms_norm_eps, "a positive number")
        _check(isinstance(self.norm_topk_prob, bool), "norm_topk_prob", self.norm_topk_prob, "true or false")
        _check(self.num_attention_heads % self.num_key_value_heads == 0, "num_key_value_heads",
               self.num_key_value_heads, f"a divisor of num_attention_heads={self.num_attention_heads}")
        _check(self.head_dim % 2 == 0, "head_dim", self.head_dim, "an even number (RoPE rotates halves)")
        _check(self.num_experts_per_tok <= self.num_experts, "num_experts_per_tok",
               self.num_experts_per_tok, f"at most num_experts={self.num_experts}")
        _check(self.shared_expert_intermediate_size % self.moe_intermediate_size == 0,
               "shared_expert_intermediate_size", self.shared_expert_intermediate_size,
               f"a multiple of moe_intermediate_size={self.moe_intermediate_size}")
        self._validate_layers()
        self._validate_rope()

    def _validate_layers(self) -> None:
        n = self.num_hidden_layers
        _check(len(self.layer_types) == n, "layer_types", f"a list of {len(self.layer_types)} entries",
               f"one entry per layer (num_hidden_layers={n})")
        for i, kind in enumerate(self.layer_types):
            _check(kind in (SLIDING, FULL), f"layer_types[{i}]", kind, f"'{SLIDING}' or '{FULL}'")
        _check(all(isinstance(i, int) and 0 <= i < n for i in self.mlp_only_layers), "mlp_only_layers",
               self.mlp_only_layers, f"layer indices in [0, {n})")

    def _validate_rope(self) -> None:
        rope = self.rope_parameters
        _check(isinstance(rope, dict) and rope.get("rope_type", "default") == "default", "rope_parameters",
               rope, "{'rope_type': 'default', 'rope_theta': ...} (no RoPE scaling)")
        theta = rope.get("rope_theta")
        _check(isinstance(theta, (int, float)) and not isinstance(theta, bool) and theta > 0,
               "rope_parameters.rope_theta", theta, "a positive number")
        if self.no_rope_layer_indices is not None:
            full = self.full_attention_layers
            _check(sorted(self.no_rope_layer_indices) == full, "no_rope_layer_indices", self.no_rope_layer_indices,
                   f"the full-attention layers of layer_types, {full} (transformers' FlintForCausalLM "
                   f"rotates the sliding layers only)")

    # ---------------------------------------------------------------- json
    @classmethod
    def from_dict(cls, data: dict) -> "FlintConfig":
        names = {f.name for f in dataclasses.fields(cls)}
        data = dict(data)
        for key, expected in _FIXED_FIELDS.items():
            value = data.pop(key, None)
            if value is not None:
                _check(value == expected, key, value, f"{expected!r} (the only value Flint has)")
        _refuse(data, "quantization_config", "no quantization_config (BF16 safetensors; NVFP4 comes as a GGUF)")
        _refuse(data, "rope_scaling", "no RoPE scaling")
        if "rope_theta" in data:  # the legacy spelling (and vLLM's): folded into rope_parameters
            theta = data.pop("rope_theta")
            data.setdefault("rope_parameters", {"rope_type": "default", "rope_theta": theta})
        for key in _TRAINING_FIELDS:
            data.pop(key, None)
        unknown = sorted(set(data) - names - _HF_METADATA_KEYS)
        if unknown:
            log.warning("config: ignoring unknown field(s) %s", unknown)
        missing = [k for k in cls.REQUIRED if k not in data]
        if missing:
            raise ConfigError(f"config: missing required field(s) {missing}")
        values = {k: v for k, v in data.items() if k in names and v is not None}
        for key in ("layer_types", "mlp_only_layers", "eos_token_id"):
            if key in data and data[key] is None:
                values.pop(key, None)
        try:
            return cls(**values)
        except TypeError as e:  # a wrong type where the dataclass builds derived values
            raise ConfigError(f"config: {e}") from None

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
        if not isinstance(data, dict):
            raise ConfigError(f"config: {path} holds {type(data).__name__}, expected a JSON object")
        try:
            return cls.from_dict(data)
        except ConfigError as e:
            raise ConfigError(f"{path}: {e}") from None

    def to_dict(self) -> dict:
        """The official config.json: transformers' FlintConfig fields (vLLM's extras when set)."""
        data = {"architectures": ["FlintForCausalLM"], "model_type": MODEL_TYPE, "hidden_act": "silu",
                "attention_bias": False, "tie_word_embeddings": False, **_TRAINING_FIELDS}
        data.update(dataclasses.asdict(self))
        if self.no_rope_layer_indices is None:
            del data["no_rope_layer_indices"]
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
    @property
    def rope_theta(self) -> float:
        return float(self.rope_parameters["rope_theta"])

    def is_full_attention(self, layer: int) -> bool:
        return self.layer_types[layer] == FULL

    def has_rope(self, layer: int) -> bool:
        """Sliding layers are rotary; full-attention layers use no positional encoding."""
        return not self.is_full_attention(layer)

    def is_moe_layer(self, layer: int) -> bool:
        return layer not in self.mlp_only_layers and (layer + 1) % self.decoder_sparse_step == 0

    @property
    def full_attention_layers(self) -> list[int]:
        return [i for i in range(self.num_hidden_layers) if self.is_full_attention(i)]

    @property
    def sliding_attention_layers(self) -> list[int]:
        return [i for i in range(self.num_hidden_layers) if not self.is_full_attention(i)]

    @property
    def moe_layers(self) -> list[int]:
        return [i for i in range(self.num_hidden_layers) if self.is_moe_layer(i)]

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
        router = self.num_experts * h
        shared = 3 * h * self.shared_expert_intermediate_size
        n_moe = len(self.moe_layers)
        n_dense = self.num_hidden_layers - n_moe
        layers = self.num_hidden_layers * (attn + norms) + n_dense * dense
        total = 2 * v * h + h + layers + n_moe * (router + shared + self.num_experts * expert)
        active = h + v * h + h + layers + n_moe * (router + shared + self.num_experts_per_tok * expert)
        return ParameterCount(total, active)


def _refuse(data: dict, key: str, expected: str) -> None:
    if data.get(key) is not None:
        raise ConfigError(f"config field {key!r}: got {data[key]!r}, expected {expected}")
    data.pop(key, None)


def _check(ok: bool, name: str, value, expected: str) -> None:
    if not ok:
        raise ConfigError(f"config field {name!r}: got {value!r}, expected {expected}")


_FLINT_40B: dict = {}  # the dataclass defaults are the full-size model

PRESETS: dict[str, dict] = {
    "flint-40b": _FLINT_40B,
    # Full per-layer shapes, 7 layers (dense 0-1, MoE 2-6; full attention at 0, 1, 5, 6): GPU checks.
    "flint-small": {**_FLINT_40B, "num_hidden_layers": 7},
    # Same structure at toy size for CPU tests: window 9 so short prompts cross it.
    "flint-tiny": {
        "vocab_size": 8192, "hidden_size": 64, "num_hidden_layers": 7,
        "num_attention_heads": 8, "num_key_value_heads": 2, "head_dim": 32,
        "intermediate_size": 128, "moe_intermediate_size": 64, "shared_expert_intermediate_size": 128,
        "num_experts": 16, "num_experts_per_tok": 4, "sliding_window": 9, "max_position_embeddings": 4096,
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
