"""The checkpoint's tensors, declared once: Hub name, GGUF name, shape, kind.

Every loader, writer and converter walks this table; nothing else spells a tensor name.
`{i}` is the layer index, `{e}` the routed-expert index. Names are those of the official
checkpoint (`RecursiveSI/flint`, and what transformers' `save_pretrained` writes): one tensor per
routed expert, the sinks as `self_attn.softmax_offset`. transformers' in-memory naming is read
too (ALIASES: the fused `mlp.experts.gate_up_proj` [E, 2I, H] / `down_proj` [E, H, I], and
`self_attn.sinks`). GGUF names are those of vLLM's Flint GGUF loader; GGUF stacks the routed
experts of a layer into one tensor (`*_exps`, shape [E, N, K]).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Callable, Iterator, NamedTuple

import torch

from flint_backend.config import FlintConfig


class Kind(Enum):
    EMBEDDING = "embedding"  # [V, H] row lookup
    LINEAR = "linear"        # [N, K] weight of y = x @ W.T
    OUTPUT = "output"        # LINEAR whose result lands on the residual stream (o_proj, down_proj)
    ROUTER = "router"        # [E, H] router weight, fp32 (logits in fp32)
    NORM = "norm"            # RMSNorm weight
    SINK = "sink"            # [heads] attention-sink logits, fp32


class Scope(Enum):
    GLOBAL = "global"  # once per model
    LAYER = "layer"    # every layer
    DENSE = "dense"    # dense MLP layers (mlp_only_layers)
    MOE = "moe"        # MoE layers
    EXPERT = "expert"  # every routed expert of every MoE layer


@dataclass(frozen=True)
class TensorSpec:
    hf: str
    gguf: str
    kind: Kind
    scope: Scope
    shape: Callable[[FlintConfig], tuple[int, ...]]


def _q(c): return c.num_attention_heads * c.head_dim
def _kv(c): return c.num_key_value_heads * c.head_dim
def _shared(c): return c.shared_expert_intermediate_size


_L = "model.layers.{i}."
_E = _L + "mlp.experts.{e}."
_S = _L + "mlp.shared_expert."

TENSORS: tuple[TensorSpec, ...] = (
    TensorSpec("model.embed_tokens.weight", "token_embd.weight", Kind.EMBEDDING, Scope.GLOBAL,
               lambda c: (c.vocab_size, c.hidden_size)),
    TensorSpec(_L + "input_layernorm.weight", "blk.{i}.attn_norm.weight", Kind.NORM, Scope.LAYER,
               lambda c: (c.hidden_size,)),
    TensorSpec(_L + "self_attn.q_proj.weight", "blk.{i}.attn_q.weight", Kind.LINEAR, Scope.LAYER,
               lambda c: (_q(c), c.hidden_size)),
    TensorSpec(_L + "self_attn.k_proj.weight", "blk.{i}.attn_k.weight", Kind.LINEAR, Scope.LAYER,
               lambda c: (_kv(c), c.hidden_size)),
    TensorSpec(_L + "self_attn.v_proj.weight", "blk.{i}.attn_v.weight", Kind.LINEAR, Scope.LAYER,
               lambda c: (_kv(c), c.hidden_size)),
    TensorSpec(_L + "self_attn.o_proj.weight", "blk.{i}.attn_output.weight", Kind.OUTPUT, Scope.LAYER,
               lambda c: (c.hidden_size, _q(c))),
    TensorSpec(_L + "self_attn.q_norm.weight", "blk.{i}.attn_q_norm.weight", Kind.NORM, Scope.LAYER,
               lambda c: (c.head_dim,)),
    TensorSpec(_L + "self_attn.k_norm.weight", "blk.{i}.attn_k_norm.weight", Kind.NORM, Scope.LAYER,
               lambda c: (c.head_dim,)),
    TensorSpec(_L + "self_attn.softmax_offset", "blk.{i}.attn_sinks.weight", Kind.SINK, Scope.LAYER,
               lambda c: (c.num_attention_heads,)),
    TensorSpec(_L + "post_attention_layernorm.weight", "blk.{i}.ffn_norm.weight", Kind.NORM, Scope.LAYER,
               lambda c: (c.hidden_size,)),
    # dense SwiGLU (mlp_only_layers)
    TensorSpec(_L + "mlp.gate_proj.weight", "blk.{i}.ffn_gate.weight", Kind.LINEAR, Scope.DENSE,
               lambda c: (c.intermediate_size, c.hidden_size)),
    TensorSpec(_L + "mlp.up_proj.weight", "blk.{i}.ffn_up.weight", Kind.LINEAR, Scope.DENSE,
               lambda c: (c.intermediate_size, c.hidden_size)),
    TensorSpec(_L + "mlp.down_proj.weight", "blk.{i}.ffn_down.weight", Kind.OUTPUT, Scope.DENSE,
               lambda c: (c.hidden_size, c.intermediate_size)),
    # MoE: router, shared expert
    TensorSpec(_L + "mlp.gate.weight", "blk.{i}.ffn_gate_inp.weight", Kind.ROUTER, Scope.MOE,
               lambda c: (c.num_experts, c.hidden_size)),
    TensorSpec(_S + "gate_proj.weight", "blk.{i}.ffn_gate_shexp.weight", Kind.LINEAR, Scope.MOE,
               lambda c: (_shared(c), c.hidden_size)),
    TensorSpec(_S + "up_proj.weight", "blk.{i}.ffn_up_shexp.weight", Kind.LINEAR, Scope.MOE,
               lambda c: (_shared(c), c.hidden_size)),
    TensorSpec(_S + "down_proj.weight", "blk.{i}.ffn_down_shexp.weight", Kind.OUTPUT, Scope.MOE,
               lambda c: (c.hidden_size, _shared(c))),
    # routed experts: one HF tensor per expert, one stacked GGUF tensor per layer
    TensorSpec(_E + "gate_proj.weight", "blk.{i}.ffn_gate_exps.weight", Kind.LINEAR, Scope.EXPERT,
               lambda c: (c.moe_intermediate_size, c.hidden_size)),
    TensorSpec(_E + "up_proj.weight", "blk.{i}.ffn_up_exps.weight", Kind.LINEAR, Scope.EXPERT,
               lambda c: (c.moe_intermediate_size, c.hidden_size)),
    TensorSpec(_E + "down_proj.weight", "blk.{i}.ffn_down_exps.weight", Kind.OUTPUT, Scope.EXPERT,
               lambda c: (c.hidden_size, c.moe_intermediate_size)),
    TensorSpec("model.norm.weight", "output_norm.weight", Kind.NORM, Scope.GLOBAL,
               lambda c: (c.hidden_size,)),
    TensorSpec("lm_head.weight", "output.weight", Kind.LINEAR, Scope.GLOBAL,
               lambda c: (c.vocab_size, c.hidden_size)),
)

# fp32 in every checkpoint (transformers keeps them so: `_keep_in_fp32_modules_strict`);
# everything else is stored in the checkpoint's dtype
FP32_KINDS = frozenset({Kind.SINK, Kind.ROUTER})


def storage_dtype(kind: Kind, dtype: torch.dtype) -> torch.dtype:
    """The dtype a checkpoint stores (and a loader returns) a tensor of this kind in."""
    return torch.float32 if kind in FP32_KINDS else dtype


def _in_scope(config: FlintConfig, scope: Scope, layer: int) -> bool:
    if scope is Scope.LAYER:
        return True
    return config.is_moe_layer(layer) == (scope in (Scope.MOE, Scope.EXPERT))


def _walk(config: FlintConfig) -> Iterator[tuple[TensorSpec, int | None]]:
    """(spec, layer) in checkpoint order: embedding, layer by layer, final norm + LM head."""
    globals_ = [s for s in TENSORS if s.scope is Scope.GLOBAL]
    yield globals_[0], None
    for i in range(config.num_hidden_layers):
        for spec in TENSORS:
            if spec.scope is not Scope.GLOBAL and _in_scope(config, spec.scope, i):
                yield spec, i
    for spec in globals_[1:]:
        yield spec, None


def checkpoint_tensors(config: FlintConfig) -> Iterator[tuple[str, tuple[int, ...], TensorSpec]]:
    """(HF name, shape, spec) of every tensor, layer by layer (embedding first, norm + LM head last)."""
    for spec, i in _walk(config):
        if spec.scope is Scope.EXPERT:
            for e in range(config.num_experts):
                yield spec.hf.format(i=i, e=e), spec.shape(config), spec
        else:
            yield spec.hf.format(i=i), spec.shape(config), spec


# ---------------------------------------------------------------- loaded-checkpoint naming
class CheckpointError(ValueError):
    """A checkpoint that does not match the schema; the message names the tensor or field."""


class LoadedTensor(NamedTuple):
    name: str                # HF name; routed experts stacked per layer (no `{e}`)
    gguf: str                # llama.cpp GGUF name
    shape: tuple[int, ...]   # routed experts: [E, N, K]
    spec: TensorSpec
    layer: int | None        # None for GLOBAL tensors


def stacked_name(spec: TensorSpec) -> str:
    """`model.layers.{i}.mlp.experts.{e}.gate_proj.weight` -> `model.layers.{i}.mlp.experts.gate_proj.weight`."""
    return spec.hf.replace(".{e}.", ".")


def loaded_tensors(config: FlintConfig) -> Iterator[LoadedTensor]:
    """Every tensor of a loaded checkpoint (the engine's naming), in checkpoint order."""
    for spec, i in _walk(config):
        if spec.scope is Scope.EXPERT:
            shape = (config.num_experts, *spec.shape(config))
            yield LoadedTensor(stacked_name(spec).format(i=i), spec.gguf.format(i=i), shape, spec, i)
        else:
            yield LoadedTensor(spec.hf.format(i=i), spec.gguf.format(i=i), spec.shape(config), spec, i)


def expert_names(config: FlintConfig, tensor: LoadedTensor) -> list[str]:
    """Per-expert HF names of a stacked routed-expert tensor, expert 0 first."""
    return [tensor.spec.hf.format(i=tensor.layer, e=e) for e in range(config.num_experts)]


def nvfp4_eligible(spec: TensorSpec) -> bool:
    """What an NVFP4 GGUF quantises: attention projections, dense MLP, shared and routed experts
    and the LM head; the embedding, norms, sinks and router stay unquantised."""
    return spec.kind in (Kind.LINEAR, Kind.OUTPUT)


# transformers' in-memory names (a FlintForCausalLM's state_dict): each holds one or more loaded
# tensors (the engine's naming, routed experts stacked) concatenated along dim -2.
@dataclass(frozen=True)
class Alias:
    name: str                 # with {i}
    parts: tuple[str, ...]    # loaded names, with {i}


_X = _L + "mlp.experts."
ALIASES: tuple[Alias, ...] = (
    Alias(_L + "self_attn.sinks", (_L + "self_attn.softmax_offset",)),
    Alias(_X + "gate_up_proj", (_X + "gate_proj.weight", _X + "up_proj.weight")),  # [E, 2I, H]
    Alias(_X + "down_proj", (_X + "down_proj.weight",)),                           # [E, H, I]
)


def aliases(config: FlintConfig) -> dict[str, tuple[str, ...]]:
    """transformers' name -> the loaded names it holds, for every layer that has them."""
    by_loaded = {t.name: t for t in loaded_tensors(config)}
    out = {}
    for alias in ALIASES:
        for i in range(config.num_hidden_layers):
            parts = tuple(p.format(i=i) for p in alias.parts)
            if all(p in by_loaded for p in parts):
                out[alias.name.format(i=i)] = parts
    return out


def check_shape(name: str, expected: tuple[int, ...], found: tuple[int, ...], where: str) -> None:
    if tuple(expected) != tuple(found):
        raise CheckpointError(f"{where}: tensor {name!r} has shape {tuple(found)}, expected {tuple(expected)}")


def check_names(expected: list[str], found: list[str], where: str) -> None:
    found_set = set(found)
    missing = [n for n in expected if n not in found_set]
    unexpected = sorted(found_set - set(expected))
    if missing:
        raise CheckpointError(f"{where}: missing {len(missing)} tensor(s), e.g. {missing[:5]}")
    if unexpected:
        raise CheckpointError(f"{where}: {len(unexpected)} unexpected tensor(s), e.g. {unexpected[:5]}")


# llama.cpp stores the NVFP4 per-tensor FP32 scale as a companion F32 tensor beside the weight:
# `blk.N.attn_q.weight` -> `blk.N.attn_q.scale` of shape [1], and for stacked experts
# `blk.N.ffn_gate_exps.scale` of shape [E] (one per expert). Absent means 1.0.
# `.input_scale` (activation scale for W4A4 kernels) is accepted on read and ignored: we run W4A16.
SCALE_SUFFIX = ".scale"
INPUT_SCALE_SUFFIX = ".input_scale"


def gguf_companion(gguf_name: str, suffix: str) -> str:
    return gguf_name.removesuffix(".weight") + suffix
