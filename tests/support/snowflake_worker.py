"""One generator process for the multi-process snowflake tests (spawned): claims a worker
ID from the real registry, generates IDs in batches, writes them to a file."""

from __future__ import annotations

from array import array
from multiprocessing.synchronize import Barrier
from pathlib import Path

from leafpool.core.config import load_settings
from leafpool.snowflake.registry import LeasedGenerator, open_registry


def run(overrides: dict[str, object], identity: str, count: int, batch: int, out: str,
        barrier: Barrier) -> None:
    settings = load_settings(**overrides)
    barrier.wait(60)  # all processes claim at the same moment
    gen = LeasedGenerator(open_registry(settings, identity), settings)
    lease = gen.start()
    ids = array("q")
    while len(ids) < count:
        ids.extend(gen.next_batch(min(batch, count - len(ids))))
    gen.close()
    with open(out, "wb") as fh:
        array("q", [lease.worker_id]).tofile(fh)
        ids.tofile(fh)
    Path(out + ".done").touch()
