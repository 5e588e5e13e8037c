"""Prefix caching (engine.prefix_cache): outputs identical with it on and off, hits wherever the
full blocks and their windows allow, isolation by cache_salt, reuse under round-robin sessions."""

import random

import pytest

from flint_backend.engine.sampling_params import SamplingParams

from engine_cases import make_engine, run_to_completion

WINDOW = 9  # flint-tiny's sliding window: a token reads the 8 positions before it in sliding layers


def shared_prefix_prompts(seed: int, count: int, base_len: int = 90) -> list[list[int]]:
    """Prompts sharing prefixes of random lengths (0 .. base_len, so hits fall at and inside block
    boundaries and windows start mid-block), some repeated whole, some prefixes of others."""
    rng = random.Random(seed)
    base = [rng.randrange(1, 8000) for _ in range(base_len)]
    prompts = []
    for i in range(count):
        if i % 7 == 3 and prompts:
            prompts.append(list(rng.choice(prompts)))  # a repeat
            continue
        shared = rng.randint(0, base_len)
        prompts.append(base[:shared] + [rng.randrange(1, 8000) for _ in range(rng.randint(1, 30))])
    return prompts


def params_for(i: int) -> SamplingParams:
    if i % 2:
        return SamplingParams(temperature=0.8, top_p=0.9, seed=1000 + i, max_tokens=8, ignore_eos=True)
    return SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)


def run_waves(engine, prompts, abort_after: dict[int, int] | None = None) -> dict[int, list[int]]:
    """Adds the prompts four at a time, two steps apart; request i in `abort_after` is aborted once
    it has that many output tokens. -> {i: output ids}"""
    abort_after = abort_after or {}
    seqs, pending = {}, list(enumerate(prompts))
    while pending or engine.has_work():
        for _ in range(min(4, len(pending))):
            i, prompt = pending.pop(0)
            seqs[i] = engine.add_request(prompt, params_for(i), request_id=f"r{i}")
        for _ in range(2):
            engine.step()
            for i, n in abort_after.items():
                if i in seqs and not seqs[i].finished and seqs[i].num_output_tokens >= n:
                    engine.abort(f"r{i}")
    return {i: seq.output_ids for i, seq in seqs.items()}


@pytest.mark.parametrize("overrides", [
    dict(),                                                   # block 4: a window spans two blocks
    dict(block_size=3, max_num_batched_tokens=7),             # windows start mid-block; small chunks
    dict(block_size=16, max_num_batched_tokens=20),           # blocks longer than a window: partial pages
    dict(num_kv_blocks=48, max_model_len=160, max_num_batched_tokens=64),  # preemption, eviction
], ids=["block4", "block3-chunk7", "block16", "preemption"])
def test_caching_on_equals_off(overrides):
    prompts = shared_prefix_prompts(seed=len(overrides), count=24)
    expected = run_waves(make_engine(enable_prefix_caching=False, **overrides), prompts)
    aborted = {5: 0, 11: 3, 17: 1}
    engine = make_engine(**overrides)
    got = run_waves(engine, prompts, abort_after=aborted)
    for i, prompt in enumerate(prompts):
        if i in aborted:
            assert got[i] == expected[i][:len(got[i])], f"request {i} (aborted)"
        else:
            assert got[i] == expected[i], f"request {i}: prompt of {len(prompt)} tokens"
    assert engine.prefix_cache.hits > 0 and engine.blocks.usage == 0.0
    if "num_kv_blocks" in overrides:
        assert engine.metrics.preemptions > 0


def test_a_second_wave_reuses_every_block_boundary_up_to_the_divergence():
    """After the first request finishes, a prompt sharing k tokens of it (prompt + output) reuses
    floor(k / block) blocks, wherever k falls, inside its last block included, and continues as
    without the cache (the windows of blocks the first request decoded come from its ring)."""
    engine, plain = make_engine(), make_engine(enable_prefix_caching=False)
    rng = random.Random(3)
    first = [rng.randrange(1, 8000) for _ in range(50)]
    seq = engine.add_request(first, SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True))
    run_to_completion(engine)
    computed = first + seq.output_ids[:-1]  # the last token is sampled, never computed
    for shared in (4, 9, 23, 48, 50, 53, 56, 59, 61, 65):
        prompt = computed[:shared] + [8001, 8002, 8003]
        greedy = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)
        reuse, alone = engine.add_request(prompt, greedy), plain.add_request(prompt, greedy)
        run_to_completion(engine)
        run_to_completion(plain)
        assert reuse.num_cached_tokens == shared // 4 * 4, f"shared {shared}"
        assert reuse.output_ids == alone.output_ids, f"shared {shared}"


def test_a_whole_prompt_repeated_computes_its_last_token():
    engine = make_engine()
    prompt = list(range(1, 41))
    a = engine.add_request(prompt, SamplingParams(temperature=0.0, max_tokens=3))
    run_to_completion(engine)
    b = engine.add_request(prompt, SamplingParams(temperature=0.0, max_tokens=3))
    run_to_completion(engine)
    assert b.num_cached_tokens == 36 and b.output_ids == a.output_ids  # 39 // 4 blocks


def test_cache_salt_isolates():
    engine = make_engine()
    prompt = list(range(100, 160))

    def cached(salt):
        seq = engine.add_request(prompt, SamplingParams(temperature=0.0, max_tokens=2, cache_salt=salt))
        run_to_completion(engine)
        return seq.num_cached_tokens

    assert cached("tenant-a") == 0
    assert cached(None) == 0          # unsalted never meets salted
    assert cached("tenant-b") == 0
    assert cached("tenant-a") == 56 and cached("tenant-b") == 56 and cached(None) == 56


def test_prompt_logprobs_requests_compute_every_prompt_token():
    engine = make_engine()
    prompt = list(range(7, 47))
    plain = engine.add_request(prompt, SamplingParams(temperature=0.0, max_tokens=2, prompt_logprobs=1))
    run_to_completion(engine)
    again = engine.add_request(prompt, SamplingParams(temperature=0.0, max_tokens=2, prompt_logprobs=1))
    run_to_completion(engine)
    assert again.num_cached_tokens == 0
    assert [lp.token_logprob for lp in again.prompt_logprobs] == [lp.token_logprob for lp in plain.prompt_logprobs]


def test_metrics_count_prompt_tokens_and_hits():
    engine = make_engine()
    prompt = list(range(1, 30))
    for _ in range(2):
        engine.add_request(prompt, SamplingParams(temperature=0.0, max_tokens=1))
        run_to_completion(engine)
    assert (engine.metrics.prefix_cache_queries, engine.metrics.prefix_cache_hits) == (58, 28)


def test_off_caches_nothing():
    engine = make_engine(enable_prefix_caching=False)
    prompt = list(range(1, 30))
    for _ in range(2):
        seq = engine.add_request(prompt, SamplingParams(temperature=0.0, max_tokens=1))
        run_to_completion(engine)
    assert seq.num_cached_tokens == 0 and engine.blocks.num_cached_blocks == 0
    assert engine.runner.kv.page_k.shape[1] == 0


def test_round_robin_sessions_keep_their_prefixes():
    """8 sessions, each a distinct 2K-token prefix growing by a turn (the previous output and 40 new
    tokens) per request, fired round-robin into a pool of ~1.25x their combined working set and a
    small window-page pool: every request after a session's first reuses >= 95% of what it could."""
    sessions, turns, new_tokens, out_tokens, bs = 8, 3, 40, 8, 16
    final = 2048 + turns * (new_tokens + out_tokens)
    pool = int(1.25 * sessions * final) // bs
    engine = make_engine(block_size=bs, num_kv_blocks=pool, num_window_pages=48, max_model_len=4096,
                         max_num_batched_tokens=512)
    rng = random.Random(8)
    history = [[rng.randrange(1, 8000) for _ in range(2048)] for _ in range(sessions)]
    computed: list[list[int]] = [[] for _ in range(sessions)]
    ratios = []
    for turn in range(turns):
        for s in range(sessions):
            prompt = history[s]
            seq = engine.add_request(prompt, SamplingParams(temperature=0.0, max_tokens=out_tokens, ignore_eos=True))
            run_to_completion(engine)
            if turn:
                common = 0
                while common < min(len(computed[s]), len(prompt) - 1) and computed[s][common] == prompt[common]:
                    common += 1
                ratios.append(seq.num_cached_tokens / (common // bs * bs))
            computed[s] = prompt + seq.output_ids[:-1]
            history[s] = prompt + seq.output_ids + [rng.randrange(1, 8000) for _ in range(new_tokens)]
    assert len(ratios) == sessions * (turns - 1) and min(ratios) >= 0.95, ratios


def test_a_failed_step_forgets_the_cache():
    engine = make_engine()
    prompt = list(range(1, 30))
    engine.add_request(prompt, SamplingParams(temperature=0.0, max_tokens=1))
    run_to_completion(engine)
    engine.add_request(prompt + [5, 6], SamplingParams(temperature=0.0, max_tokens=4))
    engine.step()
    engine.fail_all("boom")
    assert engine.blocks.num_cached_blocks == 0
    again = engine.add_request(prompt, SamplingParams(temperature=0.0, max_tokens=1))
    run_to_completion(engine)
    assert again.num_cached_tokens == 0
