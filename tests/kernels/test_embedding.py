"""embedding (the decode step's first launch, with the PDL prologue) vs torch indexing."""

import pytest
import torch

from flint_backend import ops as ops_module
from flint_kernels import embedding as embedding_module
from flint_kernels.embedding import embedding, embedding_torch

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("ids_dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("n,v,h", [(1, 50, 64), (5, 1000, 1536), (3, 7, 100)],
                         ids=["one-token", "H-over-two-blocks", "H-not-a-block-multiple"])
def test_rows_are_copied_exactly(n, v, h, dtype, ids_dtype):
    g = torch.Generator().manual_seed(n)
    weight = torch.randn(v, h, generator=g).to(DEVICE, dtype)
    ids = torch.randint(0, v, (n,), generator=g).to(DEVICE, ids_dtype)
    ids[0] = v - 1  # the last row
    got = embedding(weight, ids)
    assert got.dtype == dtype and got.shape == (n, h)
    assert torch.equal(got, weight[ids])
    assert torch.equal(embedding_torch(weight, ids), weight[ids])


def test_prefill_batches_index_with_torch(monkeypatch):
    """Beyond MAX_TOKENS (prefill chunks) the launcher indexes with torch; the same rows."""
    monkeypatch.setattr(embedding_module, "MAX_TOKENS", 2)
    weight = torch.randn(30, 64, device=DEVICE)
    ids = torch.tensor([3, 29, 0, 3], device=DEVICE)
    launches = []

    class Counted:  # the kernel, counting its launches
        def __getitem__(self, grid):
            launches.append(grid)
            return real[grid]

    real = embedding_module._embedding_kernel
    monkeypatch.setattr(embedding_module, "_embedding_kernel", Counted())
    assert torch.equal(embedding(weight, ids), weight[ids]) and launches == []
    assert torch.equal(embedding(weight, ids[:2]), weight[ids[:2]]) and len(launches) == 1
    assert embedding(weight, ids[:0]).shape == (0, 64)


def test_errors_name_the_argument():
    weight = torch.randn(30, 64, device=DEVICE)
    with pytest.raises(ValueError, match=r"ids is torch.float32 \(2,\)"):
        embedding(weight, torch.zeros(2, device=DEVICE))
    with pytest.raises(ValueError, match=r"ids is torch.int64 \(1, 2\)"):
        embedding(weight, torch.zeros(1, 2, dtype=torch.int64, device=DEVICE))
    with pytest.raises(ValueError, match=r"weight has shape \(64, 30\)"):
        embedding(weight.T, torch.zeros(2, dtype=torch.int64, device=DEVICE))


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_ops_embedding_and_logits(backend):
    """The op table's embedding and logits (the LM head as fp32 values of its bf16 outputs)."""
    ops = ops_module.get_ops(backend)
    g = torch.Generator().manual_seed(0)
    weight = torch.randn(40, 64, generator=g).to(DEVICE, torch.bfloat16)
    ids = torch.tensor([5, 39], device=DEVICE)
    assert torch.equal(ops.embedding(weight, ids), weight[ids])
    h = torch.randn(2, 64, generator=g).to(DEVICE, torch.bfloat16)
    logits = ops.logits(h, weight)
    assert logits.dtype == torch.float32 and logits.shape == (2, 40)
    assert torch.equal(logits, ops.linear(h, weight).float())
