"""router_topk (one launch: logits per expert block + top-k by the last program) vs router_topk_torch,
and the torch twin vs transformers' FlintTopKRouter (fp32 and bf16 router weights)."""

import pytest
import torch
import transformers
from transformers.models.flint import modeling_flint as hf

from flint_backend.config import FlintConfig
from flint_kernels import tuning
from flint_kernels.router import router_topk, router_topk_torch, weight_parts, weight_parts_torch

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
# weights: fp32 sigmoid/normalisation of logits that differ only in summation order
WEIGHT_TOL = dict(rtol=1e-5, atol=1e-6)


def inputs(t, e, h, dtype, seed=0, w_dtype=None):
    """x [T, H] in dtype, router weight [E, H] in w_dtype (default: dtype)."""
    g = torch.Generator(DEVICE).manual_seed(seed)
    x = torch.randn(t, h, device=DEVICE, generator=g).to(dtype)
    w = (torch.randn(e, h, device=DEVICE, generator=g) / h ** 0.5).to(w_dtype or dtype)
    return x, w


def assert_same_routing(got, expected):
    torch.testing.assert_close(got[0], expected[0], rtol=0, atol=0)
    torch.testing.assert_close(got[1], expected[1], **WEIGHT_TOL)


@pytest.mark.parametrize("dtype,w_dtype", [(torch.float32, torch.float32), (torch.bfloat16, torch.bfloat16),
                                           (torch.bfloat16, torch.float32)], ids=["fp32", "bf16", "bf16-x-fp32-w"])
@pytest.mark.parametrize("t,e,h,k,renorm", [
    (1, 16, 64, 4, True),      # decode
    (3, 16, 96, 16, True),     # every expert chosen (K = E)
    (5, 40, 64, 6, False),     # E not a power of two, unnormalised
    (17, 16, 64, 4, True),     # two token tiles
])
def test_matches_torch(t, e, h, k, renorm, dtype, w_dtype):
    x, w = inputs(t, e, h, dtype, seed=t, w_dtype=w_dtype)
    got = router_topk(x, w, k, renorm)
    assert got[0].dtype == torch.int32 and got[1].dtype == torch.float32
    assert_same_routing(got, router_topk_torch(x, w, k, renorm))


@pytest.mark.parametrize("tile", [(1, 1), (1, 4), (1, 64), (16, 16), (16, 64), (16, 16, 3), (16, 64, 2), (32, 16),
                                  (64, 64)])
@pytest.mark.parametrize("t", [1, 5, 17, 37])
def test_every_tile_shape(t, tile):
    """Expert blocks wider than E = 40 or not dividing it; one-token programs, 16-token dot tiles,
    dot tiles over H = 96 in 3 splits of 32 or 2 of 64 (the second half masked), and 32- or
    64-token tiles (prefill), whose top-k runs 16 tokens at a time."""
    x, w = inputs(t, 40, 96, torch.bfloat16, seed=t + tile[1])
    got = router_topk(x, w, 6, True, tile=tile)
    assert_same_routing(got, router_topk_torch(x, w, 6, True))


@pytest.mark.parametrize("t", [2, 17])
def test_ties_go_to_the_lower_expert(t):
    x, w = inputs(t, 16, 64, torch.float32)
    w[8:] = w[0]  # experts 8..15 score exactly as expert 0
    ids, _ = router_topk(x, w, 16, False)
    for row in ids.tolist():
        assert row.index(0) < row.index(8) < row.index(9) < row.index(15)
    assert torch.equal(ids, router_topk_torch(x, w, 16, False)[0])  # the twin's ties too
    # saturated sigmoids: many experts score exactly 1.0, the lowest ids win
    big = torch.zeros(16, 64, device=DEVICE)
    big[::2, 0] = 1000.0
    ones = torch.ones(t, 64, device=DEVICE)
    ids, weights = router_topk(ones, big, 3, True)
    assert ids.tolist() == [[0, 2, 4]] * t
    torch.testing.assert_close(weights, torch.full((t, 3), 1 / 3, device=DEVICE), **WEIGHT_TOL)


def test_weights_are_the_chosen_sigmoid_scores():
    """No correction bias, no scaling factor: unnormalised weights are the chosen sigmoid scores,
    normalised ones sum to 1."""
    x, w = inputs(2, 16, 64, torch.float32)
    ids, weights = router_topk(x, w, 4, False)
    scores = torch.sigmoid(x @ w.T)
    assert torch.equal(ids.long(), scores.topk(4, dim=-1).indices)
    torch.testing.assert_close(weights, scores.gather(1, ids.long()), **WEIGHT_TOL)
    _, normed = router_topk(x, w, 4, True)
    torch.testing.assert_close(normed.sum(-1), torch.ones(2, device=DEVICE), **WEIGHT_TOL)


def hf_router(config, w):
    """transformers' FlintTopKRouter of `config` holding the router weight w (fp32 or bf16)."""
    router = hf.FlintTopKRouter(transformers.FlintConfig(**config.to_dict())).to(DEVICE)
    router.weight.data = w
    return router


@pytest.mark.parametrize("x_dtype,w_dtype", [(torch.float32, torch.float32), (torch.bfloat16, torch.float32),
                                             (torch.bfloat16, torch.bfloat16)],
                         ids=["fp32", "bf16-x-fp32-w", "bf16"])
@pytest.mark.parametrize("renorm", [True, False])
def test_twin_matches_transformers_router(x_dtype, w_dtype, renorm):
    """router_topk_torch == transformers' FlintTopKRouter (fp32 logits of either weight dtype)."""
    config = FlintConfig.preset("flint-tiny", norm_topk_prob=renorm)
    x, w = inputs(7, config.num_experts, config.hidden_size, x_dtype, seed=9, w_dtype=w_dtype)
    logits, weights, ids = hf_router(config, w)(x)
    assert logits.dtype == torch.float32
    got = router_topk_torch(x, w, config.num_experts_per_tok, config.norm_topk_prob)
    assert torch.equal(got[0].long(), ids)
    torch.testing.assert_close(got[1], weights, **WEIGHT_TOL)
    # and the kernel, on the same inputs
    assert_same_routing(router_topk(x, w, config.num_experts_per_tok, renorm), (ids.int(), weights))


def test_errors_name_the_argument():
    x, w = inputs(2, 16, 64, torch.float32)
    with pytest.raises(ValueError, match="top_k"):
        router_topk(x, w, 17, True)
    with pytest.raises(ValueError, match="weight is torch.float64"):
        router_topk(x, w.double(), 4, True)
    assert router_topk(x[:0], w, 4, True)[0].shape == (0, 4)
    for tile in [(2, 16), (16, 8), (1, 3), (1, 4, 2), (16, 16, 0), (16, 16, 65), (256, 16), (64, 8), (32, 16, 2)]:
        with pytest.raises(ValueError, match="tile"):
            router_topk(x, w, 4, True, tile=tile)


@pytest.mark.gpu
@pytest.mark.parametrize("w_dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("t", [1, 8, 64, 8192])
def test_real_shapes(t, w_dtype):
    x, w = inputs(t, 256, 2048, torch.bfloat16, w_dtype=w_dtype)
    got, expected = router_topk(x, w, 6, True), router_topk_torch(x, w, 6, True)
    # rows whose 6th and 7th scores are closer than fp32 summation noise may swap experts, and two
    # chosen scores that close may come in either order: the chosen set is compared where the 6th
    # and 7th are apart, its order where every neighbour is
    scores = torch.sigmoid(x.float() @ w.float().T)
    top = scores.topk(7, dim=-1).values
    gaps = top[:, :-1] - top[:, 1:]
    clear, ordered = gaps[:, 5] > 1e-5, (gaps > 1e-5).all(-1)
    assert ordered.float().mean() > 0.5
    assert torch.equal(got[0][ordered], expected[0][ordered])
    got_ids, order = got[0][clear].sort(-1)
    expected_ids, expected_order = expected[0][clear].sort(-1)
    assert torch.equal(got_ids, expected_ids)
    torch.testing.assert_close(got[1][clear].gather(-1, order), expected[1][clear].gather(-1, expected_order),
                               **WEIGHT_TOL)


def test_weight_parts_sum_to_the_weight():
    """weight_parts: three bf16 parts that sum back to the fp32 weight exactly, each part at most
    half an ulp of the sum before it (tiny, huge and negative weights; E and H whose product is no
    multiple of the program's block); on a GPU the twin's bits (the interpreter's bf16 conversion
    rounds otherwise, to the same sums)."""
    g = torch.Generator(DEVICE).manual_seed(3)
    w = torch.randn(40, 97, device=DEVICE, generator=g) * torch.logspace(-30, 30, 97, device=DEVICE)
    parts = weight_parts(w)
    assert parts.dtype == torch.bfloat16 and parts.shape == (3, 40, 97)
    hi, mid, lo = parts.float()
    assert torch.equal(lo + mid + hi, w) and torch.equal((w - hi) - mid, lo)
    assert ((w - hi).abs() <= hi.abs() * 2.0 ** -7).all() and ((w - hi - mid).abs() <= mid.abs() * 2.0 ** -7).all()
    if DEVICE == "cuda":
        assert torch.equal(parts, weight_parts_torch(w))
    twin = weight_parts_torch(w).float()
    assert torch.equal(twin[2] + twin[1] + twin[0], w)
    with pytest.raises(ValueError, match="weight_parts: weight is torch.bfloat16"):
        weight_parts(w.to(torch.bfloat16))


@pytest.mark.parametrize("tile", [(16, 16), (32, 64), (64, 32)])
@pytest.mark.parametrize("t", [17, 70])
def test_prefill_tiles_from_weight_parts(t, tile, monkeypatch):
    """tuning.ROUTER_WEIGHT_PARTS: the dot tiles load the fp32 weight's parts instead of splitting
    each weight tile: the same routing as the twin and as the splitting tiles, and their bits
    (picks and weights) under the interpreter and, on a GPU, in the tiles whose dots stay mma
    (16 x 16 and the prefill default 32 x 64; with the parts 64 x 32 takes wgmma, which sums
    in another order)."""
    x, w = inputs(t, 40, 96, torch.bfloat16, seed=t, w_dtype=torch.float32)
    monkeypatch.setattr(tuning, "ROUTER_WEIGHT_PARTS", False)
    split = router_topk(x, w, 6, True, tile=tile)
    monkeypatch.setattr(tuning, "ROUTER_WEIGHT_PARTS", True)
    got = router_topk(x, w, 6, True, tile=tile)
    assert_same_routing(got, split)
    assert_same_routing(got, router_topk_torch(x, w, 6, True))
    if DEVICE == "cpu" or tile != (64, 32):
        assert torch.equal(got[0], split[0]) and torch.equal(got[1], split[1])
