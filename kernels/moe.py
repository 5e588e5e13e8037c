"""Mixture of experts: the routed SwiGLU experts chosen per token, weighted and summed, plus the
shared expert. Expert weights are stacked: w13 [E, 2I, H] (gate rows, then up rows), w2 [E, H, I]."""

import torch
import torch.nn.functional as F


def _swiglu(x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor) -> torch.Tensor:
    gate, up = (x @ w13.T).chunk(2, dim=-1)
    return (F.silu(gate) * up) @ w2.T


def fused_moe_torch(x: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor,
                    w13: torch.Tensor, w2: torch.Tensor,
                    shared_w13: torch.Tensor | None = None, shared_w2: torch.Tensor | None = None) -> torch.Tensor:
    """x [T, H], topk_ids [T, K] int, topk_weights [T, K] fp32 -> [T, H] in x.dtype.
    Each expert's output is rounded to x.dtype, weighted and summed in fp32 (as the reference)."""
    routed = torch.zeros(x.shape, dtype=torch.float32, device=x.device)  # [T, H]
    ids = topk_ids.long()
    for e in torch.unique(ids).tolist():
        tokens, slot = torch.nonzero(ids == e, as_tuple=True)
        y = _swiglu(x[tokens], w13[e], w2[e]).float() * topk_weights[tokens, slot, None]
        routed.index_add_(0, tokens, y)
    out = routed.to(x.dtype)
    if shared_w13 is not None:
        out = out + _swiglu(x, shared_w13, shared_w2)
    return out
