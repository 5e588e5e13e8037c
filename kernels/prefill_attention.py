"""Prefill attention with sinks: chunked, causal, sliding window, mixed batches; see attention.py."""

from __future__ import annotations

import torch

from .attention import attention_torch, check_attention_inputs  # noqa: F401  (re-exported)


def prefill_attention_torch(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                            query_start_loc: torch.Tensor, context_lens: torch.Tensor,
                            k_cache: torch.Tensor, v_cache: torch.Tensor, sinks: torch.Tensor | None,
                            sm_scale: float, window: int, max_query_len: int,
                            block_tables: torch.Tensor | None = None, ring_rows: torch.Tensor | None = None,
                            out: torch.Tensor | None = None) -> torch.Tensor:
    """Same signature and semantics as `prefill_attention` (max_query_len is only a hint)."""
    result = attention_torch(q, k, v, query_start_loc, context_lens, k_cache, v_cache, sinks, sm_scale,
                             window, block_tables=block_tables, ring_rows=ring_rows)
    if out is None:
        return result
    out.copy_(result)
    return out
