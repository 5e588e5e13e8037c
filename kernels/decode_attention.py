"""Decode attention with sinks: one new token per sequence (N == B); see attention.py."""

from __future__ import annotations

import torch

from .attention import attention_torch, check_attention_inputs  # noqa: F401  (re-exported)


def decode_attention_torch(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                           k_cache: torch.Tensor, v_cache: torch.Tensor, context_lens: torch.Tensor,
                           sinks: torch.Tensor | None, sm_scale: float, window: int,
                           block_tables: torch.Tensor | None = None, ring_rows: torch.Tensor | None = None,
                           out: torch.Tensor | None = None, num_splits: int | None = None) -> torch.Tensor:
    """Same signature and semantics as `decode_attention` (num_splits is ignored)."""
    qsl = torch.arange(q.shape[0] + 1, dtype=torch.int32, device=q.device)
    result = attention_torch(q, k, v, qsl, context_lens, k_cache, v_cache, sinks, sm_scale, window,
                             block_tables=block_tables, ring_rows=ring_rows)
    if out is None:
        return result
    out.copy_(result)
    return out
