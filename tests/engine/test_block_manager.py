from flint_backend.engine.block_manager import BlockManager
from flint_backend.engine.sampling_params import SamplingParams
from flint_backend.engine.sequence import Sequence


def seq(n_tokens):
    return Sequence("r", list(range(n_tokens)), n_tokens, SamplingParams(), 10, frozenset())


def test_grow_allocates_whole_blocks_and_a_ring_row():
    bm = BlockManager(num_blocks=10, block_size=4, num_ring_rows=2)
    s = seq(9)
    assert bm.blocks_needed(s, 9) == 3 and bm.can_grow(s, 9)
    bm.grow(s, 9)
    assert s.block_table == [0, 1, 2] and s.ring_row == 0
    s.num_computed = 9
    assert bm.blocks_needed(s, 3) == 0  # positions 9..11 fit the third block
    assert bm.blocks_needed(s, 4) == 1
    assert abs(bm.usage - 0.3) < 1e-9


def test_free_returns_everything():
    bm = BlockManager(num_blocks=6, block_size=2, num_ring_rows=3)
    seqs = [seq(4) for _ in range(3)]
    for s in seqs:
        bm.grow(s, 4)
    assert bm.num_free_blocks == 0 and bm.num_free_rows == 0
    assert not bm.can_grow(seq(1), 1)
    for s in seqs:
        bm.free(s)
    assert bm.num_free_blocks == 6 and bm.num_free_rows == 3 and bm.usage == 0.0
    assert all(s.block_table == [] and s.ring_row is None for s in seqs)


def test_no_ring_row_means_no_room():
    bm = BlockManager(num_blocks=100, block_size=4, num_ring_rows=1)
    a, b = seq(2), seq(2)
    bm.grow(a, 2)
    assert not bm.can_grow(b, 1)
    assert bm.can_grow(a, 40)
