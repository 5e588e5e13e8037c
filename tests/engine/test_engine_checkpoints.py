"""The engine on checkpoints in each official form equals transformers' FlintForCausalLM loaded
from the same directory by AutoModelForCausalLM.from_pretrained (no project code in the oracle):
greedy tokens of 16+ concurrent prompts, chunked prefill, and a pool small enough to preempt.

The forms: what scripts/make_checkpoint.py writes; what transformers' save_pretrained writes from a
FlintForCausalLM(config) holding the same weights; and those weights under transformers' own
in-memory names (a state_dict: fused experts, `sinks`)."""

import pytest
import torch
import transformers
from safetensors.torch import save_file

from flint_backend.config import FlintConfig
from flint_backend.engine.engine import LLMEngine
from flint_backend.engine.engine_args import EngineArgs
from flint_backend.engine.sampling_params import SamplingParams
from flint_backend.weights.hf_state import transformers_state_dict
from flint_backend.weights.loader import load_checkpoint

from engine_cases import random_prompts, run_to_completion
from oracle import TIE_MARGIN, NearTie, checkpoint_oracle, greedy

NEW_TOKENS = 8
ENGINES = {
    "chunked": dict(max_num_batched_tokens=16, num_kv_blocks=512, max_model_len=128),
    "preemption": dict(max_num_batched_tokens=64, num_kv_blocks=40, max_model_len=128),
}


@pytest.fixture(scope="module")
def checkpoints(tiny_checkpoint, tmp_path_factory):
    """{form: directory}, all holding the weights of tiny_checkpoint."""
    tmp = tmp_path_factory.mktemp("forms")
    ours = load_checkpoint(tiny_checkpoint, dtype=torch.float32, progress=False)
    model = transformers.FlintForCausalLM(transformers.FlintConfig(**ours.config.to_dict()))
    model.load_state_dict(transformers_state_dict(ours.tensors, ours.config))
    model.save_pretrained(tmp / "save_pretrained")
    names = tmp / "transformers_names"
    names.mkdir()
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(names / "model.safetensors"))
    ours.config.to_json(names)
    for directory in (tmp / "save_pretrained", names):  # the tokenizer, as make_checkpoint ships it
        for path in tiny_checkpoint.iterdir():
            if path.suffix in (".jinja",) or path.name.startswith("tokenizer"):
                (directory / path.name).write_bytes(path.read_bytes())
    return {"make_checkpoint": tiny_checkpoint, "save_pretrained": tmp / "save_pretrained",
            "transformers_names": names}


@pytest.fixture(scope="module")
def cases(checkpoints):
    """(prompt, oracle's greedy tokens) of the make_checkpoint directory, near-ties left out."""
    oracle = checkpoint_oracle(checkpoints["make_checkpoint"], torch.float64)
    found = []
    for prompt in random_prompts(24, 2, 40, seed=21):
        try:
            found.append((prompt, greedy(oracle, prompt, NEW_TOKENS, tie_margin=TIE_MARGIN)))
        except NearTie:
            pass
    assert len(found) >= 16
    return found[:16]


@pytest.mark.parametrize("form", ["make_checkpoint", "save_pretrained", "transformers_names"])
@pytest.mark.parametrize("engine", list(ENGINES))
def test_greedy_equals_transformers_on_each_checkpoint_form(checkpoints, cases, form, engine):
    if form != "make_checkpoint":  # the oracle loads each form itself: the same tokens
        oracle = checkpoint_oracle(checkpoints[form], torch.float64)
        assert [greedy(oracle, p, NEW_TOKENS) for p, _ in cases[:2]] == [out for _, out in cases[:2]]
    llm = LLMEngine(EngineArgs(model=str(checkpoints[form]), dtype="float32", device="cpu", block_size=4,
                               max_num_seqs=16, **ENGINES[engine]))
    params = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, ignore_eos=True)
    seqs = [llm.add_request(p, params) for p, _ in cases]
    run_to_completion(llm)
    assert [s.output_ids for s in seqs] == [out for _, out in cases]
    if engine == "preemption":
        assert llm.metrics.preemptions > 0
    assert llm.blocks.usage == 0.0


def test_the_checkpoints_config_is_transformers_own(checkpoints):
    for directory in checkpoints.values():
        assert FlintConfig.from_json(directory) == FlintConfig.from_json(checkpoints["make_checkpoint"])
