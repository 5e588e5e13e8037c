"""tools/bench/sweep_tiles.py's moe_experts rows: the routing over N experts and the count of the
grouped MoE's gate/up programs with work that labels them."""

import torch

from tools.bench.bench_kernels import FULL
from tools.bench.sweep_tiles import _routing_over, gate_up_programs


def test_routing_over_n_experts_draws_distinct_experts_among_them():
    ids, weights = _routing_over(64, 48, 256 - 48, FULL, "cpu")
    assert ids.dtype == torch.int32 and ids.shape == weights.shape == (64, FULL["top_k"])
    assert ids.min() >= 208 and ids.max() < 256
    assert all(len(set(row.tolist())) == FULL["top_k"] for row in ids)
    torch.testing.assert_close(weights.sum(-1), torch.ones(64))


def test_gate_up_programs_count_blocks_of_8_pairs_by_column_tiles():
    # flint-40b: 4 column tiles of 128 a routed block (I = 512), 8 a shared block (Is = 1024)
    assert gate_up_programs(torch.tensor([[0, 1], [0, 2]]), 2, FULL) == 3 * 4 + 1 * 8
    # experts 5 and 6 hold 9 pairs each: two blocks each, 7 and 8 one; 17 tokens: three shared blocks
    ids = torch.tensor([[5, 6]] * 9 + [[7, 8]] * 8)
    assert gate_up_programs(ids, 17, FULL) == (2 + 2 + 1 + 1) * 4 + 3 * 8
