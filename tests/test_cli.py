"""The ``leafpool`` command, run as a real process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from leafpool.segment.store import SegmentStore

Run = Callable[..., subprocess.CompletedProcess[str]]


@pytest.fixture
def cli(database_url: str, redis_url: str) -> Run:
    def run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        full_env = {k: v for k, v in os.environ.items() if not k.startswith("LEAFPOOL_")}
        full_env.update({"LEAFPOOL_DATABASE_URL": database_url,
                         "LEAFPOOL_REDIS_URL": redis_url, "COLUMNS": "200",
                         "LEAFPOOL_HOME": os.environ["LEAFPOOL_HOME"]})
        full_env.update(env or {})
        return subprocess.run([sys.executable, "-m", "leafpool.cli", *args], env=full_env,
                              capture_output=True, text=True, timeout=60)

    return run


def test_schema_tags_refill_status_and_pop(cli: Run, database_url: str) -> None:
    assert cli("db", "init").returncode == 0
    assert "already exists" in cli("db", "init").stdout
    added = cli("tag", "add", "order", "--step", "1000", "--start", "500",
                "--description", "orders")
    assert added.returncode == 0, added.stderr
    assert cli("tag", "step", "order", "2000").returncode == 0
    listed = json.loads(cli("tag", "list", "--json").stdout)
    assert listed == [{"mode": "segment", "tag": "order", "max_id": 500, "step": 2000,
                       "description": "orders"}]
    assert cli("refill", "order").returncode == 0
    status = json.loads(cli("status", "--json").stdout)
    assert status[0]["tag"] == "order" and status[0]["length"] == status[0]["target"] > 0
    table = cli("status").stdout
    assert "order" in table and "ready/target" in table
    popped = cli("pop", "order", "-n", "3")
    assert popped.stdout.split() == ["500", "501", "502"]
    assert cli("tag", "remove", "order").returncode == 0
    assert SegmentStore.from_url(database_url).list_tags() == []


@pytest.mark.parametrize("args,needle", [
    (["tag", "add", "", "--step", "10"], "tag='' is not valid"),
    (["tag", "add", "x" * 129, "--step", "10"], "at most 128"),
    (["tag", "add", "a:b", "--step", "10"], "allowed characters"),
    (["tag", "add", "ok", "--step", "0"], "step=0 is not valid"),
    (["tag", "add", "ok", "--step", "1000001"], "step=1000001 is not valid"),
    (["tag", "add", "ok", "--step", "10", "--start", "0"], "start=0 is not valid: an integer >= 1"),
    (["tag", "add", "ok"], "step=None is not valid: required for segment tags"),
    (["tag", "add", "ok", "--mode", "uuid"], "mode='uuid' is not valid"),
    (["tag", "add", "ok", "--mode", "snowflake", "--step", "5"], "not used by snowflake"),
    (["tag", "step", "missing", "10"], "missing: unknown tag"),
    (["tag", "remove", "missing"], "missing: unknown tag"),
])
def test_bad_input_exits_2_with_the_field_and_writes_nothing(
    cli: Run, database_url: str, args: list[str], needle: str
) -> None:
    cli("db", "init")
    result = cli(*args)
    assert result.returncode == 2
    assert needle in " ".join(result.stderr.split())
    assert SegmentStore.from_url(database_url).list_tags() == []


def test_a_tag_removed_and_added_again_never_repeats_an_id(cli: Run) -> None:
    """The issue's exact steps: it once served 1 2 3 a second time."""
    cli("db", "init")

    def add_refill_pop(*extra: str) -> list[str]:
        added = cli("tag", "add", "pay", "--step", "10", *extra)
        assert added.returncode == 0, added.stderr
        assert cli("refill", "pay").returncode == 0
        return cli("pop", "pay", "-n", "3").stdout.split()

    first = add_refill_pop()
    assert first == ["1", "2", "3"]
    removed = cli("tag", "remove", "pay")
    assert removed.returncode == 0 and "retired" in removed.stdout
    refused = cli("tag", "add", "pay", "--step", "10", "--start", "1")
    assert refused.returncode == 2
    assert "start=1 is not valid: at least" in " ".join(refused.stderr.split())
    again = add_refill_pop()
    assert int(again[0]) > 3 and not set(again) & set(first)


def test_a_malformed_environment_variable_exits_2(cli: Run) -> None:
    result = cli("status", env={"LEAFPOOL_POOL_SECONDS": "soon"})
    assert result.returncode == 2
    assert "LEAFPOOL_POOL_SECONDS='soon'" in result.stderr


def test_an_unreachable_redis_exits_1(cli: Run) -> None:
    result = cli("status", env={"LEAFPOOL_REDIS_URL": "redis://127.0.0.1:1/0"})
    assert result.returncode == 1
    assert "redis" in result.stderr


def test_snowflake_tags_are_declared_listed_and_removed(cli: Run, database_url: str) -> None:
    cli("db", "init")
    added = cli("tag", "add", "flake", "--mode", "snowflake")
    assert added.returncode == 0, added.stderr
    listed = json.loads(cli("tag", "list", "--json").stdout)
    assert listed == [{"mode": "snowflake", "tag": "flake"}]
    status = json.loads(cli("status", "--json").stdout)
    assert [(s["tag"], s["mode"]) for s in status] == [("flake", "snowflake")]
    assert cli("tag", "add", "flake", "--step", "10").returncode == 2  # one name, one tag
    assert cli("tag", "remove", "flake").returncode == 0
    assert SegmentStore.from_url(database_url).list_snowflake_tags() == []


def test_decode_agrees_with_leafs_decoder(cli: Run) -> None:
    # timestamp 1567733700834, worker 39, sequence 3448 on Leaf's epoch
    snowflake_id = ((1567733700834 - 1288834974657) << 22) | (39 << 12) | 3448
    result = cli("decode", str(snowflake_id), "--json")
    assert result.returncode == 0, result.stderr
    decoded = json.loads(result.stdout)
    assert (decoded["timestamp_ms"], decoded["worker_id"], decoded["sequence"]) == (
        1567733700834, 39, 3448)
    assert decoded["iso"].startswith("2019-09-06T01:35:00.834")
    assert (decoded["dc"], decoded["dc_count"]) == (0, 1)
    # the DC is the worker ID's range under this process's LEAFPOOL_DC_COUNT: 39 // 32 = 1
    many = cli("decode", str(snowflake_id), env={"LEAFPOOL_DC_COUNT": "32"})
    assert many.returncode == 0, many.stderr
    assert "worker 39  dc 1 (of LEAFPOOL_DC_COUNT=32)" in many.stdout
    for bad_id in ("x12", str(2**63)):
        bad = cli("decode", bad_id)
        assert bad.returncode == 2 and f"id='{bad_id}' is not valid" in bad.stderr


def test_status_holds_the_garbage_collector_off_only_while_it_reads() -> None:
    import gc

    from leafpool.cli_status import _collector_paused

    assert gc.isenabled()
    with pytest.raises(RuntimeError), _collector_paused():
        assert not gc.isenabled()
        raise RuntimeError("Redis went away mid-read")
    assert gc.isenabled()  # back on after an error
    gc.disable()
    try:
        with _collector_paused():
            pass
        assert not gc.isenabled()  # a caller that had it off keeps it off
    finally:
        gc.enable()


# -- secrets (issue: least privilege): no password is printed, whatever it holds ------------


@pytest.mark.parametrize("var, url, secret", [
    ("LEAFPOOL_REDIS_URL", "redis://u:Ab/Cd+Ef==@127.0.0.1:6379/0", "Ab/Cd+Ef=="),
    ("LEAFPOOL_REDIS_URL", "redis://u:pw@127.0.0.1:99999/0", "pw@"),
    ("LEAFPOOL_DATABASE_URL", "mysql+pymysql://l:S3cret@h:abc/x", "S3cret"),
    ("LEAFPOOL_DATABASE_URL", "mysql+pymysql://l:S3/cret@h:3306/x", "S3/cret"),
])
def test_a_malformed_url_is_refused_naming_the_variable_without_its_password(
    cli: Run, var: str, url: str, secret: str
) -> None:
    done = cli("tag", "list", env={var: url})
    assert done.returncode == 2, done.stderr
    said = done.stdout + done.stderr
    assert var in said and secret not in said and "Traceback" not in said


def test_a_database_that_cannot_be_opened_is_named_without_its_password(cli: Run) -> None:
    done = cli("tag", "list", env={"LEAFPOOL_DATABASE_URL": "sqlite://leaf:S3cret@h/x.db"})
    said = done.stdout + done.stderr
    assert done.returncode != 0 and "S3cret" not in said and "leaf:***@" in said


@pytest.mark.parametrize("url", [
    "redis://u:Ab%2FCd@127.0.0.1:6379/0", "redis://:p@ss:w0rd@h:1/0", "rediss://u:x/y?z#w@h/0",
    "mysql+pymysql://l:p@h/x?password=p2&ssl=1", "sqlite://leaf:S3cret@h/x.db",
])
def test_the_one_masking_function_hides_any_password(url: str) -> None:
    from leafpool.core.config import hide_password

    shown = hide_password(url)
    assert "***" in shown
    for secret in ("Ab%2FCd", "p@ss:w0rd", "x/y?z#w", "p2", "S3cret"):
        assert secret not in shown


def test_snowflake_layout_shows_and_sets_a_growing_site(cli: Run, tmp_path: Path) -> None:
    """``leafpool snowflake layout`` (mode local: the host's cache directory): a site of one
    DC holding worker 3 and, mapped, 700; shown with each worker ID's DC under the
    recorded and the configured layout; --set refused naming 700 (exit 2, the record
    unchanged); once 700 is released, --set records DC 0 of 2."""
    from leafpool.core.config import load_settings
    from leafpool.snowflake.registry import open_registry

    cache = tmp_path / "cache"
    env = {"LEAFPOOL_SNOWFLAKE_MODE": "local", "LEAFPOOL_SNOWFLAKE_CACHE_DIR": str(cache),
           "LEAFPOOL_DC_COUNT": "2"}
    held = []
    for identity, worker in (("host-a:w:0", 3), ("host-b:w:0", 700)):
        settings = load_settings(snowflake_mode="local", snowflake_cache_dir=str(cache),
                                 snowflake_local_map=f"{identity}={worker}")
        reg = open_registry(settings, identity, background=False)
        assert reg.claim().worker_id == worker
        held.append(reg)
    shown = cli("snowflake", "layout", env=env)
    assert shown.returncode == 0, shown.stderr
    assert "recorded    DC 0 of 1 (worker IDs 0..1023)" in shown.stdout
    assert "configured  DC 0 of 2 (worker IDs 0..511)" in shown.stdout
    rows = {line.split()[0]: line.split() for line in shown.stdout.splitlines()
            if line[:1].isdigit()}
    assert rows["3"][1:5] == ["0", "of", "1", "0"] and rows["700"][1:5] == ["0", "of", "1", "1"]
    refused = cli("snowflake", "layout", "--set", env=env)
    assert refused.returncode == 2
    assert "LEAFPOOL_DC_COUNT=2" in refused.stderr and "worker 700 of host-b:w:0" in refused.stderr
    as_json = json.loads(cli("snowflake", "layout", "--json", env=env).stdout)
    assert as_json["recorded"]["dc_count"] == 1
    assert [h["worker_id"] for h in as_json["held"] if h["blocks_set"]] == [700]
    held[1].release()
    done = cli("snowflake", "layout", "--set", env=env)
    assert done.returncode == 0, done.stderr
    assert "recorded    DC 0 of 2 (worker IDs 0..511)" in done.stdout
    assert "recorded the configured layout" in done.stdout
    held[0].release()
