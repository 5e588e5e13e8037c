"""Shared engine builders for the engine tests."""

import random

import torch

from flint_backend.engine.engine import LLMEngine
from flint_backend.engine.engine_args import EngineArgs



def make_engine(**overrides) -> LLMEngine:
    args = dict(dtype="float32", device="cpu", block_size=4, max_num_batched_tokens=32, max_num_seqs=32,
                num_kv_blocks=512, max_model_len=512)
    args.update(overrides)
    return LLMEngine(EngineArgs(**args))


def random_prompts(count, lo, hi, seed=0, vocab=8000):
    rng = random.Random(seed)
    return [[rng.randrange(vocab) for _ in range(rng.randint(lo, hi))] for _ in range(count)]


def run_to_completion(engine, max_steps=100_000):
    outputs = []
    for _ in range(max_steps):
        if not engine.has_work():
            return outputs
        outputs.extend(engine.step())
    raise AssertionError("engine did not finish")


def prefill_logits(engine: LLMEngine, prompts: list[list[int]], rows) -> list[torch.Tensor]:
    """fp32 logits [len(rows(L)), V] of each prompt's positions rows(L) (L its length), from the
    model's prefill steps (chunked as the engine schedules them; no token is generated)."""
    from flint_backend.engine.sampling_params import SamplingParams
    from flint_backend.engine.step_batch import build_step_batch

    seqs = [engine.add_request(p, SamplingParams(temperature=0.0, max_tokens=1)) for p in prompts]
    wanted = {s.request_id: set(rows(len(s.token_ids))) for s in seqs}
    got: dict[int, dict[int, torch.Tensor]] = {s.request_id: {} for s in seqs}
    while engine.has_work():
        scheduled = engine.scheduler.schedule()
        batch = build_step_batch(scheduled.entries, engine.blocks.block_size, engine.config.sliding_window,
                                 engine.device)
        x, residual = engine.runner.model.hidden_states(batch, engine.runner.kv)
        row = 0
        for seq, n in scheduled.entries:
            positions = [p for p in range(seq.num_computed, seq.num_computed + n) if p in wanted[seq.request_id]]
            if positions:
                index = torch.tensor([row + p - seq.num_computed for p in positions], device=engine.device)
                out = engine.runner.model.logits_of_rows(x, residual, index).float().cpu()
                got[seq.request_id].update(zip(positions, out))
            row += n
            seq.num_computed += n
        for seq in batch.sample_seqs:
            engine._finish(seq, "length")
    return [torch.stack([got[s.request_id][p] for p in sorted(wanted[s.request_id])]) for s in seqs]
