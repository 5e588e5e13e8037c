"""kv_prefetch.prefetch_rings: the requests it would issue (DRY_RUN, under the interpreter) cover
exactly each sequence's K and V rings, in CHUNK_BYTES pieces, and nothing for a row of -1; on the
H200 the real requests run in a CUDA graph and change no tensor."""

import pytest
import torch

from flint_kernels import kv_prefetch

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def test_dry_run_names_each_rings_chunks(monkeypatch):
    monkeypatch.setattr(kv_prefetch, "CHUNK_BYTES", 128)
    cache = torch.zeros(3, 5, 2, 16, dtype=torch.bfloat16, device=DEVICE)  # a ring: 5 x 2 x 16 x 2 = 320 bytes
    rows = torch.tensor([2, 0, -1], dtype=torch.int32, device=DEVICE)
    named = kv_prefetch.prefetch_rings(cache, cache.clone(), rows, dry_run=True).cpu()  # [B, K|V, chunk, 2]
    ring2 = [[640, 128], [768, 128], [896, 64]]
    ring0 = [[0, 128], [128, 128], [256, 64]]
    assert named.tolist() == [[ring2, ring2], [ring0, ring0], [[[-1, -1]] * 3] * 2]


def test_errors_name_the_field():
    cache = torch.zeros(3, 5, 2, 16, dtype=torch.bfloat16)
    rows = torch.tensor([0], dtype=torch.int32)
    with pytest.raises(ValueError, match="prefetch_rings: k_cache and v_cache"):
        kv_prefetch.prefetch_rings(cache, cache[:2], rows, dry_run=True)
    with pytest.raises(ValueError, match="prefetch_rings: ring_rows is torch.int64"):
        kv_prefetch.prefetch_rings(cache, cache, rows.long(), dry_run=True)
    with pytest.raises(ValueError, match="a ring is 10 bytes"):
        odd = torch.zeros(3, 5, 1, 1, dtype=torch.bfloat16)
        kv_prefetch.prefetch_rings(odd, odd, rows, dry_run=True)


@pytest.mark.gpu
def test_real_rings_in_a_graph_change_nothing():
    k = torch.randn(4, 513, 4, 128, dtype=torch.bfloat16, device=DEVICE)
    v = torch.randn_like(k)
    rows = torch.tensor([3, 1], dtype=torch.int32, device=DEVICE)
    k0, v0 = k.clone(), v.clone()
    kv_prefetch.RINGS = True
    try:
        assert kv_prefetch.can_prefetch(k.device)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            kv_prefetch.prefetch_rings(k, v, rows)
        graph.replay()
        torch.cuda.synchronize()
    finally:
        kv_prefetch.RINGS = False
    assert torch.equal(k, k0) and torch.equal(v, v0)
