"""An NVFP4 LM head (nvfp4_linear.nvfp4_logits, rms_norm_nvfp4_logits): fp32 logits with fp32
accumulation, the greedy argmax packed in the head's launch (GEMV or GEMM), vs the torch twin (the dequantised
weight in an fp32 matmul); and ops.norm_logits / ops.logits taking an NVFP4Weight head."""

import pytest
import torch

from flint_backend import ops as ops_module
from flint_backend.weights.nvfp4_quantize import quantize_nvfp4
from flint_kernels import greedy
from flint_kernels import nvfp4_linear as nvfp4_linear_module
from flint_kernels import tuning
from flint_kernels.nvfp4_linear import (GEMV_MAX_TOKENS, nvfp4_logits, nvfp4_logits_torch, rms_norm_nvfp4_logits,
                                        rms_norm_nvfp4_logits_torch)
from launch_spy import spy_launches

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
# both fp32 sums of exact products (bf16 activations x E2M1 * E4M3): the order of the sum and the
# global scale's place (on the sum, or on each weight) only
TOL = dict(rtol=1e-5, atol=1e-4)


def empty_slots(n):
    return torch.full((n,), greedy.EMPTY, dtype=torch.int64, device=DEVICE)


def head(v, k, seed=0, tied=()):
    """An NVFP4 head [V, K] (one global scale, as a GGUF's output.weight + output.scale); rows
    `tied` equal to row 7, whose first 8 columns are large (the best logit of x = 1 there)."""
    w = torch.randn(v, k, generator=torch.Generator().manual_seed(seed)) * k ** -0.5
    if tied:
        w[7, :8] = 1.0
    for row in tied:
        w[row] = w[7]
    return quantize_nvfp4(w).to(DEVICE)


def activations(t, k, seed=0):
    return torch.randn(t, k, generator=torch.Generator().manual_seed(seed)).to(DEVICE, torch.bfloat16)


@pytest.fixture(params=[False, True], ids=["bytes", "words-prefetch"])
def words(request, monkeypatch):
    monkeypatch.setattr(tuning, "FP4_GEMV_WORDS", request.param)
    return request.param


@pytest.mark.parametrize("t,v,k", [(1, 1000, 256), (3, 517, 64), (GEMV_MAX_TOKENS, 130, 512), (5, 517, 256),
                                   (17, 70, 64)], ids=["T1", "T3", "T4", "T5-gemm", "T17-gemm"])
def test_matches_the_torch_twin_with_greedy_slots(t, v, k, words, monkeypatch):
    """fp32 logits, never rounded to bf16, close to the twin's; each token's slot holds the
    argmax of the logits stored (the first of three tied rows in different programs), packed by
    the head's own launch at decode sizes (the GEMV) and beyond (the GEMM's tiles: torch's argmax
    only in the twin). V not a multiple of any block."""
    packs = []
    monkeypatch.setattr(nvfp4_linear_module, "pack_argmax",
                        lambda logits: packs.append(1) or greedy.pack_argmax(logits))
    w = head(v, k, seed=t, tied=(v - 3, v // 2))
    x = activations(t, k, seed=t)
    x[0] = 0.0
    x[0, :8] = 1.0  # token 0's best rows are the tied ones (equal logits, whatever the sum order)
    w_f = w.dequantize(torch.float32)
    assert (w_f[7] @ x[0].float()) == (w_f @ x[0].float()).max()
    slots, twin_slots = empty_slots(t), empty_slots(t)
    got = nvfp4_logits(x, w, greedy=slots)
    expected = nvfp4_logits_torch(x, w, greedy=twin_slots)
    assert packs == [1]  # the twin's
    assert got.dtype == expected.dtype == torch.float32 and got.shape == (t, v)
    torch.testing.assert_close(got, expected, **TOL)
    plain = nvfp4_logits(activations(t, k, seed=t + 100), w)  # random activations: fp32 values, not bf16 ones
    assert (plain != plain.bfloat16().float()).float().mean() > 0.9
    assert torch.equal(slots, greedy.pack_argmax(got))
    assert greedy.token(slots).tolist() == got.argmax(-1).tolist()
    assert greedy.token(slots)[0].item() == greedy.token(twin_slots)[0].item() == 7
    unslotted = nvfp4_logits(x, w)  # without slots: the same logits
    if DEVICE == "cpu":
        assert torch.equal(unslotted, got)
    else:  # up to the fp32 sum's order: a GPU may split K without slots
        torch.testing.assert_close(unslotted, got, rtol=1e-6, atol=1e-5)


@pytest.mark.parametrize("residual", [False, True], ids=["layer-0", "residual"])
@pytest.mark.parametrize("t", [1, GEMV_MAX_TOKENS])
def test_final_norm_folded(t, residual, words):
    """The final residual add + RMSNorm, the head and the argmax in one launch == the twin."""
    k, v = 512, 333
    g = torch.Generator().manual_seed(t)
    x = activations(t, k, seed=t)
    res = torch.randn(t, k, generator=g).to(DEVICE, torch.bfloat16) if residual else None
    norm_w = (1 + 0.1 * torch.randn(k, generator=g)).to(DEVICE, torch.bfloat16)
    w = head(v, k, seed=t)
    before = None if res is None else res.clone()
    slots = empty_slots(t)
    got, got_res = rms_norm_nvfp4_logits(x, res, norm_w, 1e-6, w, greedy=slots)
    exp, exp_res = rms_norm_nvfp4_logits_torch(x, res, norm_w, 1e-6, w)
    assert res is None or torch.equal(res, before)
    torch.testing.assert_close(got_res, exp_res, rtol=2 ** -7, atol=0)  # the interpreter truncates the add
    # the normed activations are bf16 (the interpreter truncates where torch rounds: 1 ulp)
    torch.testing.assert_close(got, exp, rtol=2e-2, atol=2e-2)
    assert torch.equal(slots, greedy.pack_argmax(got))


def test_no_decoded_scratch_and_fp32_products(monkeypatch):
    """The GEMM path of the head decodes in its tiles (no [V, K] scratch, whatever
    FP4_DEQUANT_MIN_TOKENS says); the GEMV path never sums in fp16 (tuning.FP4_GEMV_F16)."""
    monkeypatch.setattr(tuning, "FP4_DEQUANT_MIN_TOKENS", 1)
    monkeypatch.setattr(tuning, "FP4_GEMV_F16", True)
    monkeypatch.setattr(tuning, "FP4_GEMV_WORDS", True)
    dequant = spy_launches(monkeypatch, nvfp4_linear_module, "_dequantize_kernel")
    gemm = spy_launches(monkeypatch, nvfp4_linear_module, "_nvfp4_matmul_kernel", "FP4")
    gemv = spy_launches(monkeypatch, nvfp4_linear_module, "_nvfp4_gemv_kernel", "F16", "GREEDY", "SPLIT")
    w = head(100, 256)
    nvfp4_logits(activations(9, 256), w)
    nvfp4_logits(activations(1, 256), w, greedy=empty_slots(1))
    assert dequant == [] and [fp4 for _, fp4 in gemm] == [True]
    assert [launch[1:] for launch in gemv] == [(False, True, 1)]


def test_twin_decodes_the_head_in_slices(monkeypatch):
    """The twin's fp32 copy of the weight is HEAD_TORCH_ROWS rows at a time: the same logits as
    the whole dequantised head, per-row global scales included."""
    from flint_backend.weights.nvfp4 import concat_rows

    monkeypatch.setattr(nvfp4_linear_module, "HEAD_TORCH_ROWS", 64)
    w = concat_rows([head(150, 128, seed=1), head(67, 128, seed=2)])  # a per-row global scale
    x = activations(3, 128)
    whole = x.float() @ w.dequantize(torch.float32).T
    torch.testing.assert_close(nvfp4_logits_torch(x, w), whole, rtol=0, atol=0)


def test_errors_name_the_argument():
    w = head(40, 64)
    x = activations(2, 64)
    with pytest.raises(ValueError, match=r"greedy is torch.int32 \(2,\).*expected int64 \[2\]"):
        nvfp4_logits(x, w, greedy=torch.zeros(2, dtype=torch.int32, device=DEVICE))
    with pytest.raises(ValueError, match=r"expected \[T, 64\]"):
        nvfp4_logits(activations(2, 32), w)
    with pytest.raises(ValueError, match=r"expected contiguous \[T <= 4"):
        rms_norm_nvfp4_logits(activations(5, 64), None, torch.ones(64, device=DEVICE), 1e-6, w)


@pytest.mark.parametrize("t", [1, 3, 5], ids=["T1-folded", "T3-folded", "T5-gemm"])
def test_ops_norm_logits_with_an_nvfp4_head(t, monkeypatch):
    """ops.norm_logits / ops.logits of an NVFP4Weight head: the triton table folds the final norm
    into the head's GEMV at decode sizes (its greedy slots too), composes rms_norm and the GEMM
    beyond; both equal the torch table's fp32 logits and argmax."""
    calls = []
    real = nvfp4_linear_module.rms_norm_nvfp4_logits
    monkeypatch.setattr(ops_module.nvfp4_k, "rms_norm_nvfp4_logits",
                        lambda *a, **kw: calls.append(1) or real(*a, **kw))
    k, v = 256, 517
    g = torch.Generator().manual_seed(t)
    x = activations(t, k, seed=t)
    res = torch.randn(t, k, generator=g).to(DEVICE, torch.bfloat16)
    norm_w = (1 + 0.1 * torch.randn(k, generator=g)).to(DEVICE, torch.bfloat16)
    w = head(v, k, seed=t)
    triton_ops, torch_ops = ops_module.get_ops("triton"), ops_module.get_ops("torch")
    slots, twin_slots = triton_ops.greedy_slots(t, DEVICE), torch_ops.greedy_slots(t, DEVICE)
    got = triton_ops.norm_logits(x, res.clone(), norm_w, 1e-6, w, slots)
    expected = torch_ops.norm_logits(x, res.clone(), norm_w, 1e-6, w, twin_slots)
    assert calls == ([1] if t <= GEMV_MAX_TOKENS else [])
    assert got.dtype == expected.dtype == torch.float32
    torch.testing.assert_close(got, expected, rtol=2e-2, atol=2e-2)  # bf16 normed activations (interpreter)
    assert torch.equal(slots, greedy.pack_argmax(got))
    assert torch.equal(twin_slots, greedy.pack_argmax(expected))
    h = torch_ops.rms_norm(x, norm_w, 1e-6, residual=res.clone())
    torch.testing.assert_close(triton_ops.logits(h, w), torch_ops.logits(h, w), **TOL)


@pytest.mark.gpu
@pytest.mark.parametrize("t", [1, 4, 8, 64, 256])
def test_real_head(t):
    """flint-40b's NVFP4 head (150144 x 2048, one global scale) with the final norm folded at
    decode sizes (64 tokens: nvfp4_linear.GEMM_WIDE_N's tiles): the twin's logits, and every slot
    the argmax of the logits stored."""
    v, k = 150144, 2048
    g = torch.Generator().manual_seed(t)
    x = activations(t, k, seed=t)
    res = torch.randn(t, k, generator=g).to(DEVICE, torch.bfloat16)
    norm_w = (1 + 0.1 * torch.randn(k, generator=g)).to(DEVICE, torch.bfloat16)
    w = quantize_nvfp4(torch.randn(v, k, device=DEVICE) * k ** -0.5)
    triton_ops, torch_ops = ops_module.get_ops("triton"), ops_module.get_ops("torch")
    slots = triton_ops.greedy_slots(t, DEVICE)
    got = triton_ops.norm_logits(x, res.clone(), norm_w, 1e-6, w, slots)
    expected = torch_ops.norm_logits(x, res.clone(), norm_w, 1e-6, w)
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=2e-3)  # rsqrt.approx: normed bf16 1 ulp apart
    assert torch.equal(slots, greedy.pack_argmax(got))
