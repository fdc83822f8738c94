"""The Prometheus collector against a real Redis after real refills, and the ops files
that use its metric names (Grafana dashboard, Prometheus scrape config)."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path

import pytest
import redis
import yaml
from prometheus_client.parser import text_string_to_metric_families

from leafpool.client import Client
from leafpool.core.config import Settings
from leafpool.core.errors import PoolEmpty
from leafpool.core.version import __version__
from leafpool.metrics import METRIC_NAMES, POOL_METRICS, make_registry, render
from leafpool.redis.connect import connect
from leafpool.redis.pool import Pool
from leafpool.segment.refiller import SegmentRefiller
from leafpool.segment.store import SegmentStore
from tests.support.services import free_port

ROOT = Path(__file__).resolve().parents[1]
Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def scrape(pool: Pool) -> tuple[set[str], Samples]:
    """Family names and samples keyed by (sample name, sorted labels)."""
    families = list(text_string_to_metric_families(render(make_registry(pool)).decode()))
    samples: Samples = {}
    for family in families:
        for s in family.samples:
            samples[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return {f.name for f in families}, samples


def tag_labels(tag: str, mode: str = "segment") -> tuple[tuple[str, str], ...]:
    return (("mode", mode), ("tag", tag))


@pytest.fixture
def refilled(pool: Pool, sqlite_url: str, make_settings: Callable[..., Settings]) -> SegmentStore:
    store = SegmentStore.from_url(sqlite_url)
    store.init_schema()
    store.add_tag("order", step=1000)
    settings = make_settings(
        database_url=sqlite_url,
        pool_floor=2000,
        pool_ceiling=50_000,
        chunk_size=500,
        reserve_seconds=10,
        pool_seconds=10,
    )
    SegmentRefiller(pool, store, settings).refill("order")
    return store


def test_a_real_refill_shows_in_the_metrics(
    pool: Pool, r: redis.Redis, refilled: SegmentStore
) -> None:
    _, samples = scrape(pool)
    order = tag_labels("order")
    snap = pool.snapshot("order")
    assert samples[("leafpool_up", ())] == 1.0
    assert samples[("leafpool_tags", (("mode", "segment"),))] == 1.0
    assert samples[("leafpool_pool_ids", order)] == r.llen("leafpool:{order}:ids") == 2000
    assert samples[("leafpool_pool_target_ids", order)] == snap.int("target")
    assert samples[("leafpool_pool_low_water_ids", order)] == snap.int("low_water")
    assert samples[("leafpool_pool_reserve_ids", order)] == snap.reserve_size > 0
    assert samples[("leafpool_pool_reserve_ranges", order)] == len(snap.reserve)
    assert samples[("leafpool_pool_step", order)] == snap.int("step")
    assert samples[("leafpool_pool_max_id", order)] == refilled.get_tag("order").max_id
    assert samples[("leafpool_pool_refills_total", order)] == 1.0
    assert samples[("leafpool_pool_pushed_ids_total", order)] == 2000.0
    assert samples[("leafpool_db_allocations_total", order)] == snap.int("allocations") >= 1
    assert samples[("leafpool_db_alloc_last_seconds", order)] == pytest.approx(
        snap.float("last_alloc_ms") / 1000
    )
    assert samples[("leafpool_pool_refill_locked", order)] == 0.0
    assert samples[("leafpool_pool_last_refill_timestamp_seconds", order)] > 1.7e9


def test_empty_hits_and_failures_are_counted(
    pool: Pool, r: redis.Redis, make_settings: Callable[..., Settings]
) -> None:
    pool.register("order", "segment", 0)
    client = Client(settings=make_settings(), policy="raise")
    for _ in range(3):
        with pytest.raises(PoolEmpty):
            client.next_id("order")
    r.hincrby("leafpool:{order}:state", "refill_failures", 2)
    r.hset("leafpool:{order}:state", mapping={"rate": "250.5", "last_error_ms": 1_700_000_000_000})
    r.rpush("leafpool:{order}:reserve", "1:1002")
    _, samples = scrape(pool)
    order = tag_labels("order")
    assert samples[("leafpool_pool_empty_hits_total", order)] == 3.0
    assert samples[("leafpool_pool_refill_failures_total", order)] == 2.0
    assert samples[("leafpool_pool_pops_per_second", order)] == 250.5
    assert samples[("leafpool_pool_seconds_left", order)] == pytest.approx(1001 / 250.5)
    assert samples[("leafpool_pool_last_error_timestamp_seconds", order)] == 1_700_000_000.0


def test_an_outage_shows_in_the_metrics(pool: Pool, r: redis.Redis) -> None:
    """docs/design.md §3.8: the database as the refillers found it, the seconds held at
    the peak and left, dry time, a counter behind, a heal (tolerant of no heal yet)."""
    pool.register("order", "segment", 0, rate="0", peak_rate="100", pushed_total=500,
                  db_unreachable_ms=1_700_000_000_000, dry_since_ms=1_700_000_060_000,
                  dry_ms=2500, last_refill_result="failed: SourceUnavailable")
    pool.register("pay", "segment", 0, rate="10", peak_rate="50", pushed_total=10,
                  last_refill_result="failed: CounterBehind", heals=2,
                  last_heal_ms=1_700_000_000_500)
    r.rpush("leafpool:{pay}:ids", *range(1, 101))
    r.rpush("leafpool:{pay}:reserve", "101:1101")
    pool.register("idle", "segment", 0)
    _, samples = scrape(pool)
    order, pay, idle = tag_labels("order"), tag_labels("pay"), tag_labels("idle")
    assert samples[("leafpool_db_up", ())] == 0.0
    assert samples[("leafpool_db_unreachable_since_timestamp_seconds", order)] == 1.7e9
    assert ("leafpool_db_unreachable_since_timestamp_seconds", pay) not in samples
    assert samples[("leafpool_pool_seconds_left", order)] == 0.0  # dry: whatever the rate
    assert samples[("leafpool_pool_dry_since_timestamp_seconds", order)] == 1_700_000_060.0
    assert samples[("leafpool_pool_dry_seconds_total", order)] == 2.5
    assert samples[("leafpool_pool_seconds_left", pay)] == 110.0  # 1,100 IDs at 10/s
    assert samples[("leafpool_pool_peak_pops_per_second", pay)] == 50.0
    assert samples[("leafpool_pool_list_peak_seconds", pay)] == 2.0
    assert samples[("leafpool_pool_reserve_peak_seconds", pay)] == 20.0
    assert samples[("leafpool_pool_counter_behind", pay)] == 1.0
    assert samples[("leafpool_pool_counter_behind", order)] == 0.0
    assert samples[("leafpool_db_heals_total", pay)] == 2.0
    assert samples[("leafpool_db_heals_total", idle)] == 0.0  # no heal recorded: 0
    assert samples[("leafpool_db_last_heal_timestamp_seconds", pay)] == 1_700_000_000.5
    assert ("leafpool_db_last_heal_timestamp_seconds", idle) not in samples
    assert ("leafpool_pool_seconds_left", idle) not in samples
    r.hset("leafpool:{order}:state", "db_unreachable_ms", "")  # an allocation succeeded
    _, samples = scrape(pool)
    assert samples[("leafpool_db_up", ())] == 1.0


def test_snowflake_state_becomes_registry_and_clock_metrics(pool: Pool, r: redis.Redis) -> None:
    pool.register(
        "sf",
        "snowflake",
        0,
        worker_ids="3,7",
        lease_state="held",
        backwards_events=2,
        last_backwards_ms=1_700_000_000_500,
        last_backwards_offset_ms=12,
    )
    _, samples = scrape(pool)
    sf = tag_labels("sf", "snowflake")
    assert samples[("leafpool_tags", (("mode", "snowflake"),))] == 1.0
    assert samples[("leafpool_snowflake_worker_ids", sf)] == 2.0
    lease = tuple(sorted((*sf, ("state", "held"))))
    assert samples[("leafpool_snowflake_lease_state", lease)] == 1.0
    assert samples[("leafpool_snowflake_clock_backwards_total", sf)] == 2.0
    assert samples[("leafpool_snowflake_last_clock_backwards_offset_seconds", sf)] == 0.012
    assert samples[("leafpool_snowflake_last_clock_backwards_timestamp_seconds", sf)] == (
        1_700_000_000.5
    )


def test_every_documented_name_is_exported(
    pool: Pool, r: redis.Redis, refilled: SegmentStore
) -> None:
    pool.register(
        "sf",
        "snowflake",
        0,
        worker_ids="1",
        lease_state="held",
        backwards_events=1,
        last_backwards_ms=1,
        last_backwards_offset_ms=1,
    )
    for field in ("empty_hits", "reserve_takes", "refill_failures"):
        r.hincrby("leafpool:{order}:state", field, 1)
    r.hset("leafpool:{order}:state", mapping={"rate": 10, "last_error_ms": 1})
    names, _ = scrape(pool)
    assert names == set(POOL_METRICS)


def test_a_scrape_with_redis_down_reports_up_0() -> None:
    dead = Pool(connect(f"redis://127.0.0.1:{free_port()}/0"), "leafpool")
    names, samples = scrape(dead)
    assert names == {"leafpool_up", "leafpool_build_info"}
    assert samples[("leafpool_up", ())] == 0.0
    assert samples[("leafpool_build_info", (("version", __version__),))] == 1.0


def test_the_build_info_names_the_release(pool: Pool) -> None:
    """``leafpool_build_info{version=...} 1``: the release, as ``leafpool --version`` says
    it, in both writers of the families (the text one /metrics serves, and collect())."""
    _, samples = scrape(pool)
    assert samples[("leafpool_build_info", (("version", __version__),))] == 1.0
    collected = {(s.name, tuple(s.labels.items())): s.value
                 for family in make_registry(pool).collect() for s in family.samples}
    assert collected[("leafpool_build_info", (("version", __version__),))] == 1.0


# -- the ops files that use the names ------------------------------------------------------

_NAME_RE = re.compile(r"\bleafpool_[a-z_]+")
_SUFFIXES = ("_total", "_bucket", "_count", "_sum", "_created")


def _family(name: str) -> str:
    for suffix in _SUFFIXES:
        if name.endswith(suffix) and name[: -len(suffix)] in METRIC_NAMES:
            return name[: -len(suffix)]
    return name


def test_grafana_dashboard_is_valid_and_uses_exported_names() -> None:
    dashboard = json.loads((ROOT / "ops" / "grafana" / "leafpool-dashboard.json").read_text())
    assert dashboard["title"] and dashboard["uid"] and dashboard["schemaVersion"] >= 30
    panels = [p for p in dashboard["panels"] if p["type"] != "row"]
    assert len(panels) >= 8
    used: set[str] = set()
    for panel in panels:
        assert panel["title"] and panel["gridPos"]["w"] > 0
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            used |= {_family(n) for n in _NAME_RE.findall(target["expr"])}
    unknown = used - set(METRIC_NAMES)
    assert unknown == set()
    must_show = {
        "leafpool_pool_ids",
        "leafpool_pool_target_ids",
        "leafpool_pool_pops_per_second",
        "leafpool_pool_empty_hits",
        "leafpool_pool_refill_failures",
        "leafpool_db_alloc_last_seconds",
        "leafpool_snowflake_clock_backwards",
        "leafpool_up",
        "leafpool_http_request_duration_seconds",
    }
    assert must_show <= used
    variables = {v["name"] for v in dashboard["templating"]["list"]}
    assert {"datasource", "tag"} <= variables


def test_prometheus_scrapes_the_http_service() -> None:
    config = yaml.safe_load((ROOT / "ops" / "prometheus" / "prometheus.yml").read_text())
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    job = jobs["leafpool"]
    assert job.get("metrics_path", "/metrics") == "/metrics"
    targets = [t for group in job["static_configs"] for t in group["targets"]]
    assert "http:8080" in targets  # the compose service name and port


# -- many tags: the pool's families written directly ------------------------------------------


def _families(
    text: str,
) -> dict[str, tuple[str, str, set[tuple[str, tuple[tuple[str, str], ...], float]]]]:
    """name -> (type, help, samples), the scrape duration's value left out."""
    out = {}
    for f in text_string_to_metric_families(text):
        samples = {
            (
                s.name,
                tuple(sorted(s.labels.items())),
                0.0 if s.name == "leafpool_scrape_duration_seconds" else s.value,
            )
            for s in f.samples
        }
        out[f.name] = (f.type, f.documentation, samples)
    return out


def test_the_direct_writer_gives_what_prometheus_client_gives(
    pool: Pool, r: redis.Redis, refilled: SegmentStore
) -> None:
    """render() writes the pool's families itself; every family, help text, type, sample
    and value equals prometheus-client's own exposition of the same collector."""
    from prometheus_client import CollectorRegistry, generate_latest

    from leafpool.metrics import PoolCollector, http_metrics

    pool.register(
        "sf",
        "snowflake",
        0,
        worker_ids="1,2",
        lease_state='held "zk"\\ok',
        backwards_events=2,
        last_backwards_ms=5,
        time_bits_years_left="40.5",
    )
    for n in range(600):  # more tags than one pipeline holds
        pool.register(f"idle{n:03d}", "segment", 0, table_step=10)
    r.hset("leafpool:{order}:state", mapping={"rate": "12.25", "last_error_ms": 3})
    # no measurement time: the rate as recorded (one with a time is brought up to the
    # moment it is read, which moves between the two expositions)
    r.hdel("leafpool:{order}:state", "rate_ts_ms")
    plain = CollectorRegistry(auto_describe=False)
    plain.register(PoolCollector(pool))
    registry = make_registry(pool)
    http_metrics(registry).observe("segment", 200, 0.001)
    direct = render(registry).decode()
    assert "leafpool_http_requests_total" in direct  # the registered metrics follow
    expected = _families(generate_latest(plain).decode())
    got = _families(direct)
    assert {name for name in got if not name.startswith("leafpool_http")} == set(expected)
    for name, family in expected.items():
        assert got[name] == family, name
    assert len(expected["leafpool_pool_ids"][2]) == 602


def test_the_registry_still_collects_the_pool_for_any_reader(pool: Pool) -> None:
    pool.register("order", "segment", 0)
    registry = make_registry(pool)
    assert (
        registry.get_sample_value("leafpool_pool_ids", {"tag": "order", "mode": "segment"}) == 0.0
    )


def test_the_http_metrics_expose_what_prometheus_clients_counter_and_histogram_expose() -> None:
    """The HTTP service counts in plain dicts (HttpMetrics) and exports at the scrape what
    prometheus-client's Counter and Histogram export for the same requests: names, types,
    help, labels, every bucket, count and sum; the counter's ``_created`` too (the
    histogram's is left out)."""
    from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

    from leafpool.metrics import HttpMetrics, http_metrics

    ref = CollectorRegistry()
    count = Counter("leafpool_http_requests", "ID requests answered, by endpoint and status code",
                    ["endpoint", "code"], registry=ref)
    latency = Histogram("leafpool_http_request_duration_seconds", "Time to answer an ID request",
                        ["endpoint"], registry=ref, buckets=HttpMetrics.BUCKETS)
    ours = CollectorRegistry()
    stats = http_metrics(ours)
    for endpoint, code, seconds in [
        ("/api/segment/get", 200, 0.0004), ("/api/segment/get", 200, 0.0005),  # on a bound
        ("/api/segment/get", 200, 0.0031), ("/api/segment/get", 404, 0.02),
        ("/api/snowflake/ids", 200, 7.5),  # past the last bound: +Inf only
    ]:
        count.labels(endpoint, str(code)).inc()
        latency.labels(endpoint).observe(seconds)
        stats.observe(endpoint, code, seconds)

    def exposed(registry: CollectorRegistry) -> dict[str, tuple[str, str, set[object]]]:
        out = {}
        for f in text_string_to_metric_families(generate_latest(registry).decode()):
            samples = {(s.name, tuple(sorted(s.labels.items())),
                        "a time" if s.name.endswith("_created") else round(s.value, 9))
                       for s in f.samples
                       if not s.name.startswith("leafpool_http_request_duration_seconds_created")}
            if samples:
                out[f.name] = (f.type, f.documentation, samples)
        return out

    got, want = exposed(ours), exposed(ref)
    assert got == want
    assert got["leafpool_http_requests_created"][2]  # the text format: a family of its own
