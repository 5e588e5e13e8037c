"""Engine counters -> Triton custom metrics (Prometheus text on tritonserver's /metrics).

`pb_utils` is passed in (triton_python_backend_utils inside the server, a fake in tests).
A thread publishes every `interval` seconds: counters by their increase, gauges as they
are, and every drained latency sample into its histogram. Names follow vLLM's, under
`flint:`; Triton adds the labels model and version.
"""

from __future__ import annotations

import threading

from flint_backend.engine.metrics import EngineMetrics

LATENCY_BUCKETS = {  # seconds
    "ttft": [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0],
    "tpot": [0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5],
    "e2e": [0.1, 0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0],
}
COUNTERS = {  # metric -> EngineMetrics attribute
    "flint:prompt_tokens_total": ("prompt_tokens", "Prompt tokens of admitted requests"),
    "flint:generation_tokens_total": ("generation_tokens", "Generated tokens"),
    "flint:num_preemptions_total": ("preemptions", "Requests preempted for lack of KV cache (recomputed later)"),
    "flint:prefix_cache_queries_total": ("prefix_cache_queries", "Prompt tokens looked up in the prefix cache"),
    "flint:prefix_cache_hits_total": ("prefix_cache_hits", "Prompt tokens found in the prefix cache"),
}
GAUGES = {
    "flint:num_requests_running": ("num_running", "Requests in the running batch"),
    "flint:num_requests_waiting": ("num_waiting", "Requests waiting to be scheduled"),
    "flint:kv_cache_usage_perc": ("kv_usage", "Fraction of the paged KV-cache blocks in use (1 = full; cached, unreferenced blocks count as free)"),
}
HISTOGRAMS = {
    "flint:time_to_first_token_seconds": ("ttft", "Time from arrival to the first generated token"),
    "flint:time_per_output_token_seconds": ("tpot", "Time between consecutive generated tokens"),
    "flint:e2e_request_latency_seconds": ("e2e", "Time from arrival to finish"),
}
FINISH_REASONS = ("stop", "length", "abort", "error")


class MetricsPublisher:
    def __init__(self, pb_utils, metrics: EngineMetrics, labels: dict[str, str], interval: float = 0.5):
        self.metrics = metrics
        family = pb_utils.MetricFamily
        self._families = []  # a family must outlive its metrics

        def make(name, description, kind, **extra):
            fam = family(name=name, description=description, kind=kind)
            self._families.append(fam)
            return fam.Metric(labels=labels, **extra)

        self._counters = {attr: make(name, text, family.COUNTER) for name, (attr, text) in COUNTERS.items()}
        self._gauges = {attr: make(name, text, family.GAUGE) for name, (attr, text) in GAUGES.items()}
        self._histograms = {key: make(name, text, family.HISTOGRAM, buckets=LATENCY_BUCKETS[key])
                            for name, (key, text) in HISTOGRAMS.items()}
        finished = family(name="flint:request_success_total", description="Finished requests by finish reason",
                          kind=family.COUNTER)
        self._families.append(finished)
        self._finished = {r: finished.Metric(labels={**labels, "finished_reason": r}) for r in FINISH_REASONS}
        self._published = {attr: 0 for attr in self._counters} | {r: 0 for r in FINISH_REASONS}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, args=(interval,), name="flint-metrics", daemon=True)

    def start(self) -> "MetricsPublisher":
        self._thread.start()
        return self

    def publish(self) -> None:
        m = self.metrics
        for attr, counter in self._counters.items():
            self._increment(counter, attr, getattr(m, attr))
        for reason, counter in self._finished.items():
            self._increment(counter, reason, m.finished[reason])
        for attr, gauge in self._gauges.items():
            gauge.set(float(getattr(m, attr)))
        for key, samples in m.drain_samples().items():
            for seconds in samples:
                self._histograms[key].observe(seconds)

    def _increment(self, counter, key: str, total: int) -> None:
        if total > self._published[key]:
            counter.increment(total - self._published[key])
            self._published[key] = total

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
        self.publish()

    def _loop(self, interval: float) -> None:
        while not self._stop.wait(interval):
            self.publish()
