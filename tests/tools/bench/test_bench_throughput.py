"""bench.throughput's warm-up runs every step of the timed run that prefills, with the same token
and sequence counts, so that no kernel specialisation is first met while timed (flint-tiny on the
CPU; the scheduler sees only lengths)."""

import pytest

from flint_backend.engine import runner
from flint_backend.engine.engine import LLMEngine
from flint_backend.engine.engine_args import EngineArgs
from tools.bench import bench


@pytest.fixture
def prefill_steps(monkeypatch):
    """-> the list each eager step that prefills appends (tokens, sequences) to."""
    steps = []
    build = runner.build_step_batch

    def record(entries, *args, **kwargs):
        batch = build(entries, *args, **kwargs)
        if not batch.decode_only:
            steps.append((batch.input_ids.shape[0], batch.context_lens.shape[0]))
        return batch

    monkeypatch.setattr(runner, "build_step_batch", record)
    return steps


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
def test_the_timed_run_prefills_only_in_steps_its_warm_up_ran(prefill_steps, async_scheduling):
    engine = LLMEngine(EngineArgs(preset="flint-tiny", device="cpu", kernel_backend="torch", max_num_seqs=16,
                                  max_graph_batch=16, max_num_batched_tokens=96, max_model_len=256,
                                  num_kv_blocks=64, block_size=16, async_scheduling=async_scheduling,
                                  enable_prefix_caching=False))
    prompts = [[1 + (i * 31 + j) % 200 for j in range(37)] for i in range(12)]  # 444 tokens: 5+ chunks
    steps = bench.prefill_warm_up(engine, prompts, 24)
    warm = list(prefill_steps)
    assert not engine.has_work() and engine.blocks.num_free_blocks == 64
    assert steps == len(warm)  # the first stream's tokens: one a step from its prefill's end
    prefill_steps.clear()
    row = bench.throughput(engine, 12, 37, 24, warmup=False)
    # the same requests, so the same steps: 96 tokens each (decodes first) but the last
    assert prefill_steps == warm and [n for n, _ in warm[:-1]] == [96] * (len(warm) - 1)
    assert row["output_tok_s"] > 0 and row["jit_compiles"] == []  # torch kernels: nothing compiles
