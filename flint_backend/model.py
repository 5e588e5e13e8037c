"""The fast Flint forward used by the engine: flattened batches of tokens (prefill chunks and
decode tokens mixed in one step) with explicit KV-cache metadata. The math is transformers'
FlintForCausalLM (the oracle); each kernel file states its rounding points and where they differ
from it in bf16.

Every op goes through an op table (`flint_backend.ops`): the same model runs with plain-PyTorch
ops ("torch": CPU and GPU, the CI path) or with our Triton kernels ("triton").
Weights come as a name -> tensor dict in HF names with the routed experts stacked
(`model.layers.{i}.mlp.experts.gate_proj.weight` [E, I, H], ...), as the weights loader returns them:
the sinks as `self_attn.softmax_offset` (fp32), the router `mlp.gate.weight` in fp32 or bf16, the
shared expert `mlp.shared_expert.*` (intermediate shared_expert_intermediate_size), `lm_head.weight`
dense or NVFP4.

Shape legend: N tokens this step, S sampled tokens, H hidden, Hq/Hk heads, D head_dim, V vocab.
"""

from __future__ import annotations

import math

import torch

from flint_backend.config import FlintConfig
from flint_backend.kv_cache import KVCache
from flint_backend.ops import Ops
from flint_backend.step_batch import StepBatch


def rope_cos_sin_cache(max_positions: int, head_dim: int, theta: float, device) -> torch.Tensor:
    """[max_positions, D] fp32: cos of the D/2 frequencies, then their sin. The angles as
    transformers' FlintRotaryEmbedding (and vLLM's rotary table) compute them: the inverse
    frequencies and position x frequency in fp32 (built on the CPU: its fp32 values)."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
    angles = torch.arange(max_positions, dtype=torch.float32)[:, None] * inv_freq[None, :]
    return torch.cat([angles.cos(), angles.sin()], dim=-1).to(device)


class FlintAttention:
    def __init__(self, config: FlintConfig, layer: int, w: dict, ops: Ops, cos_sin: torch.Tensor):
        p = f"model.layers.{layer}.self_attn."
        self.config, self.layer, self.ops = config, layer, ops
        self.is_full = config.is_full_attention(layer)
        self.qkv_proj = ops.concat_rows([w[p + "q_proj.weight"], w[p + "k_proj.weight"], w[p + "v_proj.weight"]])
        self.o_proj = w[p + "o_proj.weight"]
        self.q_norm, self.k_norm = w[p + "q_norm.weight"], w[p + "k_norm.weight"]
        self.sinks = w[p + "softmax_offset"].float()  # [Hq]
        self.cos_sin = cos_sin if config.has_rope(layer) else None  # full layers are NoPE
        self.window = 0 if self.is_full else config.sliding_window
        self.sm_scale = 1.0 / math.sqrt(config.head_dim)

    def forward(self, qkv: torch.Tensor, batch: StepBatch, kv: KVCache) -> torch.Tensor:
        """qkv: the QKV projection of the normed input [N, (Hq + 2 Hk) D] (the decoder layer folds
        the input RMSNorm into it) -> the o_proj output [N, H]."""
        c, ops = self.config, self.ops
        k_cache, v_cache = kv.layer(self.layer)
        kv_scales = kv.scales(self.layer)  # (k_scale, v_scale) with an FP8 cache, else None
        slots = batch.full_slots if self.is_full else batch.ring_slots
        cache_rows = dict(block_tables=batch.block_tables if self.is_full else None,
                          ring_rows=None if self.is_full else batch.ring_rows, kv_scales=kv_scales)
        if batch.decode_only:  # the Q/K norm, RoPE and cache write in the attention op, then o_proj
            return ops.decode_attention_o(
                qkv, self.q_norm, self.k_norm, batch.positions, self.cos_sin, c.rms_norm_eps,
                c.num_attention_heads, c.num_key_value_heads, k_cache, v_cache, slots, batch.context_lens,
                self.sinks, self.sm_scale, self.window, self.o_proj, **cache_rows)  # [N, H]
        # Full layers write K/V before attention (distinct slots). A sliding layer's ring write
        # waits until after attention: a chunk would overwrite ring slots that its own earlier
        # tokens still read.
        write_now = self.is_full
        q, k, v = ops.qk_norm_rope(
            qkv, self.q_norm, self.k_norm, batch.positions, self.cos_sin, c.rms_norm_eps,
            c.num_attention_heads, c.num_key_value_heads,
            k_cache=k_cache if write_now else None, v_cache=v_cache if write_now else None,
            slot_mapping=slots if write_now else None, kv_scales=kv_scales)
        out = ops.attention(
            q, k, v, batch.query_start_loc, batch.context_lens, k_cache, v_cache, self.sinks, self.sm_scale,
            self.window, **cache_rows, decode_only=False, max_query_len=batch.max_query_len,
            kv_in_cache=write_now)  # [N, Hq, D]
        if not write_now:
            ops.cache_write(k, v, k_cache, v_cache, slots, kv_scales)
            if batch.window_slots is not None:  # the prefix cache's window pages (engine.prefix_cache)
                ops.cache_write(k, v, *kv.window_pages(self.layer), batch.window_slots, kv_scales)
        return ops.linear(out.reshape(out.shape[0], -1), self.o_proj)


class FlintMLP:
    def __init__(self, config: FlintConfig, prefix: str, w: dict, ops: Ops):
        self.ops, self.eps = ops, config.rms_norm_eps
        self.gate_up = ops.concat_rows([w[prefix + "gate_proj.weight"], w[prefix + "up_proj.weight"]])
        self.down = w[prefix + "down_proj.weight"]

    def forward(self, x: torch.Tensor, residual: torch.Tensor, norm_w: torch.Tensor):
        """-> (MLP(rms_norm(residual + x)), residual + x): the norm folded into gate/up."""
        gate_up, residual = self.ops.norm_linear(x, residual, norm_w, self.eps, self.gate_up)
        return self.ops.silu_linear(gate_up, self.down), residual


class FlintMoE:
    """Sigmoid top-k router (no bias, no scaling), routed SwiGLU experts, plus the shared expert
    added in full (no gate)."""

    def __init__(self, config: FlintConfig, layer: int, w: dict, ops: Ops):
        p = f"model.layers.{layer}.mlp."
        self.config, self.ops, self.eps = config, ops, config.rms_norm_eps
        self.router = w[p + "gate.weight"]  # [E, H] fp32 or bf16
        self.w13 = ops.concat_rows([w[p + "experts.gate_proj.weight"], w[p + "experts.up_proj.weight"]], dim=1)
        self.w2 = w[p + "experts.down_proj.weight"]  # [E, H, I]
        self.shared_w13 = ops.concat_rows([w[p + "shared_expert.gate_proj.weight"],
                                           w[p + "shared_expert.up_proj.weight"]])  # [2 Is, H]
        self.shared_w2 = w[p + "shared_expert.down_proj.weight"]  # [H, Is]

    def forward(self, x: torch.Tensor, residual: torch.Tensor, norm_w: torch.Tensor):
        """-> (MoE(rms_norm(residual + x)), residual + x): the norm folded into the router."""
        c = self.config
        return self.ops.norm_moe(x, residual, norm_w, self.eps, self.router, c.num_experts_per_tok,
                                 c.norm_topk_prob, self.w13, self.w2, self.shared_w13, self.shared_w2)


class FlintDecoderLayer:
    def __init__(self, config: FlintConfig, layer: int, w: dict, ops: Ops, cos_sin: torch.Tensor):
        p = f"model.layers.{layer}."
        self.ops, self.eps = ops, config.rms_norm_eps
        self.input_norm = w[p + "input_layernorm.weight"]
        self.post_norm = w[p + "post_attention_layernorm.weight"]
        self.self_attn = FlintAttention(config, layer, w, ops, cos_sin)
        self.mlp = (FlintMoE(config, layer, w, ops) if config.is_moe_layer(layer)
                    else FlintMLP(config, p + "mlp.", w, ops))

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None, batch: StepBatch, kv: KVCache):
        """x: the previous sublayer's output [N, H]; residual: the running sum (None at layer 0).
        Each residual add + RMSNorm is folded into the op after it (at decode sizes one launch)."""
        attn = self.self_attn
        qkv, residual = self.ops.norm_linear(x, residual, self.input_norm, self.eps, attn.qkv_proj)
        x = attn.forward(qkv, batch, kv)  # [N, H]
        return self.mlp.forward(x, residual, self.post_norm)


class FlintModel:
    def __init__(self, config: FlintConfig, weights: dict[str, torch.Tensor], ops: Ops, max_positions: int):
        self.config, self.ops = config, ops
        device = weights["model.embed_tokens.weight"].device
        cos_sin = rope_cos_sin_cache(max_positions, config.head_dim, config.rope_theta, device)
        self.embed = weights["model.embed_tokens.weight"]
        self.layers = [FlintDecoderLayer(config, i, weights, ops, cos_sin) for i in range(config.num_hidden_layers)]
        self.norm = weights["model.norm.weight"]
        self.lm_head = weights["lm_head.weight"]  # [V, H] dense or NVFP4 (fp32 logits either way)

    @torch.no_grad()
    def forward(self, batch: StepBatch, kv: KVCache) -> torch.Tensor:
        """-> logits [S, V] fp32 of the tokens in batch.sample_rows."""
        x, residual = self.hidden_states(batch, kv)
        return self._head(x, residual, batch)

    @torch.no_grad()
    def hidden_states(self, batch: StepBatch, kv: KVCache) -> tuple[torch.Tensor, torch.Tensor]:
        """-> (x, residual) [N, H] of every token of the step, before the final RMSNorm; forward()
        applies the head to the rows of batch.sample_rows, logits_of_rows to any rows."""
        x, residual = self._embedding(batch), None  # [N, H]
        for layer in self.layers:
            x, residual = layer.forward(x, residual, batch, kv)
        return x, residual

    @torch.no_grad()
    def logits_of_rows(self, x: torch.Tensor, residual: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        """hidden_states' rows `rows` [R] -> their fp32 logits [R, V]."""
        return self.ops.norm_logits(x.index_select(0, rows), residual.index_select(0, rows), self.norm,
                                    self.config.rms_norm_eps, self.lm_head, None)

    def _embedding(self, batch: StepBatch) -> torch.Tensor:
        if batch.prev_rows is None:
            return self.ops.embedding(self.embed, batch.input_ids)
        return self.ops.decode_embedding(self.embed, batch.input_ids, batch.prev_rows, batch.prev_slots,
                                         batch.greedy_slots)

    def _head(self, x: torch.Tensor, residual: torch.Tensor, batch: StepBatch) -> torch.Tensor:
        """-> fp32 logits of the sampled rows; their argmax into batch.greedy_slots when given."""
        if batch.sample_rows.shape[0] != x.shape[0]:  # only sampled rows need the head (increasing rows:
            residual = residual.index_select(0, batch.sample_rows)  # as many as x means all of them)
            x = x.index_select(0, batch.sample_rows)
        return self.ops.norm_logits(x, residual, self.norm, self.config.rms_norm_eps, self.lm_head,
                                    batch.greedy_slots)
