"""``leafpool snowflake layout``: the DC layout a worker-ID registry records and the worker
IDs it holds; ``--set`` records the configured ``LEAFPOOL_DC_ID``/``LEAFPOOL_DC_COUNT``
(a site that grows to more DCs; docs/design.md §12.1, docs/how-to/multiple-dcs.md).
Runs under the admin's login: MySQL's admin grants, the workers' ZooKeeper login."""

from __future__ import annotations

import json
import sys
from typing import TYPE_CHECKING, Annotated

import typer

from leafpool.cli_common import out, reports_errors
from leafpool.core.config import get_settings
from leafpool.core.snowflake_layout import dc_of, dc_range
from leafpool.status import plain_table

if TYPE_CHECKING:
    from leafpool.snowflake.registry.layout_report import Report

snowflake_app = typer.Typer(no_args_is_help=True, help="Snowflake worker-ID registries.")

COLUMNS = ("worker", "dc recorded", "dc configured", "identity", "state", "where", "blocks --set")


def _dc(worker_id: int, count: int | None) -> str:
    return "-" if count is None else f"{dc_of(worker_id, count)} of {count}"


def _lines(report: Report, set_asked: bool) -> str:
    cfg = report.configured
    if report.recorded is not None:
        recorded = dc_range(*report.recorded).describe()
    elif report.serves is not None:
        recorded = (f"none: it holds worker IDs from before the record, so it serves "
                    f"{dc_range(*report.serves).describe()}")
    else:
        recorded = "none (no worker ID held): the first worker records its layout"
    lines = [f"registry    {report.where} (mode {report.mode})",
             f"recorded    {recorded}",
             f"configured  {cfg.describe()} (LEAFPOOL_DC_ID={cfg.dc_id}, "
             f"LEAFPOOL_DC_COUNT={cfg.dc_count})"]
    if set_asked:
        lines.append("set         " + ("recorded the configured layout" if report.written
                                       else "nothing to do: it records the configured layout"))
    lines += [f"note        {note}" for note in report.notes]
    outside = report.outside()
    rows = [[str(h.worker_id) + (f" (then {h.then})" if h.then not in (None, h.worker_id)
                                 else ""),
             _dc(h.worker_id, report.serves[1] if report.serves else None),
             _dc(h.worker_id if h.then is None else h.then, cfg.dc_count), h.identity,
             h.state, h.where, "yes" if h in outside else ""] for h in report.held]
    lines.append("")
    table = plain_table(rows, COLUMNS) if rows else "no worker ID held\n"
    return "\n".join(lines) + "\n" + table


@snowflake_app.command("layout")
@reports_errors
def snowflake_layout(
    set_layout_: Annotated[bool, typer.Option(
        "--set", help="Record the configured LEAFPOOL_DC_ID/LEAFPOOL_DC_COUNT; refused, "
                      "naming them, while worker IDs held (or possibly still in use) lie "
                      "outside its range")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="JSON output")] = False,
) -> None:
    """Show the DC layout the snowflake registry records, and every worker ID it holds or
    leases with its DC under the recorded and the configured layout; --set records the
    configured layout (a site that grows to more DCs)."""
    # imported here: the registries' clients (SQLAlchemy, kazoo) cost every other
    # command a third of a second at start
    from leafpool.snowflake.registry.layout_admin import inspect, set_layout

    settings = get_settings()
    report = set_layout(settings) if set_layout_ else inspect(settings)
    if as_json:
        out.print_json(json.dumps(report.as_dict()))
        return
    sys.stdout.write(_lines(report, set_layout_))
    sys.stdout.flush()
