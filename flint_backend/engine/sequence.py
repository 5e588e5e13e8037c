"""A request as the engine sees it: token ids, progress through the KV cache, and timing.

With async scheduling (engine.py) a decode step samples a token on the device and the next step
is launched before the host has read it: such a token is *pending*, counted by `num_pending`
(0 or 1 between steps) but not yet in `token_ids`. Lengths that the cache and the scheduler see
(`num_tokens`, `num_sampled`) count it; what the request has been given (`num_output_tokens`,
`output_ids`) does not.
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass, field
from enum import Enum

from flint_backend.engine.sampling_params import SamplingParams


_uids = itertools.count()


class SequenceStatus(Enum):
    WAITING = "waiting"    # not in the KV cache (new, or preempted for recompute)
    RUNNING = "running"    # owns KV blocks and a ring row
    FINISHED = "finished"


@dataclass(eq=False)
class Sequence:
    request_id: str
    token_ids: list[int]             # prompt followed by the generated tokens
    num_prompt_tokens: int
    params: SamplingParams
    max_tokens: int                  # resolved against the context length
    stop_ids: frozenset[int]
    arrival: float = field(default_factory=time.monotonic)
    status: SequenceStatus = SequenceStatus.WAITING
    num_computed: int = 0            # tokens whose K/V are in the cache
    num_pending: int = 0             # sampled on the device, not yet read into token_ids
    block_table: list[int] = field(default_factory=list)  # full-attention layers' paged blocks
    ring_row: int | None = None      # sliding layers' ring-buffer row
    finish_reason: str | None = None
    first_token_time: float | None = None
    last_token_time: float | None = None
    num_preemptions: int = 0
    num_cached_tokens: int = 0       # prompt tokens taken from the prefix cache at first admission
    uid: int = field(default_factory=lambda: next(_uids))  # unique for the process (request ids may repeat)
    # prefix caching (engine.prefix_cache): hashes of the full blocks of known tokens, blocks cached
    # so far, blocks whose window page is settled, pages being filled (block index -> OpenPage)
    block_hashes: list[bytes] = field(default_factory=list)
    block_hash_root: bytes = b""
    num_registered_blocks: int = 0
    num_window_blocks: int = 0
    open_pages: dict = field(default_factory=dict)
    prompt_logprobs: list = field(default_factory=list)  # TokenLogprobs of prompt tokens 1, 2, ... computed so far

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids) + self.num_pending

    @property
    def num_sampled(self) -> int:
        """Tokens sampled so far, pending ones included: the index of the next one to sample."""
        return self.num_tokens - self.num_prompt_tokens

    @property
    def num_output_tokens(self) -> int:
        """Tokens the host has read (and delivered)."""
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def output_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens:]

    @property
    def num_uncomputed(self) -> int:
        return self.num_tokens - self.num_computed

    @property
    def is_decoding(self) -> bool:
        """Only the last sampled token (pending or not) is missing from the cache."""
        return self.num_uncomputed == 1 and self.num_sampled > 0

    @property
    def finished(self) -> bool:
        return self.status is SequenceStatus.FINISHED
