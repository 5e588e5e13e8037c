"""A checkpoint whose greedy output is a chosen token sequence, to test output parsing end to end.

Every layer's output projections (attention o_proj, every MLP/expert down_proj) are zero, so the
last hidden state is the embedding of the last token. Token chain[i] embeds as the unit vector
e_i and the LM head scores chain[i + 1] only along e_i: after chain[i] the model says chain[i + 1],
whatever came before. The chain's tokens must be distinct, at most hidden_size of them.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

LOGIT = 50.0  # times the final RMSNorm's sqrt(hidden_size) scale: far above every other logit (0)


def successor_checkpoint(source: Path, dest: Path, chain: list[int]) -> Path:
    if len(set(chain)) != len(chain):
        raise ValueError(f"chain tokens must be distinct, got {chain}")
    shutil.copytree(source, dest)
    (shard,) = dest.glob("*.safetensors")
    tensors = load_file(shard)
    hidden = tensors["model.embed_tokens.weight"].shape[1]
    if len(chain) > hidden:
        raise ValueError(f"a chain of {len(chain)} tokens does not fit hidden size {hidden}")
    for name, tensor in tensors.items():
        if name.endswith(("o_proj.weight", "down_proj.weight")):
            tensor.zero_()
    tensors["model.norm.weight"].fill_(1.0)
    embed, head = tensors["model.embed_tokens.weight"], tensors["lm_head.weight"]
    head.zero_()
    for i, token in enumerate(chain):
        embed[token] = torch.nn.functional.one_hot(torch.tensor(i), hidden).to(embed.dtype)
        if i + 1 < len(chain):
            head[chain[i + 1], i] = LOGIT
    save_file(tensors, shard, metadata={"format": "pt"})
    return dest
