"""FlintConfig <-> GGUF metadata, declared once as a table of llama.cpp-style keys.

Layer types are stored as llama.cpp's per-layer bool array `flint.attention.sliding_window_pattern`
(true = sliding-window layer with RoPE, false = full-attention NoPE layer), the form gguf-py's
`add_sliding_window_pattern` writes for interleaved-SWA models; the dense layers
(`mlp_only_layers`) as the per-layer bool array `flint.dense_layer_pattern` (our key: Flint's
dense layers need not lead). The stop tokens, a list in
config.json, go to `flint.eos_token_ids` (our key); `tokenizer.ggml.eos_token_id` carries the
first for llama.cpp tools. Floats are float32 in GGUF and compare as float32.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
from gguf import ExpertGatingFuncType, GGUFReader, GGUFValueType, GGUFWriter

from flint_backend.config import FULL, SLIDING, ConfigError, FlintConfig
from flint_backend.weights.schema import CheckpointError

ARCH = "flint"
_U32, _F32, _BOOL = GGUFValueType.UINT32, GGUFValueType.FLOAT32, GGUFValueType.BOOL


@dataclass(frozen=True)
class MetaKey:
    key: str                                   # "{arch}." is prepended unless it starts with "tokenizer."
    field: str | None                          # FlintConfig field; None: derived, checked only
    vtype: GGUFValueType                       # scalar type, or the element type of an array
    write: Callable[[FlintConfig], Any]        # config -> GGUF value (None: key not written)
    read: Callable[[Any], Any] = lambda v: v   # GGUF value -> config value
    array: bool = False

    @property
    def full_key(self) -> str:
        return self.key if self.key.startswith("tokenizer.") else f"{ARCH}.{self.key}"


def _field(key: str, field: str, vtype: GGUFValueType = _U32, **kw) -> MetaKey:
    return MetaKey(key, field, vtype, lambda c: getattr(c, field), **kw)


def _layer_types(pattern: list[bool]) -> list[str]:
    return [SLIDING if sliding else FULL for sliding in pattern]


METADATA: tuple[MetaKey, ...] = (
    _field("vocab_size", "vocab_size"),
    _field("context_length", "max_position_embeddings"),
    _field("embedding_length", "hidden_size"),
    _field("block_count", "num_hidden_layers"),
    _field("feed_forward_length", "intermediate_size"),
    _field("expert_feed_forward_length", "moe_intermediate_size"),
    _field("expert_shared_feed_forward_length", "shared_expert_intermediate_size"),
    _field("expert_count", "num_experts"),
    _field("expert_used_count", "num_experts_per_tok"),
    MetaKey("expert_shared_count", None, _U32, lambda c: 1),
    _field("expert_weights_norm", "norm_topk_prob", _BOOL),
    MetaKey("expert_gating_func", None, _U32, lambda c: int(ExpertGatingFuncType.SIGMOID)),
    MetaKey("dense_layer_pattern", "mlp_only_layers", _BOOL,
            lambda c: [i in c.mlp_only_layers for i in range(c.num_hidden_layers)],
            lambda pattern: [i for i, dense in enumerate(pattern) if dense], array=True),
    _field("decoder_sparse_step", "decoder_sparse_step"),
    _field("attention.head_count", "num_attention_heads"),
    _field("attention.head_count_kv", "num_key_value_heads"),
    _field("attention.key_length", "head_dim"),
    MetaKey("attention.value_length", None, _U32, lambda c: c.head_dim),
    _field("attention.layer_norm_rms_epsilon", "rms_norm_eps", _F32),
    _field("attention.sliding_window", "sliding_window"),
    MetaKey("attention.sliding_window_pattern", "layer_types", _BOOL,
            lambda c: [t == SLIDING for t in c.layer_types], _layer_types, array=True),
    MetaKey("rope.freq_base", "rope_parameters", _F32, lambda c: c.rope_theta,
            lambda v: {"rope_type": "default", "rope_theta": v}),
    _field("eos_token_ids", "eos_token_id", _U32, array=True),
    _field("tokenizer.ggml.bos_token_id", "bos_token_id"),
    MetaKey("tokenizer.ggml.eos_token_id", None, _U32, lambda c: c.eos_token_id[0] if c.eos_token_id else None),
    _field("tokenizer.ggml.padding_token_id", "pad_token_id"),
)


def write_metadata(writer: GGUFWriter, config: FlintConfig) -> None:
    """All METADATA keys (general.architecture is written by GGUFWriter itself)."""
    for meta in METADATA:
        value = meta.write(config)
        if value is None or (meta.array and not value):
            continue
        if meta.array:
            writer.add_key_value(meta.full_key, list(value), GGUFValueType.ARRAY, sub_type=meta.vtype)
        else:
            writer.add_key_value(meta.full_key, value, meta.vtype)


def read_metadata(reader: GGUFReader) -> dict[str, Any]:
    """GGUF key -> Python value for every METADATA key present."""
    values = {}
    for meta in METADATA:
        field = reader.fields.get(meta.full_key)
        if field is not None:
            values[meta.full_key] = field.contents()
    return values


def architecture(reader: GGUFReader) -> str | None:
    field = reader.fields.get("general.architecture")
    return None if field is None else field.contents()


def config_from_metadata(values: dict[str, Any], where: str) -> FlintConfig:
    """A FlintConfig from GGUF metadata alone; every error names the GGUF key."""
    fields: dict[str, Any] = {}
    for meta in METADATA:
        if meta.full_key in values and meta.field is not None:
            fields[meta.field] = meta.read(_plain(values[meta.full_key], meta.vtype))
    missing = [m.full_key for m in METADATA if m.field in FlintConfig.REQUIRED and m.full_key not in values]
    if missing:
        raise CheckpointError(f"{where}: GGUF metadata lacks {missing} and no hf_config_path was given")
    try:
        config = FlintConfig(**fields)
    except (ConfigError, TypeError) as e:
        raise CheckpointError(f"{where}: GGUF metadata gives an invalid config: {e}") from None
    check_metadata(config, values, where, "the config built from it")
    return config


def check_metadata(config: FlintConfig, values: dict[str, Any], where: str, config_source: str) -> None:
    """Every METADATA key present in the GGUF must agree with `config`."""
    for meta in METADATA:
        if meta.full_key not in values:
            continue
        expected = meta.write(config)
        found = _plain(values[meta.full_key], meta.vtype)
        if not _same(expected, found, meta.vtype):
            name = f"field {meta.field!r} (GGUF key {meta.full_key!r})" if meta.field else f"GGUF key {meta.full_key!r}"
            raise CheckpointError(f"{where}: config/GGUF mismatch in {name}: {config_source} gives "
                                  f"{expected!r}, the GGUF metadata has {found!r}")


def _plain(value: Any, vtype: GGUFValueType) -> Any:
    """float32 values to the shortest decimal that round-trips (1e-05, not 9.99999974738e-06)."""
    if vtype is _F32:
        return float(np.format_float_positional(np.float32(value), unique=True, trim="-"))
    if vtype is _BOOL:
        return [bool(v) for v in value] if isinstance(value, list) else bool(value)
    return value


def _same(expected: Any, found: Any, vtype: GGUFValueType) -> bool:
    if vtype is _F32 and expected is not None:
        return np.float32(expected) == np.float32(found)
    if isinstance(expected, list) or isinstance(found, list):
        return list(expected or []) == list(found or [])
    return expected == found
