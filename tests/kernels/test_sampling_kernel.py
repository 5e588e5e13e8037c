"""sample (fused sampling kernel) vs sample_torch (same algorithm, same draws), the exact
categorical it must follow, the allowed sets of the engine's torch sampler, and reproducibility."""

import pytest
import torch

from flint_backend.engine.sampler import Sampler
from flint_backend.engine.sampling_params import SamplingParams
from flint_kernels.sampling import BLOCK_V, philox_uniform, sample, sample_torch

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
CHI2_P001 = {1: 10.83, 2: 13.82, 4: 18.47}  # chi-square quantile at p = 0.001 by degrees of freedom


def params(rows, temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, seed=0, offsets=None):
    def full(v, dtype):
        return torch.full((rows,), v, dtype=dtype, device=DEVICE)
    offsets = torch.arange(rows, device=DEVICE) if offsets is None else offsets
    return (full(temperature, torch.float32), full(top_k, torch.int32), full(top_p, torch.float32),
            full(min_p, torch.float32), full(seed, torch.int64), offsets)


def mixed_params(rows, vocab, seed):
    g = torch.Generator().manual_seed(seed)
    u = lambda: torch.rand(rows, generator=g)  # noqa: E731
    temperature = torch.where(u() < 0.15, 0.0, u() * 1.5 + 0.2)
    top_k = torch.where(u() < 0.5, torch.randint(1, vocab // 4, (rows,), generator=g), 0).int()
    top_p = torch.where(u() < 0.6, u() * 0.95 + 0.05, 1.0)
    min_p = torch.where(u() < 0.3, u() * 0.3, 0.0)
    seeds = torch.randint(-2**62, 2**62, (rows,), generator=g)
    offsets = torch.randint(0, 2**40, (rows,), generator=g)
    return [t.to(DEVICE) for t in (temperature, top_k, top_p, min_p, seeds, offsets)]


def test_kernel_draws_the_same_tokens_as_its_torch_twin():
    vocab = 3 * BLOCK_V + 17  # several chunks, a partial last one
    logits = 2 * torch.randn(40, vocab, device=DEVICE, generator=torch.Generator(DEVICE).manual_seed(0))
    args = mixed_params(40, vocab, seed=1)
    assert torch.equal(sample(logits, *args), sample_torch(logits, *args))


def test_greedy_rows_take_the_first_argmax():
    logits = torch.randn(6, 2 * BLOCK_V + 3, device=DEVICE)
    logits[1, [5, 400]] = 50.0       # a tie: the first index wins, as torch.argmax
    logits[2, -1] = 50.0             # in the partial last chunk
    logits[3, :] = float("-inf")
    logits[3, 7] = 0.0
    tokens = sample(logits, *params(6, temperature=0.0))
    assert tokens.tolist() == logits.argmax(-1).tolist()
    assert tokens[1] == 5 and tokens[2] == logits.shape[1] - 1 and tokens[3] == 7


def test_a_draw_depends_only_on_seed_and_offset():
    g = torch.Generator(DEVICE).manual_seed(2)
    row = torch.randn(1, 300, device=DEVICE, generator=g)
    alone = sample(row, *params(1, top_p=0.9, seed=77, offsets=torch.tensor([5], device=DEVICE)))
    crowd = torch.randn(7, 300, device=DEVICE, generator=g)
    crowd[4] = row[0]
    t, k, p, m, seeds, offsets = mixed_params(7, 300, seed=3)
    t[4], k[4], p[4], m[4], seeds[4], offsets[4] = 1.0, 0, 0.9, 0.0, 77, 5
    assert sample(crowd, t, k, p, m, seeds, offsets)[4] == alone[0]
    others = [int(sample(row, *params(1, top_p=0.9, seed=77, offsets=torch.tensor([o], device=DEVICE))))
              for o in range(6, 12)]
    assert len(set(others + [int(alone)])) > 1  # the offset moves the stream


def test_draws_follow_the_exact_categorical():
    draws = 400
    logits = torch.tensor([2.0, 1.0, 0.0, -1.0, 0.5], device=DEVICE).repeat(draws, 1)
    counts = torch.bincount(sample(logits, *params(draws, temperature=0.7, seed=1234)), minlength=5).float()
    expected = torch.softmax(logits[0] / 0.7, -1) * draws
    assert float(((counts - expected) ** 2 / expected).sum()) < CHI2_P001[4]


# T = 0.8: p = 0.466, 0.250, 0.134, 0.038, 0.020, 0.092
@pytest.mark.parametrize("filters,allowed", [
    (dict(top_k=3), 3), (dict(top_p=0.75), 3), (dict(min_p=0.2), 3),
    (dict(top_k=4, top_p=0.9, min_p=0.3), 2),  # top-4 renormalised: 0.495, 0.265, 0.142, 0.098
])
def test_twin_follows_the_filtered_categorical(filters, allowed):
    """6000 draws of the twin (the kernel draws the same tokens, above) against the torch
    sampler's filtered probabilities, the engine's definition."""
    draws = 6000
    logits = torch.tensor([2.0, 1.5, 1.0, 0.0, -0.5, 0.7], device=DEVICE)
    probs = Sampler(torch.device(DEVICE))._filtered_probs(
        logits[None], [SamplingParams(temperature=0.8, **filters)])[0]
    probs = probs / probs.sum()
    assert int((probs > 0).sum()) == allowed
    tokens = sample_torch(logits.repeat(draws, 1), *params(draws, temperature=0.8, seed=9, **filters))
    counts = torch.bincount(tokens, minlength=6).float()
    assert set(torch.nonzero(counts).flatten().tolist()) == set(torch.nonzero(probs).flatten().tolist())
    keep = probs > 0
    expected = probs[keep] * draws
    chi2 = float(((counts[keep] - expected) ** 2 / expected).sum())
    assert chi2 < CHI2_P001[allowed - 1]


@pytest.mark.parametrize("filters,allowed", [
    (dict(top_k=2), {0, 1}),              # softmax: 0.37, 0.34, 0.14, ...
    (dict(top_p=0.6), {0, 1}),            # the smallest prefix reaching 0.6
    (dict(min_p=0.3), {0, 1, 2}),         # p >= 0.3 * 0.37
])
def test_kernel_keeps_exactly_the_allowed_sets(filters, allowed):
    draws = 60
    logits = torch.tensor([3.0, 2.9, 2.0, 1.0, 0.0, -1.0], device=DEVICE).repeat(draws, 1)
    assert set(sample(logits, *params(draws, seed=1, **filters)).tolist()) == allowed


def test_philox_matches_triton():
    import triton
    import triton.language as tl

    @triton.jit
    def uniform_kernel(out_ptr, seed, offset, N: tl.constexpr):
        rnd = tl.arange(0, N)
        c0 = (offset & 0xFFFFFFFF).to(tl.uint32)
        c1 = ((offset >> 32) & 0xFFFFFFFF).to(tl.uint32)
        r, _, _, _ = tl.philox(seed, c0 + rnd.to(tl.uint32) * 0, c1 + rnd.to(tl.uint32) * 0, rnd.to(tl.uint32),
                               rnd.to(tl.uint32) * 0)
        tl.store(out_ptr + rnd, tl.uint_to_uniform_float(r))

    out = torch.empty(4, device=DEVICE)
    seed, offset = -(2**61) + 12345, 2**35 + 7
    uniform_kernel[(1,)](out, seed, offset, N=4)
    assert out.tolist() == [philox_uniform(seed, offset, r) for r in range(4)]


def test_errors_name_the_argument():
    logits = torch.randn(2, 10, device=DEVICE)
    t, k, p, m, s, o = params(2)
    with pytest.raises(ValueError, match="top_k"):
        sample(logits, t, k.long(), p, m, s, o)
    with pytest.raises(ValueError, match="logits"):
        sample(logits.double(), t, k, p, m, s, o)


@pytest.mark.gpu
@pytest.mark.parametrize("rows", [1, 8, 64])
def test_real_vocab(rows):
    logits = 3 * torch.randn(rows, 150144, device=DEVICE)
    args = mixed_params(rows, 150144, seed=rows)
    assert torch.equal(sample(logits, *args), sample_torch(logits, *args))
