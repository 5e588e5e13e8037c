from flint_backend.engine.block_manager import BlockManager
from flint_backend.engine.sampling_params import SamplingParams
from flint_backend.engine.scheduler import Scheduler
from flint_backend.engine.sequence import Sequence, SequenceStatus


def seq(rid, n_tokens, arrival):
    return Sequence(rid, list(range(n_tokens)), n_tokens, SamplingParams(), 100, frozenset(), arrival=arrival)


def advance(batch, sample=True):
    """What the engine does after a step: mark tokens computed, append a token where sampled."""
    for s, n in batch.entries:
        s.num_computed += n
        if sample and s.num_computed == s.num_tokens:
            s.token_ids.append(7)


def test_chunked_prefill_within_budget_and_decodes_first():
    sched = Scheduler(BlockManager(100, 4, 8), max_num_seqs=8, max_num_batched_tokens=10)
    long, short = seq("long", 25, 0.0), seq("short", 3, 1.0)
    sched.add(long)
    sched.add(short)
    b1 = sched.schedule()
    assert [(s.request_id, n) for s, n in b1.entries] == [("long", 10)]
    advance(b1)
    b2 = sched.schedule()
    assert [(s.request_id, n) for s, n in b2.entries] == [("long", 10)]
    advance(b2)
    b3 = sched.schedule()
    assert [(s.request_id, n) for s, n in b3.entries] == [("long", 5), ("short", 3)]
    advance(b3)
    b4 = sched.schedule()  # both decode now: one token each
    assert [(s.request_id, n) for s, n in b4.entries] == [("long", 1), ("short", 1)]
    # a new long prompt gets the remaining budget, decodes are never starved
    sched.add(seq("new", 30, 2.0))
    advance(b4)
    b5 = sched.schedule()
    assert [(s.request_id, n) for s, n in b5.entries] == [("long", 1), ("short", 1), ("new", 8)]


def test_a_step_that_decodes_takes_the_smaller_budget():
    """max_num_batched_tokens_with_decodes: a step with a decoding sequence (whose stream waits for
    it) takes up to that many tokens, decodes included; a step that decodes nothing takes up to
    max_num_batched_tokens; a budget with decodes above max_num_batched_tokens leaves that in force."""
    sched = Scheduler(BlockManager(100, 4, 8), max_num_seqs=8, max_num_batched_tokens=16,
                      max_num_batched_tokens_with_decodes=10)
    long, short = seq("long", 40, 0.0), seq("short", 3, 1.0)
    sched.add(short)
    sched.add(long)
    b1 = sched.schedule()  # nothing decodes: 16 tokens, the short prompt whole and 13 of the long one
    assert [(s.request_id, n) for s, n in b1.entries] == [("short", 3), ("long", 13)]
    advance(b1)
    b2 = sched.schedule()  # short decodes now: the long prompt's chunk is what 10 leaves
    assert [(s.request_id, n) for s, n in b2.entries] == [("short", 1), ("long", 9)]
    sched.remove(short)
    advance(b2)
    b3 = sched.schedule()  # alone again
    assert [(s.request_id, n) for s, n in b3.entries] == [("long", 16)]
    assert Scheduler(BlockManager(100, 4, 8), 8, 10, max_num_batched_tokens_with_decodes=64).decoding_step_tokens == 10
    assert Scheduler(BlockManager(100, 4, 8), 8, 10).decoding_step_tokens == 10


def test_preempts_latest_arrival_when_blocks_run_out():
    sched = Scheduler(BlockManager(4, 4, 4), max_num_seqs=4, max_num_batched_tokens=64)
    a, b = seq("a", 8, 0.0), seq("b", 7, 1.0)
    sched.add(a)
    sched.add(b)
    batch = sched.schedule()
    assert [s.request_id for s, _ in batch.entries] == ["a", "b"]
    advance(batch)  # a has 9 tokens (needs a 3rd block), b has 8
    batch = sched.schedule()
    assert batch.preempted == [b] and b.status is SequenceStatus.WAITING and b.num_computed == 0
    assert [s.request_id for s, _ in batch.entries] == ["a"]
    assert list(sched.waiting) == [b] and b.block_table == [] and b.ring_row is None


def test_waits_instead_of_crashing_when_nothing_fits():
    sched = Scheduler(BlockManager(2, 4, 4), max_num_seqs=4, max_num_batched_tokens=64)
    a, b = seq("a", 8, 0.0), seq("b", 8, 1.0)
    sched.add(a)
    sched.add(b)
    batch = sched.schedule()
    assert [s.request_id for s, _ in batch.entries] == ["a"] and list(sched.waiting) == [b]
    sched.remove(a)
    assert [s.request_id for s, _ in sched.schedule().entries] == ["b"]


def test_max_num_seqs_limits_running():
    sched = Scheduler(BlockManager(100, 4, 8), max_num_seqs=2, max_num_batched_tokens=64)
    for i in range(4):
        sched.add(seq(f"r{i}", 3, float(i)))
    batch = sched.schedule()
    assert [s.request_id for s, _ in batch.entries] == ["r0", "r1"] and len(sched.waiting) == 2


def test_decodes_only_next_when_every_running_sequence_decodes_and_grows():
    """What async scheduling may launch ahead: one decode token for each running sequence, no
    admission, no preemption, none left out."""
    sched = Scheduler(BlockManager(5, 4, 4), max_num_seqs=2, max_num_batched_tokens=64)
    a, b = seq("a", 4, 0.0), seq("b", 3, 1.0)
    sched.add(a)
    assert not sched.decodes_only_next(8)  # a waits for its prefill
    advance(sched.schedule())
    sched.add(b)
    assert not sched.decodes_only_next(8)  # b may be admitted
    advance(sched.schedule())  # a decodes, b prefills
    assert sched.decodes_only_next(8) and not sched.decodes_only_next(1)
    sched.add(seq("c", 3, 2.0))
    steps = 0
    while sched.decodes_only_next(8):  # c waits: max_num_seqs are running
        batch = sched.schedule()
        assert [(s.request_id, n) for s, n in batch.entries] == [("a", 1), ("b", 1)] and not batch.preempted
        advance(batch)
        steps += 1
    assert steps == 5 and sched.blocks.num_free_blocks == 0 and sched.blocks.blocks_needed(b, 1) == 1
    assert sched.schedule().preempted == [b]  # what a step in flight must never meet
