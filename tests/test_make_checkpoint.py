import json

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoTokenizer

from flint_backend.config import FlintConfig
from flint_backend.reference import build_reference
from flint_backend.tokenizer import STOP_TOKENS
from flint_backend.weights.random_init import random_weights
from flint_backend.weights.schema import checkpoint_tensors
from scripts.make_checkpoint import main, make_checkpoint

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
    assert tensors["model.layers.0.self_attn.sinks"].dtype == torch.float32
    assert tensors["model.layers.2.mlp.gate.e_score_correction_bias"].dtype == torch.float32
    assert tensors["model.layers.0.self_attn.q_proj.weight"].dtype == torch.bfloat16


def test_transformers_loads_it_and_matches_the_reference(tiny_checkpoint):
    tokenizer = AutoTokenizer.from_pretrained(tiny_checkpoint)
    model = AutoModelForCausalLM.from_pretrained(tiny_checkpoint, dtype=torch.float32)
    config = FlintConfig.from_json(tiny_checkpoint)
    expected = build_reference(config, dict(random_weights(config, seed=0)))
    ids = tokenizer.apply_chat_template(PROMPTS[0], add_generation_prompt=True, return_dict=True,
                                        return_tensors="pt")["input_ids"]
    logits = model(ids).logits
    assert logits.shape == (1, ids.shape[1], config.vocab_size) and logits.dtype == torch.float32
    torch.testing.assert_close(logits, expected(ids).logits, rtol=0, atol=0)


def test_bf16_load_keeps_sinks_and_bias_in_fp32(tiny_checkpoint):
    model = AutoModelForCausalLM.from_pretrained(tiny_checkpoint)
    assert model.dtype == torch.bfloat16
    assert model.model.layers[0].self_attn.sinks.dtype == torch.float32
    assert model.model.layers[2].mlp.gate.e_score_correction_bias.dtype == torch.float32


def test_greedy_decoding_depends_on_the_prompt(tiny_checkpoint):
    tokenizer = AutoTokenizer.from_pretrained(tiny_checkpoint)
    model = AutoModelForCausalLM.from_pretrained(tiny_checkpoint, dtype=torch.float32)
    outputs, last_logits = [], []
    for messages in PROMPTS:
        ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True)
        ids = ids["input_ids"] if hasattr(ids, "keys") else ids
        last_logits.append(model(torch.tensor(ids)).logits[-1])
        outputs.append(model.generate_greedy(ids, 24))
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
