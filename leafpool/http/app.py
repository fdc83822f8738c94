"""The ASGI app: the routes of every module, the service they share, its lifespan, and
how ``leafpool serve`` runs it (in this process, or in uvicorn worker processes each
building the app with :func:`app_from_env`)."""

from __future__ import annotations

import logging
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from starlette.applications import Starlette
from starlette.types import Receive, Scope, Send

from leafpool.core.config import Settings, get_settings
from leafpool.core.errors import BackendUnavailable
from leafpool.http import decode, ids, openapi, ops, pages, probes
from leafpool.http.fast import FastIds
from leafpool.http.service import Service

log = logging.getLogger(__name__)

#: the ASGI server ``leafpool serve`` runs (chosen by bench/http_bench.py's comparison)
DEFAULT_SERVER = "uvicorn"


class ServiceApp(Starlette):
    """Starlette, with the lean path of the bare single-ID request in front of it
    (:mod:`leafpool.http.fast`; ``lean = None`` turns it off: every request routed)."""

    lean: FastIds | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        lean = self.lean
        if lean is not None:
            matched = lean.match(scope)
            if matched is not None:
                await lean.answer(*matched, scope, receive, send)
                return
        await super().__call__(scope, receive, send)


def create_app(settings: Settings | None = None) -> ServiceApp:
    """The ASGI app. The settings were validated when they were loaded (a malformed
    ``LEAFPOOL_HTTP_TOKENS`` stops the program before anything is served)."""
    service = Service(settings or get_settings())

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        try:
            try:  # a replica requirement the master cannot meet stops the start here
                await service.client.start()
            except BackendUnavailable as exc:  # Redis down: checked at the first pop
                log.warning("http: replicas not checked at start: %s", exc)
            yield
        finally:
            await service.aclose()

    endpoints = ids.IdEndpoints(service)
    routes = [*ids.routes(endpoints), *decode.routes(), *ops.routes(), *probes.routes(),
              *pages.routes(), *openapi.routes()]
    app = ServiceApp(routes=routes, lifespan=lifespan)
    app.lean = FastIds(endpoints)
    app.state.service = service
    return app


def app_from_env() -> ServiceApp:
    """Factory for several worker processes:
    ``uvicorn --factory leafpool.http:app_from_env --workers 4``."""
    return create_app(get_settings())


def serve(settings: Settings | None = None, workers: int = 1) -> None:
    """Run the HTTP service until interrupted, on ``settings``' host and port: in this
    process (``workers=1``), or in ``workers`` uvicorn worker processes (uvicorn's
    ``--workers``), each building its app with :func:`app_from_env`; they read their
    settings from the environment, where this writes the host and port first."""
    import uvicorn

    settings = settings or get_settings()
    log.info("leafpool HTTP on http://%s:%d, %d worker process(es) "
             "(/cache, /metrics, /health, /healthz, /readyz)",
             settings.http_host, settings.http_port, workers)
    if workers == 1:
        uvicorn.run(create_app(settings), host=settings.http_host, port=settings.http_port,
                    access_log=False, server_header=False, log_level="info")
        return
    os.environ["LEAFPOOL_HTTP_HOST"] = settings.http_host
    os.environ["LEAFPOOL_HTTP_PORT"] = str(settings.http_port)
    uvicorn.run("leafpool.http:app_from_env", factory=True, workers=workers,
                host=settings.http_host, port=settings.http_port,
                access_log=False, server_header=False, log_level="info")
