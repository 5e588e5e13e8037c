"""ModelRunner: the only part of the engine that touches the device (weights, KV cache, forward, sampling)."""

from __future__ import annotations

import torch

from flint_backend.config import FlintConfig
from flint_backend.engine.async_step import InFlightStep
from flint_backend.engine.decode_graphs import DecodeGraphs
from flint_backend.engine.engine_args import EngineArgs
from flint_backend.engine.guided import GuidedDecoding
from flint_backend.engine.prefix_cache import WindowCopy
from flint_backend.engine.prompt_logprobs import add_prompt_logprobs, wanted
from flint_backend.engine.sampler import SampleResult, Sampler
from flint_backend.engine.scheduler import ScheduledBatch
from flint_backend.engine.step_batch import build_step_batch
from flint_backend.engine.sequence import Sequence
from flint_backend.kv_cache import KVCache, KVCacheSpec, cache_element_type
from flint_backend.model import FlintModel
from flint_backend.ops import get_ops


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device: got {name!r}, but no CUDA GPU is available")
    return device


def use_device(device: torch.device) -> None:
    """Make `device` the calling thread's current CUDA device (the current device is per thread):
    Triton kernels and CUDA graphs run on the current device, whatever device their tensors are on,
    so an engine on cuda:1 needs it in the thread that builds it and in the one that steps it."""
    if device.type == "cuda" and device.index is not None:  # plain "cuda" means the current device
        torch.cuda.set_device(device)


class ModelRunner:
    def __init__(self, config: FlintConfig, weights: dict[str, torch.Tensor], args: EngineArgs,
                 device: torch.device, max_model_len: int, release_weights: bool = False):
        self.config, self.args, self.device = config, args, device
        self.dtype = getattr(torch, args.dtype)
        self.kv_dtype = cache_element_type(args.kv_cache_dtype, self.dtype)
        self.ops = get_ops(args.kernel_backend)
        self.model = FlintModel(config, weights, self.ops, max_positions=max_model_len)
        if release_weights:  # the model holds its fused copies (qkv, gate_up, w13); the sources can go
            weights.clear()
        if device.type == "cuda":
            torch.cuda.empty_cache()  # before the KV cache is sized from the free memory
        self.kv_spec = self._kv_spec(max_model_len)
        self.kv = KVCache(config, self.kv_spec, self.kv_dtype, device)
        # the torch backend keeps the plain-torch sampler; the triton backend samples with the kernel
        fused = self.ops.sample if args.kernel_backend == "triton" else None
        guided = GuidedDecoding(str(args.tokenizer_dir()), config.vocab_size, frozenset(config.eos_token_id or ()))
        self.sampler = Sampler(device, seed=args.seed, fused_sample=fused, guided=guided)
        self.graphs = None
        if not args.enforce_eager:
            # captured only where it can be: CUDA, and kernels that never sync with the host
            capture = device.type == "cuda" and args.kernel_backend == "triton"
            self.graphs = DecodeGraphs(self.model, self.kv, min(args.max_graph_batch, args.max_num_seqs),
                                       -(-max_model_len // args.block_size), config.sliding_window,
                                       args.block_size, capture)

    def _kv_spec(self, max_model_len: int) -> KVCacheSpec:
        a, c = self.args, self.config
        if a.num_kv_blocks is not None:
            pages = a.num_window_pages if a.num_window_pages is not None else a.num_kv_blocks
            spec = KVCacheSpec(a.num_kv_blocks, a.block_size, a.max_num_seqs, pages if a.enable_prefix_caching else 0)
        else:
            if self.device.type == "cuda":
                free, _ = torch.cuda.mem_get_info(self.device)
                budget = int(free * a.kv_cache_memory_fraction)
            else:
                budget = a.kv_cache_memory_bytes
            spec = KVCacheSpec.from_budget(c, budget, a.block_size, a.max_num_seqs, self.kv_dtype,
                                           a.prefix_cache_window_fraction if a.enable_prefix_caching else 0.0,
                                           a.num_window_pages if a.enable_prefix_caching else 0)
        if spec.num_blocks * spec.block_size < max_model_len:
            raise ValueError(
                f"kv cache: {spec.num_blocks} blocks of {spec.block_size} tokens hold {spec.num_blocks * spec.block_size} "
                f"tokens, fewer than max_model_len={max_model_len}; give the cache more memory or lower max_model_len")
        return spec

    def copy_windows(self, copies: list[WindowCopy]) -> None:
        """The prefix cache's window copies (ring rows <-> window pages), in order, before a step."""
        for copy in copies:
            self.kv.copy_window(copy.to_ring, copy.ring_row,
                                torch.tensor(copy.ring_slots, dtype=torch.int64).to(self.device, non_blocking=True),
                                torch.tensor(copy.page_slots, dtype=torch.int64).to(self.device, non_blocking=True))

    def execute(self, scheduled: ScheduledBatch) -> tuple[list[Sequence], SampleResult]:
        seqs = [seq for seq, _ in scheduled.entries]
        all_decode = all(n == 1 and seq.num_computed + 1 == seq.num_tokens for seq, n in scheduled.entries)
        if self.graphs is not None and all_decode and len(seqs) <= self.graphs.max_batch:
            logits, _ = self.graphs.run(seqs)  # [B, V], every sequence samples
        elif wanted(scheduled.entries):  # prompt logprobs: the head on the prompt rows too
            batch = build_step_batch(scheduled.entries, self.kv_spec.block_size, self.config.sliding_window,
                                     self.device)
            x, residual = self.model.hidden_states(batch, self.kv)
            add_prompt_logprobs(scheduled.entries, x, residual, self.model.logits_of_rows)
            logits, seqs = self.model.logits_of_rows(x, residual, batch.sample_rows), batch.sample_seqs
        else:
            batch = build_step_batch(scheduled.entries, self.kv_spec.block_size, self.config.sliding_window,
                                     self.device)
            logits, seqs = self.model.forward(batch, self.kv), batch.sample_seqs  # [S, V]
        if not seqs:
            return [], SampleResult([], [])
        return seqs, self.sampler(logits, seqs)

    @property
    def max_launch_ahead_batch(self) -> int:
        """Largest all-decode step `launch_decode` takes (0: async scheduling off or no static buffers)."""
        return self.graphs.max_batch if self.graphs is not None and self.args.async_scheduling else 0

    def can_launch_ahead(self, seq: Sequence) -> bool:
        return self.sampler.samples_on_device(seq)

    def launch_decode(self, seqs: list[Sequence], previous: InFlightStep | None) -> InFlightStep:
        """An all-decode step (every sequence `can_launch_ahead`, at most max_launch_ahead_batch of them)
        whose sampled tokens stay on the device; it returns once the step is queued. A sequence with
        a pending token (num_pending 1) was launched in `previous`: its input id comes from there."""
        prev_slots = prev_rows = None
        if previous is not None:
            prev_slots, prev_rows = previous.slots, previous.rows_of(seqs)
        logits, slots = self.graphs.run(seqs, prev_slots, prev_rows)  # slots: the greedy tokens
        if not all(seq.params.greedy for seq in seqs):
            slots.copy_(self.ops.pack_tokens(self.sampler.sample_tokens(logits, seqs)))
        return InFlightStep(seqs, slots, *self.graphs.slots_to_host(slots), self.ops.slot_tokens)
