"""A client gone after its pop, under uvicorn's own protocols (httptools and h11) fed the
request's bytes over a transport that records what is written, against a real Redis:
the lean path reads the request cycle's ``disconnected`` flag
(leafpool/http/disconnect.py) instead of running ``receive()``; the ID popped for a gone
client is never written, is counted as a gap and the request with status 499, and the
next request gets the next ID."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest
import redis
from uvicorn.config import Config
from uvicorn.protocols.http.h11_impl import H11Protocol
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
from uvicorn.server import ServerState

from leafpool.core.config import Settings
from leafpool.http import create_app
from leafpool.http.disconnect import _asked, client_gone
from tests.support.http_helpers import fill

PROTOCOLS = {"httptools": HttpToolsProtocol, "h11": H11Protocol}
REQUEST = b"GET /api/segment/get/order HTTP/1.1\r\nHost: x\r\n\r\n"


class Transport(asyncio.Transport):
    """Records what the protocol writes; closed on request."""

    def __init__(self) -> None:
        super().__init__()
        self.written = b""
        self.closed = False

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self.written += bytes(data)

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"sockname": ("127.0.0.1", 8000), "peername": ("127.0.0.1", 50000)}.get(
            name, default)


async def _serve(app: Any, http: str, gone: bool) -> tuple[bytes, Any]:
    """One request through uvicorn's ``http`` protocol; with ``gone`` the connection is
    lost as soon as the request was read (before the app runs its pop). (What was
    written, the request's cycle.)"""
    config = Config(app, http=http, lifespan="off", proxy_headers=False, log_level="warning")
    config.load()
    state = ServerState()
    protocol: Any = PROTOCOLS[http](config=config, server_state=state, app_state={})
    transport = Transport()
    protocol.connection_made(transport)
    protocol.data_received(REQUEST)
    cycle = protocol.cycle
    if gone:
        protocol.connection_lost(None)
    await asyncio.gather(*state.tasks)
    return transport.written, cycle


@pytest.mark.parametrize("http", sorted(PROTOCOLS))
def test_a_client_gone_after_its_pop_is_a_counted_gap_never_a_repeat(
    make_settings: Callable[..., Settings], r: redis.Redis, http: str
) -> None:
    fill(r, "order", [1, 2, 3])
    app = create_app(make_settings())

    async def run() -> tuple[bytes, bytes, bytes]:
        async with app.router.lifespan_context(app):
            first, _ = await _serve(app, http, gone=False)
            lost, cycle = await _serve(app, http, gone=True)
            assert cycle.disconnected
            again, _ = await _serve(app, http, gone=False)
            # the gap is counted in a task of its own: done before Redis is read
            await asyncio.gather(*app.state.service.pool._counting)
            return first, lost, again

    first, lost, again = asyncio.run(run())
    assert first.startswith(b"HTTP/1.1 200") and first.endswith(b"\r\n\r\n1")
    assert lost == b""  # nothing written to the gone client
    assert again.startswith(b"HTTP/1.1 200") and again.endswith(b"\r\n\r\n3")
    assert r.hget("leafpool:{order}:hits", "gaps") == b"1"  # ID 2: popped, counted
    metrics = app.state.service.http
    assert metrics._requests[("/api/segment/get", 499)] == 1
    assert metrics._requests[("/api/segment/get", 200)] == 2


@pytest.mark.parametrize("http", sorted(PROTOCOLS))
def test_the_cycles_flag_answers_as_its_receive_does(http: str) -> None:
    """For uvicorn's cycles, :func:`client_gone` reads the flag; running ``receive()``
    (the way every other server is asked) gives the same answer, there and gone."""
    seen: list[tuple[bool, bool]] = []
    held: dict[str, Any] = {}

    async def app(scope: Any, receive: Any, send: Any) -> None:
        seen.append((client_gone(receive), _asked(receive)))
        held["protocol"].connection_lost(None)
        seen.append((client_gone(receive), _asked(receive)))

    async def run() -> None:
        config = Config(app, http=http, lifespan="off", proxy_headers=False,
                        log_level="warning")
        config.load()
        state = ServerState()
        protocol = held["protocol"] = PROTOCOLS[http](config=config, server_state=state,
                                                      app_state={})
        protocol.connection_made(Transport())
        protocol.data_received(REQUEST)
        await asyncio.gather(*state.tasks)

    asyncio.run(run())
    assert seen == [(False, False), (True, True)]
