"""The sweep (every second): which tags need a refill now: below their low-water mark,
never filled, or found empty by a client. A short-lived ``queued`` marker per tag keeps
the sweep from queueing the same refill twice."""

from __future__ import annotations

from leafpool.pool import Pool


def sweep(pool: Pool, queued_seconds: int) -> list[tuple[str, str, bool]]:
    """Tags to refill now, as ``(tag, mode, force)``; each is marked queued."""
    wanted = set(pool.take_wanted())
    out: list[tuple[str, str, bool]] = []
    for snap in pool.snapshots(pool.tags()):
        if not snap.known:
            continue
        low_water = snap.int("low_water", -1)
        below = low_water < 0 or snap.length < low_water
        if snap.state.get("mode", "segment") == "segment":
            below = below or snap.reserve_size < snap.int("reserve_target") // 2
        force = snap.tag in wanted
        if (below or force) and not snap.locked and pool.mark_queued(snap.tag, queued_seconds):
            out.append((snap.tag, snap.state.get("mode", "segment"), force))
    return out
