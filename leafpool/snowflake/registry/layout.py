"""The DC layout a registry serves (docs/design.md §12.1): each DC leases worker IDs from
its own range (:class:`~leafpool.core.snowflake_layout.DcRange`), and each registry (a
ZooKeeper tree, a MySQL database, a host's cache directory) records which DC of how many
it serves. The first worker writes the record; every start compares it with its settings
and refuses on a mismatch, naming the setting, the recorded and the configured values.

A registry without a record that already holds worker IDs (a deployment from before the
record, or Leaf's own tree) served DC 0 of 1: it is recorded so when a worker of that
layout starts there, and refused to any other layout (its IDs may lie in any DC's range).
"""

from __future__ import annotations

from typing import Any

from leafpool.core.config import Settings
from leafpool.core.errors import ConfigurationError, WorkerIdUnavailable
from leafpool.core.snowflake_layout import DcRange, dc_range

DC_ID_ENV = "LEAFPOOL_DC_ID"
DC_COUNT_ENV = "LEAFPOOL_DC_COUNT"

#: what a registry without a record and with worker IDs of before served
UNRECORDED = (0, 1)


def settings_range(settings: Settings) -> DcRange:
    """The range of this process's DC (validated with the settings)."""
    return dc_range(settings.dc_id, settings.dc_count)


def record_data(dc: DcRange) -> dict[str, int]:
    """What a record holds: the DC and the count (and the range, for a reader's eyes)."""
    return {"dc_id": dc.dc_id, "dc_count": dc.dc_count, "first": dc.first, "last": dc.last}


def changing_data(before: DcRange, after: DcRange) -> dict[str, Any]:
    """The record while ``leafpool snowflake layout --set`` checks the registry: no
    ``dc_id``/``dc_count``, so every worker of any release that reads the record refuses
    to claim until the command writes the new layout (or puts the old one back)."""
    return {"changing": {"from": record_data(before), "to": record_data(after)}}


def parse_record(data: Any, where: str) -> tuple[int, int]:
    """``(dc_id, dc_count)`` of a record; one that is not a layout refuses the start."""
    if isinstance(data, dict) and isinstance(data.get("changing"), dict):
        raise ConfigurationError(
            DC_ID_ENV, "?",
            f"{where} says that the DC layout of this registry is being changed "
            f"({data['changing']!r}) by leafpool snowflake layout --set: no worker claims "
            "meanwhile; retry in a moment (if the command stopped half-way, run it again: "
            "it finishes or puts the previous layout back)")
    try:
        dc_id, dc_count = data["dc_id"], data["dc_count"]
        if isinstance(dc_id, int) and isinstance(dc_count, int):
            dc_range(dc_id, dc_count)
            return dc_id, dc_count
    except Exception:  # any malformed record is reported the same way
        pass
    raise ConfigurationError(
        DC_ID_ENV, "?",
        f"{where} should record the DC layout this registry serves ({{'dc_id': k, "
        f"'dc_count': n}}) but holds {data!r}; repair or remove it (a registry serves one "
        "DC's range for the deployment's life)")


def mismatch(dc: DcRange, recorded: tuple[int, int], where: str, note: str = ""
             ) -> ConfigurationError:
    """The refusal of a start whose settings disagree with the registry's record."""
    rec_id, rec_count = recorded
    if rec_count != dc.dc_count:
        field, value, theirs = DC_COUNT_ENV, dc.dc_count, rec_count
    else:
        field, value, theirs = DC_ID_ENV, dc.dc_id, rec_id
    got = dc_range(rec_id, rec_count)
    return ConfigurationError(
        field, value,
        f"{where} records that this registry serves {got.describe()}{note}, so {field} "
        f"must be {theirs} here; this process is configured as {dc.describe()} "
        f"({DC_ID_ENV}={dc.dc_id}, {DC_COUNT_ENV}={dc.dc_count}). A registry serves one "
        "DC's range for the deployment's life: give this DC's workers its values, or "
        "point them at their own DC's registry; refusing to start")


def check(dc: DcRange, recorded: tuple[int, int] | None, where: str,
          history: str | None) -> bool:
    """Compare the registry's record with this process's layout; raise on a mismatch.
    ``history``: what the registry holds from before the record (None: nothing). True
    when there is no record and this process should write one."""
    if recorded is None:
        if history is not None and (dc.dc_id, dc.dc_count) != UNRECORDED:
            raise mismatch(dc, UNRECORDED, f"{where} is absent and",
                           f" (it holds {history} from before the record)")
        return True
    if recorded != (dc.dc_id, dc.dc_count):
        raise mismatch(dc, recorded, where)
    return False


def exhausted(identity: str, dc: DcRange, what: str) -> WorkerIdUnavailable:
    """No worker ID of the DC's range can be taken."""
    return WorkerIdUnavailable(
        f"{identity}: {dc.describe()}: all {dc.size} worker IDs of its range are {what}; "
        f"none is free to claim ({DC_COUNT_ENV}={dc.dc_count} gives each DC {dc.size})")


def outside(identity: str, dc: DcRange, worker_id: int, where: str) -> WorkerIdUnavailable:
    """A worker ID found (a cache file, a row, a node) outside the DC's range."""
    return WorkerIdUnavailable(
        f"{identity}: worker {worker_id} from {where} lies outside {dc.describe()} "
        f"({DC_ID_ENV}={dc.dc_id}, {DC_COUNT_ENV}={dc.dc_count}); refusing to use it: "
        "it may be another DC's")
