"""Has the client gone? Asked after a request's pop and before its answer is sent: IDs
popped for a client that is gone are a gap, counted (docs/design.md §7.2), not silently
lost in a send the server drops.

ASGI has no "is the client there" call; its ``receive()`` answers ``http.disconnect`` at
once when the server saw the connection close, and otherwise waits. :func:`client_gone`
runs ``receive()`` only as far as it goes without waiting: a request message (the body
of a GET or POST, which these endpoints do not read) is passed over, a disconnect is
reported, and a ``receive()`` that would wait is closed unfinished (the client is there).
Nothing is scheduled and nothing blocks: a few microseconds per request.
"""

from __future__ import annotations

from starlette.types import Receive

MAX_MESSAGES = 4  # request messages passed over before the answer "still there"


def client_gone(receive: Receive) -> bool:
    """True when the server already reported the client's connection closed."""
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
