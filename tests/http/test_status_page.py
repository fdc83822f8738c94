"""The /cache status page loaded once in a real headless Chromium (Debian's package)
from uvicorn serving the app on loopback: the tags and their figures render in the DOM."""

from __future__ import annotations

import shutil
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from html.parser import HTMLParser
from pathlib import Path

import pytest
import redis
import uvicorn

from leafpool.core.config import Settings
from leafpool.http import create_app
from leafpool.redis.pool import Pool
from tests.support.processes import own_home
from tests.support.services import free_port, missing, port_open, wait_until

CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu",
                  "--disable-background-networking", "--disable-component-update",
                  "--disable-sync", "--no-first-run"]


class Rows(HTMLParser):
    """Text of every ``<td class=...>`` per ``<tr data-tag=...>``, and the meta tags."""

    def __init__(self) -> None:
        super().__init__()
        self.rows: dict[str, dict[str, str]] = {}
        self.modes: dict[str, str] = {}
        self.metas: list[dict[str, str]] = []
        self._tag: str | None = None
        self._cell: str | None = None

    def handle_starttag(self, name: str, attrs: list[tuple[str, str | None]]) -> None:
        a = {k: v or "" for k, v in attrs}
        if name == "meta":
            self.metas.append(a)
        if name == "tr" and "data-tag" in a:
            self._tag = a["data-tag"]
            self.rows[self._tag] = {}
            self.modes[self._tag] = a.get("data-mode", "")
        elif name == "br" and self._tag is not None and self._cell is not None:
            self.rows[self._tag][self._cell] += " "
        elif name == "td" and self._tag is not None:
            self._cell = a.get("class", "").split()[0]
            self.rows[self._tag][self._cell] = ""

    def handle_endtag(self, name: str) -> None:
        if name == "td":
            self._cell = None
        elif name == "tr":
            self._tag = None

    def handle_data(self, data: str) -> None:
        if self._tag is not None and self._cell is not None:
            self.rows[self._tag][self._cell] += data


@pytest.fixture
def chromium() -> str:
    binary = shutil.which("chromium") or shutil.which("chromium-browser")
    if binary is None:
        missing("chromium (Debian packages chromium and chromium-driver)")
    assert binary
    return binary


@pytest.fixture
def served(make_settings: Callable[..., Settings]) -> Iterator[str]:
    """uvicorn serving the app on a free loopback port, in a thread of this process."""
    port = free_port()
    config = uvicorn.Config(create_app(make_settings()), host="127.0.0.1", port=port,
                            log_level="warning", access_log=False)
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    # bounded polling: uvicorn has no readiness callback; the port opens when it serves
    wait_until(lambda: port_open(port), 15, "uvicorn")
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=15)


def test_cache_page_renders_tags_and_figures_in_chromium(
    chromium: str, served: str, r: redis.Redis, tmp_path: Path
) -> None:
    now_ms = int(time.time() * 1000)
    pool = Pool(r, "leafpool")
    pool.register("order", "segment", 0, target=4000, low_water=2000, step=2000,
                  max_id=12001, rate=37.5, empty_hits=4, last_refill_ms=now_ms - 3 * 3_600_000,
                  last_refill_result="ok +1000", last_error="database: <timeout>",
                  last_error_ms=now_ms - 60_000)
    r.rpush("leafpool:{order}:ids", *range(5001, 8001))
    r.rpush("leafpool:{order}:reserve", "8001:10001", "10001:12001")
    pool.register("sf", "snowflake", 0, target=2000, worker_ids="5,9", lease_state="held",
                  last_backwards_ms=now_ms - 5000, last_backwards_offset_ms=3,
                  backwards_events=1)
    r.rpush("leafpool:{sf}:ids", *range(100, 150))

    profile = tmp_path / "chromium-profile"
    done = subprocess.run(  # its crash reports and caches in tmp_path, not in $HOME
        [chromium, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", "--dump-dom",
         f"{served}/cache"], env=own_home(tmp_path / "home", temp=False),
        capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    dom = Rows()
    dom.feed(done.stdout)

    assert {"http-equiv": "refresh", "content": "5"} in dom.metas
    assert dom.modes == {"order": "segment", "sf": "snowflake"}
    order = {k: " ".join(v.split()) for k, v in dom.rows["order"].items()}
    assert order["tag"] == "order"
    assert order["ready"] == "3,000 / 4,000"
    assert order["low-water"] == "2,000"
    assert order["reserve"] == "8001:10001 10001:12001 4,000 IDs"
    assert order["step"] == "2,000"
    assert order["max-id"] == "12,001"
    assert order["rate"] == "37.5"
    assert order["left"] == "3m"  # (3,000 + 4,000) / 37.5 per s = 187 s
    # hours: the age shown stays the same however long Chromium takes (within its timeout)
    assert order["last-refill"].startswith("3.0h ago")
    assert "ok +1000" in order["last-refill"]
    assert order["err"].startswith("database: <timeout>")  # escaped, so shown as text
    assert order["empty-hits"] == "4"
    sf = {k: " ".join(v.split()) for k, v in dom.rows["sf"].items()}
    assert sf["ready"] == "50 / 2,000"
    assert sf["workers"] == "5, 9"
    assert sf["lease"] == "held"
    assert sf["backwards"].startswith("3 ms back")
    assert sf["backwards"].endswith("1 events")
