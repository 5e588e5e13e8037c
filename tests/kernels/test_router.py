"""router_topk (one launch: logits per expert block + top-k by the last program) vs router_topk_torch,
and the torch twin vs the reference's FlintRouter."""

import pytest
import torch

from flint_backend.config import FlintConfig
from flint_backend.reference import FlintRouter
from flint_kernels.router import router_topk, router_topk_torch

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
# weights: fp32 sigmoid/normalisation of logits that differ only in summation order
WEIGHT_TOL = dict(rtol=1e-5, atol=1e-6)


def inputs(t, e, h, dtype, seed=0):
    g = torch.Generator(DEVICE).manual_seed(seed)
    x = torch.randn(t, h, device=DEVICE, generator=g).to(dtype)
    w = (torch.randn(e, h, device=DEVICE, generator=g) / h ** 0.5).to(dtype)
    bias = 0.1 * torch.randn(e, device=DEVICE, generator=g)
    return x, w, bias


def assert_same_routing(got, expected):
    torch.testing.assert_close(got[0], expected[0], rtol=0, atol=0)
    torch.testing.assert_close(got[1], expected[1], **WEIGHT_TOL)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("t,e,h,k,renorm", [
    (1, 16, 64, 4, True),      # decode
    (3, 16, 96, 16, True),     # every expert chosen (K = E)
    (5, 40, 64, 6, False),     # E not a power of two, unnormalised
    (17, 16, 64, 4, True),     # two token tiles
])
def test_matches_torch(t, e, h, k, renorm, dtype):
    x, w, bias = inputs(t, e, h, dtype, seed=t)
    got = router_topk(x, w, bias, k, 2.5, renorm)
    assert got[0].dtype == torch.int32 and got[1].dtype == torch.float32
    assert_same_routing(got, router_topk_torch(x, w, bias, k, 2.5, renorm))


@pytest.mark.parametrize("tile", [(1, 1), (1, 4), (1, 64), (16, 16), (16, 64)])
@pytest.mark.parametrize("t", [1, 5, 17])
def test_every_tile_shape(t, tile):
    """Expert blocks wider than E = 40 or not dividing it; one-token programs or 16-token dot tiles."""
    x, w, bias = inputs(t, 40, 96, torch.bfloat16, seed=t + tile[1])
    got = router_topk(x, w, bias, 6, 2.5, True, tile=tile)
    assert_same_routing(got, router_topk_torch(x, w, bias, 6, 2.5, True))


@pytest.mark.parametrize("t", [2, 17])
def test_ties_go_to_the_lower_expert_and_negative_scores_order(t):
    x, w, _ = inputs(t, 16, 64, torch.float32)
    w[8:] = w[0]  # experts 8..15 score exactly as expert 0
    bias = torch.zeros(16, device=DEVICE)
    ids, _ = router_topk(x, w, bias, 16, 1.0, False)
    for row in ids.tolist():
        assert row.index(0) < row.index(8) < row.index(9) < row.index(15)
    bias = -3.0 - torch.arange(16, device=DEVICE) / 32  # every biased score negative
    assert_same_routing(router_topk(x, w[:8].contiguous(), bias[:8], 3, 1.0, True),
                        router_topk_torch(x, w[:8].contiguous(), bias[:8], 3, 1.0, True))


def test_fp32_router_weight_with_bf16_activations():
    x, _, bias = inputs(3, 16, 64, torch.bfloat16)
    w = torch.randn(16, 64, device=DEVICE) / 8
    assert_same_routing(router_topk(x, w, bias, 4, 1.0, True), router_topk_torch(x, w, bias, 4, 1.0, True))


def test_bias_picks_but_never_weighs():
    x, w, _ = inputs(2, 16, 64, torch.float32)
    bias = torch.zeros(16, device=DEVICE)
    bias[[3, 11]] = 100.0  # forces experts 3 and 11 first
    ids, weights = router_topk(x, w, bias, 4, 1.0, False)
    assert (ids[:, :2].sort(dim=1).values == torch.tensor([3, 11], device=DEVICE)).all()
    scores = torch.sigmoid(x @ w.T)
    torch.testing.assert_close(weights, scores.gather(1, ids.long()), **WEIGHT_TOL)


def test_twin_matches_the_reference_router():
    config = FlintConfig.preset("flint-tiny")
    router = FlintRouter(config).to(DEVICE)
    x, w, bias = inputs(7, config.n_routed_experts, config.hidden_size, torch.float32, seed=9)
    router.weight.data, router.e_score_correction_bias = w, bias
    ids, weights = router(x)
    got = router_topk_torch(x, w, bias, config.num_experts_per_tok, config.routed_scaling_factor,
                            config.norm_topk_prob)
    assert torch.equal(got[0].long(), ids)
    torch.testing.assert_close(got[1], weights, **WEIGHT_TOL)


def test_errors_name_the_argument():
    x, w, bias = inputs(2, 16, 64, torch.float32)
    with pytest.raises(ValueError, match="top_k"):
        router_topk(x, w, bias, 17, 1.0, True)
    with pytest.raises(ValueError, match="bias"):
        router_topk(x, w, bias.double(), 4, 1.0, True)
    assert router_topk(x[:0], w, bias, 4, 1.0, True)[0].shape == (0, 4)
    for tile in [(2, 16), (16, 8), (1, 3)]:
        with pytest.raises(ValueError, match="tile"):
            router_topk(x, w, bias, 4, 1.0, True, tile=tile)


@pytest.mark.gpu
@pytest.mark.parametrize("t", [1, 8, 64, 8192])
def test_real_shapes(t):
    x, w, bias = inputs(t, 256, 2048, torch.bfloat16)
    got, expected = router_topk(x, w, bias, 6, 2.5, True), router_topk_torch(x, w, bias, 6, 2.5, True)
    # rows whose 6th and 7th biased scores are closer than fp32 summation noise may swap experts
    scores = torch.sigmoid(x.float() @ w.float().T) + bias
    top = scores.topk(7, dim=-1).values
    clear = (top[:, 5] - top[:, 6]) > 1e-5
    assert torch.equal(got[0][clear], expected[0][clear])
    torch.testing.assert_close(got[1][clear], expected[1][clear], **WEIGHT_TOL)
