"""build_step_batch: a step's per-token inputs and KV-cache slots, as literals."""

import pytest
import torch

from flint_backend.engine.prefix_cache import OpenPage
from flint_backend.engine.sampling_params import SamplingParams
from flint_backend.engine.sequence import Sequence
from flint_backend.engine.step_batch import build_step_batch


def sequence(token_ids, computed, table, ring_row, open_pages=None) -> Sequence:
    seq = Sequence("r", list(token_ids), len(token_ids), SamplingParams(), 4, frozenset())
    seq.num_computed, seq.block_table, seq.ring_row = computed, table, ring_row
    seq.open_pages = open_pages or {}
    return seq


def values(batch, name):
    tensor = getattr(batch, name)
    return None if tensor is None else tensor.tolist()


def test_a_prefill_chunk_beside_a_decode():
    # blocks of 4 positions, a window of 3; the chunk covers positions 3-8 of 10 (no sample), its
    # block 1 (positions 4-7) fills window page 9; the decode is position 4 of 5 (it samples)
    chunk = sequence(range(10, 20), 3, [7, 2, 5], 1, {1: OpenPage(9)})
    decode = sequence(range(20, 25), 4, [3, 8], 0)
    batch = build_step_batch([(chunk, 6), (decode, 1)], block_size=4, window=3, device=torch.device("cpu"))
    assert values(batch, "input_ids") == [13, 14, 15, 16, 17, 18, 24]
    assert values(batch, "positions") == [3, 4, 5, 6, 7, 8, 4]
    assert values(batch, "query_start_loc") == [0, 6, 7]
    assert values(batch, "context_lens") == [3, 4]
    assert values(batch, "block_tables") == [[7, 2, 5], [3, 8, 0]]
    assert values(batch, "ring_rows") == [1, 0]
    assert values(batch, "full_slots") == [7 * 4 + 3, 8, 9, 10, 11, 5 * 4, 8 * 4]
    assert values(batch, "ring_slots") == [-1, -1, -1, 3, 4, 5, 1]  # the chunk's last 3 only
    assert values(batch, "window_slots") == [-1, 36, 37, 38, 39, -1, -1]
    assert values(batch, "sample_rows") == [6] and batch.sample_seqs == [decode]
    assert not batch.decode_only and batch.max_query_len == 6
    dtypes = {name: getattr(batch, name).dtype for name in ("input_ids", "positions", "full_slots", "ring_slots",
                                                             "window_slots", "sample_rows")}
    assert set(dtypes.values()) == {torch.int64}
    assert {getattr(batch, name).dtype for name in ("query_start_loc", "context_lens", "block_tables",
                                                    "ring_rows")} == {torch.int32}


def test_decodes_alone_and_no_open_page():
    a, b = sequence(range(6), 5, [4, 1], 2), sequence(range(3), 2, [6], 3)
    batch = build_step_batch([(a, 1), (b, 1)], block_size=4, window=3, device=torch.device("cpu"))
    assert values(batch, "full_slots") == [1 * 4 + 1, 6 * 4 + 2]
    assert values(batch, "ring_slots") == [2 * 3 + 2, 3 * 3 + 2]
    assert batch.window_slots is None and batch.decode_only and batch.max_query_len == 1
    assert values(batch, "sample_rows") == [0, 1] and batch.sample_seqs == [a, b]


def test_a_chunk_past_the_known_tokens_is_refused():
    seq = sequence(range(5), 2, [0, 1], 0)
    with pytest.raises(IndexError, match="4 tokens from 2 scheduled, 5 known"):
        build_step_batch([(seq, 4)], block_size=4, window=3, device=torch.device("cpu"))
