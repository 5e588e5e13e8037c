"""The MoE top-k picked inside the expert launches: rms_norm_router_logits (the router launch
without its top-k) and fused_moe_routed (gate/up and down programs routing from the logits) vs
the router's own top-k then fused_moe, and vs the torch twins; ops.norm_moe."""

import pytest
import torch

from flint_backend import ops as ops_module
from flint_kernels import moe_gemv, tuning
from flint_kernels.moe import fused_moe, fused_moe_routed, fused_moe_routed_torch, fused_moe_torch
from flint_kernels.router import (ROUTING_WORDS, rms_norm_router_logits, rms_norm_router_logits_torch,
                                  rms_norm_router_topk, route_from_logits_torch)
from kv_cases import assert_scaled_close
from test_moe import BF16_REL, check, experts

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def router_logits(t, e, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (2 * torch.randn(t, e, generator=g)).to(DEVICE)


def handoff(x):
    """The routing handoff buffer as the router launch leaves it (zeros)."""
    return torch.zeros(x.shape[0], ROUTING_WORDS, dtype=torch.int32, device=DEVICE)


@pytest.mark.parametrize("w_dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("has_residual", [True, False], ids=["residual", "layer-0"])
@pytest.mark.parametrize("t,e,h", [(1, 64, 512), (3, 40, 256), (8, 16, 96)])
def test_router_logits_are_the_top_k_routers(t, e, h, has_residual, w_dtype):
    """Same h and residual + x bits as rms_norm_router_topk, and logits whose top-k is its ids;
    a bf16 or an fp32 router weight."""
    g = torch.Generator().manual_seed(e)
    x = torch.randn(t, h, generator=g).to(DEVICE, torch.bfloat16)
    residual = (4 * torch.randn(t, h, generator=g)).to(DEVICE, torch.bfloat16) if has_residual else None
    norm_w = (1 + 0.5 * torch.randn(h, generator=g)).to(DEVICE, torch.bfloat16)
    w = torch.randn(e, h, generator=g).to(DEVICE, w_dtype)
    before = None if residual is None else residual.clone()
    h_out, logits, res_out, routing = rms_norm_router_logits(x, residual, norm_w, 1e-5, w)
    assert logits.dtype == torch.float32 and logits.shape == (t, e)
    assert torch.equal(routing, torch.zeros(t, ROUTING_WORDS, dtype=torch.int32, device=DEVICE))
    h_topk, ids, weights, res_topk = rms_norm_router_topk(x, residual, norm_w, 1e-5, w, 6, True)
    assert torch.equal(h_out, h_topk) and torch.equal(res_out, res_topk)
    assert residual is None or torch.equal(residual, before)
    got_ids, got_weights = route_from_logits_torch(logits, 6, True)
    assert torch.equal(got_ids, ids)
    torch.testing.assert_close(got_weights, weights, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(logits, h_out.float() @ w.float().T, rtol=1e-5, atol=1e-4)  # order of the sum
    h_torch, logits_torch, res_torch, _ = rms_norm_router_logits_torch(x, residual, norm_w, 1e-5, w)
    assert_scaled_close(h_out, h_torch)  # interpreter: bf16 roundings truncate
    torch.testing.assert_close(res_out, res_torch, rtol=1e-2, atol=2e-2)
    torch.testing.assert_close(logits_torch, h_torch.float() @ w.float().T)


@pytest.mark.parametrize("fmt,dtype", [("dense", torch.float32), ("dense", torch.bfloat16),
                                       ("nvfp4", torch.float32), ("nvfp4", torch.bfloat16)])
@pytest.mark.parametrize("t,e,k,shared", [(1, 16, 6, 1), (3, 40, 6, 1), (5, 16, 8, 0), (2, 16, 7, 1), (1, 16, 6, 2),
                                          (5, 40, 6, 2), (3, 16, 4, 2)],
                         ids=["T1", "T3-E40", "T5-K8-no-shared", "T2-K7-all-slots", "T1-shared-2I",
                              "T5-E40-shared-2I", "T3-K4-shared-2I"])
def test_routed_matches_top_k_then_experts(fmt, dtype, t, e, k, shared, monkeypatch):
    """fused_moe_routed == fused_moe on the same logits' top-k (route_from_logits_torch), and its
    torch twin; NVFP4 experts as 32-bit words (the launches that route). shared: none, one as
    wide as a routed expert, or 2I wide (flint-40b: K = 6 and two slots of I fill the 8)."""
    monkeypatch.setattr(tuning, "FP4_MOE_WORDS", True)
    monkeypatch.setattr(tuning, "FP4_MOE_DOWN_WORDS", True)
    w13, w2, s13, s2 = experts(e, 64, 32, 32 * max(shared, 1), dtype, fmt, seed=t + k)
    if not shared:
        s13 = s2 = None
    logits = router_logits(t, e, seed=t)
    x = torch.randn(t, 64, device=DEVICE).to(dtype)
    routing = handoff(x)
    got = fused_moe_routed(x, logits, routing, k, True, w13, w2, s13, s2)
    ids, weights = route_from_logits_torch(logits, k, True)
    # the gate/up launch's handoff to the down launch: ids + 1, then the weights' fp32 bits
    assert torch.equal(routing[:, :k], ids + 1) and not routing[:, k:8].any()
    torch.testing.assert_close(routing[:, 8:8 + k].view(torch.float32), weights, rtol=1e-6, atol=0)
    # the same picks and kernels: only the weights' fp32 normalisation may differ (its sum's order)
    check(got, fused_moe(x, ids, weights, w13, w2, s13, s2, path="small"), dtype)
    check(got, fused_moe_routed_torch(x, logits, handoff(x), k, True, w13, w2, s13, s2), dtype)


@pytest.mark.parametrize("renormalize", [True, False])
def test_routed_ties_and_unnormalised_weights(renormalize):
    """Equal scores go to the lower expert id, as the router's top-k; unnormalised weights."""
    t, e, k = 2, 16, 4
    w13, w2, s13, s2 = experts(e, 64, 32, 32, torch.float32, "dense", seed=3)
    logits = torch.zeros(t, e, device=DEVICE)
    logits[:, 8:] = 1.0  # experts 8..15 tie; the top-4 are 8..11
    x = torch.randn(t, 64, device=DEVICE)
    got = fused_moe_routed(x, logits, handoff(x), k, renormalize, w13, w2, s13, s2)
    ids = torch.tensor([[8, 9, 10, 11]] * t, dtype=torch.int32, device=DEVICE)
    weight = 1 / k if renormalize else torch.sigmoid(torch.tensor(1.0)).item()
    weights = torch.full((t, k), weight, device=DEVICE)
    check(got, fused_moe_torch(x, ids, weights, w13, w2, s13, s2), torch.float32)


def routed_handoff(x, logits, k, weights):
    """fused_moe_routed's handoff (expert ids + 1, then the router weights' bits)."""
    routing = handoff(x)
    fused_moe_routed(x, logits, routing, k, True, *weights)
    return routing


@pytest.mark.parametrize("ties", [False, True])
@pytest.mark.parametrize("fmt", ["dense", "nvfp4"])
def test_handoff_holds_the_picks(fmt, ties):
    """The gate/up programs' top-k (tl.topk's bitonic network) hands the down launch the torch
    twin's ids, best first, ties included (the lowest ids among equals)."""
    t, e, k = 3, 40, 6
    w13, w2, s13, s2 = experts(e, 64, 32, 32, torch.float32, fmt, seed=5)
    logits = router_logits(t, e, seed=5)
    if ties:
        logits[:, ::3] = 30.0  # 14 experts tie above all others (sigmoid 1.0); the six lowest ids win
    x = torch.randn(t, 64, device=DEVICE)
    routing = routed_handoff(x, logits, k, (w13, w2, s13, s2))
    if ties:
        ids = torch.tensor([[0, 3, 6, 9, 12, 15]] * t, dtype=torch.int32, device=DEVICE)
        assert torch.equal(route_from_logits_torch(logits, k, True)[0], ids)  # the twin's ties too
    else:
        ids, _ = route_from_logits_torch(logits, k, True)
    assert torch.equal(routing[:, :k] - 1, ids)  # the handoff holds ids + 1, best first


def test_errors_name_the_argument(monkeypatch):
    w13, w2, s13, s2 = experts(16, 64, 32, 32, torch.float32, "dense")
    logits = router_logits(2, 16)
    x = torch.randn(2, 64, device=DEVICE)
    with pytest.raises(ValueError, match="logits is torch.bfloat16"):
        fused_moe_routed(x, logits.bfloat16(), handoff(x), 6, True, w13, w2, s13, s2)
    with pytest.raises(ValueError, match="logits for 8 experts, expected 16"):
        fused_moe_routed(x, logits[:, :8].contiguous(), handoff(x), 6, True, w13, w2, s13, s2)
    with pytest.raises(ValueError, match="top_k 8"):
        fused_moe_routed(x, logits, handoff(x), 8, True, w13, w2, s13, s2)  # 8 + the shared one > 8 slots
    with pytest.raises(ValueError, match=r"routing is torch.int32 \(2, 8\)"):
        fused_moe_routed(x, logits, handoff(x)[:, :8], 6, True, w13, w2, s13, s2)
    monkeypatch.setattr(moe_gemv, "DOWN_DENSE_MAX_I", 16)  # narrower than these experts: the per-expert loop
    with pytest.raises(ValueError, match="routes_in_experts"):
        fused_moe_routed(x, logits, handoff(x), 6, True, w13, w2, s13, s2)


@pytest.mark.parametrize("router_dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("t", [1, 3, 20], ids=["T1", "T3", "T20-prefill"])
def test_ops_norm_moe(t, router_dtype, monkeypatch):
    """ops.norm_moe: the routed launches at decode sizes, the grouped path beyond; both equal the
    torch table's composition. The router weight fp32 or bf16; the shared expert 2I wide."""
    calls = []
    real = ops_module.moe_k.fused_moe_routed
    monkeypatch.setattr(ops_module.moe_k, "fused_moe_routed", lambda *a: calls.append(1) or real(*a))
    g = torch.Generator().manual_seed(t)
    x = torch.randn(t, 64, generator=g).to(DEVICE, torch.bfloat16)
    residual = torch.randn(t, 64, generator=g).to(DEVICE, torch.bfloat16)
    norm_w = (1 + 0.5 * torch.randn(64, generator=g)).to(DEVICE, torch.bfloat16)
    router_w = torch.randn(16, 64, generator=g).to(DEVICE, router_dtype)
    weights = experts(16, 64, 32, 64, torch.bfloat16, "dense", seed=t)
    triton_ops, torch_ops = ops_module.get_ops("triton"), ops_module.get_ops("torch")
    got, res = triton_ops.norm_moe(x, residual.clone(), norm_w, 1e-5, router_w, 4, True, *weights)
    expected, res_ref = torch_ops.norm_moe(x, residual.clone(), norm_w, 1e-5, router_w, 4, True, *weights)
    assert calls == ([1] if t <= 8 else [])
    assert_scaled_close(got, expected, rel=BF16_REL)
    torch.testing.assert_close(res, res_ref, rtol=1e-2, atol=2e-2)


@pytest.mark.gpu
@pytest.mark.parametrize("fmt", ["dense", "nvfp4"])
def test_handoff_real_shapes(fmt):
    """flint-40b's MoE at batch 1: tl.topk's picks in the handoff are the torch twin's, on the
    GPU's compile."""
    e, k = 256, 6
    w13, w2, s13, s2 = experts(e, 2048, 512, 1024, torch.bfloat16, fmt)
    x = torch.randn(1, 2048, device=DEVICE, dtype=torch.bfloat16)
    for seed in range(4):
        logits = router_logits(1, e, seed=seed)
        routing = routed_handoff(x, logits, k, (w13, w2, s13, s2))
        assert torch.equal(routing[:, :k] - 1, route_from_logits_torch(logits, k, True)[0])


@pytest.mark.gpu
@pytest.mark.parametrize("fmt", ["dense", "nvfp4"])
@pytest.mark.parametrize("t", [1, 8])
def test_real_shapes(fmt, t):
    """flint-40b's MoE (256 experts of 512, top-6, a shared expert of 1024) routed in its
    launches == the router's top-k then fused_moe, and close to the torch twin."""
    e, k = 256, 6
    w13, w2, s13, s2 = experts(e, 2048, 512, 1024, torch.bfloat16, fmt)
    logits = router_logits(t, e, seed=t)
    x = torch.randn(t, 2048, device=DEVICE, dtype=torch.bfloat16)
    ids, weights = route_from_logits_torch(logits, k, True)
    got = fused_moe_routed(x, logits, handoff(x), k, True, w13, w2, s13, s2)
    assert_scaled_close(got, fused_moe(x, ids, weights, w13, w2, s13, s2, path="small"), rel=1e-2)
    assert_scaled_close(got, fused_moe_torch(x, ids, weights, w13, w2, s13, s2), rel=1e-2)

