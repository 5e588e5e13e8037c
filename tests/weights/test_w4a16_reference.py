"""The W4A16 oracle: transformers' FlintForCausalLM on the NVFP4 checkpoint's exactly dequantised weights."""

import torch

from flint_backend.weights.hf_state import transformers_state_dict
from flint_backend.weights.loader import load_checkpoint

from oracle import oracle_model

PROMPTS, PROMPT_LEN, NEW_TOKENS = 8, 8, 16


def greedy(model, ids: torch.Tensor, steps: int) -> torch.Tensor:
    """[B, T] -> [B, T + steps], all prompts at once (the oracle recomputes every step)."""
    for _ in range(steps):
        ids = torch.cat([ids, model(ids).logits[:, -1].argmax(-1, keepdim=True)], dim=1)
    return ids


def test_w4a16_reference_uses_exactly_the_dequantised_weights(config, bf16_dir, nvfp4_gguf):
    ckpt = load_checkpoint(nvfp4_gguf, hf_config_path=bf16_dir, progress=False)
    model = oracle_model(config, ckpt.tensors, torch.float32)
    stacked = ckpt.tensors["model.layers.4.mlp.experts.down_proj.weight"]
    assert torch.equal(model.model.layers[4].mlp.experts.down_proj[9], stacked[9].dequantize(torch.float32))
    assert torch.equal(model.model.layers[0].self_attn.q_proj.weight,
                       ckpt.tensors["model.layers.0.self_attn.q_proj.weight"].dequantize(torch.float32))
    assert torch.equal(model.lm_head.weight, ckpt.tensors["lm_head.weight"].dequantize(torch.float32))


def test_w4a16_greedy_tokens_against_bf16(config, bf16_dir, nvfp4_gguf):
    """Random tiny weights give nearly flat logits (std ~1 over 8192 tokens: top-1 margins of
    ~0.2), and the NVFP4 error (~0.1 per weight) grows to ~0.35 of the logits over 7 layers,
    exactly as much as Gaussian noise of the same size does. So top-1 tokens often flip; the
    floors below are far above chance (1/8192) and catch a broken quantiser or repack."""
    bf16 = load_checkpoint(bf16_dir, progress=False)
    nvfp4 = load_checkpoint(nvfp4_gguf, hf_config_path=bf16_dir, progress=False)
    ref = oracle_model(config, bf16.tensors, torch.float32)
    w4a16 = oracle_model(config, nvfp4.tensors, torch.float32)
    prompts = torch.randint(0, config.vocab_size, (PROMPTS, PROMPT_LEN), generator=torch.Generator().manual_seed(1))
    tokens, tokens_w4 = greedy(ref, prompts, NEW_TOKENS), greedy(w4a16, prompts, NEW_TOKENS)

    # teacher forcing: both models predict each of BF16's greedy tokens from the same prefix
    logits, logits_w4 = ref(tokens).logits[:, PROMPT_LEN - 1:-1], w4a16(tokens).logits[:, PROMPT_LEN - 1:-1]
    top1 = (logits_w4.argmax(-1) == logits.argmax(-1)).float().mean().item()
    top5 = (logits_w4.topk(5, dim=-1).indices == logits.argmax(-1, keepdim=True)).any(-1).float().mean().item()
    free = (tokens_w4[:, PROMPT_LEN:] == tokens[:, PROMPT_LEN:]).float().mean().item()
    logit_error = ((logits_w4 - logits).norm() / logits.norm()).item()
    print(f"W4A16 vs BF16 greedy on flint-tiny ({PROMPTS} prompts x {NEW_TOKENS} tokens): teacher-forced "
          f"top-1 agreement {top1:.3f}, BF16 token in W4A16 top-5 {top5:.3f}, free-running same token "
          f"{free:.3f}, relative logit error {logit_error:.3f}")
    assert top1 >= 0.25 and top5 >= 0.5
    assert logit_error <= 0.5

    # NVFP4 perturbs the model no more than unbiased Gaussian noise of the same per-tensor size
    state = transformers_state_dict(bf16.tensors, config)
    state_w4 = transformers_state_dict(nvfp4.tensors, config)
    g = torch.Generator().manual_seed(2)
    noisy = ref.state_dict()
    for name, w in state.items():
        err = state_w4[name].float() - w.float()
        noisy[name] = w.float() + err.std() * torch.randn(w.shape, generator=g) if err.any() else w
    noise_model = oracle_model(config, bf16.tensors, torch.float32)
    noise_model.load_state_dict(noisy)
    logits_noise = noise_model(tokens).logits[:, PROMPT_LEN - 1:-1]
    noise_error = ((logits_noise - logits).norm() / logits.norm()).item()
    print(f"relative logit error from equal-size Gaussian weight noise: {noise_error:.3f}")
    assert logit_error <= 1.25 * noise_error
