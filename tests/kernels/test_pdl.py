"""flint_kernels/pdl.py: when programmatic dependent launch is on, the interpreter never sees its PTX,
and (GPU) a CUDA graph of PDL kernels replays to the same bits as one without."""

import os
import subprocess
import sys

import pytest
import torch
import triton
import triton.language as tl

from flint_kernels import pdl, tuning
from flint_kernels.pdl import launch_args, pdl_prologue

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
CUDA0 = torch.device("cuda", 0)  # a device object needs no GPU


@pytest.fixture
def flags(monkeypatch):
    """pdl's switches as on an sm_90 GPU outside the interpreter; a test changes one."""
    monkeypatch.setattr(tuning, "PDL", True)
    monkeypatch.setattr(tuning, "INTERPRET", False)
    monkeypatch.setattr(pdl, "ON_HOST", False)
    monkeypatch.setattr(pdl, "_major", lambda index: 9)
    return monkeypatch


def test_on_for_sm90_cuda_only(flags):
    assert pdl.enabled(CUDA0)
    assert launch_args(CUDA0) == {"PDL": True, "launch_pdl": True}
    assert not pdl.enabled(torch.device("cpu"))
    assert launch_args(torch.device("cpu")) == {"PDL": False}
    flags.setattr(pdl, "_major", lambda index: 8)  # griddepcontrol is sm_90+
    assert not pdl.enabled(CUDA0)


@pytest.mark.parametrize("switch,value", [("PDL", False), ("INTERPRET", True)])
def test_switches_turn_it_off(flags, switch, value):
    flags.setattr(tuning, switch, value)
    flags.setattr(pdl, "ON_HOST", True)  # even compile_kernels.py's host launches
    assert not pdl.enabled(CUDA0) and not pdl.enabled(torch.device("cpu"))
    assert launch_args(CUDA0) == {"PDL": False}


@pytest.mark.parametrize("env,enabled,interpret", [
    ({}, True, False), ({"FLINT_PDL": "0"}, False, False), ({"FLINT_PDL": "1"}, True, False),
    ({"FLINT_PDL": "1", "TRITON_INTERPRET": "1"}, True, True)])
def test_environment_read_at_import(env, enabled, interpret):
    base = {k: v for k, v in os.environ.items() if k not in ("FLINT_PDL", "TRITON_INTERPRET")}
    out = subprocess.run([sys.executable, "-c",
                          "from flint_kernels import pdl, tuning; print(tuning.PDL, tuning.INTERPRET)"],
                         env={**base, **env}, capture_output=True, text=True, check=True).stdout
    assert out.split() == [str(enabled), str(interpret)]


def test_bad_environment_value_names_the_variable():
    base = {k: v for k, v in os.environ.items() if k != "FLINT_PDL"}
    run = subprocess.run([sys.executable, "-c", "from flint_kernels import pdl"], env={**base, "FLINT_PDL": "yes"},
                         capture_output=True, text=True)
    assert run.returncode != 0
    assert "FLINT_PDL: got 'yes', expected '0' or '1'" in run.stderr


@triton.jit
def _add_one_kernel(src_ptr, dst_ptr, N, BLOCK: tl.constexpr, PDL: tl.constexpr):
    pdl_prologue(PDL)
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(dst_ptr + offs, tl.load(src_ptr + offs, mask=offs < N) + 1, mask=offs < N)


@pytest.mark.skipif(not tuning.INTERPRET, reason="interpreter only")
def test_interpreter_never_traces_the_prologue():
    src = torch.arange(100, dtype=torch.float32)
    dst = torch.empty_like(src)
    # PDL off: the prologue's branch is not run; a stray launch option is dropped, not an argument
    _add_one_kernel[(4,)](src_ptr=src, dst_ptr=dst, N=100, BLOCK=32, PDL=False, launch_pdl=True)
    assert torch.equal(dst, src + 1)
    with pytest.raises(Exception, match="_semantic"):  # what the branch keeps away: inline PTX
        _add_one_kernel[(4,)](src_ptr=src, dst_ptr=dst, N=100, BLOCK=32, PDL=True)


# ----------------------------------------------------------------------------- GPU
def _decode_chain(x, res, p):
    """Batch-1 decode-shaped chain: every kernel reads what the one before wrote; torch ops
    (launched without PDL) in between. -> (sampled tokens [1], final hidden [1, H])."""
    from flint_kernels.moe_gemv import moe_gemv
    from flint_kernels.nvfp4_linear import nvfp4_linear, nvfp4_logits
    from flint_kernels.rms_norm import rms_norm
    from flint_kernels.router import router_topk
    from flint_kernels.sampling import sample
    from flint_kernels.swiglu import silu_mul

    res = res.clone()
    for _ in range(p["layers"]):
        h = rms_norm(x, p["norm"], 1e-5, residual=res)
        ids, weights = router_topk(h, p["router"], 6, True)
        x = moe_gemv(h, ids, weights, p["w13"], p["w2"])
        x = x + moe_gemv(h, ids, weights, p["w13_fp4"], p["w2_fp4"])  # down reads ids before its wait
        x = x + nvfp4_linear(silu_mul(nvfp4_linear(h, p["up"])), p["down"])
    logits = nvfp4_logits(rms_norm(x, p["norm"], 1e-5, residual=res), p["head"])
    return sample(logits, *p["sampling"]), x


def _chain_weights(h=2048, i=512, experts=32, vocab=4096):
    from flint_backend.weights.nvfp4_quantize import quantize_nvfp4
    g = torch.Generator().manual_seed(0)

    def rand(*shape, scale=0.05):
        return (torch.randn(*shape, generator=g) * scale).to(torch.bfloat16).to(DEVICE)

    def fp4(n, k):
        return quantize_nvfp4(torch.randn(n, k, generator=g) * k ** -0.5).to(DEVICE)

    ones, zeros = torch.ones(1, device=DEVICE), torch.zeros(1, device=DEVICE)
    sampling = (ones, torch.full((1,), 50, dtype=torch.int32, device=DEVICE), 0.9 * ones, zeros,
                torch.full((1,), 7, dtype=torch.int64, device=DEVICE), torch.zeros(1, dtype=torch.int64, device=DEVICE))
    def fp4_experts(n, k):
        return quantize_nvfp4(torch.randn(experts, n, k, generator=g) * k ** -0.5).to(DEVICE)

    return dict(layers=4, norm=1 + rand(h), router=rand(experts, h),
                w13=rand(experts, 2 * i, h), w2=rand(experts, h, i), up=fp4(2 * i, h), down=fp4(h, i),
                w13_fp4=fp4_experts(2 * i, h), w2_fp4=fp4_experts(h, i),
                head=fp4(vocab, h), sampling=sampling)


def _replays(p, x, res, replays=20):
    """Eager result, then `replays` replays of the chain captured in a CUDA graph."""
    eager = _decode_chain(x, res, p)  # also compiles this PDL variant before the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = _decode_chain(x, res, p)
    outs = []
    for _ in range(replays):
        graph.replay()
        outs.append(tuple(t.clone() for t in captured))
    torch.cuda.synchronize()
    return eager, outs


@pytest.mark.gpu
def test_graph_replay_with_pdl_equals_without(monkeypatch):
    monkeypatch.setattr(tuning, "PDL", True)
    if not pdl.enabled(torch.device(DEVICE)):
        pytest.skip("PDL needs compute capability 9.0+")
    p = _chain_weights()
    x, res = (torch.randn(1, 2048, device=DEVICE).to(torch.bfloat16) for _ in range(2))
    results = {}
    for on in (True, False):  # FLINT_PDL's values
        monkeypatch.setattr(tuning, "PDL", on)
        eager, outs = _replays(p, x, res)
        for i, out in enumerate(outs):
            assert all(torch.equal(a, b) for a, b in zip(out, eager)), f"PDL {on}: replay {i} differs from eager"
        results[on] = eager
    assert all(torch.equal(a, b) for a, b in zip(results[True], results[False])), "PDL on differs from off"
