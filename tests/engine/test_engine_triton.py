"""The engine on every Triton kernel (kernel_backend="triton", CPU interpreter): greedy tokens equal
transformers' FlintForCausalLM's, on dense weights and on an NVFP4 GGUF (W4A16). fp32 activations:
the kernels differ from the oracle only in summation order, so tokens are exact away from
near-ties (the oracle skips those prompts). Small on purpose: every kernel runs in Triton's
interpreter, so the model is flint-tiny cut to 4 layers (dense 0-1, MoE 2-3; full attention 0, 1
and 3, sliding 2)."""

import pytest
import torch

from flint_backend.config import FlintConfig
from flint_backend.engine.engine import LLMEngine
from flint_backend.engine.engine_args import EngineArgs
from flint_backend.engine.sampling_params import SamplingParams
from flint_backend.engine.step_batch import build_step_batch
from flint_backend.weights.convert import convert_checkpoint
from flint_backend.weights.loader import load_checkpoint
from flint_backend.weights.nvfp4 import NVFP4Weight
from flint_backend.weights.random_init import random_stacked_weights, random_weights
from flint_backend.weights.safetensors_writer import write_sharded
from flint_kernels import moe as moe_module
from flint_kernels import moe_grouped as moe_grouped_module
from flint_kernels import nvfp4_linear as nvfp4_linear_module
from flint_kernels import tuning

from engine_cases import random_prompts, run_to_completion
from oracle import BF16_BOUND, TIE_MARGIN, NearTie, greedy, logits_distance, oracle_model

NEW_TOKENS = 6
# one prefill step for all prompts (T > SMALL_BATCH_TOKENS: the grouped MoE path), then decode
# steps of up to 4 tokens (the small-batch path)
ENGINE = dict(dtype="float32", device="cpu", block_size=4, max_num_batched_tokens=64, max_num_seqs=4,
              num_kv_blocks=64, max_model_len=64)


def tiny_config(**overrides) -> FlintConfig:
    return FlintConfig.preset("flint-tiny", num_hidden_layers=4, **overrides)


def fair_cases(tensors: dict, config: FlintConfig, count: int) -> list[tuple[list[int], list[int]]]:
    """(prompt, greedy continuation of the float64 oracle on `tensors`) for prompts free of near-ties."""
    oracle = oracle_model(config, tensors, torch.float64)
    cases = []
    for prompt in random_prompts(3 * count, 3, 20, seed=5):
        try:
            cases.append((prompt, greedy(oracle, prompt, NEW_TOKENS, tie_margin=TIE_MARGIN)))
        except NearTie:
            pass
    assert len(cases) >= count
    return cases[:count]


def run_greedy(engine: LLMEngine, prompts: list[list[int]], new_tokens: int = NEW_TOKENS) -> list[list[int]]:
    params = SamplingParams(temperature=0.0, max_tokens=new_tokens, ignore_eos=True)
    seqs = [engine.add_request(p, params) for p in prompts]
    run_to_completion(engine)
    return [s.output_ids for s in seqs]


def test_triton_backend_greedy_equals_the_oracle():
    """Then a prompt extending the longest one by its first 3 tokens starts from the prefix cache
    (full blocks and the rebuilt sliding window) and continues as the oracle does."""
    config = tiny_config()
    weights = random_stacked_weights(config, 0, torch.float32)
    cases = fair_cases(weights, config, 3)
    engine = LLMEngine(EngineArgs(kernel_backend="triton", **ENGINE), config=config, weights=weights)
    assert engine.runner.sampler.fused_sample is not None
    assert run_greedy(engine, [p for p, _ in cases]) == [out for _, out in cases]
    prompt, expected = max(cases, key=lambda case: len(case[0]))
    params = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS - 3, ignore_eos=True)
    again = engine.add_request(prompt + expected[:3], params)
    run_to_completion(engine)
    assert again.num_cached_tokens == (len(prompt) + 2) // 4 * 4 > 0
    assert again.output_ids == expected[3:]


def test_full_layers_reading_whole_pages_give_the_oracles_tokens(monkeypatch):
    """16-position pages (the interpreter's tiles hold two): the full layers' prefill attention
    reads the chunk's keys back from the cache by whole pages, over chunks of 12 tokens that start
    inside a page and cross into the next one."""
    from flint_kernels import prefill_attention as module
    tiles = []
    tile_pages = module._tile_pages
    monkeypatch.setattr(module, "_tile_pages", lambda *args: tiles.append(tile_pages(*args)) or tiles[-1])
    config = tiny_config()
    weights = random_stacked_weights(config, 1, torch.float32)
    cases = fair_cases(weights, config, 3)
    engine = LLMEngine(EngineArgs(kernel_backend="triton", **dict(ENGINE, block_size=16, max_num_batched_tokens=12,
                                                                   num_kv_blocks=16)), config=config, weights=weights)
    assert run_greedy(engine, [p for p, _ in cases]) == [out for _, out in cases]
    assert 2 in tiles
    prompt, expected = max(cases, key=lambda case: len(case[0]))  # its first page from the prefix cache
    params = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS - 3, ignore_eos=True)
    again = engine.add_request(prompt + expected[:3], params)
    run_to_completion(engine)
    assert again.num_cached_tokens == (len(prompt) + 2) // 16 * 16 > 0
    assert again.output_ids == expected[3:]


@pytest.fixture(scope="module")
def nvfp4_gguf(tmp_path_factory):
    """Every linear's K a multiple of 64, so every linear (the LM head too) is NVFP4: written as
    HF safetensors, converted to an NVFP4 GGUF -> (the GGUF, the HF folder with its config)."""
    config = tiny_config()
    hf_dir = tmp_path_factory.mktemp("w4a16") / "flint-tiny"
    write_sharded(random_weights(config, 0), hf_dir, 1 << 30)
    config.to_json(hf_dir)
    gguf = hf_dir.parent / "flint-tiny-nvfp4.gguf"
    convert_checkpoint(hf_dir, gguf, outtype="nvfp4", progress=False)
    return gguf, hf_dir


@pytest.fixture(scope="module")
def nvfp4_checkpoint(nvfp4_gguf):
    """The NVFP4 GGUF loaded with keep_nvfp4, fp32 activations."""
    gguf, hf_dir = nvfp4_gguf
    ckpt = load_checkpoint(gguf, hf_config_path=hf_dir, dtype=torch.float32, keep_nvfp4=True, progress=False)
    assert isinstance(ckpt.tensors["model.layers.3.mlp.experts.down_proj.weight"], NVFP4Weight)
    assert isinstance(ckpt.tensors["model.layers.0.self_attn.k_proj.weight"], NVFP4Weight)
    assert isinstance(ckpt.tensors["lm_head.weight"], NVFP4Weight)
    return ckpt


@pytest.mark.parametrize("backend,prompts,new_tokens", [("torch", 4, NEW_TOKENS), ("triton", 1, 4)])
def test_w4a16_greedy_equals_the_oracle_on_the_dequantised_weights(backend, prompts, new_tokens, nvfp4_checkpoint):
    """The oracle on the exactly dequantised weights (weights.hf_state) is the W4A16 oracle."""
    cases = fair_cases(nvfp4_checkpoint.tensors, nvfp4_checkpoint.config, prompts)
    engine = LLMEngine(EngineArgs(kernel_backend=backend, **ENGINE), config=nvfp4_checkpoint.config,
                       weights=nvfp4_checkpoint.tensors)
    assert run_greedy(engine, [p for p, _ in cases], new_tokens) == [out[:new_tokens] for _, out in cases]



def decode_step_logits(engine: LLMEngine, prompts: list[list[int]]) -> tuple[list[list[int]], torch.Tensor]:
    """Prefills the prompts and samples each one's first token (greedy), then runs one decode step
    of all of them through the model -> (each prompt + its first token, that step's fp32 logits
    [len(prompts), V])."""
    params = SamplingParams(temperature=0.0, max_tokens=2, ignore_eos=True)
    seqs = [engine.add_request(p, params) for p in prompts]
    while not all(s.num_output_tokens for s in seqs):
        engine.step()
    scheduled = engine.scheduler.schedule()
    assert [n for _, n in scheduled.entries] == [1] * len(prompts)  # one decode batch of every sequence
    batch = build_step_batch(scheduled.entries, engine.blocks.block_size, engine.config.sliding_window,
                             engine.device)
    model = engine.runner.model
    x, residual = model.hidden_states(batch, engine.runner.kv)
    logits = model.logits_of_rows(x, residual, torch.arange(len(prompts))).float()
    order = [next(i for i, s in enumerate(seqs) if s is seq) for seq, _ in scheduled.entries]
    return [list(seqs[i].token_ids) for i in order], logits


@pytest.mark.parametrize("f16_gemm_activations", [False, True], ids=["gemm-x-bf16", "gemm-x-fp16"])
def test_w4a16_bf16_decode_batch_is_within_the_bf16_bound(f16_gemm_activations, tmp_path, monkeypatch):
    """A decode step of 17 sequences in bf16 on the Triton kernels: more tokens than
    moe.SMALL_BATCH_TOKENS, router.GEMV_MAX_T and nvfp4_linear.GEMV_MAX_TOKENS, so the grouped MoE,
    the router's tensor-core tiles (its fp32 weight split into bf16 parts) and the W4A16 GEMM run,
    their NVFP4 tiles decoded to fp16 (tuning.FP4_MMA_F16), and with
    tuning.FP4_GEMM_F16_ACTIVATIONS decode attention hands o_proj's GEMM fp16 activations; the
    grouped MoE takes its blocks straight from the router's ids (tuning.MOE_UNSORTED_MAX_TOKENS).
    Its logits are within the bf16 bound of transformers' fp32 FlintForCausalLM on the dequantised
    weights, at each sequence's position. Three layers (dense 0-1, MoE 2) and a 512-token
    vocabulary: every launch of a 17-sequence step runs in the interpreter."""
    monkeypatch.setattr(tuning, "FP4_GEMM_F16_ACTIVATIONS", f16_gemm_activations)
    gemm_x = []
    real = nvfp4_linear_module.nvfp4_linear
    monkeypatch.setattr(nvfp4_linear_module, "nvfp4_linear", lambda x, *a, **kw: gemm_x.append(
        (x.shape[0], x.dtype)) or real(x, *a, **kw))
    grouped, sorted_ = [], []  # token counts of the grouped MoE's calls, and of its sorts
    real_grouped, real_sort = moe_module.moe_grouped, moe_grouped_module.sort_pairs
    monkeypatch.setattr(moe_module, "moe_grouped", lambda x, *a, **kw: grouped.append(x.shape[0]) or
                        real_grouped(x, *a, **kw))
    monkeypatch.setattr(moe_grouped_module, "sort_pairs", lambda ids, *a: sorted_.append(ids.shape[0]) or
                        real_sort(ids, *a))
    config = FlintConfig.preset("flint-tiny", num_hidden_layers=3, vocab_size=512)
    hf_dir = tmp_path / "flint-tiny"
    write_sharded(random_weights(config, 0), hf_dir, 1 << 30)
    config.to_json(hf_dir)
    convert_checkpoint(hf_dir, tmp_path / "nvfp4.gguf", outtype="nvfp4", progress=False)
    ckpt = load_checkpoint(tmp_path / "nvfp4.gguf", hf_config_path=hf_dir, dtype=torch.bfloat16, keep_nvfp4=True,
                           progress=False)
    assert ckpt.tensors["model.layers.2.mlp.gate.weight"].dtype == torch.float32
    prompts = random_prompts(17, 3, 5, seed=11, vocab=512)
    engine = LLMEngine(EngineArgs(kernel_backend="triton", dtype="bfloat16", device="cpu", block_size=4,
                                  max_num_batched_tokens=128, max_num_seqs=32, num_kv_blocks=128, max_model_len=32,
                                  async_scheduling=False, enable_prefix_caching=False),
                       config=ckpt.config, weights=ckpt.tensors)
    assert engine.runner.model.layers[2].mlp.w13.packed.dtype == torch.uint8  # NVFP4 experts
    tokens, logits = decode_step_logits(engine, prompts)
    step_x = [dtype for t, dtype in gemm_x if t == 17]
    # qkv and o_proj of 3 layers, the dense MLPs' gate/up and down: o_proj's in fp16 with the switch
    fp16 = 3 if f16_gemm_activations else 0
    assert (step_x.count(torch.float16), step_x.count(torch.bfloat16)) == (fp16, 10 - fp16)
    assert 17 in grouped and 17 not in sorted_  # the step's MoE: blocks from the ids, no sort
    oracle = oracle_model(ckpt.config, ckpt.tensors, torch.float32)
    with torch.no_grad():
        expected = [oracle(torch.tensor([t])).logits[0, -1:] for t in tokens]
    distance = logits_distance([row[None] for row in logits], expected)
    assert distance < BF16_BOUND, f"bf16 decode batch vs fp32 oracle: {distance:.4f}"
