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


def test_cached_blocks_outlive_their_sequence_and_go_last_block_first():
    bm = BlockManager(num_blocks=4, block_size=2, num_ring_rows=2)
    a = seq(6)
    bm.grow(a, 6)
    for j, h in enumerate((b"h0", b"h1", b"h2")):
        bm.register(a.block_table[j], h)
    assert bm.cached_prefix([b"h0", b"h1", b"x", b"h2"]) == [0, 1]
    bm.free(a)
    assert bm.num_free_blocks == 4 and bm.usage == 0.0 and bm.num_cached_blocks == 3
    b = seq(2)
    bm.grow(b, 2)
    assert b.block_table == [3]  # a never-cached block goes first
    c = seq(2)
    bm.grow(c, 2)
    assert c.block_table == [2] and bm.cached_prefix([b"h0", b"h1", b"h2"]) == [0, 1]  # the tail went first


def test_taking_a_cached_prefix_shares_and_revives_blocks():
    bm = BlockManager(num_blocks=4, block_size=2, num_ring_rows=3)
    a = seq(4)
    bm.grow(a, 4)
    bm.register(a.block_table[0], b"h0")
    b = seq(5)
    assert bm.can_take(b, [0], 3)  # one shared block, two new
    bm.take(b, [0])
    bm.grow(b, 2 + 3)
    assert b.block_table[0] == 0 and len(b.block_table) == 3 and bm.num_free_blocks == 0
    bm.free(a)
    assert bm.num_free_blocks == 1  # block 0 is still b's
    bm.free(b)
    assert bm.num_free_blocks == 4 and bm.cached_prefix([b"h0"]) == [0]
    c = seq(3)
    assert not bm.can_take(c, [0], 10)  # 1 revived + 5 new > 4
    bm.reset_cache()
    assert bm.cached_prefix([b"h0"]) == [] and bm.num_free_blocks == 4


def test_window_pages_evict_tails_last():
    from flint_backend.engine.prefix_cache import WindowPages
    pages = WindowPages(3)
    for h, tail in ((b"t", True), (b"a", False), (b"b", False)):
        pages.commit(pages.allocate(), h, 0, tail)
    pages.use(pages.get(b"a")[0])  # a used after b: b is the least recently used
    page_b = pages.get(b"b")[0]
    assert pages.allocate() == page_b and pages.get(b"b") is None and pages.get(b"t") is not None
    pages.allocate()
    assert pages.get(b"a") is None and pages.get(b"t") is not None  # the tail outlives the others
    assert pages.allocate() is not None and pages.get(b"t") is None and pages.allocate() is None
