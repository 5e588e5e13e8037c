"""The KV cache tensors: paged blocks for full-attention layers, ring rows for sliding layers, and
the prefix cache's window pages.

Full layers:    k, v [num_blocks, block_size, Hk, D] each; position p of a sequence lives in
                block block_table[p // block_size], row p % block_size.
Sliding layers: k, v [num_rows, W, Hk, D] each; a running sequence owns one row and position p
                lives at slot p % W (W = sliding_window), so the row always holds the last W positions.
Window pages:   k, v [Ls, num_pages, block_size, Hk, D] (Ls sliding layers): one block's sliding
                K/V, kept so that a prefix-cache hit can rebuild a ring row (engine.prefix_cache).
Only full layers grow with the context: 14 x 4 x 128 x 2 x 2 B = 28 KiB per token at full size
(14 KiB with FP8 KV: E4M3 codes, with a scale per layer for K and for V; flint_kernels/fp8_kv.py).
The sliding layers' rings (and pages) are each one tensor [Ls, ...], so a window moves between a
ring row and pages in one copy for all layers.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from flint_backend.config import FlintConfig
from flint_kernels.fp8_kv import FP8_DTYPE


def cache_element_type(kv_cache_dtype: str, model_dtype: torch.dtype) -> torch.dtype:
    """EngineArgs.kv_cache_dtype -> the cache tensors' dtype: E4M3 for "fp8*", else the model's."""
    return FP8_DTYPE if kv_cache_dtype.startswith("fp8") else model_dtype


@dataclass
class KVCacheSpec:
    num_blocks: int
    block_size: int
    num_ring_rows: int
    num_window_pages: int = 0

    @staticmethod
    def bytes_per_block(config: FlintConfig, block_size: int, dtype: torch.dtype) -> int:
        return block_size * config.kv_bytes_per_token(dtype.itemsize)

    @staticmethod
    def bytes_per_ring_row(config: FlintConfig, dtype: torch.dtype) -> int:
        per_layer = config.sliding_window * config.num_key_value_heads * config.head_dim * 2 * dtype.itemsize
        return len(config.sliding_attention_layers) * per_layer

    @staticmethod
    def bytes_per_window_page(config: FlintConfig, block_size: int, dtype: torch.dtype) -> int:
        per_layer = block_size * config.num_key_value_heads * config.head_dim * 2 * dtype.itemsize
        return len(config.sliding_attention_layers) * per_layer

    @classmethod
    def from_budget(cls, config: FlintConfig, budget_bytes: int, block_size: int, num_ring_rows: int,
                    dtype: torch.dtype, window_fraction: float = 0.0,
                    num_window_pages: int | None = None) -> "KVCacheSpec":
        """`num_window_pages` pages, or (None) as many as `window_fraction` of the budget holds."""
        rings = num_ring_rows * cls.bytes_per_ring_row(config, dtype)
        page = cls.bytes_per_window_page(config, block_size, dtype)
        if num_window_pages is None:
            num_window_pages = int(budget_bytes * window_fraction) // page if page else 0
        pages = num_window_pages * page
        num_blocks = (budget_bytes - rings - pages) // cls.bytes_per_block(config, block_size, dtype)
        if num_blocks < 1:
            raise ValueError(f"kv cache: a budget of {budget_bytes} bytes does not cover {num_ring_rows} ring rows "
                             f"({rings} bytes), {num_window_pages} window pages ({pages} bytes) and one block; "
                             f"raise the budget or lower max_num_seqs")
        return cls(int(num_blocks), block_size, num_ring_rows, num_window_pages)


class KVCache:
    def __init__(self, config: FlintConfig, spec: KVCacheSpec, dtype: torch.dtype, device: torch.device):
        """dtype: the cache's element type, the model's or float8_e4m3fn (FP8 KV: every layer's K and
        V scale 1.0, powers of two as fp8_kv.py requires; E4M3 holds +-448, and K comes out of
        an RMSNorm)."""
        self.spec, self.dtype = spec, dtype
        self._scales = {i: (1.0, 1.0) for i in range(config.num_hidden_layers)} if dtype == FP8_DTYPE else {}
        hk, d = config.num_key_value_heads, config.head_dim
        self.full = {i: (torch.zeros(spec.num_blocks, spec.block_size, hk, d, dtype=dtype, device=device),
                         torch.zeros(spec.num_blocks, spec.block_size, hk, d, dtype=dtype, device=device))
                     for i in config.full_attention_layers}
        sliding = config.sliding_attention_layers
        self._sliding_index = {layer: s for s, layer in enumerate(sliding)}
        w = config.sliding_window
        self.ring_k, self.ring_v = (torch.zeros(len(sliding), spec.num_ring_rows, w, hk, d, dtype=dtype, device=device)
                                    for _ in range(2))  # [Ls, rows, W, Hk, D]
        self.page_k, self.page_v = (torch.zeros(len(sliding), spec.num_window_pages, spec.block_size, hk, d,
                                                dtype=dtype, device=device)
                                    for _ in range(2))  # [Ls, pages, block_size, Hk, D]

    def layer(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Full layer i: its paged k, v; sliding layer i: its rings [rows, W, Hk, D]."""
        if i in self.full:
            return self.full[i]
        s = self._sliding_index[i]
        return self.ring_k[s], self.ring_v[s]

    def scales(self, i: int) -> tuple[float, float] | None:
        """Layer i's (k_scale, v_scale) with an FP8 cache, else None."""
        return self._scales.get(i)

    def window_pages(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Sliding layer i's window pages k, v [pages, block_size, Hk, D]."""
        s = self._sliding_index[i]
        return self.page_k[s], self.page_v[s]

    def copy_window(self, to_ring: bool, ring_row: int, ring_slots: torch.Tensor, page_slots: torch.Tensor) -> None:
        """Every sliding layer's K/V at ring slots `ring_slots` [n] of `ring_row` <-> window-page slots
        `page_slots` [n] (page * block_size + offset): into the ring when `to_ring`, else out of it."""
        ring_k, ring_v = self.ring_k[:, ring_row], self.ring_v[:, ring_row]  # [Ls, W, Hk, D]
        flat = (self.page_k.flatten(1, 2), self.page_v.flatten(1, 2))      # [Ls, pages * block_size, Hk, D]
        for ring, pages in zip((ring_k, ring_v), flat):
            if to_ring:
                ring[:, ring_slots] = pages[:, page_slots]
            else:
                pages[:, page_slots] = ring[:, ring_slots]
