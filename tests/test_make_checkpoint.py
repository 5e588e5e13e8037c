import json
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoTokenizer

from flint_backend.config import FlintConfig
from flint_backend.tokenizer import STOP_TOKENS
from flint_backend.weights.hf_state import transformers_state_dict
from flint_backend.weights.loader import load_checkpoint
from flint_backend.weights.schema import checkpoint_tensors
from scripts.make_checkpoint import main, make_checkpoint

from oracle import greedy

PROMPTS = [
    [{"role": "user", "content": "Hello there, how are you?"}],
    [{"role": "user", "content": "Write a haiku about the sea."}],
    [{"role": "system", "content": "Be terse."}, {"role": "user", "content": "2 + 2 = ?"}],
    [{"role": "user", "content": "東京の天気は？"}],
]


def _tensors(directory):
    out = {}
    for shard in sorted(directory.glob("*.safetensors")):
        out.update(load_file(shard))
    return out


def test_checkpoint_layout(tiny_checkpoint):
    config = FlintConfig.from_json(tiny_checkpoint)
    tokenizer = AutoTokenizer.from_pretrained(tiny_checkpoint)
    assert config.eos_token_id == tokenizer.convert_tokens_to_ids(list(STOP_TOKENS))
    index = json.loads((tiny_checkpoint / "model.safetensors.index.json").read_text())
    expected = {name: shape for name, shape, _ in checkpoint_tensors(config)}
    assert set(index["weight_map"]) == set(expected)
    tensors = _tensors(tiny_checkpoint)
    assert {k: tuple(v.shape) for k, v in tensors.items()} == expected
    assert tensors["model.layers.0.self_attn.softmax_offset"].dtype == torch.float32
    assert tensors["model.layers.2.mlp.gate.weight"].dtype == torch.float32
    assert tensors["model.layers.2.mlp.experts.5.up_proj.weight"].dtype == torch.bfloat16
    assert tensors["model.layers.2.mlp.shared_expert.down_proj.weight"].shape == (64, 128)
    assert not any("e_score_correction_bias" in name or "shared_experts" in name for name in tensors)


FRESH_LOAD = """
import json, sys, transformers
model, info = transformers.AutoModelForCausalLM.from_pretrained(sys.argv[1], output_loading_info=True)
print(json.dumps({"module": type(model).__module__, "report": {k: sorted(map(str, v)) for k, v in info.items()},
                  "sinks": str(model.model.layers[0].self_attn.sinks.dtype)}))
"""


@pytest.mark.parametrize("preset", ["flint-tiny", "flint-small"])
def test_a_fresh_interpreter_loads_it_as_transformers_flint(tmp_path, preset):
    """No project import: transformers' own FlintForCausalLM, nothing missing, unexpected or mismatched.
    flint-small (4.9B parameters) is written with its expert count cut to 8: the same layout."""
    overrides = {} if preset == "flint-tiny" else {"num_experts": 8, "vocab_size": 4096 * 4}
    make_checkpoint(preset, tmp_path, seed=0, overrides=overrides)
    run = subprocess.run([sys.executable, "-c", FRESH_LOAD, str(tmp_path)], capture_output=True, text=True,
                         timeout=600, cwd=tmp_path)
    assert run.returncode == 0, run.stderr[-3000:]
    result = json.loads(run.stdout.strip().splitlines()[-1])
    assert result == {"module": "transformers.models.flint.modeling_flint", "sinks": "torch.float32",
                      "report": {"error_msgs": [], "missing_keys": [], "mismatched_keys": [], "unexpected_keys": []}}


def test_our_loader_reads_the_weights_transformers_reads(tiny_checkpoint):
    model = AutoModelForCausalLM.from_pretrained(tiny_checkpoint, dtype=torch.float32)
    ckpt = load_checkpoint(tiny_checkpoint, dtype=torch.float32, progress=False)
    ours = transformers_state_dict(ckpt.tensors, ckpt.config)
    theirs = model.state_dict()
    assert set(ours) == set(theirs)
    for name, value in theirs.items():
        assert torch.equal(ours[name], value), name


def test_bf16_load_keeps_sinks_and_router_in_fp32(tiny_checkpoint):
    model = AutoModelForCausalLM.from_pretrained(tiny_checkpoint)
    assert model.dtype == torch.bfloat16
    assert model.model.layers[0].self_attn.sinks.dtype == torch.float32
    assert model.model.layers[2].mlp.gate.weight.dtype == torch.float32


def test_greedy_decoding_depends_on_the_prompt(tiny_checkpoint):
    tokenizer = AutoTokenizer.from_pretrained(tiny_checkpoint)
    model = AutoModelForCausalLM.from_pretrained(tiny_checkpoint, dtype=torch.float32)
    outputs, last_logits = [], []
    for messages in PROMPTS:
        ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True)
        ids = ids["input_ids"] if hasattr(ids, "keys") else ids
        last_logits.append(model(torch.tensor([ids])).logits[0, -1])
        outputs.append(greedy(model, ids, 24))
    for out in outputs:
        assert len(set(out)) > 6, f"greedy output collapsed: {out}"
    assert len({tuple(o) for o in outputs}) == len(PROMPTS)
    for a in range(len(PROMPTS)):
        for b in range(a + 1, len(PROMPTS)):
            assert (last_logits[a] - last_logits[b]).abs().max() > 0.1


def test_deterministic_per_seed_and_sharded(tmp_path, tiny_checkpoint):
    make_checkpoint("flint-tiny", tmp_path / "again", seed=0, shard_size="1MB")
    make_checkpoint("flint-tiny", tmp_path / "other", seed=1)
    assert len(list((tmp_path / "again").glob("*.safetensors"))) > 1
    a, b, c = _tensors(tiny_checkpoint), _tensors(tmp_path / "again"), _tensors(tmp_path / "other")
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not torch.equal(a["lm_head.weight"], c["lm_head.weight"])


def test_refuses_to_overwrite_without_force(tmp_path, capsys):
    make_checkpoint("flint-tiny", tmp_path, seed=0)
    with pytest.raises(SystemExit, match="--force"):
        main(["--preset", "flint-tiny", "--out", str(tmp_path)])
    main(["--preset", "flint-tiny", "--out", str(tmp_path), "--force", "--seed", "3"])
