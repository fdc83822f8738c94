"""Kubernetes-style probes of the HTTP service: ``/healthz`` (liveness: the process
answers, no backend is touched, so a Redis outage never restarts the pods) and
``/readyz`` (readiness: the settings were loaded and validated, and Redis answers PING
under this service's own credentials). A 503 names what is not ready; no password or
token is ever in it (:func:`~leafpool.core.config.hide_password`, and any password of a
configured URL masked wherever a backend's error repeats it).

``/health`` (:mod:`~leafpool.http.ops`) stays as it was: it also checks the database when
a segment tag exists, which is what compose's healthcheck wants; a readiness probe that
took every pod out of the Service during a database outage would turn a brownout (the
pools still serve) into a full outage, so ``/readyz`` does not.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator
from urllib.parse import urlsplit

from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Route

from leafpool.core.config import Settings, hide_password
from leafpool.core.errors import LeafpoolError
from leafpool.http.errors import NO_STORE, may_log
from leafpool.http.service import service

log = logging.getLogger(__name__)

READY_TIMEOUT_SECONDS = 2.0


def mask(text: str, settings: Settings) -> str:
    """``text`` with every configured URL masked and any of their passwords replaced."""
    for url in (settings.redis_url, settings.broker_url, settings.database_url):
        if not url:
            continue
        text = text.replace(url, hide_password(url))
        try:
            password = urlsplit(url).password
        except ValueError:
            password = None
        if password:
            text = text.replace(password, "***")
    return text


async def healthz(request: Request) -> Response:
    """200 ``alive``: the event loop runs and answers; nothing else is asked."""
    return PlainTextResponse("alive\n", headers=NO_STORE)


async def readyz(request: Request) -> Response:
    """200 naming what was checked, or 503 ``not ready: <what>: <why>``."""
    svc = service(request)
    s = svc.settings
    checks = [f"settings: loaded (redis {s.redis_topology}, snowflake mode {s.snowflake_mode})"]
    problems: list[str] = []
    try:
        await asyncio.wait_for(svc.pool.ping(), READY_TIMEOUT_SECONDS)
        checks.append("redis: PONG")
    except TimeoutError:
        problems.append(f"redis: no answer within {READY_TIMEOUT_SECONDS}s")
    except (LeafpoolError, OSError) as exc:
        problems.append(f"redis: {exc}")
    if problems:
        text = mask("; ".join(problems), s)
        if may_log("readyz"):
            log.warning("http: not ready: %s", text)
        return PlainTextResponse(f"not ready: {text}\n", 503, headers=NO_STORE)
    return PlainTextResponse("ready\n" + "\n".join(checks) + "\n", headers=NO_STORE)


def routes() -> Iterator[Route]:
    yield Route("/healthz", healthz)
    yield Route("/readyz", readyz)
