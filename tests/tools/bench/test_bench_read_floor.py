"""tools/bench/bench_read_floor.py's layer rows: each launch of the chain reads the expert ids the
launch before wrote (or, ahead, its own table row), sums exactly the chosen experts' gate/up and
down words and block scales, and hands the next launch its ids."""

import pytest
import torch

from tools.bench.bench_read_floor import SLOTS, layer_launches

E, ROWS13, ROWS2 = 16, 4, 8


@pytest.mark.parametrize("ahead", [False, True])
def test_layer_chain_reads_the_chosen_experts(ahead):
    g = torch.Generator().manual_seed(0)
    words = lambda *shape: torch.randint(0, 1000, shape, dtype=torch.int32, generator=g)
    w13, s13, w2, s2 = words(E, 32, 16), words(E, 32, 2), words(E, 64, 4), words(E, 64, 2)
    choices = [torch.randperm(E, generator=g)[:SLOTS].to(torch.int32) for _ in range(3)]
    out = torch.zeros(64, dtype=torch.int32)
    calls = layer_launches(w13, s13, w2, s2, choices, out, ROWS13, ROWS2, warps=4, ahead=ahead, pdl=False)
    up_programs = SLOTS * 32 // ROWS13
    for i, call in enumerate(calls * 2):  # twice round: the last call seeds the first again
        out.zero_()
        call()
        ids = choices[i % 3].long()
        up = [int(w13[ids[p % SLOTS], (p // SLOTS) * ROWS13:][:ROWS13].sum()
                  + s13[ids[p % SLOTS], (p // SLOTS) * ROWS13:][:ROWS13].sum()) for p in range(up_programs)]
        down = [int(w2[ids, r:r + ROWS2].sum() + s2[ids, r:r + ROWS2].sum()) for r in range(0, 64, ROWS2)]
        assert out[:up_programs + 8].tolist() == up + down, i
        assert not out[up_programs + 8:].any()
