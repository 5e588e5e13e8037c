"""GET /metrics: Triton's metrics (the engine's flint:* series among them), passed through, and
this server's own counters after them, in Prometheus' text format."""

from __future__ import annotations

from collections import Counter

import httpx

PREFIX = "flint_openai"


class ServerMetrics:
    def __init__(self) -> None:
        self.requests: Counter[tuple[str, int]] = Counter()  # (endpoint, HTTP status) -> count
        self.running = 0

    def observe(self, endpoint: str, status: int) -> None:
        self.requests[(endpoint, status)] += 1

    def render(self, triton_up: bool) -> str:
        lines = [f"# HELP {PREFIX}:requests_total Requests answered, by endpoint and HTTP status.",
                 f"# TYPE {PREFIX}:requests_total counter"]
        lines += [f'{PREFIX}:requests_total{{endpoint="{e}",status="{s}"}} {n}'
                  for (e, s), n in sorted(self.requests.items())]
        lines += [f"# HELP {PREFIX}:requests_running Requests in flight.", f"# TYPE {PREFIX}:requests_running gauge",
                  f"{PREFIX}:requests_running {self.running}",
                  f"# HELP {PREFIX}:triton_metrics_up Whether Triton's /metrics answered this scrape.",
                  f"# TYPE {PREFIX}:triton_metrics_up gauge", f"{PREFIX}:triton_metrics_up {int(triton_up)}"]
        return "\n".join(lines) + "\n"


async def scrape(client: httpx.AsyncClient, url: str) -> str | None:
    try:
        response = await client.get(url, timeout=5.0)
    except httpx.HTTPError:
        return None
    return response.text if response.status_code == 200 else None
