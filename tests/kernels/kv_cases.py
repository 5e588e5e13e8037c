"""Attention steps as the engine would present them: earlier positions already written to a
paged or ring cache (in order, so a ring keeps only its last R positions), this step's
tokens in q/k/v. Unwritten cache slots hold NaN, so reading one fails the comparison."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class Step:
    q: torch.Tensor                  # [N, Hq, D]
    k: torch.Tensor                  # [N, Hk, D]
    v: torch.Tensor                  # [N, Hk, D]
    query_start_loc: torch.Tensor    # [B + 1] int32
    context_lens: torch.Tensor       # [B] int32
    k_cache: torch.Tensor            # [rows, R, Hk, D]
    v_cache: torch.Tensor
    sinks: torch.Tensor              # [Hq] fp32
    block_tables: torch.Tensor | None
    ring_rows: torch.Tensor | None
    keys: list[torch.Tensor]         # per sequence [ctx + n, Hk, D]: every position's key
    values: list[torch.Tensor]

    def cache_kwargs(self):
        return dict(block_tables=self.block_tables, ring_rows=self.ring_rows)


def make_step(seqs: list[tuple[int, int]], *, hq=8, hk=2, d=16, dtype=torch.float32, layout="paged",
              rows_per=8, sink_scale=1.0, write_current=False, seed=0, device="cpu") -> Step:
    """seqs: (context_len, new_tokens) per sequence. layout "paged": R = block size, blocks
    handed out shuffled; "ring": R = ring width. write_current also writes this step's
    tokens before attention (what the fused qk_norm_rope write does in decode)."""
    g = torch.Generator(device=device).manual_seed(seed)
    rand = lambda *shape: torch.randn(*shape, generator=g, device=device).to(dtype)  # noqa: E731
    b = len(seqs)
    keys = [rand(c + n, hk, d) for c, n in seqs]
    values = [rand(c + n, hk, d) for c, n in seqs]
    q = rand(sum(n for _, n in seqs), hq, d)
    k = torch.cat([kk[c:] for kk, (c, _) in zip(keys, seqs)])
    v = torch.cat([vv[c:] for vv, (c, _) in zip(values, seqs)])
    qsl = torch.tensor([0] + [n for _, n in seqs]).cumsum(0).to(torch.int32).to(device)
    ctx = torch.tensor([c for c, _ in seqs], dtype=torch.int32, device=device)
    tables = ring = None
    if layout == "paged":
        need = [-(-(c + n) // rows_per) for c, n in seqs]
        rows = sum(need) + 3
        perm = torch.randperm(rows, generator=g, device=device).to(torch.int32)
        tables = torch.full((b, max(need) + 1), rows + 7, dtype=torch.int32, device=device)  # padding: never read
        used = 0
        for i, m in enumerate(need):
            tables[i, :m] = perm[used:used + m]
            used += m
    else:
        rows = b + 2
        ring = torch.randperm(rows, generator=g, device=device)[:b].to(torch.int32)
    k_cache = torch.full((rows, rows_per, hk, d), float("nan"), dtype=dtype, device=device)
    v_cache = torch.full_like(k_cache, float("nan"))
    for i, (c, n) in enumerate(seqs):
        end = c + n if write_current else c
        first = 0 if tables is not None else max(0, end - rows_per)  # a ring keeps the last R written
        pos = torch.arange(first, end, device=device)
        if tables is not None:
            slots = tables[i].long()[pos // rows_per] * rows_per + pos % rows_per
        else:
            slots = ring[i].long() * rows_per + pos % rows_per
        k_cache.view(-1, hk, d)[slots] = keys[i][first:end]
        v_cache.view(-1, hk, d)[slots] = values[i][first:end]
    sinks = torch.randn(hq, generator=g, device=device) * sink_scale
    return Step(q, k, v, qsl, ctx, k_cache, v_cache, sinks, tables, ring, keys, values)


def assert_scaled_close(got: torch.Tensor, expected: torch.Tensor, rel: float = 2e-2) -> None:
    """Max error relative to the largest expected value: long contexts average random values
    down to ~1/sqrt(L), where a plain atol would pass anything."""
    scale = float(expected.float().abs().max())
    err = float((got.float() - expected.float()).abs().max())
    assert err <= rel * scale, f"max error {err:.3e} > {rel} x max |expected| {scale:.3e}"
