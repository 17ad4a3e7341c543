"""What the router's own code costs per request, without the kernel, wrk or a backend.

``bench/router.py`` times whole proxies under wrk, where the router's user-space share of a
plain request (a few dozen microseconds) moves by several percent from one run to the next.
This script drives the router's real objects in one process instead: a
:class:`~tinct.router.connection.ServerConnection` and the upstream pool's
:class:`~tinct.router.upstream.UpstreamConnection` s on in-memory transports, on uvloop. The
client side feeds the bench's plain chat request (one read, as wrk's arrive); each upstream
transport answers what the router sends it with a fixed 200 in the next loop iteration, as a
backend's answer arrives in a later one. Everything else is the router as it runs: parsing,
classification, the sticky choice, the upstream head deadline, the answer's head, token
metrics and request metrics.

Keys of the JSON line (microseconds of CPU per request, the median of seven batches):

- ``request_us``: the whole plain request, routed to stable by a table at weight 0.
- ``request_trusted_role_us``: the same with ``--trust-role-from`` set (the role header read).
- ``request_no_token_metrics_us``: the same with ``--no-token-metrics``; ``token_metrics_us``
  is what token metrics add.
- ``request_candidate_us``: weight 50 with a new ``X-Session-Id`` per request: the sticky
  hash, and half the requests to the candidate.
- ``connection_floor_us``: the connection alone: the request parsed, a task run, a fixed
  answer written; ``router_code_us`` = ``request_us`` less that floor.
- ``long_request_us``: the long-prompt case's request (``bench/router.py --cases long``: about
  220 KB, weight 50, no session header), fed in one read; ``long_parse_us`` is ``orjson.loads``
  of its body alone, the part of it that classification cannot do without.
- ``chunk_to_client_us``: an SSE chunk of a streaming chat answer (one token), from the
  backend's bytes handed to the upstream connection to the router's write of them to the
  client's transport; ``chunk_us`` until the router is done with the chunk's relay (token
  metrics stamp and queue the chunk there; the meter reads queued chunks later, together:
  :class:`~tinct.router.tokens.MeterSweep`, ``token_meter_us_per_chunk`` of
  ``bench/router.py``). ``_no_token_metrics_us`` the same with ``--no-token-metrics``, and
  ``token_metrics_chunk_to_client_us``, ``token_metrics_chunk_us`` the differences: the delay
  token metrics add to a chunk on its way to the client, and their time in its relay. Medians of
  seven batches of wall-clock time, each chunk fed in a loop iteration of its own.

The loop iterations the client side waits for are part of every figure; compare figures of
one run, or runs of two commits on one machine.

Usage: python bench/router_code.py [--requests N]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from typing import Any

import orjson
import uvloop
from router import (  # the hop case's request, the long case's, and the SSE case's event
    ANSWER,
    REQUEST,
    _event,
    _table,
    chunk_of,
    long_prompt_request,
)

from tinct.api.routing import RoutingTable
from tinct.router.app import Router
from tinct.router.config import RouterConfig
from tinct.router.connection import ServerConnection
from tinct.router.request import Request
from tinct.router.server import HttpServer
from tinct.router.upstream import UpstreamConnection

#: The hop case's request and answer (``bench/router.py``), as bytes on the wire.
BODY = REQUEST.encode()
LONG_BODY = long_prompt_request().encode()
ANSWER_BODY = ANSWER.encode()
RESPONSE = (
    b"HTTP/1.1 200 OK\r\nServer: nginx\r\nDate: Sat, 05 Dec 2026 21:00:00 GMT\r\n"
    b"Content-Type: application/json\r\nContent-Length: %d\r\nConnection: keep-alive\r\n\r\n%b"
    % (len(ANSWER_BODY), ANSWER_BODY)
)
#: A streaming chat request, and the head of the event stream that answers it.
STREAM_BODY = b'{"model":"bench","stream":true,"messages":[{"role":"user","content":"hi"}]}'
STREAM_HEAD = (
    b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n"
    b"Transfer-Encoding: chunked\r\n\r\n"
)
#: Backends of the table: never connected to (the pool is given connections on fakes).
STABLE, CANDIDATE = "http://127.0.0.1:9", "http://localhost:9"


def request(session: str | None = "bench", body: bytes = BODY) -> bytes:
    sid = b"X-Session-Id: %b\r\n" % session.encode() if session is not None else b""
    return (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: router\r\nContent-Length: %d\r\n"
        b"Content-Type: application/json\r\n%b\r\n%b" % (len(body), sid, body)
    )


class ClientTransport:
    """The client's side of a connection: counts the router's writes."""

    def __init__(self) -> None:
        self.writes = 0
        self.closed = False

    def write(self, data: bytes) -> None:
        self.writes += 1

    def writelines(self, data: Any) -> None:
        self.writes += 1

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return ("127.0.0.1", 40000) if name == "peername" else default

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True

    def can_write_eof(self) -> bool:
        return True

    def write_eof(self) -> None:
        pass

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


class BackendTransport(ClientTransport):
    """A backend's side: answers each request with ``answer`` in the next loop iteration."""

    def __init__(
        self, loop: asyncio.AbstractEventLoop, conn: UpstreamConnection, answer: bytes = RESPONSE
    ) -> None:
        super().__init__()
        self.loop = loop
        self.conn = conn
        self.answer = answer

    def write(self, data: bytes) -> None:
        self.loop.call_soon(self.conn.data_received, self.answer)

    def writelines(self, data: Any) -> None:
        self.write(b"")


async def _started(
    config: RouterConfig, weight: float, answer: bytes
) -> tuple[Router, HttpServer, list[UpstreamConnection]]:
    """A router serving the hop case's table at ``weight``, its pool given two connections to
    each backend that answer every request with ``answer``."""
    router = Router(config)
    await router.start()
    router.state.holder.swap(RoutingTable.model_validate(_table(STABLE, CANDIDATE, weight)), "bench")
    loop = asyncio.get_running_loop()
    pool, server = router._pool, router._server
    assert pool is not None
    assert server is not None
    upstreams = []
    for host in ("127.0.0.1", "localhost"):
        for _ in range(2):
            upstream = UpstreamConnection(pool, (host, 9, False))
            upstream.connection_made(BackendTransport(loop, upstream, answer))  # type: ignore[arg-type]
            pool.release(upstream)
            upstreams.append(upstream)
    return router, server, upstreams


async def per_request_us(
    config: RouterConfig, weight: float, requests: int, *, floor: bool = False, long: bool = False
) -> float:
    """Median CPU microseconds per request over seven batches, after a warm-up (``long``: the
    long-prompt request, without a session)."""
    router, server, _ = await _started(config, weight, RESPONSE)
    if floor:
        fixed = (200, [(b"Content-Type", b"application/json")], ANSWER_BODY)

        async def answer(req: Request, conn: ServerConnection) -> None:
            await req.body.read_all(1 << 20)
            conn.respond(fixed)

        server.handler = answer
    conn = ServerConnection(server)
    client = ClientTransport()
    conn.connection_made(client)  # type: ignore[arg-type]
    if long:
        heads = [request(None, LONG_BODY)]
    elif 0 < weight < 100:  # a new session per request: the sticky hash runs
        heads = [request(f"s-{i}") for i in range(1000)]
    else:
        heads = [request()]

    async def run(n: int) -> None:
        for i in range(n):
            before = client.writes
            conn.data_received(heads[i % len(heads)])
            while client.writes == before:
                await asyncio.sleep(0)
            await asyncio.sleep(0)  # the handler's task ends
        assert not client.closed, "the router closed the client's connection"

    await run(min(2000, requests // 7))
    batches = []
    for _ in range(7):
        started = time.process_time()
        await run(requests // 7)
        batches.append((time.process_time() - started) / (requests // 7) * 1e6)
    conn.connection_lost(None)
    await router.stop()
    return statistics.median(batches)


def parse_us(body: bytes, n: int) -> float:
    """Median CPU microseconds of ``orjson.loads(body)`` over seven batches of ``n // 7``."""
    batches = []
    for _ in range(7):
        started = time.process_time()
        for _ in range(n // 7):
            orjson.loads(body)
        batches.append((time.process_time() - started) / (n // 7) * 1e6)
    return statistics.median(batches)


class StampingTransport(ClientTransport):
    """A client's side that notes when the router last wrote to it."""

    def __init__(self) -> None:
        super().__init__()
        self.at = 0.0

    def write(self, data: bytes) -> None:
        self.at = time.perf_counter()
        self.writes += 1


async def chunk_relay_us(config: RouterConfig, chunks: int) -> tuple[float, float]:
    """(to the client, in all): median wall-clock microseconds of an SSE chunk through the
    router, over seven batches of ``chunks // 7`` chunks of one streaming answer."""
    router, server, upstreams = await _started(config, 0.0, STREAM_HEAD)
    conn = ServerConnection(server)
    client = StampingTransport()
    conn.connection_made(client)  # type: ignore[arg-type]
    conn.data_received(
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: router\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n\r\n%b" % (len(STREAM_BODY), STREAM_BODY)
    )
    while not client.writes:  # the answer's head, sent when the stream starts
        await asyncio.sleep(0)
    upstream = next(u for u in upstreams if u.resp is not None)  # the one the request went out on
    events = [chunk_of(_event(i)) for i in range(100)]

    async def run(n: int) -> tuple[float, float]:
        to_client, in_all = [], []
        perf = time.perf_counter
        for i in range(n):
            await asyncio.sleep(0)
            t0 = perf()
            upstream.data_received(events[i % 100])
            t1 = perf()
            to_client.append(client.at - t0)
            in_all.append(t1 - t0)
        return statistics.median(to_client) * 1e6, statistics.median(in_all) * 1e6

    await run(2000)
    batches = [await run(chunks // 7) for _ in range(7)]
    # One write for the head, then one per chunk: each chunk's time is of its own write.
    assert client.writes == 1 + 2000 + 7 * (chunks // 7), "a chunk was not relayed in one write"
    upstream.data_received(chunk_of(b"data: [DONE]\n\n") + b"0\r\n\r\n")
    await asyncio.sleep(0)
    conn.connection_lost(None)
    await router.stop()
    return statistics.median(b[0] for b in batches), statistics.median(b[1] for b in batches)


async def main(requests: int) -> dict[str, float]:
    base = RouterConfig(host="127.0.0.1", port=0, shutdown_timeout=1)

    def cfg(**kw: Any) -> RouterConfig:
        return RouterConfig(**{**base.__dict__, **kw})

    out: dict[str, float] = {}
    for key, config, weight, floor in (
        ("request_us", base, 0.0, False),
        ("request_trusted_role_us", cfg(trust_role_from=("10.0.0.0/8",)), 0.0, False),
        ("request_no_token_metrics_us", cfg(measure_tokens=False), 0.0, False),
        ("request_candidate_us", base, 50.0, False),
        ("connection_floor_us", base, 0.0, True),
    ):
        out[key] = round(await per_request_us(config, weight, requests, floor=floor), 2)
        print(f"{key}: {out[key]}", file=sys.stderr)
    out["long_request_us"] = round(await per_request_us(base, 50.0, max(7, requests // 10), long=True), 2)
    out["long_parse_us"] = round(parse_us(LONG_BODY, max(7, requests // 10)), 2)
    print(
        f"long_request_us: {out['long_request_us']}, long_parse_us: {out['long_parse_us']}", file=sys.stderr
    )
    out["token_metrics_us"] = round(out["request_us"] - out["request_no_token_metrics_us"], 2)
    out["router_code_us"] = round(out["request_us"] - out["connection_floor_us"], 2)
    for suffix, config in (("", base), ("_no_token_metrics", cfg(measure_tokens=False))):
        to_client, in_all = await chunk_relay_us(config, requests)
        out[f"chunk_to_client{suffix}_us"] = round(to_client, 2)
        out[f"chunk{suffix}_us"] = round(in_all, 2)
        print(f"chunk{suffix}: to the client {to_client:.2f} us, in all {in_all:.2f} us", file=sys.stderr)
    out["token_metrics_chunk_to_client_us"] = round(
        out["chunk_to_client_us"] - out["chunk_to_client_no_token_metrics_us"], 2
    )
    out["token_metrics_chunk_us"] = round(out["chunk_us"] - out["chunk_no_token_metrics_us"], 2)
    return out


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--requests", type=int, default=35_000, help="requests per figure (default: %(default)s)")
    args = ap.parse_args()
    print(json.dumps(uvloop.run(main(args.requests))))
