"""A client process of the nemesis run: ``python -m tests.support.nemesis_client OUT
TAG:MODE... [--seed N] [--pace S] [--http BASE]``.

It takes IDs all the time until SIGTERM, one thread per tag (a tag that runs dry blocks
its own thread only: the other tags are still asked, so a pause measured on a tag is the
tag's), each mixing ``next_id`` and ``next_ids(n)`` (n from 2 to 20, seeded), through
leafpool's :class:`Client` (one, shared by the threads)
(settings from the environment: Sentinel, ``LEAFPOOL_EMPTY_POLICY``,
``LEAFPOOL_POP_REPLICAS``...) or, with ``--http``, through the HTTP service's
``/api/<mode>/ids/<tag>?count=n``. Every call is one line of OUT
(:func:`tests.support.nemesis_history.call_record`): its start and end, the IDs the
caller got (a ``PoolEmpty``'s partial IDs included: the caller holds them) or the error's
class. Lines are flushed every 0.2 s and at SIGTERM, which ends the loop after the call
in flight. The nemesis never kills a client: a client's history is complete.

``--pace`` is a pause between calls (seeded jitter around it): it shapes the load so that
the client processes do not starve the processes under test of the machine's cores.
"""

from __future__ import annotations

import argparse
import json
import random
import signal
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

from tests.support.nemesis_history import LineWriter, call_record
from tests.support.stop_signals import stop_event

MAX_N = 20
HTTP_TIMEOUT_S = 10.0

#: (IDs got, the error's class or None, its message)
Take = Callable[[str, str, int], tuple[list[int], str | None, str | None]]


def _client_take() -> tuple[Take, Callable[[], None]]:
    """Calls through leafpool's Client, built once Redis answers (a client started
    during a failover waits for it)."""
    from leafpool.client import Client
    from leafpool.core.errors import LeafpoolError, PoolEmpty

    while True:
        try:
            leaf = Client()
            break
        except LeafpoolError:
            time.sleep(0.2)

    def take(tag: str, mode: str, n: int) -> tuple[list[int], str | None, str | None]:
        try:
            if n == 1:
                return [leaf.next_id(tag)], None, None
            return leaf.next_ids(tag, n), None, None
        except PoolEmpty as exc:
            return list(exc.partial), type(exc).__name__, str(exc)
        except LeafpoolError as exc:
            return [], type(exc).__name__, str(exc)
        except Exception as exc:  # not leafpool's: a finding, recorded as such
            return [], f"unexpected:{type(exc).__name__}", str(exc)

    return take, leaf.close


def _http_take(base: str) -> tuple[Take, Callable[[], None]]:
    """Calls to the HTTP service; an error is ``http-<status>-<kind>`` (the JSON body's
    ``error``), or the class of a connection failure."""

    def take(tag: str, mode: str, n: int) -> tuple[list[int], str | None, str | None]:
        url = f"{base}/api/{mode}/ids/{tag}?count={n}"
        try:
            with urllib.request.urlopen(url, timeout=HTTP_TIMEOUT_S) as resp:
                body = json.loads(resp.read())
            return [int(i) for i in body["ids"]], None, None
        except urllib.error.HTTPError as exc:
            try:
                body = json.loads(exc.read())
            except ValueError:
                body = {}
            return [], f"http-{exc.code}-{body.get('error', '?')}", body.get("message")
        except urllib.error.URLError as exc:
            return [], f"http-{type(exc.reason).__name__}", str(exc.reason)
        except OSError as exc:  # a reset, a timeout
            return [], f"http-{type(exc).__name__}", str(exc)

    return take, lambda: None


def run(out: Path, tags: list[tuple[str, str]], seed: int, pace_s: float,
        http: str | None, stop: threading.Event) -> None:
    take, close = _http_take(http) if http else _client_take()
    history = LineWriter(out)

    def loop(tag: str, mode: str, rng: random.Random) -> None:
        while not stop.is_set():
            n = 1 if rng.random() < 0.4 else rng.randint(2, MAX_N)
            op = "http" if http else "id" if n == 1 else "ids"
            start = time.time()
            ids, err, msg = take(tag, mode, n)
            history.write(call_record(start, time.time(), tag, op, n, ids, err, msg))
            if pace_s > 0:
                stop.wait(rng.uniform(0.5, 1.5) * pace_s)

    threads = [threading.Thread(target=loop, args=(tag, mode, random.Random(seed * 10 + i)),
                                name=f"take-{tag}", daemon=True)
               for i, (tag, mode) in enumerate(tags)]
    for t in threads:
        t.start()
    print("READY", flush=True)
    try:
        while any(t.is_alive() for t in threads):
            for t in threads:
                t.join(timeout=0.5)
    finally:
        history.close()
        close()


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m tests.support.nemesis_client")
    parser.add_argument("out", type=Path)
    parser.add_argument("tags", nargs="+", help="TAG:MODE (segment or snowflake)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--pace", type=float, default=0.03)
    parser.add_argument("--http", default=None, help="the HTTP service's base URL")
    args = parser.parse_args()
    tags = [tuple(t.split(":", 1)) for t in args.tags]
    stop = stop_event(signal.SIGTERM, signal.SIGINT)
    run(args.out, [(t, m) for t, m in tags], args.seed, args.pace, args.http, stop)


if __name__ == "__main__":
    main()
