"""Backends close idle keep-alive connections (uvicorn after 5 s, nginx when it runs short of
connections); a ``tinct router`` process in front of them never fails a request for it.

The backend here is a raw asyncio server on 127.0.0.1 speaking HTTP/1.1 keep-alive, which
closes its connections the ways real ones do: after an idle time, right after each answer,
or as a request arrives on a connection it already served (the router reused a connection
the backend was closing: the race the router cannot see coming), with an end of stream or a
reset. A connection the backend closes before answering on a *new* connection is its
failure: the router answers that with its documented 502, and never tries again and again.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import struct
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tinct.router.config import RouterConfig
from tinct.router.summing import parse as parse_metrics
from tinct_testing.router_fakes import (
    CHAT,
    CLOSE_WAIT,
    ESTABLISHED,
    FakeScheduler,
    RawBackend,
    RouterProcess,
    read_request,
    router_process,
    table_doc,
)
from tinct_testing.wait import eventually_async

WAIT = 30.0  # bound on one wait; never a measured figure
RETRIES = "tinct_router_upstream_retries_total"


@dataclass
class ClosingBackend(RawBackend):
    """Answers chat completions on keep-alive connections (JSON, or a chunked SSE stream when
    the request asks for one) and closes connections as ``mode`` says:

    - ``idle``: after ``idle`` seconds without a request (uvicorn's keep-alive timeout);
    - ``after_answer``: right after each answer (which still says keep-alive);
    - ``reused``: when a request arrives on a connection it answered on before, unanswered;
    - ``all``: every request, unanswered;
    - ``keep``: never.

    With ``reset`` it closes with a TCP reset (``SO_LINGER`` 0) instead of an end of stream.
    With ``together``, the first answers wait until that many requests are in (so that many
    connections are open at once).
    """

    mode: str
    idle: float | None = None
    reset: bool = False
    version: str = "v1"
    together: int = 0
    connections: int = 0
    requests: int = 0
    answered: int = 0
    #: Connections closed for being idle (``idle``).
    idle_closed: int = 0
    url: str = ""
    _server: asyncio.Server | None = None
    _all_in: asyncio.Event = field(default_factory=asyncio.Event)

    async def _request(self, reader: asyncio.StreamReader) -> bytes | None:
        """A request's body; None when none came within the idle time."""
        try:
            async with asyncio.timeout(self.idle):
                return await read_request(reader)
        except TimeoutError:
            return None

    def _answer(self, body: bytes) -> bytes:
        if json.loads(body).get("stream"):
            events = b"".join(
                b"data: %b\n\n" % json.dumps({"choices": [{"index": 0, "delta": {"content": w}}]}).encode()
                for w in ("hello", " from", f" {self.version}")
            )
            events += b"data: [DONE]\n\n"
            return (
                b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
                b"%x\r\n%b\r\n0\r\n\r\n" % (len(events), events)
            )
        doc = {
            "choices": [
                {"index": 0, "message": {"role": "assistant", "content": f"hello from {self.version}"}}
            ]
        }
        data = json.dumps(doc).encode()
        return b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%b" % (
            len(data),
            data,
        )

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        served = 0
        try:
            while True:
                body = await self._request(reader)
                if body is None:
                    self.idle_closed += 1
                    return
                self.requests += 1
                if self.mode == "all" or (self.mode == "reused" and served):
                    return
                if self.requests >= self.together:
                    self._all_in.set()
                elif not served:
                    await self._all_in.wait()
                writer.write(self._answer(body))
                await writer.drain()
                served += 1
                self.answered += 1
                if self.mode == "after_answer":
                    return
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            if self.reset:
                sock = writer.get_extra_info("socket")
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            writer.close()


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as s:
        yield s


def _table(tmp_path: Path, stable: str, candidate: str | None = None, weight: float = 0) -> str:
    """A table file; without a candidate of its own, the candidate (never chosen at weight 0)
    is stable under another name."""
    candidate = candidate or stable.replace("127.0.0.1", "localhost")
    path = tmp_path / "table.json"
    path.write_text(json.dumps(table_doc(stable, candidate, default_weight=weight)))
    return str(path)


def _router(table: str) -> contextlib.AbstractAsyncContextManager[RouterProcess]:
    """A router that would keep idle connections for an hour: only the backend closes them."""
    return router_process(table, "--upstream-idle-timeout", "3600")


async def _post(
    http: aiohttp.ClientSession, base: str, doc: dict[str, Any] = CHAT
) -> tuple[int, dict[str, str], bytes]:
    async with http.post(f"{base}/v1/chat/completions", json=doc) as r:
        return r.status, dict(r.headers), await r.read()


async def _counter(http: aiohttp.ClientSession, router: RouterProcess, name: str, **labels: str) -> float:
    """The sum of the router's ``name`` samples carrying ``labels`` (0 when it has none)."""
    async with http.get(f"{router.local}/metrics") as r:
        family = parse_metrics(await r.text()).get(name.removesuffix("_total"))
    if family is None:
        return 0.0
    want = set(labels.items())
    return sum(v for (n, ls), v in family.samples.items() if n == name and want <= set(ls))


#: The router's end not closed yet: established, or half-closed by the backend.
OPEN = (ESTABLISHED, CLOSE_WAIT)


def _port(url: str) -> int:
    return int(url.rsplit(":", 1)[1])


def test_the_default_idle_timeout_is_under_uvicorns_keep_alive() -> None:
    """uvicorn (vLLM, SGLang) closes a keep-alive connection after 5 s without a request: by
    default the router lets go of an idle connection before that."""
    assert RouterConfig().keepalive_timeout < 5.0


@pytest.mark.parametrize("reset", [False, True], ids=["eof", "reset"])
async def test_requests_on_connections_closed_as_they_were_reused_are_sent_again(
    tmp_path: Path, http: aiohttp.ClientSession, reset: bool
) -> None:
    """Every request after the first meets the connection the backend is closing: each is sent
    once more on a new connection, answered, and counted."""
    backend = await ClosingBackend("reused", reset=reset).start()
    try:
        async with _router(_table(tmp_path, backend.url)) as router:
            for _ in range(5):
                status, headers, body = await _post(http, router.base)
                assert status == 200, body
                assert headers["X-Scheduler-Active"] == "v1"
                assert json.loads(body)["choices"][0]["message"]["content"] == "hello from v1"
            assert await _counter(http, router, RETRIES, side="stable") == 4
            assert await _counter(http, router, "tinct_router_requests_total", code="200") == 5
            assert await _counter(http, router, "tinct_router_requests_total", code="502") == 0
            # Four requests reached a closing connection, and went again on a new one each.
            assert (backend.requests, backend.answered, backend.connections) == (9, 5, 5)
    finally:
        await backend.stop()


async def test_idle_connections_closed_all_at_once_cost_one_new_connection(
    tmp_path: Path, http: aiohttp.ClientSession
) -> None:
    """Four idle connections, all closed by the backend at once (as nginx drops idle
    keep-alive connections when it runs short of them): the request that meets one is sent
    again on a new connection, not on another of the closed ones."""
    backend = await ClosingBackend("reused", together=4).start()
    try:
        async with _router(_table(tmp_path, backend.url)) as router:
            answers = await asyncio.gather(*(_post(http, router.base) for _ in range(4)))
            assert [status for status, _, _ in answers] == [200] * 4
            assert backend.connections == 4  # all four kept idle by the router
            status, _, body = await _post(http, router.base)
            assert status == 200, body
            assert await _counter(http, router, RETRIES, side="stable") == 1
            assert (backend.requests, backend.answered, backend.connections) == (6, 5, 5)
    finally:
        await backend.stop()


async def test_a_stream_on_a_connection_closed_as_it_was_reused_is_sent_again(
    tmp_path: Path, http: aiohttp.ClientSession
) -> None:
    backend = await ClosingBackend("reused").start()
    stream = {**CHAT, "stream": True}
    try:
        async with _router(_table(tmp_path, backend.url)) as router:
            for _ in range(2):
                status, headers, body = await _post(http, router.base, stream)
                assert status == 200, body
                assert headers["Content-Type"] == "text/event-stream"
                events = [e for e in body.split(b"\n\n") if e]
                assert events[-1] == b"data: [DONE]"
                words = [json.loads(e[6:])["choices"][0]["delta"]["content"] for e in events[:-1]]
                assert "".join(words) == "hello from v1"
            assert await _counter(http, router, RETRIES, side="stable") == 1
            assert (backend.requests, backend.answered) == (3, 2)
    finally:
        await backend.stop()


@pytest.mark.parametrize("mode", ["idle", "after_answer"])
async def test_connections_the_backend_closed_are_not_used_again(
    tmp_path: Path, http: aiohttp.ClientSession, mode: str
) -> None:
    """Once the router saw the backend close an idle connection, it never sends a request on
    it: each request goes on a new connection, with nothing to retry."""
    backend = await ClosingBackend(mode, idle=0.2 if mode == "idle" else None).start()
    port = _port(backend.url)
    try:
        async with _router(_table(tmp_path, backend.url)) as router:
            for n in range(1, 4):
                status, _, body = await _post(http, router.base)
                assert status == 200, body
                await eventually_async(
                    lambda: router.connections_to(port, OPEN) == 0,
                    timeout=WAIT,
                    interval=0.02,
                    what="the router closed its end of the connection the backend closed",
                )
                assert backend.connections == n
            assert await _counter(http, router, RETRIES) == 0
            assert (backend.requests, backend.answered) == (3, 3)
    finally:
        await backend.stop()


async def test_a_backend_closing_after_each_answer_fails_no_request(
    tmp_path: Path, http: aiohttp.ClientSession
) -> None:
    """Requests back to back: the next one may reach the router before the backend's end of
    stream does (it is then sent again) or after (a new connection at once): none fails."""
    backend = await ClosingBackend("after_answer").start()
    try:
        async with _router(_table(tmp_path, backend.url)) as router:
            for _ in range(20):
                status, _, body = await _post(http, router.base)
                assert status == 200, body
            # A request sent on a connection the backend had closed never reached it.
            assert (backend.requests, backend.answered, backend.connections) == (20, 20, 20)
            assert await _counter(http, router, RETRIES, side="stable") <= 19
    finally:
        await backend.stop()


async def test_a_fresh_connection_closed_unanswered_is_a_502_sent_once(
    tmp_path: Path, http: aiohttp.ClientSession
) -> None:
    """A backend that closes a new connection without answering fails the request: stable's
    documented 502. A reused one that fails so is sent again once, not again and again."""
    backend = await ClosingBackend("all").start()
    try:
        async with _router(_table(tmp_path, backend.url)) as router:
            status, _, body = await _post(http, router.base)
            assert status == 502
            assert json.loads(body)["error"]["code"] == "stable_unavailable"
            assert (backend.requests, backend.connections) == (1, 1)
            assert await _counter(http, router, RETRIES) == 0

            backend.mode = "keep"
            status, _, body = await _post(http, router.base)  # a kept connection
            assert status == 200, body
            backend.mode = "all"
            status, _, body = await _post(http, router.base)
            assert status == 502
            assert json.loads(body)["error"]["code"] == "stable_unavailable"
            # The kept connection, then one new one: sent again once.
            assert (backend.requests, backend.connections) == (4, 3)
            assert await _counter(http, router, RETRIES, side="stable") == 1
    finally:
        await backend.stop()


async def test_the_candidate_is_sent_again_too_and_falls_back_only_when_that_fails(
    tmp_path: Path, http: aiohttp.ClientSession, v1: FakeScheduler
) -> None:
    """A retry on a new connection is part of one attempt: a candidate that answers there
    answers (no fallback); one whose new connection fails falls back to stable as before."""
    candidate = await ClosingBackend("reused", version="v2").start()
    try:
        async with _router(_table(tmp_path, v1.url, candidate.url, weight=100)) as router:
            for _ in range(3):
                status, headers, body = await _post(http, router.base)
                assert status == 200, body
                assert headers["X-Scheduler-Active"] == "v2"
                assert "X-Fallback-Reason" not in headers
            assert await _counter(http, router, RETRIES, side="candidate") == 2
            assert await _counter(http, router, "tinct_router_fallbacks_total") == 0
            assert await _counter(http, router, "tinct_router_candidate_failures_total") == 0

            candidate.mode = "all"
            status, headers, body = await _post(http, router.base)
            assert status == 200, body
            assert headers["X-Scheduler-Active"] == "v1"
            assert headers["X-Fallback-Reason"] == "upstream_error"
            assert await _counter(http, router, RETRIES, side="candidate") == 3
            assert await _counter(http, router, "tinct_router_fallbacks_total", reason="upstream_error") == 1
            assert len(v1.seen) == 1
    finally:
        await candidate.stop()
