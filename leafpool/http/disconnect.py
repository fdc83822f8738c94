"""Has the client gone? Asked after a request's pop and before its answer is sent: IDs
popped for a client that is gone are a gap, counted (docs/design.md §7.2), not silently
lost in a send the server drops.

ASGI has no "is the client there" call; its ``receive()`` answers ``http.disconnect`` at
once when the server saw the connection close, and otherwise waits. :func:`client_gone`
runs ``receive()`` only as far as it goes without waiting: a request message (the body
of a GET or POST, which these endpoints do not read) is passed over, a disconnect is
reported, and a ``receive()`` that would wait is closed unfinished (the client is there).
Nothing is scheduled and nothing blocks: a few microseconds per request.

Under uvicorn (``leafpool serve``) the answer is read where its ``receive()`` reads it:
the request cycle's ``disconnected`` flag, which the protocol sets when the connection
is lost before the response completed, and which its ``receive()`` turns into
``http.disconnect``. Running ``receive()`` to its wait and closing it (two calls, an
:class:`asyncio.Event` wait and its future, a coroutine closed) cost a tenth of the
lean path's own CPU (issue 30); the flag is one attribute read, and the same answer.
Any other server's ``receive`` takes the general way.
"""

from __future__ import annotations

from starlette.types import Receive

MAX_MESSAGES = 4  # request messages passed over before the answer "still there"
#: the classes whose bound ``receive`` reports a disconnect from their ``disconnected``
#: flag: uvicorn's request cycles (httptools and h11), by module and name, so that
#: nothing here imports uvicorn
FLAGGED = frozenset({("uvicorn.protocols.http.httptools_impl", "RequestResponseCycle"),
                     ("uvicorn.protocols.http.h11_impl", "RequestResponseCycle")})
_flagged: dict[type, bool] = {}  # each receive's owner class: is it one of FLAGGED?


def client_gone(receive: Receive) -> bool:
    """True when the server already reported the client's connection closed."""
    owner = getattr(receive, "__self__", None)
    if owner is not None:
        kind = type(owner)
        flagged = _flagged.get(kind)
        if flagged is None:
            flagged = _flagged[kind] = (kind.__module__, kind.__qualname__) in FLAGGED
        if flagged:
            return bool(owner.disconnected)
    return _asked(receive)


def _asked(receive: Receive) -> bool:
    """:func:`client_gone` by running ``receive()`` as far as it goes without waiting."""
    for _ in range(MAX_MESSAGES):
        step = receive().__await__()  # a coroutine (uvicorn), or another server's awaitable
        try:
            next(step)
        except StopIteration as done:  # answered without waiting
            message = done.value or {}
            if message.get("type") == "http.disconnect":
                return True
            if message.get("type") == "http.request":
                continue
            return False
        close = getattr(step, "close", None)
        if close is not None:
            close()  # it would wait: the client is there
        return False
    return False
