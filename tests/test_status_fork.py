"""Many tags' statuses read and rendered in forked children (leafpool.cli_status.rendered): what
the children send back is what this process renders itself, chunk for chunk and in order;
a chunk whose child failed is read again here, so a real error is raised here with its own
type; closing early ends the children; and ``leafpool status`` of more tags than the fork
threshold prints what the statuses read in one process print, in every format."""

from __future__ import annotations

import contextlib
import json
import multiprocessing
import os
import re
import signal
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import cast

import pytest
import redis

import leafpool.cli_status as status_fork
from leafpool.cli_common import tsv
from leafpool.cli_status import (
    TSV_FIELDS,
    TablePart,
    _table_part,
    _tsv_part,
    json_body,
    rendered,
    says_something,
)
from leafpool.redis.pool import Pool
from leafpool.status import TagStatus, footnotes, notices, plain_table, pool_status, status_row
from leafpool.status_json import status_json
from tests.test_status_same_output import NOW_MS, fill

PARENT = os.getpid()


@pytest.fixture
def small_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    """Chunks of 25 tags, forked from 1 tag on: the 200 tags filled are 8 chunks."""
    monkeypatch.setattr(status_fork, "CHUNK", 25)
    monkeypatch.setattr(status_fork, "FORK_MIN_TAGS", 1)


def _with_pid(render: Callable[[list[TagStatus]], object]
              ) -> Callable[[list[TagStatus]], tuple[int, object]]:
    return lambda rows: (os.getpid(), render(rows))


def _unclocked(parts: object) -> str:
    """The parts' text, each "how long ago" (read from this host's clock as each cell is
    written) left out."""
    return re.sub(r"\d+(\.\d+)?[smhd] ago", "ago", repr(parts))


@pytest.mark.usefixtures("small_chunks")
@pytest.mark.parametrize("render", [json_body, _table_part, _tsv_part])
def test_the_children_render_what_this_process_renders(
    pool: Pool, r: redis.Redis, render: Callable[[list[TagStatus]], object]
) -> None:
    fill(pool, r, 200)
    names = pool.tags()
    here = list(rendered(pool, names, NOW_MS, _with_pid(render), workers=1))
    forked = list(rendered(pool, names, NOW_MS, _with_pid(render), workers=2))
    assert len(forked) == len(here) == 8
    assert {pid for pid, _ in here} == {PARENT}
    assert PARENT not in {pid for pid, _ in forked}  # every chunk from a child
    assert _unclocked([part for _, part in forked]) == _unclocked([part for _, part in here])
    # and the pieces together are the statuses of all the tags at once
    whole = pool_status(pool, names, NOW_MS)
    if render is json_body:
        bodies = [cast(str, p) for _, p in forked]
        assert "[\n" + ",\n".join(bodies) + "\n]\n" == status_json(whole)
    else:
        cells = [row for _, part in forked for row in cast(TablePart, part).cells]
        if render is _table_part:
            assert _unclocked(plain_table(cast(list[list[str]], cells))) == _unclocked(
                plain_table([status_row(s) for s in whole]))
        else:
            assert tsv(TSV_FIELDS, cells) == tsv(
                TSV_FIELDS, [[getattr(s, f) for f in TSV_FIELDS] for s in whole])


@pytest.mark.usefixtures("small_chunks")
def test_a_chunk_failed_in_its_child_is_read_again_here(pool: Pool, r: redis.Redis) -> None:
    fill(pool, r, 200)
    names = pool.tags()

    def render(rows: Sequence[TagStatus]) -> tuple[int, str]:
        if os.getpid() != PARENT and rows[0].tag == names[100]:
            raise RuntimeError("a child's failure")
        return os.getpid(), json_body(rows)

    parts = list(rendered(pool, names, NOW_MS, render, workers=2))
    assert [pid == PARENT for pid, _ in parts] == [i == 4 for i in range(8)]
    assert [p for _, p in parts] == list(map(json_body, (
        pool_status(pool, names[lo:lo + 25], NOW_MS) for lo in range(0, 200, 25))))


@pytest.mark.usefixtures("small_chunks")
def test_an_error_of_every_process_is_raised_here_as_itself(
    pool: Pool, r: redis.Redis, redis_url: str
) -> None:
    """Redis refusing the status's commands (a user without them): the error the parent's
    own read raises, type and text, not a child's pickled one."""
    fill(pool, r, 120)
    names = pool.tags()
    r.acl_setuser("nostatus", enabled=True, passwords=["+pw"], keys=["*"],
                  commands=["+ping", "+hello", "+client"])
    try:
        denied = Pool(redis.Redis.from_url(redis_url, username="nostatus", password="pw"),
                      "leafpool")
        with pytest.raises(Exception) as here:
            list(rendered(denied, names, NOW_MS, json_body, workers=1))
        with pytest.raises(Exception) as forked:
            list(rendered(denied, names, NOW_MS, json_body, workers=2))
        assert type(forked.value) is type(here.value)
        assert str(forked.value) == str(here.value)
        assert "llen" in str(here.value).lower() or "permission" in str(here.value).lower()
    finally:
        r.acl_deluser("nostatus")


@pytest.mark.usefixtures("small_chunks")
def test_closing_early_ends_the_children(pool: Pool, r: redis.Redis) -> None:
    fill(pool, r, 200)
    parts = rendered(pool, pool.tags(), NOW_MS, json_body, workers=2)
    assert next(parts).startswith('{"tag": "t000"')
    assert multiprocessing.active_children()
    parts.close()
    assert not multiprocessing.active_children()


@pytest.mark.slow
def test_leafpool_status_of_more_tags_than_the_threshold(
    pool: Pool, redis_url: str, tmp_path: Path
) -> None:
    """The command as a real process over FORK_MIN_TAGS + 1 tags (each with a state of
    its own, none depending on the clock): each format is what this process writes of the
    statuses read at once."""
    n = status_fork.FORK_MIN_TAGS + 1
    pool.register_many([(f"t{i:05d}", "segment", 0,
                         {"max_id": i * 7, "step": 1000 + i % 3, "table_step": 1000,
                          "target": 200, "refills": i % 11})
                        for i in range(n)])
    env = {k: v for k, v in os.environ.items() if not k.startswith("LEAFPOOL_")}
    env.update({"LEAFPOOL_REDIS_URL": redis_url,
                "LEAFPOOL_DATABASE_URL": f"sqlite:///{tmp_path / 'db.sqlite3'}",
                "LEAFPOOL_HOME": os.environ["LEAFPOOL_HOME"]})

    def run(*args: str) -> str:
        done = subprocess.run([sys.executable, "-m", "leafpool.cli", "status", *args], env=env,
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        return done.stdout

    whole = pool_status(pool)
    assert len(whole) == n
    as_json = run("--json")
    assert as_json == status_json(whole)
    assert json.loads(as_json)[-1]["max_id"] == (n - 1) * 7
    plain = run("--format", "plain")
    assert plain.startswith(plain_table([status_row(s) for s in whole]))
    assert plain.rstrip().endswith("(Leaf's dynamic step)")  # the grown steps' footnote
    assert run("--format", "tsv") == tsv(TSV_FIELDS,
                                         [[getattr(s, f) for f in TSV_FIELDS] for s in whole])


def test_the_notices_of_the_tags_that_say_something_are_those_of_all(
    pool: Pool, r: redis.Redis
) -> None:
    """What the children send of a chunk for above and below the table: the statuses
    :func:`says_something` keeps."""
    fill(pool, r, 200)
    every = pool_status(pool, now_ms=NOW_MS)
    said = [s for s in every if says_something(s)]
    assert 0 < len(said) < len(every)
    assert notices(said, clock=lambda: NOW_MS / 1000) == notices(every, clock=lambda: NOW_MS / 1000)
    assert footnotes(said) == footnotes(every) != []


_FLAG_HANDLERS = """
import signal, sys, multiprocessing
import leafpool.cli_status as cs
import redis
from leafpool.redis.pool import Pool

stopped = []
for sig in (signal.SIGTERM, signal.SIGINT):  # as leafpool.embedded's runner installs them
    signal.signal(sig, lambda signum, frame: stopped.append(signum))
cs.CHUNK, cs.FORK_MIN_TAGS = 25, 1
pool = Pool(redis.Redis.from_url(sys.argv[1]), "leafpool")
names = pool.tags()
parts = list(cs.rendered(pool, names, 1.7e12, cs.json_body, workers=2))
early = cs.rendered(pool, names, 1.7e12, cs.json_body, workers=2)
next(early)
early.close()
print(len(parts), len(multiprocessing.active_children()), stopped)
"""


def test_the_children_end_whatever_signal_handlers_the_parent_installed(
    pool: Pool, r: redis.Redis, redis_url: str
) -> None:
    """A process with flag-only SIGTERM and SIGINT handlers (leafpool's embedded runner,
    a test's stop event): its children still end on the pool's ``terminate``, at the end
    and when the caller stops reading early (they inherited the handler and the pool
    waited on them forever)."""
    fill(pool, r, 200)
    proc = subprocess.Popen([sys.executable, "-c", _FLAG_HANDLERS, redis_url], text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=120)
    finally:  # the hung children too
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 0, err
    assert out.split() == ["8", "0", "[]"]
