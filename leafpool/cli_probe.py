"""``leafpool probe``: exec probes for containers (issue 20; README, Deploy).

- ``leafpool probe http [--ready]``: GET ``/healthz`` (or ``/readyz``) of the HTTP service
  on this host, at the address and port ``leafpool serve`` listens on by the same
  settings (``LEAFPOOL_HTTP_HOST``, ``LEAFPOOL_HTTP_PORT``; a wildcard address is probed
  on loopback). The image's HEALTHCHECK runs it.
- ``leafpool probe snowflake``: ready when a snowflake generator process of this host
  holds its worker-ID lease (its readiness file is fresh and its process runs;
  docs/design.md §8.6). No Redis, no pub/sub: a file read.

Exit 0 when healthy or ready, 1 when not (one line says why).
"""

from __future__ import annotations

from typing import Annotated

import typer

from leafpool.cli_common import err, out
from leafpool.core.config import get_settings
from leafpool.core.snowflake_layout import wall_clock_ms

probe_app = typer.Typer(no_args_is_help=True, help="Exec probes (healthchecks) for containers.")

WILDCARDS = {"", "0.0.0.0", "::", "[::]"}


def http_probe_url(host: str, port: int, ready: bool = False) -> str:
    """The URL a probe on this host asks for the service listening on ``host:port``."""
    host = "127.0.0.1" if host in WILDCARDS else host
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"
    return f"http://{host}:{port}/{'readyz' if ready else 'healthz'}"


@probe_app.command("http")
def probe_http(
    ready: Annotated[bool, typer.Option("--ready", help="/readyz instead of /healthz")] = False,
    timeout: Annotated[float, typer.Option(help="seconds to wait for the answer")] = 3.0,
) -> None:
    """The HTTP service on this host answers /healthz (or /readyz) with 200."""
    import urllib.error  # here: urllib.request costs the other commands' start
    import urllib.request

    s = get_settings()
    url = http_probe_url(s.http_host, s.http_port, ready)
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            body = resp.read().decode(errors="replace").strip()
    except urllib.error.HTTPError as exc:
        body = exc.read().decode(errors="replace").strip()
        err.print(f"{url}: {exc.code} {body}", highlight=False, markup=False, soft_wrap=True)
        raise typer.Exit(1) from None
    except OSError as exc:
        err.print(f"{url}: {exc}", highlight=False, markup=False, soft_wrap=True)
        raise typer.Exit(1) from None
    first = body.splitlines()[0] if body else "ok"
    out.print(f"{url}: {first}", highlight=False, markup=False, soft_wrap=True)


@probe_app.command("snowflake")
def probe_snowflake() -> None:
    """A snowflake generator on this host holds its worker-ID lease."""
    # imported here: leafpool.snowflake.registry is not needed by the other commands
    from leafpool.snowflake.registry.ready import probe as probe_ready
    from leafpool.snowflake.registry.ready import ready_dir

    directory = ready_dir(get_settings())
    ready, stale = probe_ready(directory, wall_clock_ms())
    for state in ready:
        out.print(f"ready: {state.identity}: worker {state.worker_id} ({state.mode}, "
                  f"pid {state.pid})", highlight=False, markup=False, soft_wrap=True)
    for why in stale:
        err.print(f"not ready: {why}", highlight=False, markup=False, soft_wrap=True)
    if not ready:
        if not stale:
            err.print(f"not ready: no generator holds a worker ID (nothing in {directory})",
                      highlight=False, markup=False, soft_wrap=True)
        raise typer.Exit(1)
