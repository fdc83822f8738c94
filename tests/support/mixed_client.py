"""A client process of one release for the mixed-version test (tests/system/
test_mixed_versions.py): ``python mixed_client.py OUT STOP TAG...``, run with the
release's code first on ``PYTHONPATH``. It pops a few IDs from each tag in turn through
that release's :class:`leafpool.client.Client` (policy ``raise``: an empty pool is a
recorded miss, not a wait that would hide a pause) until the file STOP exists, and writes
one line per event to OUT: ``<monotonic> <tag> <id> <id> ...`` for each pop that got IDs,
``<monotonic> <tag> - <error>`` for each that came short (after a line of the IDs it
got, if any). ``time.monotonic`` is the
machine's CLOCK_MONOTONIC: the test merges the lines of several such processes.

It imports only what every release has (``leafpool.client.Client``,
``leafpool.core.errors``) and nothing of the tests: it runs as a script of either tree.
"""

from __future__ import annotations

import os
import sys
import time

from leafpool.client import Client
from leafpool.core.errors import LeafpoolError, PoolEmpty

PER_POP = 4
PACE_S = 0.01  # about 400 IDs/s per tag per client


def main(out: str, stop: str, tags: list[str]) -> None:
    client = Client(policy="raise")
    with open(out, "w", buffering=1) as f:
        f.write(f"# {os.environ.get('PYTHONPATH', '')}\n")
        while not os.path.exists(stop):
            for tag in tags:
                try:
                    ids = client.next_ids(tag, PER_POP)
                    f.write(f"{time.monotonic():.6f} {tag} {' '.join(map(str, ids))}\n")
                except LeafpoolError as exc:
                    now = time.monotonic()
                    partial = exc.partial if isinstance(exc, PoolEmpty) else []
                    if partial:  # popped before the pool ran dry: handed out, the caller's
                        f.write(f"{now:.6f} {tag} {' '.join(map(str, partial))}\n")
                    f.write(f"{now:.6f} {tag} - {type(exc).__name__}\n")
            time.sleep(PACE_S)
    client.close()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3:])
