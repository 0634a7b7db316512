"""What ``GET /metrics`` exposes, through prometheus_client.

Each gateway has its own ``CollectorRegistry`` (tests run several in one
process, and a global registry would mix their counts). Latencies and
outcomes are recorded as they happen; what is a state rather than an event
(sessions by state, the warm pool, the loop lag) is read when scraped, from
callables the composition root hands in, so nothing here imports the layers
it watches.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

# Seconds: a warm execute answers in milliseconds, a cold create takes about one.
_EXECUTE_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300)
_CREATE_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2, 4, 8, 15, 30, 60)

# Labels -> value, read at scrape time.
Reading = Callable[[], Mapping[tuple[str, ...], float]]


class GatewayMetrics:
    """One gateway's metrics: recorded events, plus live readings registered by ``watch``."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self._live = _Live()
        self.registry.register(self._live)
        self._execute_seconds = Histogram(
            "sbx_execute_seconds",
            "Execute latency, from its turn in the session to its outcome.",
            ["kernel", "tenant", "status"],
            buckets=_EXECUTE_BUCKETS,
            registry=self.registry,
        )
        self._executions = Counter(
            "sbx_executions",
            "Finished executions by kernel, tenant and status (ok, error, timeout, ...).",
            ["kernel", "tenant", "status"],
            registry=self.registry,
        )
        self._create_seconds = Histogram(
            "sbx_session_create_seconds",
            "Latency of session creates that succeeded, by whether a warm kernel served them.",
            ["kernel", "start"],
            buckets=_CREATE_BUCKETS,
            registry=self.registry,
        )
        self._creates = Counter(
            "sbx_session_creates",
            "Session creates by kernel, tenant and outcome (ok, or the error code).",
            ["kernel", "tenant", "outcome"],
            registry=self.registry,
        )

    def executed(self, kernel: str, tenant: str, status: str, seconds: float) -> None:
        """Count one finished execution; the session manager calls it."""
        self._execute_seconds.labels(kernel, tenant, status).observe(seconds)
        self._executions.labels(kernel, tenant, status).inc()

    def created(self, kernel: str, tenant: str, outcome: str, seconds: float, start: str) -> None:
        """Count one create; ``start`` is warm or cold, and only successes are timed."""
        self._creates.labels(kernel, tenant, outcome).inc()
        if outcome == "ok":
            self._create_seconds.labels(kernel, start).observe(seconds)

    def watch(
        self, kind: str, name: str, documentation: str, labels: Sequence[str], read: Reading
    ) -> None:
        """Expose ``read()`` as a gauge or counter (``kind``) read on each scrape."""
        self._live.readings.append((kind, name, documentation, list(labels), read))

    def exposition(self) -> bytes:
        """The text a Prometheus scraper reads."""
        return generate_latest(self.registry)


class _Live(Collector):
    """Families whose values are read from the gateway's state when scraped."""

    def __init__(self) -> None:
        self.readings: list[tuple[str, str, str, list[str], Reading]] = []

    def collect(self) -> Iterable[Metric]:
        for kind, name, documentation, labels, read in self.readings:
            family_class = GaugeMetricFamily if kind == "gauge" else CounterMetricFamily
            family = family_class(name, documentation, labels=labels)
            for values, value in sorted(read().items()):
                family.add_metric(list(values), value)
            yield family
