"""The engine loads checkpoints through the weights loader and runs the Triton kernels."""


from flint_backend.engine.engine import LLMEngine
from flint_backend.engine.engine_args import EngineArgs
from flint_backend.engine.sampling_params import SamplingParams

from engine_cases import make_engine, random_prompts, run_to_completion

GREEDY = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)


def test_engine_from_an_hf_checkpoint_equals_random_init(tiny_checkpoint):
    # make_checkpoint stores bf16 weights; random init in bf16 gives the same values
    loaded = LLMEngine(EngineArgs(model=str(tiny_checkpoint), dtype="bfloat16", device="cpu",
                                  num_kv_blocks=64, block_size=16, max_model_len=512))
    random = make_engine(dtype="bfloat16")
    prompts = random_prompts(3, 2, 20, seed=5)
    a = [loaded.add_request(p, GREEDY) for p in prompts]
    b = [random.add_request(p, GREEDY) for p in prompts]
    run_to_completion(loaded)
    run_to_completion(random)
    assert [s.output_ids for s in a] == [s.output_ids for s in b]
    assert loaded.default_stop_ids == {8175, 8179, 8181}  # the tokenizer's stop tokens, from config.json


def test_random_weights_of_a_preset_follow_the_seed():
    """model null: the engine builds its weights from (preset, seed[, quantization]); a served model
    and an in-process engine with the same arguments give the same tokens."""
    prompts = random_prompts(3, 2, 20, seed=6)

    def greedy(**args):
        engine = make_engine(dtype="bfloat16", **args)
        seqs = [engine.add_request(p, GREEDY) for p in prompts]
        run_to_completion(engine)
        return [s.output_ids for s in seqs]

    assert greedy(seed=3) == greedy(seed=3)
    assert greedy(seed=3) != greedy(seed=4)
    nvfp4 = greedy(seed=3, quantization="nvfp4")
    assert nvfp4 == greedy(seed=3, quantization="nvfp4")
    assert nvfp4 != greedy(seed=3)  # the quantised weights are used (W4A16), not the bf16 ones
