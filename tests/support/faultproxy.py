"""A fault-injecting TCP proxy for Redis, for tests (Toxiproxy-like, stdlib sockets + threads).

:class:`FaultProxy` listens on a free 127.0.0.1 port and opens one connection to the real
redis-server per client connection. It always parses RESP both ways: client commands (arrays
of bulk strings, or inline) and every RESP2/RESP3 reply type (``+ - : $ * _ # , ( ! = % ~ |``;
``>`` pushes are out of band). Replies come in command order, so each is paired with its
command, pipelines included, and a rule armed after setup traffic counts right.

A rule names a command (case-insensitive; the name on the wire: redis-py's ``incr()`` sends
INCRBY) and optionally a predicate on its arguments (without the name, e.g. ``lambda a: a[0]
== sha1`` for one script's EVALSHA). It fires for the first ``times`` matching commands, on
any connection; rules are armed and disarmed while the proxy runs. At the socket level:

``drop_reply``: the command is forwarded and Redis runs it; replies to the commands before it
are forwarded, its own is read and thrown away, then both sockets are shut down (the client
reads EOF: redis-py raises ``ConnectionError``). Nothing the client sent after that command
(same write or later) reaches Redis.
``delay_reply``: the command is forwarded; its reply is held ``seconds`` once it has arrived,
then forwarded, and the replies after it in order (later commands reach Redis meanwhile).
``reset_before``: neither the command nor anything sent after it reaches Redis; the replies to
the commands before it are forwarded, then both sockets are shut down.

``Rule.fired`` is set when a command matches, ``Rule.done`` just before the action takes
effect (sockets shut down, delayed reply sent): a client that saw the effect finds it set.

Limits: after SUBSCRIBE, PSUBSCRIBE, SSUBSCRIBE or MONITOR a connection is a plain byte pipe
for good and rules skip it. CLIENT REPLY OFF/SKIP breaks the pairing; inside MULTI the reply
paired with a command is its ``+QUEUED``. A command is forwarded once complete (a big value is
buffered here). A protocol error or a failing predicate lands in :attr:`FaultProxy.errors`.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import NamedTuple

Match = Callable[[list[bytes]], bool]
DROP, DELAY, RESET, RAW = "drop_reply", "delay_reply", "reset_before", "raw"
RAW_COMMANDS = {b"SUBSCRIBE", b"PSUBSCRIBE", b"SSUBSCRIBE", b"MONITOR"}
LINE_TYPES, BULK_TYPES = b"+-:_#,(", b"$!="
AGGREGATE_WIDTH = {ord("*"): 1, ord("~"): 1, ord(">"): 1, ord("%"): 2}


def _line(buf: bytearray, pos: int) -> tuple[bytes, int] | None:
    end = buf.find(b"\r\n", pos)
    return None if end < 0 else (bytes(buf[pos:end]), end + 2)


def reply_end(buf: bytearray, pos: int = 0) -> int | None:
    """End of the one complete RESP2/RESP3 value that starts at ``pos``, or None when
    ``buf`` holds only part of it. An attribute (``|``) and the value it annotates are one."""
    need = 1
    while need:
        got = _line(buf, pos + 1) if pos < len(buf) else None
        if got is None:
            return None
        kind, (text, pos) = buf[pos], got
        need -= 1
        if kind in LINE_TYPES:
            continue
        n = int(text)
        if kind in BULK_TYPES:
            if n >= 0:
                pos += n + 2
                if pos > len(buf):
                    return None
        elif kind in AGGREGATE_WIDTH:
            need += max(n, 0) * AGGREGATE_WIDTH[kind]
        elif kind == ord("|"):
            need += 2 * n + 1
        else:
            raise ValueError(f"unknown RESP type {chr(kind)!r}")
    return pos


def parse_command(buf: bytearray, pos: int = 0) -> tuple[list[bytes], int] | None:
    """(arguments, end) of the one complete client command at ``pos``, or None."""
    got = _line(buf, pos)
    if got is None:
        return None
    text, pos = got
    if not text.startswith(b"*"):
        return text.split(), pos  # inline command
    args: list[bytes] = []
    for _ in range(int(text[1:])):
        got = _line(buf, pos)
        if got is None:
            return None
        text, pos = got
        if not text.startswith(b"$"):
            raise ValueError(f"expected a bulk string, got {text[:20]!r}")
        end = pos + int(text[1:])
        if end + 2 > len(buf):
            return None
        args.append(bytes(buf[pos:end]))
        pos = end + 2
    return args, pos


@dataclass(eq=False)
class Rule:
    """One armed fault; ``calls`` holds the arguments of each command it fired for."""

    command: bytes
    action: str
    match: Match | None = None
    times: int = 1
    seconds: float = 0.0
    count: int = 0
    calls: list[list[bytes]] = field(default_factory=list)
    fired: threading.Event = field(default_factory=threading.Event)
    done: threading.Event = field(default_factory=threading.Event)

    def matches(self, args: list[bytes]) -> bool:
        return (self.count < self.times and args[0].upper() == self.command
                and (self.match is None or self.match(args[1:])))

    def disarm(self) -> None:
        """No more matches (a fault already decided for a command still happens)."""
        self.times = self.count


class _Entry(NamedTuple):
    """A command sent upstream whose reply is not forwarded yet, or a RAW/RESET marker."""

    action: str | None
    rule: Rule | None = None


class _Conn:
    def __init__(self, client: socket.socket, upstream: socket.socket) -> None:
        self.client, self.upstream = client, upstream
        self.lock = threading.Lock()
        self.pending: deque[_Entry] = deque()
        self.discard = False  # requests side, after a drop or reset: forward nothing more
        self.raw = False  # requests side, after SUBSCRIBE & co: forward bytes verbatim
        self.threads: list[threading.Thread] = []
        self._running = 2

    def kill(self, rule: Rule | None = None) -> None:
        """Shut both sockets down: the peers read EOF, both pumps wake up and end."""
        if rule is not None:
            rule.done.set()
        for sock in (self.client, self.upstream):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    def entry(self, index: int) -> _Entry | None:
        with self.lock:
            return self.pending[index] if index < len(self.pending) else None

    def enqueue(self, entry: _Entry) -> None:
        """Queue a command's entry; a reset with no reply left to forward fires at once."""
        with self.lock:
            if entry.action == RESET and not self.pending:
                self.kill(entry.rule)
            else:
                self.pending.append(entry)

    def settle(self, answered: int) -> None:
        """Pop ``answered`` entries whose replies went out; fire a reset now at the head."""
        with self.lock:
            for _ in range(answered):
                self.pending.popleft()
            if self.pending and self.pending[0].action == RESET:
                self.kill(self.pending[0].rule)

    def finished(self) -> bool:
        """One pump ended; the last one closes the sockets and returns True."""
        with self.lock:
            self._running -= 1
            last = self._running == 0
        if last:
            self.kill()
            self.client.close()
            self.upstream.close()
        return last


class FaultProxy:
    """See the module docstring. ``start()`` returns the proxy; ``url()`` is its address."""

    def __init__(self, upstream_host: str, upstream_port: int) -> None:
        self.upstream = (upstream_host, upstream_port)
        self.port = 0
        self.errors: list[BaseException] = []
        self._rules: list[Rule] = []
        self._lock = threading.Lock()
        self._conns: set[_Conn] = set()
        self._stopping = threading.Event()
        self._listener = socket.socket()
        self._acceptor: threading.Thread | None = None

    def start(self) -> FaultProxy:
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(128)
        self.port = int(self._listener.getsockname()[1])
        self._acceptor = threading.Thread(target=self._accept, daemon=True,
                                          name=f"faultproxy-{self.port}-accept")
        self._acceptor.start()
        return self

    def __enter__(self) -> FaultProxy:
        return self if self.port else self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def url(self, db: int = 0) -> str:
        return f"redis://127.0.0.1:{self.port}/{db}"

    def drop_reply(self, command: str, match: Match | None = None, times: int = 1) -> Rule:
        return self._arm(Rule(command.upper().encode(), DROP, match, times))

    def delay_reply(
        self, command: str, seconds: float, match: Match | None = None, times: int = 1
    ) -> Rule:
        return self._arm(Rule(command.upper().encode(), DELAY, match, times, seconds))

    def reset_before(self, command: str, match: Match | None = None, times: int = 1) -> Rule:
        return self._arm(Rule(command.upper().encode(), RESET, match, times))

    def clear(self) -> None:
        """Disarm every rule (a fault already decided for a command still happens)."""
        with self._lock:
            for rule in self._rules:
                rule.disarm()
            self._rules.clear()

    def stop(self) -> None:
        """Stop accepting, shut every connection down, join the threads, close the sockets."""
        self._stopping.set()
        with contextlib.suppress(OSError):
            self._listener.shutdown(socket.SHUT_RDWR)
        if self._acceptor is not None:
            self._acceptor.join(10)
        self._listener.close()
        with self._lock:
            conns = list(self._conns)
        for conn in conns:
            conn.kill()
        for thread in (t for conn in conns for t in conn.threads):
            thread.join(10)

    def _arm(self, rule: Rule) -> Rule:
        with self._lock:
            self._rules.append(rule)
        return rule

    def _fire(self, args: list[bytes]) -> Rule | None:
        with self._lock:
            rule = next((rule for rule in self._rules if self._matches(rule, args)), None)
            if rule is not None:
                rule.count += 1
                rule.calls.append(args[1:])
                rule.fired.set()
            return rule

    def _matches(self, rule: Rule, args: list[bytes]) -> bool:
        try:
            return rule.matches(args)
        except Exception as exc:  # a broken predicate: no match, and reported
            self.errors.append(exc)
            return False

    def _accept(self) -> None:
        while not self._stopping.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(self.upstream, timeout=10)
            except OSError:
                client.close()
                continue
            upstream.settimeout(None)
            for sock in (client, upstream):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self._serve(_Conn(client, upstream))

    def _serve(self, conn: _Conn) -> None:
        with self._lock:
            self._conns.add(conn)
        for source, pump in ((conn.client, self._requests), (conn.upstream, self._replies)):
            conn.threads.append(threading.Thread(
                target=self._run, args=(conn, source, pump), daemon=True,
                name=f"faultproxy-{self.port}-{pump.__name__}"))
        for thread in conn.threads:
            thread.start()

    def _run(
        self, conn: _Conn, source: socket.socket, pump: Callable[[_Conn, bytearray], None]
    ) -> None:
        """Feed one direction's bytes to ``pump`` until EOF or a shutdown. A client's EOF is
        passed on to Redis (which then closes); any other end shuts the connection down."""
        buf = bytearray()
        try:
            while data := source.recv(262144):
                buf += data
                pump(conn, buf)
            if source is conn.client:
                conn.upstream.shutdown(socket.SHUT_WR)
            else:
                conn.kill()
        except OSError:
            conn.kill()
        except Exception as exc:
            self.errors.append(exc)
            conn.kill()
        finally:
            if conn.finished():
                with self._lock:
                    self._conns.discard(conn)

    def _entry(self, args: list[bytes]) -> _Entry | None:
        """What to do with a command; None for an empty one (Redis answers nothing)."""
        if not args:
            return None
        if args[0].upper() in RAW_COMMANDS:
            return _Entry(RAW)
        rule = self._fire(args)
        return _Entry(rule.action if rule else None, rule)

    def _requests(self, conn: _Conn, buf: bytearray) -> None:
        out, pos = bytearray(), 0
        while not (conn.raw or conn.discard) and (parsed := parse_command(buf, pos)):
            args, end = parsed
            entry = self._entry(args)
            if entry is not None:
                conn.raw = entry.action == RAW
                conn.discard = entry.action in (DROP, RESET)
                conn.enqueue(entry)  # before the bytes go: the reply may come back at once
            if entry is None or entry.action != RESET:
                out += buf[pos:end]
            pos = end
        if conn.raw:
            out += buf[pos:]
        del buf[:len(buf) if conn.raw or conn.discard else pos]
        if out:
            conn.upstream.sendall(out)

    def _replies(self, conn: _Conn, buf: bytearray) -> None:
        out, pos, answered = bytearray(), 0, 0
        while True:
            head = conn.entry(answered)
            action, rule = (head.action, head.rule) if head else (None, None)
            if action in (RAW, RESET) or (end := reply_end(buf, pos)) is None:
                break
            if buf[pos] == ord(">"):  # a push: out of band, answers no command
                out += buf[pos:end]
                pos = end
                continue
            if rule is not None and action in (DROP, DELAY):
                conn.client.sendall(out)
                out.clear()
                if action == DROP:
                    conn.kill(rule)
                    return
                self._stopping.wait(rule.seconds)
                rule.done.set()
                conn.client.sendall(buf[pos:end])
            else:
                out += buf[pos:end]
            pos = end
            answered += head is not None
        if action == RAW:
            out += buf[pos:]
            pos = len(buf)
        del buf[:pos]
        conn.client.sendall(out)
        conn.settle(answered)
