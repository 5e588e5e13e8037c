"""Plain-PyTorch Flint: the definition of correct for the whole project.

Written for clarity, not speed: explicit masks, one expert at a time, no KV cache.
Module names equal the checkpoint's tensor names, so `load_state_dict` maps one to one.
Importing this module registers the model with transformers, so
`AutoModelForCausalLM.from_pretrained(dir)` loads our checkpoints.

Shape legend: T tokens, B batch, H hidden, Hq query heads, Hk KV heads, D head_dim,
E routed experts, K experts per token, V vocabulary.
"""

from __future__ import annotations

import dataclasses
import math

import torch
import torch.nn.functional as F
from torch import nn
from transformers import AutoConfig, AutoModelForCausalLM, PreTrainedConfig, PreTrainedModel
from transformers.modeling_outputs import CausalLMOutput

from flint_backend.config import FlintConfig

_FLINT_FIELDS = {f.name for f in dataclasses.fields(FlintConfig)}


class FlintHFConfig(PreTrainedConfig):
    """transformers' view of a FlintConfig (validated by FlintConfig on construction)."""

    model_type = "flint"

    def __init__(self, **kwargs):
        flint = FlintConfig(**{k: kwargs.pop(k) for k in list(kwargs) if k in _FLINT_FIELDS})
        for name, value in dataclasses.asdict(flint).items():
            setattr(self, name, value)
        kwargs.setdefault("architectures", ["FlintForCausalLM"])
        super().__init__(**kwargs)

    def to_flint(self) -> FlintConfig:
        return FlintConfig(**{k: getattr(self, k) for k in _FLINT_FIELDS})


def upcast(x: torch.Tensor) -> torch.Tensor:
    """bf16/fp16 -> fp32; fp32 and fp64 stay as they are (tests run the reference in fp64)."""
    return x.to(torch.promote_types(x.dtype, torch.float32))


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Normalise in fp32, cast back, then scale (the HF Llama convention)."""
    xf = upcast(x)
    normed = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return normed.to(x.dtype) * weight.to(x.dtype)


class FlintRMSNorm(nn.Module):
    def __init__(self, size: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x):
        return rms_norm(x, self.weight, self.eps)


def rope_cos_sin(positions: torch.Tensor, dim: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """NeoX rotate-half RoPE over all `dim` dims. positions [T] -> cos, sin [T, dim] (fp64)."""
    inv_freq = 1.0 / theta ** (torch.arange(0, dim, 2, dtype=torch.float64, device=positions.device) / dim)
    freqs = positions.double()[:, None] * inv_freq[None, :]  # [T, dim/2]
    angles = torch.cat([freqs, freqs], dim=-1)
    return angles.cos(), angles.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [B, heads, T, D]; cos/sin [T, D]."""
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    xf, rf = upcast(x), upcast(rotated)
    return (xf * cos.to(xf.dtype) + rf * sin.to(xf.dtype)).to(x.dtype)


def attention_mask(t: int, window: int | None, device=None) -> torch.Tensor:
    """[T, T] bool, True where query i may attend key j: causal, and within `window` if given
    (the query itself counts as one of the window's positions)."""
    i = torch.arange(t, device=device)[:, None]
    j = torch.arange(t, device=device)[None, :]
    allowed = j <= i
    if window is not None:
        allowed &= j > i - window
    return allowed


class FlintAttention(nn.Module):
    def __init__(self, config: FlintConfig, layer: int):
        super().__init__()
        self.config = config
        self.is_full = config.is_full_attention(layer)
        h, d = config.hidden_size, config.head_dim
        self.q_proj = nn.Linear(h, config.num_attention_heads * d, bias=False)
        self.k_proj = nn.Linear(h, config.num_key_value_heads * d, bias=False)
        self.v_proj = nn.Linear(h, config.num_key_value_heads * d, bias=False)
        self.o_proj = nn.Linear(config.num_attention_heads * d, h, bias=False)
        self.q_norm = FlintRMSNorm(d, config.rms_norm_eps)
        self.k_norm = FlintRMSNorm(d, config.rms_norm_eps)
        self.sinks = nn.Parameter(torch.zeros(config.num_attention_heads))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        c = self.config
        b, t, _ = x.shape
        q = self.q_proj(x).view(b, t, c.num_attention_heads, c.head_dim).transpose(1, 2)  # [B, Hq, T, D]
        k = self.k_proj(x).view(b, t, c.num_key_value_heads, c.head_dim).transpose(1, 2)  # [B, Hk, T, D]
        v = self.v_proj(x).view(b, t, c.num_key_value_heads, c.head_dim).transpose(1, 2)  # [B, Hk, T, D]
        q, k = self.q_norm(q), self.k_norm(k)
        if not self.is_full:  # full-attention layers use no positional encoding (NoPE)
            cos, sin = rope_cos_sin(torch.arange(t, device=x.device), c.head_dim, c.rope_theta)
            q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        group = c.num_attention_heads // c.num_key_value_heads
        k = k.repeat_interleave(group, dim=1)  # [B, Hq, T, D]
        v = v.repeat_interleave(group, dim=1)
        scores = (upcast(q) @ upcast(k).transpose(-1, -2)) / math.sqrt(c.head_dim)  # [B, Hq, T, T]
        window = None if self.is_full else c.sliding_window
        scores = scores.masked_fill(~attention_mask(t, window, x.device), float("-inf"))
        # the learned sink joins the softmax denominator and contributes no value
        sink = self.sinks.to(scores.dtype).view(1, -1, 1, 1).expand(b, -1, t, 1)
        probs = torch.softmax(torch.cat([scores, sink], dim=-1), dim=-1)[..., :-1]
        out = (probs @ upcast(v)).to(x.dtype)  # [B, Hq, T, D]
        return self.o_proj(out.transpose(1, 2).reshape(b, t, -1))


class FlintMLP(nn.Module):
    """SwiGLU: down(silu(gate(x)) * up(x))."""

    def __init__(self, hidden: int, intermediate: int):
        super().__init__()
        self.gate_proj = nn.Linear(hidden, intermediate, bias=False)
        self.up_proj = nn.Linear(hidden, intermediate, bias=False)
        self.down_proj = nn.Linear(intermediate, hidden, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class FlintRouter(nn.Module):
    """Sigmoid scores from fp32 logits; the correction bias picks the experts but never weighs them."""

    def __init__(self, config: FlintConfig):
        super().__init__()
        self.config = config
        self.weight = nn.Parameter(torch.zeros(config.n_routed_experts, config.hidden_size))
        self.register_buffer("e_score_correction_bias", torch.zeros(config.n_routed_experts))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x [T, H] -> expert ids [T, K] (long), weights [T, K] (fp32)."""
        c = self.config
        xf = upcast(x)
        scores = torch.sigmoid(xf @ self.weight.to(xf.dtype).T)  # [T, E], fp32 logits
        ids = torch.topk(scores + self.e_score_correction_bias.to(xf.dtype), c.num_experts_per_tok, dim=-1).indices
        weights = scores.gather(-1, ids)
        if c.norm_topk_prob:
            weights = weights / weights.sum(-1, keepdim=True)
        return ids, weights * c.routed_scaling_factor


class FlintMoE(nn.Module):
    def __init__(self, config: FlintConfig):
        super().__init__()
        h = config.hidden_size
        self.gate = FlintRouter(config)
        self.experts = nn.ModuleList(
            FlintMLP(h, config.moe_intermediate_size) for _ in range(config.n_routed_experts))
        self.shared_experts = FlintMLP(h, config.shared_intermediate_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        x = x.reshape(-1, shape[-1])  # [T, H]
        ids, weights = self.gate(x)
        routed = torch.zeros(x.shape, dtype=weights.dtype, device=x.device)  # [T, H]
        for e, expert in enumerate(self.experts):
            tokens, slot = torch.nonzero(ids == e, as_tuple=True)  # tokens that chose expert e
            if len(tokens):
                y = upcast(expert(x[tokens])) * weights[tokens, slot, None]
                routed.index_add_(0, tokens, y)
        out = routed.to(x.dtype) + self.shared_experts(x)
        return out.reshape(shape)


class FlintDecoderLayer(nn.Module):
    def __init__(self, config: FlintConfig, layer: int):
        super().__init__()
        self.input_layernorm = FlintRMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = FlintAttention(config, layer)
        self.post_attention_layernorm = FlintRMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = FlintMoE(config) if config.is_moe_layer(layer) else FlintMLP(
            config.hidden_size, config.intermediate_size)

    def forward(self, x):
        x = x + self.self_attn(self.input_layernorm(x))
        return x + self.mlp(self.post_attention_layernorm(x))


class FlintModel(nn.Module):
    def __init__(self, config: FlintConfig):
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(FlintDecoderLayer(config, i) for i in range(config.num_hidden_layers))
        self.norm = FlintRMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(self, input_ids):
        x = self.embed_tokens(input_ids)  # [B, T, H]
        for layer in self.layers:
            x = layer(x)
        return self.norm(x)


class FlintForCausalLM(PreTrainedModel):
    config_class = FlintHFConfig
    base_model_prefix = "model"
    _no_split_modules = ["FlintDecoderLayer"]
    _keep_in_fp32_modules_strict = ["sinks", "e_score_correction_bias"]

    def __init__(self, config: FlintHFConfig | FlintConfig):
        if isinstance(config, FlintConfig):
            config = FlintHFConfig(**dataclasses.asdict(config))
        super().__init__(config)
        self.flint_config = config.to_flint()
        self.model = FlintModel(self.flint_config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.post_init()

    def _init_weights(self, module):
        pass  # weights come from checkpoints or flint_backend.weights.random_init

    def forward(self, input_ids: torch.Tensor, **unused) -> CausalLMOutput:
        """input_ids [B, T] or [T] -> logits [B, T, V] (or [T, V]) in fp32 (fp64 for an fp64 model)."""
        squeeze = input_ids.dim() == 1
        ids = input_ids[None] if squeeze else input_ids
        logits = upcast(self.lm_head(self.model(ids)))
        return CausalLMOutput(logits=logits[0] if squeeze else logits)

    @torch.no_grad()
    def generate_greedy(self, prompt_ids: list[int], max_new_tokens: int,
                        stop_ids: frozenset[int] = frozenset()) -> list[int]:
        """Naive greedy decoding that recomputes the whole sequence every step (the test oracle)."""
        ids = list(prompt_ids)
        out: list[int] = []
        device = self.lm_head.weight.device
        for _ in range(max_new_tokens):
            logits = self(torch.tensor(ids, device=device)).logits[-1]
            token = int(torch.argmax(logits))
            out.append(token)
            ids.append(token)
            if token in stop_ids:
                break
        return out


AutoConfig.register("flint", FlintHFConfig, exist_ok=True)
AutoModelForCausalLM.register(FlintHFConfig, FlintForCausalLM, exist_ok=True)


def build_reference(config: FlintConfig, state_dict: dict[str, torch.Tensor] | None = None,
                    dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu") -> FlintForCausalLM:
    """A reference model in `dtype` (sinks and the router bias at least fp32) from a name->tensor dict."""
    model = FlintForCausalLM(config).to(device=device, dtype=dtype)
    for module in model.modules():
        if isinstance(module, FlintAttention):
            module.sinks.data = upcast(module.sinks.data)
        if isinstance(module, FlintRouter):
            module.e_score_correction_bias.data = upcast(module.e_score_correction_bias.data)
    if state_dict is not None:
        missing, unexpected = model.load_state_dict(state_dict, strict=False)
        if missing or unexpected:
            raise KeyError(f"reference: missing tensors {missing[:5]}..., unexpected {unexpected[:5]}...")
    return model.eval().requires_grad_(False)
