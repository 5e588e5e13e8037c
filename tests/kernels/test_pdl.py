"""kernels/pdl.py: when programmatic dependent launch is on; the interpreter never sees its PTX."""

import os
import subprocess
import sys

import pytest
import torch
import triton
import triton.language as tl

from flint_kernels import pdl
from flint_kernels.pdl import launch_args, pdl_prologue

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
CUDA0 = torch.device("cuda", 0)  # a device object needs no GPU


@pytest.fixture
def flags(monkeypatch):
    """pdl's switches as on an sm_90 GPU outside the interpreter; a test changes one."""
    monkeypatch.setattr(pdl, "ENABLED", True)
    monkeypatch.setattr(pdl, "INTERPRET", False)
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


@pytest.mark.parametrize("switch,value", [("ENABLED", False), ("INTERPRET", True)])
def test_switches_turn_it_off(flags, switch, value):
    flags.setattr(pdl, switch, value)
    flags.setattr(pdl, "ON_HOST", True)  # even compile_kernels.py's host launches
    assert not pdl.enabled(CUDA0) and not pdl.enabled(torch.device("cpu"))
    assert launch_args(CUDA0) == {"PDL": False}


@pytest.mark.parametrize("env,enabled,interpret", [({}, True, False), ({"FLINT_PDL": "0"}, False, False),
                                                   ({"FLINT_PDL": "1", "TRITON_INTERPRET": "1"}, True, True)])
def test_environment_read_at_import(env, enabled, interpret):
    base = {k: v for k, v in os.environ.items() if k not in ("FLINT_PDL", "TRITON_INTERPRET")}
    out = subprocess.run([sys.executable, "-c", "from flint_kernels import pdl; print(pdl.ENABLED, pdl.INTERPRET)"],
                         env={**base, **env}, capture_output=True, text=True, check=True).stdout
    assert out.split() == [str(enabled), str(interpret)]


@triton.jit
def _add_one_kernel(src_ptr, dst_ptr, N, BLOCK: tl.constexpr, PDL: tl.constexpr):
    pdl_prologue(PDL)
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(dst_ptr + offs, tl.load(src_ptr + offs, mask=offs < N) + 1, mask=offs < N)


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="interpreter only")
def test_interpreter_never_traces_the_prologue():
    src = torch.arange(100, dtype=torch.float32)
    dst = torch.empty_like(src)
    # PDL off: the prologue's branch is not run; a stray launch option is dropped, not an argument
    _add_one_kernel[(4,)](src_ptr=src, dst_ptr=dst, N=100, BLOCK=32, PDL=False, launch_pdl=True)
    assert torch.equal(dst, src + 1)
    with pytest.raises(Exception, match="_semantic"):  # what the branch keeps away: inline PTX
        _add_one_kernel[(4,)](src_ptr=src, dst_ptr=dst, N=100, BLOCK=32, PDL=True)

