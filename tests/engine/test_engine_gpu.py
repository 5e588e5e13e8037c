"""The engine on a GPU at flint-small (full per-layer shapes, 7 layers): Triton kernels vs the
torch ops and transformers' FlintForCausalLM (the oracle; a transformers >= 5.21 wheel must be
carried to the device), CUDA-graph replay vs eager."""

import pytest
import torch

from flint_backend.config import FlintConfig
from flint_backend.engine.engine import LLMEngine
from flint_backend.engine.engine_args import EngineArgs
from flint_backend.engine.sampling_params import SamplingParams
from flint_backend.engine.step_batch import build_step_batch
from flint_backend.weights.random_init import random_stacked_weights

from engine_cases import prefill_logits
from oracle import BF16_BOUND, TIE_MARGIN, logits_distance, oracle_model

pytestmark = pytest.mark.gpu
PROMPTS = [[(7 * i + 3 * j) % 8000 + 1 for j in range(n)] for i, n in enumerate((5, 130, 600, 1100))]


def engine(weights, config, **overrides):
    args = dict(preset="flint-small", dtype="bfloat16", device="cuda", kernel_backend="triton",
                block_size=64, max_num_seqs=16, max_num_batched_tokens=512, max_model_len=4096,
                num_kv_blocks=512)
    args.update(overrides)
    return LLMEngine(EngineArgs(**args), config=config, weights=weights)


def last_logits(eng, prompts):
    """The last prompt position's logits of each prompt, from the model's forward (prefill steps
    only: an engine made for it needs no decode graphs, enforce_eager, whose capture would compile
    every decode kernel for five batch sizes first)."""
    seqs = [eng.add_request(p, SamplingParams(temperature=0.0, max_tokens=1)) for p in prompts]
    logits = {}
    while eng.has_work():
        scheduled = eng.scheduler.schedule()
        batch = build_step_batch(scheduled.entries, eng.blocks.block_size, eng.config.sliding_window, eng.device)
        out = eng.runner.model.forward(batch, eng.runner.kv)
        for row, seq in enumerate(batch.sample_seqs):
            logits[seq.request_id] = out[row].float().cpu()
        for seq, n in scheduled.entries:
            seq.num_computed += n
        for seq in batch.sample_seqs:
            eng._finish(seq, "length")
    return [logits[s.request_id] for s in seqs]


@pytest.fixture(scope="module", params=["bf16", "nvfp4"])
def small(request):
    config = FlintConfig.preset("flint-small")
    weights = random_stacked_weights(config, 0, torch.bfloat16, "cuda", nvfp4=request.param == "nvfp4")
    return request.param, config, weights


@pytest.mark.parametrize("fmt", ["bf16", "nvfp4"])
def test_kernels_match_torch_ops_in_fp32(fmt):
    """fp32 end to end, so no router choice flips on rounding: the kernels compute the torch
    ops' function (NVFP4 weights dequantised exactly in both)."""
    config = FlintConfig.preset("flint-small")
    weights = random_stacked_weights(config, 0, torch.float32, "cuda", nvfp4=fmt == "nvfp4")
    kernels = last_logits(engine(weights, config, dtype="float32", enforce_eager=True), PROMPTS)
    plain = last_logits(engine(weights, config, dtype="float32", kernel_backend="torch", enforce_eager=True), PROMPTS)
    for a, b in zip(kernels, plain):
        assert (a - b).abs().max().item() < 2e-3 * b.abs().max().item(), f"{fmt}: kernels vs torch ops (fp32)"
        assert int(a.argmax()) == int(b.argmax())


LONG = [[(13 * i + 5 * j) % 8000 + 1 for j in range(n)] for i, n in enumerate((1100, 1500))]


def past_the_window(length: int) -> range:
    """Every 8th position past twice the window (513): where a window error shows."""
    return range(2 * 513, length, 8)


def test_bf16_kernels_are_within_the_bound_of_the_fp32_oracle(small):
    """The bf16 engine (Triton kernels, chunked prefill of 512 tokens a step) against transformers'
    FlintForCausalLM in fp32 on the same weights: oracle.logits_distance under oracle.BF16_BOUND,
    the bound that a window one wider, a dropped shared expert, rope_theta x 2 or routed experts
    x 1.1 exceed on the CPU (test_bf16_bound.py)."""
    fmt, config, weights = small
    got = prefill_logits(engine(weights, config, enforce_eager=True), LONG, past_the_window)
    torch.backends.cuda.matmul.allow_tf32 = False
    oracle = oracle_model(config, weights, torch.float32)
    with torch.no_grad():
        expected = [oracle(torch.tensor([p], device="cuda")).logits[0, past_the_window(len(p))].float().cpu()
                    for p in LONG]
    del oracle
    torch.cuda.empty_cache()
    distance = logits_distance(got, expected)
    print(f"{fmt}: bf16 kernels vs the fp32 oracle, logits distance {distance:.4f} (bound {BF16_BOUND})")
    assert distance < BF16_BOUND, fmt


@pytest.mark.parametrize("fmt", ["bf16", "nvfp4"])
def test_fp32_greedy_of_eight_concurrent_requests_equals_transformers(fmt):
    """fp32 end to end: the engine (Triton kernels, CUDA graphs, continuous batching of 8 requests)
    generates transformers' greedy tokens, 32 of each; prompts whose oracle path has a near-tie
    are left out (at least 8 of 12 remain)."""
    torch.backends.cuda.matmul.allow_tf32 = False
    config = FlintConfig.preset("flint-small")
    weights = random_stacked_weights(config, 0, torch.float32, "cuda", nvfp4=fmt == "nvfp4")
    candidates = [[(17 * i + 7 * j) % 8000 + 1 for j in range(n)] for i, n in enumerate(
        (3, 40, 200, 513, 514, 700, 1030, 64, 9, 300, 900, 128))]
    oracle = oracle_model(config, weights, torch.float32)
    fair = {}
    with torch.no_grad():
        for prompt in candidates:
            out = oracle.generate(torch.tensor([prompt], device="cuda"), max_new_tokens=32, do_sample=False,
                                  output_logits=True, return_dict_in_generate=True, pad_token_id=0)
            gaps = [step[0].float().topk(2).values for step in out.logits]
            if all(float(g[0] - g[1]) >= 10 * TIE_MARGIN for g in gaps):
                fair[tuple(prompt)] = out.sequences[0, len(prompt):].tolist()
    del oracle
    torch.cuda.empty_cache()
    assert len(fair) >= 8, f"{fmt}: only {len(fair)} prompts free of near-ties"
    prompts = [list(p) for p in fair][:8]
    eng = engine(weights, config, dtype="float32", max_num_seqs=8)
    params = SamplingParams(temperature=0.0, max_tokens=32, ignore_eos=True)
    seqs = [eng.add_request(p, params) for p in prompts]
    while eng.has_work():
        eng.step()
    for prompt, seq in zip(prompts, seqs):
        assert seq.output_ids == fair[tuple(prompt)], f"{fmt}: prompt of {len(prompt)} tokens"


def test_graph_replay_equals_eager(small):
    """Greedy decode through the replayed graphs, synchronous: each step the same batch as
    eager's (4, then 2, then 1 rows as the prompts finish). Async scheduling would launch a step
    ahead with the rows of sequences whose last token is still in flight (their tokens dropped):
    the 1100-token prompt's 10th token came from 4 rows instead of eager's 2, where the decode
    attention takes other splits, and flipped on a near-tie (H100 and H200, NVFP4, 792cce6).
    The seeded test below runs async scheduling on batches that finish together."""
    fmt, config, weights = small
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    outs = []
    for eager in (True, False):
        eng = engine(weights, config, enforce_eager=eager, async_scheduling=False)
        seqs = [eng.add_request(p, params) for p in PROMPTS]
        while eng.has_work():
            eng.step()
        outs.append([s.output_ids for s in seqs])
    assert outs[0] == outs[1], f"{fmt}: graph replay of the regular path must be bit-identical to eager"


def test_warm_up_leaves_the_engine_as_it_found_it(small):
    """On CUDA with the triton backend the engine warms up when it starts (EngineArgs.warmup's
    default): afterwards its KV pool is free, its metrics zero, and it generates the tokens of an
    engine that did not warm up (synchronous steps, as above)."""
    fmt, config, weights = small
    params = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
    outs = []
    for warmup in (None, False):
        eng = engine(weights, config, warmup=warmup, async_scheduling=False)
        assert (eng.warmup_s is not None) == (warmup is None), fmt
        assert eng.blocks.usage == 0.0 and eng.metrics.prompt_tokens == 0 and not eng.has_work()
        seqs = [eng.add_request(p, params) for p in PROMPTS]
        while eng.has_work():
            eng.step()
        outs.append([s.output_ids for s in seqs])
    assert outs[0] == outs[1], f"{fmt}: tokens after the warm-up differ"


def test_graph_replay_with_seeded_sampling_equals_eager(small):
    """Seeded draws (the fused sampler) mixed with a greedy row: replayed decode graphs under async
    scheduling (sampled tokens packed into the argmax slots, copied back on a side stream, read by
    the next step's embedding) emit what synchronous eager steps emit. Four prompts of one length
    prefill in one step and decode together to the end, so every decode step has the same batch
    (bucket 4) both ways: kernels sized by the batch (the MoE's rows a program) sum in the same
    order, and the draws see the same logits bits."""
    fmt, config, weights = small
    prompts = [[(11 * i + 5 * j) % 8000 + 1 for j in range(100)] for i in range(4)]
    params = [SamplingParams(temperature=0.8, top_p=0.9, seed=11, max_tokens=12, ignore_eos=True),
              SamplingParams(temperature=1.0, top_k=20, seed=12, max_tokens=12, ignore_eos=True),
              SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True),
              SamplingParams(temperature=0.7, min_p=0.05, seed=13, max_tokens=12, ignore_eos=True)]
    outs = []
    for eager in (True, False):
        eng = engine(weights, config, enforce_eager=eager)
        seqs = [eng.add_request(p, sp) for p, sp in zip(prompts, params)]
        while eng.has_work():
            eng.step()
        outs.append([s.output_ids for s in seqs])
    assert outs[0] == outs[1], f"{fmt}: sampled decode through graphs must equal eager"
    assert [len(o) for o in outs[1]] == [12] * 4


def test_logprobs_prompt_logprobs_and_guided_json_on_the_gpu_path(small):
    """Requests that sample on the host beside graph-replayed ones: logprobs are the greedy token's
    and a sorted top 3; prompt logprobs equal the log-softmax of the model's own logits for the
    prompt's prefixes (bf16-close: other batch shapes); a guided request's output is the schema's
    JSON and ends on a stop token (xgrammar's bitmask applied to CUDA logits)."""
    import json

    from flint_backend.tokenizer import load_tokenizer

    fmt, config, weights = small
    tokenizer = load_tokenizer()
    stops = [tokenizer.convert_tokens_to_ids(t) for t in ("<|endoftext|>", "<|user|>")]
    schema = {"type": "object", "properties": {"answer": {"enum": ["yes", "no"]}}, "required": ["answer"],
              "additionalProperties": False}
    eng = engine(weights, config)
    prompt = PROMPTS[1]
    scored = eng.add_request(prompt, SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True, logprobs=3,
                                                    prompt_logprobs=2))
    guided = eng.add_request(PROMPTS[0], SamplingParams(temperature=1.0, seed=5, max_tokens=40, guided_json=schema,
                                                        stop_token_ids=stops))
    plain = eng.add_request(PROMPTS[2], SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True))
    outputs = []
    while eng.has_work():
        outputs += eng.step()
    mine = [o for o in outputs if o.request_id == scored.request_id]
    for out in mine:
        for token, lp in zip(out.new_token_ids, out.logprobs):
            assert lp.top[0][0] == token and lp.top[0][1] == lp.token_logprob, fmt
            assert [v for _, v in lp.top] == sorted((v for _, v in lp.top), reverse=True)
    prompt_lps = mine[0].prompt_logprobs
    assert [t for t, _ in prompt_lps] == prompt and prompt_lps[0][1] is None
    check = engine(weights, config, enforce_eager=True, warmup=False)
    for p in (1, 40, len(prompt) - 1):
        (logits,) = last_logits(check, [prompt[:p]])
        expected = logits.float().log_softmax(-1)[prompt[p]]
        assert prompt_lps[p][1].token_logprob == pytest.approx(float(expected), abs=5e-2), (fmt, p)
    assert guided.finish_reason == "stop" and guided.output_ids[-1] in stops
    assert set(json.loads(tokenizer.decode(guided.output_ids[:-1]))) == {"answer"}, fmt
    assert len(plain.output_ids) == 6


def test_fp32_prefix_cache_hits_give_the_logits_of_no_cache():
    """Real shapes, Triton kernels, fp32: a prompt sharing 1000 tokens of a finished request's
    prompt (a hit at 960: full blocks and a window from pages the prefill wrote), and one extending
    its prompt and 70 of its 80 output tokens (a hit at 1152: the window's last page filled from
    the ring after decode steps), have the top-5 logprobs of their first token as without the cache."""
    config = FlintConfig.preset("flint-small")
    weights = random_stacked_weights(config, 0, torch.float32, "cuda")
    first = [(11 * j) % 8000 + 1 for j in range(1100)]
    cached, plain = (engine(weights, config, dtype="float32", enforce_eager=True, enable_prefix_caching=on)
                     for on in (True, False))

    def run(eng, prompt, max_tokens=1):
        seq = eng.add_request(prompt, SamplingParams(temperature=0.0, max_tokens=max_tokens, logprobs=5,
                                                     ignore_eos=True))
        outputs = []
        while eng.has_work():
            outputs += [o for o in eng.step() if o.request_id == seq.request_id]
        return seq, outputs[0]

    a, _ = run(cached, first, max_tokens=80)
    extra = [(17 * j) % 8000 + 1 for j in range(150)]
    for prompt, hit in ((first[:1000] + extra, 960), (first + a.output_ids[:70] + extra[:30], 1152)):
        seq, out = run(cached, prompt)
        _, want = run(plain, prompt)
        assert seq.num_cached_tokens == hit
        got, expected = dict(out.logprobs[0].top), dict(want.logprobs[0].top)
        assert out.new_token_ids == want.new_token_ids
        common = got.keys() & expected.keys()
        assert len(common) >= 4 and all(abs(got[t] - expected[t]) < 1e-3 for t in common), (got, expected)
