"""What ``leafpool snowflake layout`` reports of a registry (:class:`Report`: the record,
each worker ID held, :class:`Held`) and the refusals of ``--set`` (docs/design.md §12.1);
:mod:`~leafpool.snowflake.registry.layout_admin` reads the registries."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from leafpool.core.errors import ConfigurationError
from leafpool.core.snowflake_layout import DcRange, dc_range
from leafpool.snowflake.registry import layout

#: who wrote the record (mysql's ``written_by``)
SET_BY = "leafpool snowflake layout --set"
#: the refusal names this many worker IDs (the command without --set lists them all)
NAMED = 10


@dataclass(frozen=True)
class Held:
    """A worker ID the registry holds: ``worker_id`` under the recorded layout (what its
    process uses now), ``then`` under the configured one where they differ (mode ``zk``:
    the DC's first ID + the forever node's sequence); ``in_use``: held, or may still be."""

    worker_id: int
    where: str
    identity: str
    state: str
    in_use: bool
    then: int | None = None


@dataclass
class Report:
    """A registry's record and holders, beside the configured layout."""

    mode: str
    where: str
    recorded: tuple[int, int] | None
    serves: tuple[int, int] | None  # the record, or DC 0 of 1 for IDs from before it
    configured: DcRange
    held: list[Held]
    written: bool = False
    #: what the operator should know beside the holders (mode zk: the sequence reached)
    notes: list[str] = field(default_factory=list)

    def outside(self) -> list[Held]:
        """What keeps ``--set`` from recording the configured layout."""
        cfg = self.configured
        return [h for h in self.held if h.in_use and (
            h.worker_id not in cfg or (h.then is not None and h.then not in cfg))]

    def as_dict(self) -> dict[str, Any]:
        def dc(pair: tuple[int, int] | None) -> dict[str, int] | None:
            return None if pair is None else layout.record_data(dc_range(*pair))

        return {"mode": self.mode, "where": self.where, "recorded": dc(self.recorded),
                "serves": dc(self.serves), "configured": layout.record_data(self.configured),
                "written": self.written, "notes": self.notes,
                "held": [{**h.__dict__, "blocks_set": h in self.outside()} for h in self.held]}


def within(before: DcRange, after: DcRange, where: str) -> None:
    """``after`` must lie within ``before``: the rest of ``before`` may be leased by the
    registry of another DC under the new layout, which this registry cannot see."""
    if before.first <= after.first and after.last <= before.last:
        return
    field, value = _field(before, after)
    raise ConfigurationError(
        field, value,
        f"{where} records {before.describe()}; --set records only a layout whose range "
        f"lies within the recorded one (a registry that grows to more DCs keeps a part of "
        f"its range), and {after.describe()} does not: its IDs outside "
        f"{before.first}..{before.last} may be leased by another DC's registry")


def _field(before: DcRange, after: DcRange) -> tuple[str, int]:
    if before.dc_count != after.dc_count:
        return layout.DC_COUNT_ENV, after.dc_count
    return layout.DC_ID_ENV, after.dc_id


def refused(report: Report, before: DcRange) -> ConfigurationError:
    cfg = report.configured
    outside = report.outside()
    names = "; ".join(
        f"worker {h.worker_id}" + (f" (worker {h.then} once restarted)" if h.then not in
                                   (None, h.worker_id) else "")
        + f" of {h.identity} ({h.where}: {h.state})" for h in outside[:NAMED])
    if len(outside) > NAMED:
        names += f"; and {len(outside) - NAMED} more (leafpool snowflake layout lists them)"
    field, value = _field(before, cfg)
    return ConfigurationError(
        field, value,
        f"{report.where} is left as it was, serving {before.describe()}: worker IDs held, "
        f"or possibly still in use, lie outside {cfg.describe()}: {names}. Stop those "
        "workers (a lease is free once released or expired; in mode zk a forever node is "
        "its identity's worker ID for ever: delete it only once that identity is retired) "
        "and run it again")


def pair(data: Any, where: str) -> tuple[tuple[int, int], bool]:
    """A record's layout, and whether it is a change left half-way (its ``from``)."""
    if isinstance(data, dict) and isinstance(data.get("changing"), dict):
        return layout.parse_record(data["changing"].get("from"), where), True
    return layout.parse_record(data, where), False
