"""Requests a backend must never see, sent on raw sockets to a real ``tinct router`` process.

Framing (RFC 9112 §6) is decided from the head before anything is forwarded: a body whose
delimitation is in doubt is refused (400, or 501 for a transfer coding other than chunked)
on the classified path and on pass-through paths alike, on a fresh connection and after a
served request on a kept-alive one, and the connection closes. Paths with dot segments,
empty segments, backslashes or encoded dots, slashes, backslashes, percents or controls
are refused (400); paths under no pass-through prefix get a 404; the rest reach stable
exactly as sent. The backends are raw servers that record every request head they get.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tinct.router.errors import CATALOGUE
from tinct_testing.router_fakes import FakeScheduler, RouterProcess, router_argv, router_process, table_doc

WAIT = 30.0  # bound on one read; never a measured figure
CHAT = b'{"model": "m", "messages": [{"role": "user", "content": "hi"}]}'
CHUNKED_CHAT = b"%x\r\n%b\r\n0\r\n\r\n" % (len(CHAT), CHAT)
PATHS = (b"/v1/chat/completions", b"/v1/embeddings")


@dataclass
class Tripwire:
    """A raw backend on 127.0.0.1 that records each request head it receives, reads the body
    (``Content-Length`` or chunked), answers ``200 {}`` and closes."""

    heads: list[bytes] = field(default_factory=list)
    #: Request lines of the requests whose body arrived whole.
    complete: list[bytes] = field(default_factory=list)
    url: str = ""

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            self.heads.append(head)
            lines = head.lower().split(b"\r\n")
            if b"transfer-encoding: chunked" in lines:
                await reader.readuntil(b"0\r\n\r\n")
            for line in lines:
                if line.startswith(b"content-length:"):
                    await reader.readexactly(int(line.split(b":")[1]))
            self.complete.append(head.split(b"\r\n", 1)[0])
            writer.write(
                b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n"
                b"Connection: close\r\n\r\n{}"
            )
            await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
            pass
        finally:
            writer.close()


@contextlib.asynccontextmanager
async def tripwire() -> AsyncIterator[Tripwire]:
    t = Tripwire()
    server = await asyncio.start_server(t._serve, "127.0.0.1", 0)
    t.url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    try:
        yield t
    finally:
        server.close()


@contextlib.asynccontextmanager
async def routed(tmp_path: Path, *args: str) -> AsyncIterator[tuple[RouterProcess, Tripwire, Tripwire]]:
    """A router process whose stable and candidate are tripwires; every classified request
    goes to the candidate (weight 100), every passed-through one to stable."""
    async with tripwire() as stable, tripwire() as candidate:
        f = tmp_path / "table.json"
        fallback = {"consecutiveFailures": 1000, "latencyMs": 60_000, "cooldownSeconds": 30}
        f.write_text(json.dumps(table_doc(stable.url, candidate.url, default_weight=100, fallback=fallback)))
        async with router_process(str(f), *args) as rp:
            yield rp, stable, candidate


async def read_answer(reader: asyncio.StreamReader) -> tuple[int, dict[str, str], bytes]:
    """One answer with a Content-Length (all the router's own have one)."""
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), WAIT)
    lines = head.decode("latin-1").split("\r\n")
    headers: dict[str, str] = {}
    for line in lines[1:]:
        if line:
            name, value = line.split(":", 1)
            headers[name.strip().lower()] = value.strip()
    body = await asyncio.wait_for(reader.readexactly(int(headers["content-length"])), WAIT)
    return int(lines[0].split()[1]), headers, body


def assert_refusal(status: int, headers: dict[str, str], body: bytes, code: str, case: object) -> None:
    """The router's own error answer of ``code``: its status, its fixed message, a request id."""
    want_status, message = CATALOGUE[code]
    assert status == want_status, (case, status, body)
    assert json.loads(body)["error"] == {
        "message": message,
        "type": json.loads(body)["error"]["type"],
        "code": code,
    }, case
    assert headers["x-request-id"], case


async def _served_first(rp: RouterProcess) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A connection that already carried one served request, kept alive."""
    reader, writer = await asyncio.open_connection("127.0.0.1", rp.port)
    writer.write(b"GET /v1/models HTTP/1.1\r\nHost: r\r\n\r\n")
    status, headers, _ = await read_answer(reader)
    assert status == 200
    assert "close" not in headers.get("connection", "")
    return reader, writer


#: (case, request line version, framing header lines, body, code of the answer)
FRAMING = [
    ("gzip: the final coding is not chunked", b"1.1", b"Transfer-Encoding: gzip\r\n", CHAT, "invalid_framing"),
    ("xchunked is not chunked", b"1.1", b"Transfer-Encoding: xchunked\r\n", CHUNKED_CHAT, "unsupported_transfer_coding"),
    ("an unknown coding", b"1.1", b"Transfer-Encoding: identity\r\n", CHAT, "unsupported_transfer_coding"),
    ("chunked with a parameter", b"1.1", b"Transfer-Encoding: chunked;x=1\r\n", CHUNKED_CHAT, "invalid_framing"),
    ("chunked, then gzip", b"1.1", b"Transfer-Encoding: chunked, gzip\r\n", CHUNKED_CHAT, "invalid_framing"),
    ("gzip, then chunked", b"1.1", b"Transfer-Encoding: gzip, chunked\r\n", CHUNKED_CHAT, "unsupported_transfer_coding"),
    ("chunked twice", b"1.1", b"Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n", CHUNKED_CHAT, "invalid_framing"),
    ("chunked in HTTP/1.0", b"1.0", b"Transfer-Encoding: chunked\r\n", CHUNKED_CHAT, "invalid_framing"),
    ("chunked and a length", b"1.1", b"Transfer-Encoding: chunked\r\nContent-Length: %d\r\n" % len(CHAT), CHUNKED_CHAT, "invalid_framing"),
    ("a length and chunked", b"1.1", b"Content-Length: %d\r\nTransfer-Encoding: chunked\r\n" % len(CHAT), CHUNKED_CHAT, "invalid_framing"),
    ("two different lengths", b"1.1", b"Content-Length: %d\r\nContent-Length: 2\r\n" % len(CHAT), CHAT, "invalid_framing"),
    ("the same length twice", b"1.1", b"Content-Length: %d\r\nContent-Length: %d\r\n" % (len(CHAT), len(CHAT)), CHAT, "invalid_framing"),
    ("a length list", b"1.1", b"Content-Length: %d, %d\r\n" % (len(CHAT), len(CHAT)), CHAT, "invalid_framing"),
    ("a signed length", b"1.1", b"Content-Length: +%d\r\n" % len(CHAT), CHAT, "invalid_framing"),
    ("a hex length", b"1.1", b"Content-Length: 0x%x\r\n" % len(CHAT), CHAT, "invalid_framing"),
    ("a negative length", b"1.1", b"Content-Length: -1\r\n", CHAT, "invalid_framing"),
    ("an empty length", b"1.1", b"Content-Length: \r\n", CHAT, "invalid_framing"),
]  # fmt: skip


async def test_a_request_that_cannot_be_framed_safely_is_refused_on_every_path_and_closed(
    tmp_path: Path,
) -> None:
    async with routed(tmp_path) as (rp, stable, candidate):
        served = 0
        for path in PATHS:
            for case, version, framing, body, code in FRAMING:
                for kept_alive in (False, True):
                    if kept_alive:
                        reader, writer = await _served_first(rp)
                        served += 1
                    else:
                        reader, writer = await asyncio.open_connection("127.0.0.1", rp.port)
                    writer.write(b"POST %b HTTP/%b\r\nHost: r\r\n%b\r\n%b" % (path, version, framing, body))
                    status, headers, answer = await read_answer(reader)
                    assert_refusal(status, headers, answer, code, (path, case, kept_alive))
                    assert headers["connection"] == "close", (path, case)
                    # Nothing later on this connection is read: it is closed.
                    assert await asyncio.wait_for(reader.read(), WAIT) == b"", (path, case)
                    writer.close()
        # No backend saw any of them: only the requests served before them came through.
        assert candidate.heads == []
        assert [h.split(b"\r\n", 1)[0] for h in stable.heads] == [b"GET /v1/models HTTP/1.1"] * served
        # The same bodies framed soundly are served, on both paths.
        for path in PATHS:
            for framing, body in ((b"Transfer-Encoding: chunked\r\n", CHUNKED_CHAT), (b"", CHAT)):
                reader, writer = await asyncio.open_connection("127.0.0.1", rp.port)
                if not framing:
                    framing = b"Content-Length: %d\r\n" % len(body)
                writer.write(b"POST %b HTTP/1.1\r\nHost: r\r\n%b\r\n%b" % (path, framing, body))
                status, _, _ = await read_answer(reader)
                assert status == 200, (path, framing)
                writer.close()
        assert candidate.complete == [b"POST /v1/chat/completions HTTP/1.1"] * 2
        assert stable.complete[-2:] == [b"POST /v1/embeddings HTTP/1.1"] * 2


async def test_a_body_whose_chunks_break_midway_is_refused_and_never_reaches_a_backend_whole(
    tmp_path: Path, v1: FakeScheduler, v2: FakeScheduler
) -> None:
    f = tmp_path / "table.json"
    f.write_text(json.dumps(table_doc(v1.url, v2.url, default_weight=100)))
    async with router_process(str(f)) as rp:
        for path in PATHS:  # classified (read whole) and passed through (streamed to stable)
            reader, writer = await asyncio.open_connection("127.0.0.1", rp.port)
            writer.write(
                b'POST %b HTTP/1.1\r\nHost: r\r\nTransfer-Encoding: chunked\r\n\r\n5\r\n{"a":\r\n' % path
            )
            await writer.drain()
            writer.write(b"zz\r\nnot a chunk\r\n0\r\n\r\n")
            status, headers, answer = await read_answer(reader)
            assert_refusal(status, headers, answer, "invalid_framing", path)
            assert headers["connection"] == "close"
            assert await asyncio.wait_for(reader.read(), WAIT) == b""
            writer.close()
    # Stable may have seen the head of the streamed one, but never a whole request.
    assert v1.seen == []
    assert v2.seen == []
    assert "Traceback" not in bytes(rp.stderr).decode()


#: Paths refused with a 400 whatever the method: a backend could read each differently.
REFUSED_PATHS = [
    b"/v1/../admin",
    b"/v1/%2e%2e/admin",
    b"/v1/%2E%2e/admin",
    b"/%2e%2e/%2e%2e/etc/passwd",
    b"//v1/chat/completions",
    b"/v1//chat/completions",
    b"/v1/x/../chat/completions",
    b"/v1/./models",
    b"/v1/models/.",
    b"/v1/models/..",
    b"/v1/..;/admin",
    b"/v1/%2fmodels",
    b"/v1%2Fchat/completions",
    b"/v1/%5c..%5cadmin",
    b"/v1\\..\\admin",
    b"/v1/models%00",
    b"/v1/models%0d%0aX-Injected:%20yes",
    b"/v1/%252e%252e/admin",
    b"/v1/%zz",
    b"/v1/models%2",
    b"/v1/models#fragment",
    b"http://stable/v1/../admin",
    b"http://stable//v1/models",
]
#: Sound paths under no pass-through prefix (default: /v1/): 404, and the connection serves on.
NOT_SERVED = [
    b"/admin",
    b"/",
    b"/v1",
    b"/v2/models",
    b"/healthzz",
    b"/.well-known/x",
    b"http://stable/admin",
    # Under a classified path: a backend reading it as the chat path would answer unclassified.
    b"/v1/chat/completions/",
    b"/v1/chat/%63ompletions/",
    b"/v1/completions/x",
]


async def test_ambiguous_paths_are_refused_and_paths_outside_the_api_reach_no_backend(tmp_path: Path) -> None:
    async with routed(tmp_path) as (rp, stable, candidate):
        for target in REFUSED_PATHS:
            for method, body in ((b"GET", b""), (b"POST", CHAT)):
                reader, writer = await asyncio.open_connection("127.0.0.1", rp.port)
                writer.write(
                    b"%b %b HTTP/1.1\r\nHost: r\r\nContent-Length: %d\r\n\r\n%b"
                    % (method, target, len(body), body)
                )
                status, headers, answer = await read_answer(reader)
                assert_refusal(status, headers, answer, "invalid_path", (method, target))
                assert headers["connection"] == "close"
                assert await asyncio.wait_for(reader.read(), WAIT) == b""
                writer.close()
        reader, writer = await asyncio.open_connection("127.0.0.1", rp.port)
        for target in [*NOT_SERVED, b"*"]:
            for method in (b"GET", b"OPTIONS", b"DELETE"):
                writer.write(b"%b %b HTTP/1.1\r\nHost: r\r\n\r\n" % (method, target))
                status, headers, answer = await read_answer(reader)
                assert_refusal(status, headers, answer, "not_found", (method, target))
                assert "connection" not in headers  # kept alive: one connection carries them all
        writer.close()
        for target in NOT_SERVED:
            reader, writer = await asyncio.open_connection("127.0.0.1", rp.port)
            writer.write(
                b"POST %b HTTP/1.1\r\nHost: r\r\nContent-Length: %d\r\n\r\n%b" % (target, len(CHAT), CHAT)
            )
            status, headers, answer = await read_answer(reader)
            assert_refusal(status, headers, answer, "not_found", (b"POST", target))
            writer.close()
        assert stable.heads == []
        assert candidate.heads == []


#: (target sent, request line stable gets): the query passes as sent, absolute form becomes origin form.
PASSED = [
    (b"/v1/models", b"GET /v1/models HTTP/1.1"),
    (b"/v1/models?after=/../x&q=%2e%2e//", b"GET /v1/models?after=/../x&q=%2e%2e// HTTP/1.1"),
    (b"/v1/models/llama%20v1", b"GET /v1/models/llama%20v1 HTTP/1.1"),
    (b"/%76%31/models", b"GET /%76%31/models HTTP/1.1"),
    (b"/v1/.well-known", b"GET /v1/.well-known HTTP/1.1"),
    (b"http://stable/v1/files?purpose=x", b"GET /v1/files?purpose=x HTTP/1.1"),
]


async def test_paths_under_the_api_reach_stable_exactly_as_sent_and_chat_is_always_classified(
    tmp_path: Path,
) -> None:
    async with routed(tmp_path) as (rp, stable, candidate):
        reader, writer = await asyncio.open_connection("127.0.0.1", rp.port)
        for target, line in PASSED:
            writer.write(b"GET %b HTTP/1.1\r\nHost: r\r\n\r\n" % target)
            assert (await read_answer(reader))[0] == 200, target
            assert stable.complete[-1] == line
        # Every chat/completions request is classified (here: all go to the candidate),
        # with a query string or with an encoded letter the backend decodes.
        prompt = b'{"model": "m", "prompt": "hi"}'
        for target, body in (
            (b"/v1/chat/completions?api-version=1", CHAT),
            (b"/v1/chat/%63ompletions", CHAT),
            (b"/v1/completions", prompt),
        ):
            writer.write(
                b"POST %b HTTP/1.1\r\nHost: r\r\nContent-Length: %d\r\n\r\n%b" % (target, len(body), body)
            )
            status, headers, _ = await read_answer(reader)
            assert (status, headers["x-scheduler-active"]) == (200, "v2"), target
            assert candidate.complete[-1] == b"POST %b HTTP/1.1" % target
        writer.close()
        assert len(stable.complete) == len(PASSED)


async def test_the_pass_through_prefixes_are_configurable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TINCT_ROUTER_PASS_THROUGH_PREFIX", "/health,/v1/models/")
    async with routed(tmp_path, "--pass-through-prefix", "/tokenize") as (rp, stable, _):
        reader, writer = await asyncio.open_connection("127.0.0.1", rp.port)
        for target, status in (
            (b"/tokenize", 200),
            (b"/tokenize/batch", 200),
            (b"/tokenizer", 404),
            (b"/health", 200),
            (b"/healthz", 404),  # the router's own: served on the proxy port as before
            (b"/healthy", 404),
            (b"/v1/models/m", 200),
            (b"/v1/models", 404),
            (b"/v1/embeddings", 404),
        ):
            writer.write(b"GET %b HTTP/1.1\r\nHost: r\r\n\r\n" % target)
            got, _, body = await read_answer(reader)
            if target == b"/healthz":
                assert (got, body) == (200, b"ok\n")
                continue
            assert got == status, target
        writer.write(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: r\r\nContent-Length: %d\r\n\r\n%b"
            % (len(CHAT), CHAT)
        )
        assert (await read_answer(reader))[0] == 200  # classified paths are always served
        writer.close()
        assert [c.split()[1] for c in stable.complete] == [
            b"/tokenize",
            b"/tokenize/batch",
            b"/health",
            b"/v1/models/m",
        ]
    # A prefix the router could not route is refused at start.
    monkeypatch.delenv("TINCT_ROUTER_PASS_THROUGH_PREFIX")
    for bad in ("v1/", "/v1/../x/", "/v1//", "/v1/%2e/"):
        proc = await asyncio.create_subprocess_exec(
            *router_argv(str(tmp_path / "table.json"), 1, "--pass-through-prefix", bad),
            stderr=asyncio.subprocess.PIPE,
        )
        _, err = await asyncio.wait_for(proc.communicate(), WAIT)
        assert proc.returncode == 2, (bad, err)
        assert b"pass-through prefix" in err, bad
