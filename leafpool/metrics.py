"""Prometheus metrics of the pools, read from Redis on every scrape.

:class:`PoolCollector` is a custom collector: it holds no counters of its own; each
scrape reads every tag's keys (one pipelined round trip, :meth:`Pool.snapshots`) and
turns each tag's :class:`~leafpool.status.TagStatus` (the one parsed shape of a tag's
state) into metric families. The counters (refills, failures, empty-pool
hits, ...) are the ones the refillers and clients keep in ``leafpool:{TAG}:state``, so
they are shared by every process and survive a restart of the HTTP service.

A scrape while Redis is down does not fail: it reports ``leafpool_up 0`` and nothing
per tag, so the alert can say "Redis unreachable" instead of "target down".

``leafpool_build_info{version="..."} 1`` names the release serving the scrape (the
Prometheus convention for a build's facts), whatever Redis answers: during a rollout each
process's scrape says which release it runs.

``leafpool_db_up`` is the database as the refillers last found it (docs/design.md §3.8):
0 while a segment tag's allocations fail for want of it, from the state they record; a
scrape never asks the database itself (a stopped database would hold the scrape for the
driver's timeouts). Alert rules on these names: ``ops/prometheus/alerts.yml``.

Every per-tag metric has the labels ``tag`` and ``mode`` (``segment`` or ``snowflake``).
"""

from __future__ import annotations

import bisect
import itertools
import logging
import math
import operator
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from leafpool.core.errors import LeafpoolError
from leafpool.core.version import __version__
from leafpool.metric_families import COUNTERS, GAUGES, LABELS
from leafpool.redis.pool import Pool
from leafpool.status import TagStatus, pool_status

log = logging.getLogger(__name__)

DB_UP = ("leafpool_db_up", "1 unless a segment tag's allocations are failing for want of the "
         "database (as the refillers last found it: leafpool_db_unreachable_since_"
         "timestamp_seconds says which tags since when)")


BUILD_INFO = ("leafpool_build_info", "1, labelled with the leafpool release serving this scrape "
              "(CHANGELOG.md)")


def build_info() -> GaugeMetricFamily:
    family = GaugeMetricFamily(*BUILD_INFO, labels=["version"])
    family.add_metric([__version__], 1.0)
    return family


def _build_info_text() -> str:
    return _header(*BUILD_INFO, "gauge") + f'{BUILD_INFO[0]}{{version="{__version__}"}} 1.0\n'


def db_up(statuses: list[TagStatus]) -> float:
    """0 while any segment tag records its allocations failing, else 1."""
    return 0.0 if any(st.db_unreachable_ms is not None for st in statuses) else 1.0


class PoolCollector(Collector):
    """Reads every tag's keys on each scrape. ``pool`` uses a synchronous Redis client:
    run :func:`render` in a thread when serving from an event loop."""

    def __init__(self, pool: Pool, perf_counter: Callable[[], float] = time.perf_counter) -> None:
        self.pool = pool
        self._perf_counter = perf_counter

    def describe(self) -> Iterable[Metric]:
        return []  # names depend on what the scrape finds; no collect() at registration

    def collect(self) -> Iterator[Metric]:
        started = self._perf_counter()
        yield build_info()
        up = GaugeMetricFamily("leafpool_up", "1 when Redis answered this scrape")
        try:
            statuses = pool_status(self.pool)
        except LeafpoolError as exc:
            log.warning("metrics: cannot read the pools: %s", exc)
            up.add_metric([], 0.0)
            yield up
            return
        up.add_metric([], 1.0)
        yield up
        db = GaugeMetricFamily(*DB_UP)
        db.add_metric([], db_up(statuses))
        yield db
        yield from self._families(statuses)
        took = GaugeMetricFamily(
            "leafpool_scrape_duration_seconds",
            "Time this scrape spent reading the pools from Redis",
        )
        took.add_metric([], self._perf_counter() - started)
        yield took

    def _families(self, statuses: list[TagStatus]) -> Iterator[Metric]:
        modes: dict[str, int] = {}
        for st in statuses:
            modes[st.mode] = modes.get(st.mode, 0) + 1
        tags = GaugeMetricFamily(
            "leafpool_tags", "Tags known to the pool, by mode", labels=["mode"]
        )
        for mode, n in sorted(modes.items()):
            tags.add_metric([mode], float(n))
        yield tags

        for name, doc, read in GAUGES:
            family = GaugeMetricFamily(name, doc, labels=LABELS)
            for st in statuses:
                value = read(st)
                if value is not None:
                    family.add_metric([st.tag, st.mode], value)
            yield family

        for name, doc, attr, kept_by in COUNTERS:
            counter = CounterMetricFamily(name, doc, labels=LABELS)
            for st in statuses:
                if st.mode in kept_by:
                    counter.add_metric([st.tag, st.mode], float(getattr(st, attr)))
            yield counter

        lease = GaugeMetricFamily(
            "leafpool_snowflake_lease_state",
            "Worker-ID lease state reported by the generators filling the tag (1 = current)",
            labels=[*LABELS, "state"],
        )
        for st in statuses:
            if st.lease_state:
                lease.add_metric([st.tag, st.mode, st.lease_state], 1.0)
        yield lease


# every family this module exports (counters without their ``_total`` suffix); the
# Grafana dashboard and the README use these names, and a test keeps them in step
POOL_METRICS: tuple[str, ...] = (
    BUILD_INFO[0],
    "leafpool_up",
    DB_UP[0],
    "leafpool_tags",
    "leafpool_scrape_duration_seconds",
    "leafpool_snowflake_lease_state",
    *(name for name, _, _ in GAUGES),
    *(name for name, _, _, _ in COUNTERS),
)
HTTP_METRICS: tuple[str, ...] = ("leafpool_http_requests", "leafpool_http_request_duration_seconds")
METRIC_NAMES = POOL_METRICS + HTTP_METRICS


class HttpMetrics(Collector):
    """Request counter and latency histogram of the HTTP service's ID endpoints.

    Counted in plain dicts by the event loop's thread, and exported at each scrape as the
    families prometheus-client's ``Counter`` and ``Histogram`` would give
    (``leafpool_http_requests_total`` by endpoint and code, with ``_created``;
    ``leafpool_http_request_duration_seconds`` by endpoint). Their locks and label
    lookups cost 4 us a request, a tenth of a single-ID request's CPU (issue 30); a dict
    update and a bisect cost a tenth of that. A scrape, in whichever thread, reads copies."""

    BUCKETS: tuple[float, ...] = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25,
                                  0.5, 1.0, 2.5, 5.0)

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self._clock = clock
        self._requests: dict[tuple[str, int], int] = {}
        self._created: dict[tuple[str, int], float] = {}
        self._buckets: dict[str, list[int]] = {}  # per bucket, not cumulative; +Inf last
        self._sums: dict[str, float] = {}

    def observe(self, endpoint: str, code: int, seconds: float) -> None:
        """One request of ``endpoint`` answered with ``code`` in ``seconds``."""
        key = (endpoint, code)
        count = self._requests.get(key)
        if count is None:
            self._created[key] = self._clock()
            count = 0
        self._requests[key] = count + 1
        buckets = self._buckets.get(endpoint)
        if buckets is None:
            self._sums[endpoint] = 0.0
            buckets = self._buckets[endpoint] = [0] * (len(self.BUCKETS) + 1)
        buckets[bisect.bisect_left(self.BUCKETS, seconds)] += 1
        self._sums[endpoint] += seconds

    def collect(self) -> Iterator[Metric]:
        requests = CounterMetricFamily("leafpool_http_requests",
                                       "ID requests answered, by endpoint and status code",
                                       labels=["endpoint", "code"])
        created = dict(self._created)
        for (endpoint, code), count in list(self._requests.items()):
            requests.add_metric([endpoint, str(code)], count,
                                created=created.get((endpoint, code)))
        yield requests
        latency = HistogramMetricFamily("leafpool_http_request_duration_seconds",
                                        "Time to answer an ID request", labels=["endpoint"])
        sums = dict(self._sums)
        bounds = [floatToGoString(b) for b in (*self.BUCKETS, math.inf)]  # type: ignore[no-untyped-call]
        for endpoint, buckets in list(self._buckets.items()):
            cumulative = list(itertools.accumulate(list(buckets)))
            latency.add_metric([endpoint], list(zip(bounds, cumulative, strict=True)),
                               sums.get(endpoint, 0.0))
        yield latency


def http_metrics(registry: CollectorRegistry) -> HttpMetrics:
    """The HTTP service's metrics, registered in ``registry``."""
    metrics = HttpMetrics()
    registry.register(metrics)
    return metrics


class PoolRegistry(CollectorRegistry):
    """A registry with the pool collector beside the registered ones (the HTTP metrics).

    ``collect()`` yields both, as any registry does; :func:`render` writes the pool's
    families itself (:func:`pool_text`): 10,000 tags are about 250,000 samples, and
    prometheus-client's generic writer spends seconds on them."""

    def __init__(self, pool_collector: PoolCollector) -> None:
        super().__init__(auto_describe=False)
        self.pool_collector = pool_collector

    def collect(self) -> Iterator[Metric]:
        yield from self.pool_collector.collect()
        yield from super().collect()

    def others(self) -> _Others:
        return _Others(self)


@dataclass(frozen=True)
class _Others:
    """The registered collectors of a :class:`PoolRegistry`, without the pool's."""

    registry: PoolRegistry

    def collect(self) -> Iterable[Metric]:
        return CollectorRegistry.collect(self.registry)


def make_registry(pool: Pool) -> PoolRegistry:
    """A registry of its own (not the process-global one) holding the pool collector."""
    return PoolRegistry(PoolCollector(pool))


def render(registry: CollectorRegistry) -> bytes:
    """The Prometheus text exposition format."""
    if isinstance(registry, PoolRegistry):
        return pool_text(registry.pool_collector, generate_latest(registry.others()))
    return generate_latest(registry)


# -- the pool's families, written directly ---------------------------------------------------


def _value(value: float) -> str:
    return repr(float(value)) if math.isfinite(value) else floatToGoString(value)  # type: ignore[no-untyped-call]


#: what :func:`_value` writes for the floats ``repr`` writes otherwise
_NOT_FINITE = {"inf": "+Inf", "-inf": "-Inf", "nan": "NaN"}


def _samples(name: str, labels: Iterable[str], values: Iterable[float]) -> list[str]:
    """A family's sample lines, ``name``, label and :func:`_value` of the value (a number),
    written by ``map`` over the family's values (no Python call a sample but the
    readers': a list comprehension a family took 6 of a 100,000-tag scrape's 10 s)."""
    text = list(map(float.__repr__, map(float, values)))
    if not _NOT_FINITE.keys().isdisjoint(text):
        text = [_NOT_FINITE.get(t, t) for t in text]
    lines = list(map(operator.add, map(name.__add__, labels), text))
    return ["\n".join(lines) + "\n"] if lines else []


def _header(name: str, doc: str, kind: str) -> str:
    doc = doc.replace("\\", r"\\").replace("\n", r"\n")
    return f"# HELP {name} {doc}\n# TYPE {name} {kind}\n"


def pool_text(collector: PoolCollector, after: bytes = b"") -> bytes:
    """The same families and samples as :meth:`PoolCollector.collect` in the text format
    (version 0.0.4), written with one f-string per sample, and ``after`` (the other
    collectors' text) joined in the same one copy (100,000 tags are 3.7 million samples).
    Tag names need no escaping: they are ``[A-Za-z0-9_.-]`` (leafpool.core.tags), modes and
    lease states are leafpool's."""
    started = collector._perf_counter()
    try:
        statuses = pool_status(collector.pool)
    except LeafpoolError as exc:
        log.warning("metrics: cannot read the pools: %s", exc)
        return (
            _build_info_text()
            + _header("leafpool_up", "1 when Redis answered this scrape", "gauge")
            + "leafpool_up 0.0\n"
        ).encode() + after
    out = [
        _build_info_text(),
        _header("leafpool_up", "1 when Redis answered this scrape", "gauge"),
        "leafpool_up 1.0\n",
        _header(*DB_UP, "gauge"),
        f"{DB_UP[0]} {db_up(statuses)!r}\n",
        _header("leafpool_tags", "Tags known to the pool, by mode", "gauge"),
    ]
    modes: dict[str, int] = {}
    for st in statuses:
        modes[st.mode] = modes.get(st.mode, 0) + 1
    out += [f'leafpool_tags{{mode="{mode}"}} {float(n)!r}\n' for mode, n in sorted(modes.items())]
    labels = [f'{{tag="{st.tag}",mode="{st.mode}"}} ' for st in statuses]
    for name, doc, read in GAUGES:
        out.append(_header(name, doc, "gauge"))
        values = list(map(read, statuses))
        kept = list(map(operator.is_not, values, itertools.repeat(None)))
        out += _samples(name, itertools.compress(labels, kept),
                        itertools.compress(values, kept))  # type: ignore[arg-type]
    kept_by_modes: dict[tuple[str, ...], tuple[list[TagStatus], list[str]]] = {}
    for name, doc, attr, kept_by in COUNTERS:
        out.append(_header(f"{name}_total", doc, "counter"))  # as prometheus-client writes it
        if kept_by not in kept_by_modes:
            kept = [st.mode in kept_by for st in statuses]
            kept_by_modes[kept_by] = (list(itertools.compress(statuses, kept)),
                                      list(itertools.compress(labels, kept)))
        of, their_labels = kept_by_modes[kept_by]
        out += _samples(f"{name}_total", their_labels, map(operator.attrgetter(attr), of))
    out.append(
        _header(
            "leafpool_snowflake_lease_state",
            "Worker-ID lease state reported by the generators filling the tag (1 = current)",
            "gauge",
        )
    )
    for st in statuses:
        if st.lease_state:
            state = st.lease_state.replace("\\", r"\\").replace('"', r"\"").replace("\n", r"\n")
            out.append(
                f'leafpool_snowflake_lease_state{{tag="{st.tag}",mode="{st.mode}",'
                f'state="{state}"}} 1.0\n'
            )
    out.append(
        _header(
            "leafpool_scrape_duration_seconds",
            "Time this scrape spent reading the pools from Redis",
            "gauge",
        )
    )
    out.append(f"leafpool_scrape_duration_seconds {_value(collector._perf_counter() - started)}\n")
    out.append(after.decode())
    return "".join(out).encode()
