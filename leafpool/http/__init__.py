"""The HTTP service (``leafpool serve``): an ASGI app for clients that cannot reach Redis,
plus the operator's pages. One concern per module:

- :mod:`~leafpool.http.app`: the app, its routes and lifespan, ``serve`` and the
  ``app_from_env`` factory (``uvicorn --factory leafpool.http:app_from_env``);
- :mod:`~leafpool.http.service`: what the handlers share (settings, the asyncio client
  and its pool, the runtime's store, metrics);
- :mod:`~leafpool.http.auth`: token auth (``LEAFPOOL_HTTP_TOKENS``);
- :mod:`~leafpool.http.errors`: errors as status codes, and the log throttle;
- :mod:`~leafpool.http.ids`: the Leaf-compatible ID endpoints, and the mode cache;
- :mod:`~leafpool.http.fast`: the lean path of the bare single-ID request, in front of
  the router (the same bytes as the route);
- :mod:`~leafpool.http.decode`: snowflake ID decoding (Leaf's shape and clean JSON);
- :mod:`~leafpool.http.ops`: ``/health``, ``/metrics``, ``/api/status``;
- :mod:`~leafpool.http.probes`: ``/healthz`` (liveness) and ``/readyz`` (readiness);
- :mod:`~leafpool.http.pages`: ``/cache`` and ``/db`` as HTML.

Every Redis command goes through :class:`~leafpool.redis.pool_async.AsyncPool` (the asyncio
client's) or the runtime's :class:`~leafpool.redis.pool.Pool` (the metrics); every SQL
statement through :class:`~leafpool.segment.store.SegmentStore`.

Owns: the HTTP surface (a room of the surfaces, beside the modules at leafpool's top).

May import: :mod:`leafpool.core`, :mod:`leafpool.redis`, :mod:`leafpool.segment`, the
surfaces :mod:`leafpool.client`, :mod:`leafpool.runtime`, :mod:`leafpool.status` and
:mod:`leafpool.metrics`.
"""

from leafpool.http.app import app_from_env, create_app, serve
from leafpool.http.errors import HttpError, as_http_error

__all__ = ["HttpError", "app_from_env", "as_http_error", "create_app", "serve"]
