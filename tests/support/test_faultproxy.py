"""The fault-injecting Redis proxy (tests/support/faultproxy.py), against the session's real
redis-server: plain traffic passes through unchanged, and each fault does what it says at
the socket level (who sees which reply, and what Redis ran)."""

from __future__ import annotations

import hashlib
import os
import socket
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from tests.support.faultproxy import FaultProxy, parse_command, reply_end
from tests.support.services import wait_until

WAIT = 10.0  # bound on every wait; never reached when things work


@pytest.fixture
def client(proxy: FaultProxy) -> Iterator[redis.Redis]:
    """Through the proxy, without retries: a fault surfaces as the error it causes."""
    c = redis.Redis.from_url(proxy.url(), retry=Retry(NoBackoff(), 0), socket_timeout=WAIT)
    c.ping()  # connected and handshaken before a test arms its rule
    yield c
    c.close()


def resp(*commands: tuple[str, ...]) -> bytes:
    out = b""
    for args in commands:
        out += f"*{len(args)}\r\n".encode()
        for arg in args:
            out += f"${len(arg.encode())}\r\n{arg}\r\n".encode()
    return out


def raw_connection(proxy: FaultProxy) -> socket.socket:
    return socket.create_connection(("127.0.0.1", proxy.port), timeout=WAIT)


def read_until_eof(sock: socket.socket) -> bytes:
    got = b""
    while data := sock.recv(65536):
        got += data
    return got


def read_until(sock: socket.socket, ending: bytes) -> bytes:
    got = b""
    while not got.endswith(ending):
        data = sock.recv(65536)
        assert data, f"EOF after {got[-200:]!r}"
        got += data
    return got


RESP_VALUES = [
    b"+OK\r\n", b"-ERR wrong\r\n", b":-42\r\n", b"$4\r\na\r\nb\r\n", b"$0\r\n\r\n", b"$-1\r\n",
    b"*-1\r\n", b"*0\r\n", b"*3\r\n:1\r\n*2\r\n$1\r\nx\r\n$-1\r\n+y\r\n", b"_\r\n", b"#t\r\n",
    b",3.14\r\n", b"(12345678901234567890123\r\n", b"!5\r\nERR x\r\n", b"=7\r\ntxt:abc\r\n",
    b"%2\r\n+a\r\n:1\r\n+b\r\n~2\r\n:1\r\n:2\r\n", b">2\r\n+invalidate\r\n*1\r\n+k\r\n",
    b"|1\r\n+ttl\r\n:3\r\n$2\r\nhi\r\n", b"*2\r\n|1\r\n+a\r\n+b\r\n:1\r\n:2\r\n",
]


@pytest.mark.parametrize("value", RESP_VALUES)
def test_reply_parser_finds_the_end_of_every_resp_type_split_anywhere(value: bytes) -> None:
    for cut in range(len(value)):
        assert reply_end(bytearray(value[:cut])) is None, value[:cut]
    assert reply_end(bytearray(value + b"+next\r\n")) == len(value)
    assert reply_end(bytearray(b"+before\r\n" + value), 9) == 9 + len(value)


def test_command_parser_reads_arrays_and_inline_commands() -> None:
    wire = resp(("SET", "k\r\n", "")) + b"PING\r\n"
    args, end = parse_command(bytearray(wire)) or ([], 0)
    assert args == [b"SET", b"k\r\n", b""]
    assert parse_command(bytearray(wire), end) == ([b"PING"], len(wire))
    assert all(parse_command(bytearray(wire[:cut])) is None for cut in range(end))


def test_plain_traffic_passes_through(client: redis.Redis, r: redis.Redis) -> None:
    assert client.set("k", "v") and client.get("k") == b"v"
    pipe = client.pipeline(transaction=False)
    for i in range(100):
        pipe.rpush("list", i)
    assert pipe.execute() == list(range(1, 101))
    assert r.llen("list") == 100
    big = os.urandom(1 << 20)  # binary, with CRLFs and '*' and '$' inside
    assert client.set("big", big)
    assert client.get("big") == big and r.get("big") == big


def test_blpop_waits_through_the_proxy_for_a_push_made_directly(
    client: redis.Redis, r: redis.Redis
) -> None:
    with ThreadPoolExecutor(1) as pool:
        popped = pool.submit(client.blpop, ["q"], 5)
        wait_until(lambda: r.info("clients")["blocked_clients"] == 1, WAIT, "BLPOP waiting")
        r.rpush("q", "v")
        assert popped.result(WAIT) == (b"q", b"v")


def test_pubsub_connection_is_forwarded_transparently(
    proxy: FaultProxy, client: redis.Redis, r: redis.Redis
) -> None:
    rule = proxy.drop_reply("PING")  # a subscribed connection is a plain pipe: rules skip it
    sub = client.pubsub()
    sub.subscribe("ch")
    assert sub.get_message(timeout=WAIT)["type"] == "subscribe"
    assert r.publish("ch", "hi") == 1
    message = sub.get_message(timeout=WAIT)
    assert message and message["data"] == b"hi"
    sub.ping()
    assert sub.get_message(timeout=WAIT)["type"] == "pong"
    assert rule.count == 0
    sub.close()


def test_drop_reply_closes_the_client_after_redis_ran_the_command(
    proxy: FaultProxy, client: redis.Redis, r: redis.Redis
) -> None:
    # redis-py's incr() sends INCRBY k 1: a rule names the command on the wire
    rule = proxy.drop_reply("incrby", match=lambda args: args[0] == b"k")
    assert client.incr("other") == 1
    with pytest.raises(redis.ConnectionError):
        client.incr("k")
    assert rule.done.wait(WAIT) and rule.calls == [[b"k", b"1"]]
    assert r.get("k") == b"1"  # Redis ran it
    assert client.incr("k") == 2  # the rule is spent; a new connection goes through


def test_drop_reply_of_the_third_command_of_a_pipeline(
    proxy: FaultProxy, client: redis.Redis, r: redis.Redis
) -> None:
    proxy.drop_reply("SET", match=lambda args: args[0] == b"c")
    pipe = client.pipeline(transaction=False)
    for key in "abcde":
        pipe.set(key, key)
    with pytest.raises(redis.ConnectionError):
        pipe.execute()
    assert [r.get(key) for key in "abcde"] == [b"a", b"b", b"c", None, None]


def test_replies_before_a_drop_are_forwarded_after_it_nothing(
    proxy: FaultProxy, r: redis.Redis
) -> None:
    rule = proxy.drop_reply("SET", match=lambda args: args[0] == b"c")
    with raw_connection(proxy) as sock:
        sock.sendall(resp(*[("SET", key, key) for key in "abcde"]))
        assert read_until_eof(sock) == b"+OK\r\n+OK\r\n"
    assert rule.done.is_set()
    assert [r.get(key) for key in "abcde"] == [b"a", b"b", b"c", None, None]


def test_a_rule_armed_after_traffic_pairs_replies_right(
    proxy: FaultProxy, r: redis.Redis
) -> None:
    r.set("x", "vx")
    r.set("notanumber", "n")
    with raw_connection(proxy) as sock:
        setup = [("RPUSH", "l", "1", "2"), ("LRANGE", "l", "0", "-1"), ("GET", "missing"),
                 ("INCR", "notanumber"), ("HSET", "h", "f", "v"), ("HGETALL", "h"),
                 ("SET", "big", "x\r\n" * 100_000), ("ECHO", "setup-done")]
        sock.sendall(resp(*setup[:4]) + b"\r\n*0\r\n" + resp(*setup[4:]))  # empty: no reply
        read_until(sock, b"$10\r\nsetup-done\r\n")
        rule = proxy.drop_reply("GET", match=lambda args: args == [b"target"])
        sock.sendall(resp(("GET", "x"), ("GET", "target"), ("GET", "y")))
        assert read_until_eof(sock) == b"$2\r\nvx\r\n"
    assert rule.calls == [[b"target"]]


def test_resp3_push_while_replies_are_due_answers_no_command(
    proxy: FaultProxy, r: redis.Redis
) -> None:
    with raw_connection(proxy) as sock:
        sock.sendall(resp(("HELLO", "3"), ("CLIENT", "TRACKING", "ON"), ("GET", "k"),
                          ("ECHO", "done")))
        read_until(sock, b"$4\r\ndone\r\n")
        rule = proxy.drop_reply("GET", match=lambda args: args == [b"target"])
        sock.sendall(resp(("BLPOP", "q", "10"), ("GET", "target")))
        wait_until(lambda: r.info("clients")["blocked_clients"] == 1, WAIT, "BLPOP waiting")
        r.set("k", "changed")  # an invalidation push, while BLPOP and GET are due
        r.rpush("q", "v")
        push = b">2\r\n$10\r\ninvalidate\r\n*1\r\n$1\r\nk\r\n"
        assert read_until_eof(sock) == push + b"*2\r\n$1\r\nq\r\n$1\r\nv\r\n"
    assert rule.done.is_set()


def test_reset_before_closes_the_client_and_redis_never_sees_the_command(
    proxy: FaultProxy, client: redis.Redis, r: redis.Redis
) -> None:
    rule = proxy.reset_before("INCRBY")
    with pytest.raises(redis.ConnectionError):
        client.incr("k")
    assert rule.done.wait(WAIT)
    assert r.get("k") is None
    assert client.incr("k") == 1


def test_reset_before_in_a_pipeline_forwards_the_replies_before_it(
    proxy: FaultProxy, r: redis.Redis
) -> None:
    proxy.reset_before("INCR")
    with raw_connection(proxy) as sock:
        sock.sendall(resp(("SET", "a", "a"), ("SET", "b", "b"), ("INCR", "k"), ("SET", "d", "d")))
        assert read_until_eof(sock) == b"+OK\r\n+OK\r\n"
    assert [r.get(key) for key in ("a", "b", "k", "d")] == [b"a", b"b", None, None]


def test_delay_reply_holds_the_reply_then_forwards_it_and_the_rest_in_order(
    proxy: FaultProxy, client: redis.Redis
) -> None:
    client.set("k", "v")
    rule = proxy.delay_reply("GET", 0.5)
    pipe = client.pipeline(transaction=False)
    pipe.get("k").incr("n").get("k")
    started = time.monotonic()
    assert pipe.execute() == [b"v", 1, b"v"]
    assert time.monotonic() - started >= 0.5
    assert rule.done.is_set() and rule.count == 1


def test_evalsha_rule_drops_only_the_matching_scripts_reply(
    proxy: FaultProxy, client: redis.Redis, r: redis.Redis
) -> None:
    source_a = "return redis.call('INCR', KEYS[1])"
    source_b = "return redis.call('INCRBY', KEYS[1], 10)"
    sha_a = hashlib.sha1(source_a.encode()).hexdigest()
    script_a, script_b = client.register_script(source_a), client.register_script(source_b)
    assert script_a.sha == sha_a and r.script_load(source_a) == sha_a  # no NOSCRIPT detour
    r.script_load(source_b)
    rule = proxy.drop_reply("EVALSHA", match=lambda args: args[0] == sha_a.encode())
    assert script_b(keys=["b"]) == 10
    with pytest.raises(redis.ConnectionError):
        script_a(keys=["a"])
    assert rule.calls == [[sha_a.encode(), b"1", b"a"]]
    assert r.get("a") == b"1"  # the script ran
    assert script_b(keys=["b"]) == 20 and script_a(keys=["a"]) == 2


def test_resp3_connection_pairs_replies_right(proxy: FaultProxy, r: redis.Redis) -> None:
    c = redis.Redis.from_url(proxy.url(), protocol=3, retry=Retry(NoBackoff(), 0),
                             socket_timeout=WAIT)
    c.hset("h", mapping={"a": "1"})
    assert c.hgetall("h") == {b"a": b"1"}  # a RESP3 map
    proxy.drop_reply("HGETALL")
    with pytest.raises(redis.ConnectionError):
        c.hgetall("h")
    assert c.hgetall("h") == {b"a": b"1"}
    c.close()


def test_default_client_resends_the_command_whose_reply_was_dropped(
    proxy: FaultProxy, r: redis.Redis
) -> None:
    """The hazard: redis-py's constructor default retries a ConnectionError (10 times, in
    redis-py 8.1), so a non-idempotent command whose reply is lost runs twice."""
    default = redis.Redis(host="127.0.0.1", port=proxy.port, socket_timeout=WAIT)
    default.ping()
    rule = proxy.drop_reply("INCRBY")
    assert default.incr("k") == 2
    assert r.get("k") == b"2" and rule.count == 1
    default.close()


def test_from_url_client_does_not_retry_by_default(proxy: FaultProxy, r: redis.Redis) -> None:
    """Unlike the constructor, ``Redis.from_url`` without ``retry=`` gets redis-py's
    connection default, no retry (redis-py 8.1): the lost reply surfaces as the error."""
    from_url = redis.Redis.from_url(proxy.url(), socket_timeout=WAIT)
    from_url.ping()
    proxy.drop_reply("INCRBY")
    with pytest.raises(redis.ConnectionError):
        from_url.incr("k")
    assert r.get("k") == b"1"
    from_url.close()
