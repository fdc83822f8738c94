"""The cache file of a generator identity (leafpool/snowflake/registry/cache.py): its record round
trip, atomic and durable replacement, refusal of a file it cannot read, whether its
writer still runs, reading a directory of them, and a registry ignoring a file that
another identity wrote."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

from leafpool.core.config import load_settings
from leafpool.core.errors import ClockMovedBackwards, WorkerIdUnavailable
from leafpool.snowflake.registry import open_registry
from leafpool.snowflake.registry.cache import CacheFile, CacheRecord, read_all
from tests.support.clocks import T0, FakeMsClock

RECORD = CacheRecord(
    worker_id=3,
    last_timestamp=5,
    identity="a",
    mode="local",
    token="t",
    lease_until=9,
    updated_at=4,
    pid=123,
)


def test_a_record_round_trips(tmp_path: Path) -> None:
    cache = CacheFile(tmp_path / "sub" / "x.json")
    assert cache.read() is None  # no file yet
    cache.write(RECORD)
    assert cache.read() == RECORD
    assert sorted(p.name for p in cache.path.parent.iterdir()) == ["x.json"]  # no temp left
    cache.write(CacheRecord(worker_id=4, last_timestamp=6, identity="a", mode="local"))
    assert cache.read() == CacheRecord(worker_id=4, last_timestamp=6, identity="a", mode="local")


def test_a_file_with_only_the_worker_id_and_timestamp_is_read(tmp_path: Path) -> None:
    path = tmp_path / "old.json"
    path.write_text(json.dumps({"worker_id": 7, "last_timestamp": 11}))
    assert CacheFile(path).read() == CacheRecord(
        worker_id=7, last_timestamp=11, identity="", mode=""
    )


@pytest.mark.parametrize(
    "text", ["{not json", "[]", "{}", '{"worker_id": 1}', '{"worker_id": "x", "last_timestamp": 1}']
)
def test_a_corrupt_file_refuses_naming_the_file(tmp_path: Path, text: str) -> None:
    path = tmp_path / "x.json"
    path.write_text(text)
    with pytest.raises(WorkerIdUnavailable) as err:
        CacheFile(path).read()
    assert "corrupt" in str(err.value) and str(path) in str(err.value)


def test_an_unreadable_file_refuses(tmp_path: Path) -> None:
    path = tmp_path / "x.json"
    path.mkdir()  # a directory where the file should be
    with pytest.raises(WorkerIdUnavailable) as err:
        CacheFile(path).read()
    assert "cannot read" in str(err.value) and str(path) in str(err.value)


def test_a_failed_replace_is_wrapped_and_leaves_no_temporary_file(tmp_path: Path) -> None:
    cache = CacheFile(tmp_path / "x.json")
    (cache.path / "occupied").mkdir(parents=True)  # a directory in the file's place
    with pytest.raises(WorkerIdUnavailable) as err:
        cache.write(RECORD)
    assert "cannot write cache file" in str(err.value) and err.value.__cause__ is not None
    assert sorted(p.name for p in tmp_path.iterdir()) == ["x.json"]


def test_a_write_into_a_file_in_place_of_the_directory_is_wrapped(tmp_path: Path) -> None:
    (tmp_path / "sub").write_text("a file, not a directory")
    with pytest.raises(WorkerIdUnavailable) as err:
        CacheFile(tmp_path / "sub" / "x.json").write(RECORD)
    assert "a: cannot write cache file" in str(err.value)


def test_whether_the_writer_still_runs() -> None:
    gone = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert CacheRecord(1, 1, "a", "m", pid=0).writer_gone()  # unknown: takeover allowed
    assert CacheRecord(1, 1, "a", "m", pid=int(gone.stdout)).writer_gone()
    assert not CacheRecord(1, 1, "a", "m", pid=os.getpid()).writer_gone()
    assert not CacheRecord(1, 1, "a", "m", pid=1).writer_gone()  # init runs (maybe not ours)


def test_a_holding_is_left_by_a_gone_writer_only_under_its_token() -> None:
    gone = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        capture_output=True,
        text=True,
        check=True,
    )
    record = CacheRecord(1, 1, "a", "m", token="t", pid=int(gone.stdout))
    assert record.left_by_gone_writer("t")  # our previous process: may be taken over
    assert record.left_by_gone_writer("t", "?")  # a holder's pid that is no pid: the record's
    assert not record.left_by_gone_writer("other")  # another process's holding
    assert not record.left_by_gone_writer("t", os.getpid())  # the holder says: a live pid
    assert not CacheRecord(1, 1, "a", "m", pid=int(gone.stdout)).left_by_gone_writer("")


def test_read_all_skips_corrupt_files(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    CacheFile(tmp_path / "b.json").write(RECORD)
    CacheFile(tmp_path / "a.json").write(CacheRecord(1, 2, "x", "local"))
    (tmp_path / "c.json").write_text("{not json")
    (tmp_path / "worker-0001.lock").write_text("")
    with caplog.at_level(logging.WARNING, logger="leafpool.snowflake.registry.cache"):
        records = read_all(tmp_path, "reader:n:0")
    assert [(p.name, r) for p, r in records] == [
        ("a.json", CacheRecord(1, 2, "x", "local")),
        ("b.json", RECORD),
    ]
    assert any(m.startswith("reader:n:0: skipped:") and "c.json" in m for m in caplog.messages)


def test_a_registry_ignores_a_cache_file_another_identity_wrote(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    settings = load_settings(
        snowflake_mode="local",
        snowflake_local_map="4",
        snowflake_cache_dir=str(tmp_path),
        snowflake_name="t",
    )
    clock = FakeMsClock(T0)
    reg = open_registry(settings, "host-a:w:0", clock=clock, background=False)
    reg.cache.write(
        CacheRecord(worker_id=4, last_timestamp=T0 + 60_000, identity="host-b:w:0", mode="local")
    )
    with caplog.at_level(logging.WARNING, logger="leafpool.snowflake.registry"):
        assert reg.read_cache() is None
    assert "belongs to 'host-b:w:0'; ignored" in caplog.text
    # not its own record, but another process's record for worker 4: still counted
    with pytest.raises(ClockMovedBackwards) as err:
        reg.claim()
    assert err.value.offset_ms == 60_000
