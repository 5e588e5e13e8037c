"""Turns the logits of one step into tokens: logit bias, min_tokens, repetition / presence /
frequency penalties, then greedy or temperature + top-k + top-p + min-p sampling.

Seeded requests draw from a generator seeded by (seed, index of the token being sampled), so
their tokens do not depend on what else is in the batch or on preemption. Logprobs are those of
the model's raw distribution (log_softmax of the logits before any processing), as vLLM reports.

With `fused_sample` (the op table's `sample`: the Triton kernel on the triton backend) the
penalties, logit bias and min_tokens stay here in torch and one fused call does temperature,
top-k/top-p/min-p and the draw for every row, greedy rows included; its counter-based RNG is
keyed by (seed, index of the token being sampled), unseeded rows getting a fresh seed from the
sampler's generator each step. The two paths draw different tokens for the same seed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from flint_backend.engine.guided import GuidedDecoding, is_guided
from flint_backend.engine.sequence import Sequence


@dataclass
class TokenLogprobs:
    token_logprob: float
    top: list[tuple[int, float]]  # (token id, logprob), best first


@dataclass
class SampleResult:
    tokens: list[int]
    logprobs: list[TokenLogprobs | None]


def _generator(seed: int, step: int, device: torch.device) -> torch.Generator:
    g = torch.Generator(device=device)
    g.manual_seed((seed * 0x9E3779B1 + step * 0x85EBCA77) % (2**63))
    return g


class Sampler:
    def __init__(self, device: torch.device, seed: int | None = None, fused_sample: Callable | None = None,
                 guided: GuidedDecoding | None = None):
        """fused_sample: (logits, temperature, top_k, top_p, min_p, seeds, offsets) -> tokens [S];
        guided: what holds guided requests to their schema (engine.guided; None: none are taken)."""
        self.device = device
        self.fused_sample = fused_sample
        self.guided = guided
        self.unseeded = torch.Generator(device=device)
        self.seed_source = torch.Generator()  # fused path: a host-side seed per unseeded row and step
        if seed is None:
            self.unseeded.seed()
            self.seed_source.seed()
        else:
            self.unseeded.manual_seed(seed)
            self.seed_source.manual_seed(seed)

    def __call__(self, logits: torch.Tensor, seqs: list[Sequence]) -> SampleResult:
        """logits [S, V] fp32, one row per sequence in `seqs`."""
        tokens = self.sample_tokens(logits, seqs).tolist()
        if self.guided is not None:
            self.guided.accept(seqs, tokens)
        logprobs = [None if seq.params.logprobs is None else _logprobs(logits[row], tokens[row], seq.params.logprobs)
                    for row, seq in enumerate(seqs)]
        return SampleResult(tokens, logprobs)

    def samples_on_device(self, seq: Sequence) -> bool:
        """Whether `seq`'s next token comes from the device alone, with no host round trip before or
        after the draw (what async scheduling needs): greedy or the fused kernel, no logprobs, no
        penalties, logit bias, min_tokens suppression or guided decoding."""
        p = seq.params
        return p.logprobs is None and not _needs_processing(seq) and (p.greedy or self.fused_sample is not None)

    def sample_tokens(self, logits: torch.Tensor, seqs: list[Sequence]) -> torch.Tensor:
        """logits [S, V] fp32 -> tokens [S] int64 on the logits' device. No host sync when every
        sequence `samples_on_device` (the torch draw and the penalties read values on the host)."""
        processed = self._penalize(logits.clone(), seqs) if any(map(_needs_processing, seqs)) else logits
        if self.guided is not None and any(map(is_guided, seqs)):
            self.guided.mask(processed, seqs)  # processed is a copy: guided requests need processing
        if all(seq.params.greedy for seq in seqs):
            return processed.argmax(-1)  # the common decode case: no host->device parameter copies
        if self.fused_sample is not None:
            return self._sample_fused(processed, seqs)
        tokens = processed.argmax(-1)  # greedy rows keep this
        drawn = [row for row, seq in enumerate(seqs) if not seq.params.greedy]
        rows = torch.tensor(drawn, device=logits.device)
        probs = self._filtered_probs(processed[rows], [seqs[r].params for r in drawn])
        race = torch.stack([self._exponential(probs.shape[1], seqs[r]) for r in drawn])
        tokens[rows] = (probs / race).argmax(-1)  # argmax(p / Exp(1)) ~ Categorical(p)
        return tokens

    def _sample_fused(self, logits: torch.Tensor, seqs: list[Sequence]) -> torch.Tensor:
        params = [seq.params for seq in seqs]
        pin = self.device.type == "cuda"  # from pageable memory the copy may block the host (async scheduling)

        def column(values, dtype):
            return torch.tensor(values, dtype=dtype, pin_memory=pin).to(self.device, non_blocking=True)

        seeds = [p.seed if p.seed is not None else int(torch.randint(2**62, (), generator=self.seed_source))
                 for p in params]
        return self.fused_sample(
            logits, column([p.temperature for p in params], torch.float32),
            column([p.top_k for p in params], torch.int32), column([p.top_p for p in params], torch.float32),
            column([p.min_p for p in params], torch.float32), column(seeds, torch.int64),
            column([seq.num_sampled for seq in seqs], torch.int64))

    def _penalize(self, logits: torch.Tensor, seqs: list[Sequence]) -> torch.Tensor:
        for row, seq in enumerate(seqs):
            p, x = seq.params, logits[row]
            for token, bias in p.logit_bias.items():
                if token < x.shape[0]:
                    x[token] += bias
            if seq.num_sampled < p.min_tokens and seq.stop_ids:
                x[torch.tensor(sorted(seq.stop_ids), device=x.device)] = float("-inf")
            if p.repetition_penalty != 1.0:
                seen = torch.tensor(sorted(set(seq.token_ids)), device=x.device)
                vals = x[seen]
                x[seen] = torch.where(vals > 0, vals / p.repetition_penalty, vals * p.repetition_penalty)
            if p.presence_penalty or p.frequency_penalty:
                counts = torch.bincount(torch.tensor(seq.output_ids, dtype=torch.int64, device=x.device),
                                        minlength=x.shape[0])[: x.shape[0]].float()
                x -= p.frequency_penalty * counts + p.presence_penalty * (counts > 0).float()
        return logits

    def _filtered_probs(self, x: torch.Tensor, params: list) -> torch.Tensor:
        """x [R, V] -> probabilities after temperature, top-k, top-p and min-p, one row per request."""
        def column(values):
            return torch.tensor(values, dtype=torch.float32, device=x.device)[:, None]

        x = x / column([p.temperature for p in params])
        top_k = [p.top_k if 0 < p.top_k < x.shape[1] else x.shape[1] for p in params]
        if min(top_k) < x.shape[1]:
            kth = torch.topk(x, max(top_k), dim=-1).values.gather(1, column(top_k).long() - 1)  # [R, 1]
            x = x.masked_fill(x < kth, float("-inf"))
        probs = torch.softmax(x, dim=-1)
        top_p = column([p.top_p for p in params])
        if bool((top_p < 1.0).any()):
            sorted_probs, order = probs.sort(dim=-1, descending=True)
            above = sorted_probs.cumsum(-1) - sorted_probs  # mass strictly above each token
            sorted_probs = sorted_probs.masked_fill(above >= top_p, 0.0)  # smallest prefix reaching top_p
            probs = torch.zeros_like(probs).scatter_(1, order, sorted_probs)
        min_p = column([p.min_p for p in params])
        if bool((min_p > 0).any()):
            probs = probs.masked_fill(probs < min_p * probs.max(-1, keepdim=True).values, 0.0)
        return probs

    def _exponential(self, size: int, seq: Sequence) -> torch.Tensor:
        p = seq.params
        g = self.unseeded if p.seed is None else _generator(p.seed, seq.num_sampled, self.device)
        return torch.empty(size, device=self.device).exponential_(generator=g)


def _needs_processing(seq: Sequence) -> bool:
    p = seq.params
    return bool(p.logit_bias or p.repetition_penalty != 1.0 or p.presence_penalty or p.frequency_penalty
                or (p.min_tokens and seq.num_sampled < p.min_tokens) or is_guided(seq))


def _logprobs(logits: torch.Tensor, token: int, n: int) -> TokenLogprobs:
    raw = logits.log_softmax(-1)
    top = torch.topk(raw, n) if n > 0 else None
    pairs = list(zip(top.indices.tolist(), top.values.tolist())) if top is not None else []
    return TokenLogprobs(float(raw[token]), pairs)
