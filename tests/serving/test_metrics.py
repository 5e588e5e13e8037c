"""MetricsPublisher against a stand-in for triton_python_backend_utils' MetricFamily."""

from types import SimpleNamespace

from flint_backend.engine.metrics import EngineMetrics
from flint_backend.serving.metrics import MetricsPublisher


class FakeMetric:
    def __init__(self, family, labels, buckets=None):
        self.family, self.labels, self.buckets = family, labels, buckets
        self.value, self.observed = 0.0, []

    def increment(self, v):
        self.value += v

    def set(self, v):
        self.value = v

    def observe(self, v):
        self.observed.append(v)


class FakeFamily:
    COUNTER, GAUGE, HISTOGRAM = "counter", "gauge", "histogram"
    made: dict = {}

    def __init__(self, name, description, kind):
        self.name, self.kind = name, kind

    def Metric(self, labels, buckets=None):  # noqa: N802  (Triton's spelling)
        assert (buckets is not None) == (self.kind == self.HISTOGRAM)
        metric = FakeMetric(self, labels, buckets)
        FakeFamily.made[(self.name, tuple(sorted(labels.items())))] = metric
        return metric


def test_counters_rise_by_their_increase_gauges_follow_samples_are_observed_once():
    m = EngineMetrics()
    publisher = MetricsPublisher(SimpleNamespace(MetricFamily=FakeFamily), m, {"model": "flint_model", "version": "1"})
    label = (("model", "flint_model"), ("version", "1"))
    m.prompt_tokens, m.generation_tokens, m.kv_usage, m.num_running = 10, 3, 0.25, 2
    m.finished["abort"] += 2
    m.observe("ttft", 0.05)
    publisher.publish()
    m.generation_tokens = 7
    m.observe("tpot", 0.01)
    publisher.publish()
    made = FakeFamily.made
    assert made[("flint:prompt_tokens_total", label)].value == 10
    assert made[("flint:generation_tokens_total", label)].value == 7
    assert made[("flint:kv_cache_usage_perc", label)].value == 0.25
    assert made[("flint:num_requests_running", label)].value == 2
    assert made[("flint:request_success_total", (("finished_reason", "abort"),) + label)].value == 2
    assert made[("flint:time_to_first_token_seconds", label)].observed == [0.05]
    assert made[("flint:time_per_output_token_seconds", label)].observed == [0.01]
    publisher.start().stop()
