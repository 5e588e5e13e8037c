"""The KV cache tensors: paged blocks for full-attention layers, ring rows for sliding layers.

Full layers:    k, v [num_blocks, block_size, Hk, D] each; position p of a sequence lives in
                block block_table[p // block_size], row p % block_size.
Sliding layers: k, v [num_rows, W, Hk, D] each; a running sequence owns one row and position p
                lives at slot p % W (W = sliding_window), so the row always holds the last W positions.
Only full layers grow with the context: 14 x 4 x 128 x 2 x 2 B = 28 KiB per token at full size.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from flint_backend.config import FlintConfig


@dataclass
class KVCacheSpec:
    num_blocks: int
    block_size: int
    num_ring_rows: int

    @staticmethod
    def bytes_per_block(config: FlintConfig, block_size: int, dtype: torch.dtype) -> int:
        return block_size * config.kv_bytes_per_token(dtype.itemsize)

    @staticmethod
    def bytes_per_ring_row(config: FlintConfig, dtype: torch.dtype) -> int:
        per_layer = config.sliding_window * config.num_key_value_heads * config.head_dim * 2 * dtype.itemsize
        return len(config.sliding_attention_layers) * per_layer

    @classmethod
    def from_budget(cls, config: FlintConfig, budget_bytes: int, block_size: int, num_ring_rows: int,
                    dtype: torch.dtype) -> "KVCacheSpec":
        rings = num_ring_rows * cls.bytes_per_ring_row(config, dtype)
        num_blocks = (budget_bytes - rings) // cls.bytes_per_block(config, block_size, dtype)
        if num_blocks < 1:
            raise ValueError(f"kv cache: a budget of {budget_bytes} bytes does not cover {num_ring_rows} ring rows "
                             f"({rings} bytes) and one block; raise the budget or lower max_num_seqs")
        return cls(int(num_blocks), block_size, num_ring_rows)


class KVCache:
    def __init__(self, config: FlintConfig, spec: KVCacheSpec, dtype: torch.dtype, device: torch.device):
        self.spec = spec
        hk, d = config.num_key_value_heads, config.head_dim
        self.full = {i: (torch.zeros(spec.num_blocks, spec.block_size, hk, d, dtype=dtype, device=device),
                         torch.zeros(spec.num_blocks, spec.block_size, hk, d, dtype=dtype, device=device))
                     for i in config.full_attention_layers}
        self.ring = {i: (torch.zeros(spec.num_ring_rows, config.sliding_window, hk, d, dtype=dtype, device=device),
                         torch.zeros(spec.num_ring_rows, config.sliding_window, hk, d, dtype=dtype, device=device))
                     for i in config.sliding_attention_layers}

    def layer(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.full[i] if i in self.full else self.ring[i]
