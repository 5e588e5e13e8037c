"""MoE routing: fp32 router logits, sigmoid scores, top-k on scores + correction bias,
weights = chosen scores (no bias), optionally renormalised to sum 1, times the scaling factor."""

import torch


def router_topk_torch(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, top_k: int,
                      scaling: float, renormalize: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """x [T, H], weight [E, H], bias [E] fp32 -> ids [T, K] int32, weights [T, K] fp32."""
    scores = torch.sigmoid(x.float() @ weight.float().T)  # [T, E]
    ids = torch.topk(scores + bias.float(), top_k, dim=-1).indices
    weights = scores.gather(-1, ids)
    if renormalize:
        weights = weights / weights.sum(-1, keepdim=True)
    return ids.to(torch.int32), weights * scaling
