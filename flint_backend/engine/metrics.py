"""Engine counters and latency samples, written by the engine thread and read by the server's metrics."""

from __future__ import annotations

import threading
from collections import Counter
from dataclasses import dataclass, field


@dataclass
class EngineMetrics:
    prompt_tokens: int = 0        # prompt tokens of admitted requests
    generation_tokens: int = 0    # sampled tokens
    preemptions: int = 0
    prefix_cache_queries: int = 0  # prompt tokens looked up in the prefix cache (vLLM counts tokens)
    prefix_cache_hits: int = 0     # of those, tokens found cached (not computed again)
    finished: Counter = field(default_factory=Counter)  # finish reason -> requests
    num_running: int = 0
    num_waiting: int = 0
    kv_usage: float = 0.0         # fraction of paged KV blocks in use (cached, unreferenced ones count as free)
    _samples: dict[str, list[float]] = field(default_factory=lambda: {"ttft": [], "tpot": [], "e2e": []})
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def observe(self, name: str, seconds: float) -> None:
        """name: "ttft" (arrival -> first token), "tpot" (between tokens), "e2e" (arrival -> finish)."""
        with self._lock:
            self._samples[name].append(seconds)

    def drain_samples(self) -> dict[str, list[float]]:
        with self._lock:
            samples, self._samples = self._samples, {name: [] for name in self._samples}
        return samples
