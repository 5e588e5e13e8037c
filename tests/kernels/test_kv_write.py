"""kv_write vs kv_write_torch: every cache row, the untouched ones included."""

import pytest
import torch

from flint_kernels.fp8_kv import FP8_DTYPE, quantize_torch
from flint_kernels.kv_write import kv_write, kv_write_torch

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def caches(rows, rows_per, hk, d, dtype):
    """A K and a V cache filled with a sentinel the writes must leave where they do not write."""
    fill = torch.full((rows, rows_per, hk, d), 7.0, device=DEVICE)
    return fill.to(dtype), fill.to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("hk,d", [(2, 16), (3, 32)])  # 3 heads: padded to 4 in the kernel
def test_rows_land_at_their_slots_and_skipped_ones_nowhere(dtype, hk, d):
    g = torch.Generator(device=DEVICE).manual_seed(hk)
    n, rows, rows_per = 11, 5, 4
    slots = torch.randperm(rows * rows_per, generator=g, device=DEVICE)[:n]
    slots[[1, 4, 9]] = -1  # a ring keeps only a chunk's last `window` tokens
    k = torch.randn(n, hk, d, generator=g, device=DEVICE).to(dtype)
    qkv = torch.randn(n, 3 * hk * d + 5, generator=g, device=DEVICE).to(dtype)
    v = qkv[:, 5:5 + hk * d].view(n, hk, d)  # a view into a wider row, as qk_norm_rope hands v out
    got, expected = caches(rows, rows_per, hk, d, dtype), caches(rows, rows_per, hk, d, dtype)
    kv_write(k, v, *got, slots)
    kv_write_torch(k, v, *expected, slots)
    for a, b in zip(got, expected):
        assert torch.equal(a, b)
    assert int((got[0] == 7.0).all(-1).all(-1).sum()) == rows * rows_per - (n - 3)


def test_fp8_codes_keep_the_sign_of_what_rounds_to_zero():
    """Values below half the least E4M3 subnormal (2**-10) round to zero keeping their sign, as
    torch's conversion does (-0.0 is code 0x80): bytes equal, ties at 2**-10 included."""
    hk, d = 1, 16
    row = torch.tensor([-1e-4, -0.0, 1e-4, -2.0 ** -10, 2.0 ** -10, -3 * 2.0 ** -10, -1.5, 0.0] * 2)
    k = row.view(1, hk, d).to(DEVICE, torch.bfloat16)
    got, expected = caches(1, 2, hk, d, FP8_DTYPE), caches(1, 2, hk, d, FP8_DTYPE)
    slots = torch.tensor([1], device=DEVICE)
    kv_write(k, k, *got, slots, kv_scales=(1.0, 1.0))
    kv_write_torch(k, k, *expected, slots, kv_scales=(1.0, 1.0))
    assert got[0].view(torch.uint8)[0, 1, 0, :8].tolist() == [0x80, 0x80, 0x00, 0x80, 0x00, 0x82, 0xBC, 0x00]
    for a, b in zip(got, expected):
        assert torch.equal(a.view(torch.uint8), b.view(torch.uint8))


def test_fp8_codes_of_the_scaled_rows():
    g = torch.Generator(device=DEVICE).manual_seed(0)
    n, hk, d, scales = 6, 2, 16, (0.25, 4.0)
    # values on the E4M3 grid times the scale (what qk_norm_rope hands out), and some off it
    k = (quantize_torch(torch.randn(n, hk, d, generator=g, device=DEVICE) * 8, 1.0).float() * scales[0])
    v = torch.randn(n, hk, d, generator=g, device=DEVICE) * 900  # off the grid, some past 448 * 4: saturated
    k, v = k.to(torch.bfloat16), v.to(torch.bfloat16)
    slots = torch.tensor([3, -1, 0, 7, 5, 2], device=DEVICE)
    got, expected = caches(2, 4, hk, d, FP8_DTYPE), caches(2, 4, hk, d, FP8_DTYPE)
    kv_write(k, v, *got, slots, kv_scales=scales)
    kv_write_torch(k, v, *expected, slots, kv_scales=scales)
    for a, b in zip(got, expected):
        assert torch.equal(a.view(torch.uint8), b.view(torch.uint8))


def test_bad_inputs_name_the_field():
    k = torch.zeros(3, 2, 16, device=DEVICE)
    cache = torch.zeros(2, 4, 2, 16, device=DEVICE)
    with pytest.raises(ValueError, match="slots is torch.int32"):
        kv_write(k, k, cache, cache, torch.zeros(3, dtype=torch.int32, device=DEVICE))
    with pytest.raises(ValueError, match="k_cache is torch.bfloat16"):
        kv_write(k, k, cache.bfloat16(), cache, torch.zeros(3, dtype=torch.int64, device=DEVICE))
    with pytest.raises(ValueError, match="kv_scales\\[0\\]"):
        kv_write(k, k, cache.to(FP8_DTYPE), cache.to(FP8_DTYPE), torch.zeros(3, dtype=torch.int64, device=DEVICE),
                 kv_scales=(0.3, 1.0))


@pytest.mark.gpu
@pytest.mark.parametrize("fp8", [False, True])
def test_real_shapes(fp8):
    # a sliding layer's 8192-token chunk into 513-row rings: only the last 513 rows written
    g = torch.Generator(device=DEVICE).manual_seed(1)
    n, hk, d, window = 8192, 4, 128, 513
    scales = (0.5, 2.0) if fp8 else None
    k = torch.randn(n, hk, d, generator=g, device=DEVICE).to(torch.bfloat16)
    v = torch.randn(n, 3 * hk, d, generator=g, device=DEVICE).to(torch.bfloat16)[:, 2 * hk:]
    pos = torch.arange(n, device=DEVICE)
    slots = torch.where(pos >= n - window, 3 * window + pos % window, -1)
    dtype = FP8_DTYPE if fp8 else torch.bfloat16
    got, expected = caches(5, window, hk, d, dtype), caches(5, window, hk, d, dtype)
    kv_write(k, v, *got, slots, kv_scales=scales)
    kv_write_torch(k, v, *expected, slots, kv_scales=scales)
    for a, b in zip(got, expected):
        assert torch.equal(a.view(torch.uint8), b.view(torch.uint8))
