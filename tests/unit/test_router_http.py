"""The router's HTTP/1.1 handling on the wire: framing, keep-alive, Expect, HEAD, bad input."""

from __future__ import annotations

import asyncio
import json

import aiohttp

from tinct.router.config import RouterConfig
from tinct_testing.router_fakes import FakeScheduler, free_port, running_router, table

WAIT = 30.0  # bound on a socket read; never a measured figure
CHAT = b'{"model": "m", "messages": [{"role": "user", "content": "hi"}]}'


def _port(base: str) -> int:
    return int(base.rsplit(":", 1)[1])


async def _connect(base: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    return await asyncio.open_connection("127.0.0.1", _port(base))


async def read_response(
    reader: asyncio.StreamReader, head_only: bool = False
) -> tuple[int, dict[str, str], bytes]:
    """One response: status, headers (lower-cased names), body (length, chunked or to EOF)."""
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), WAIT)
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers: dict[str, str] = {}
    for line in lines[1:]:
        if line:
            k, v = line.split(":", 1)
            headers[k.strip().lower()] = v.strip()
    if head_only or status < 200 or status in (204, 304):
        return status, headers, b""
    if "content-length" in headers:
        body = await asyncio.wait_for(reader.readexactly(int(headers["content-length"])), WAIT)
    elif headers.get("transfer-encoding") == "chunked":
        body = b""
        while True:
            size = int((await asyncio.wait_for(reader.readuntil(b"\r\n"), WAIT))[:-2], 16)
            data = await asyncio.wait_for(reader.readexactly(size + 2), WAIT)
            if size == 0:
                break
            body += data[:-2]
    else:
        body = await asyncio.wait_for(reader.read(), WAIT)
    return status, headers, body


def post_chat(extra: bytes = b"", body: bytes = CHAT, path: bytes = b"/v1/chat/completions") -> bytes:
    return (
        b"POST %b HTTP/1.1\r\nHost: r\r\nContent-Type: application/json\r\nContent-Length: %d\r\n%b\r\n%b"
        % (path, len(body), extra, body)
    )


async def test_malformed_request_gets_400_and_the_router_keeps_serving(
    v1: FakeScheduler, v2: FakeScheduler
) -> None:
    async with running_router(table(v1.url, v2.url)) as (base, _):
        for garbage in (b"NOT HTTP AT ALL\r\n\r\n", b"GET / HTTP/1.1\r\nBad Header\r\n\r\n"):
            reader, writer = await _connect(base)
            writer.write(garbage)
            status, headers, body = await read_response(reader)
            assert status == 400
            assert headers["connection"] == "close"
            assert json.loads(body)["error"]["code"] == "bad_request"
            assert await asyncio.wait_for(reader.read(), WAIT) == b""  # closed
            writer.close()
        reader, writer = await _connect(base)
        writer.write(b"GET /v1/" + b"x" * 9000 + b" HTTP/1.1\r\nHost: r\r\n\r\n")
        assert (await read_response(reader))[0] == 414
        writer.close()
        assert v1.seen == []
        reader, writer = await _connect(base)
        writer.write(post_chat())
        status, headers, _ = await read_response(reader)
        assert (status, headers["x-scheduler-active"]) == (200, "v1")
        writer.close()


async def test_keep_alive_serves_requests_one_after_another(v1: FakeScheduler, v2: FakeScheduler) -> None:
    async with running_router(table(v1.url, v2.url)) as (base, _):
        reader, writer = await _connect(base)
        for _ in range(5):
            writer.write(post_chat())
            status, headers, body = await read_response(reader)
            assert status == 200
            assert "connection" not in headers
            assert json.loads(body)["model"] == "v1"
        writer.close()
        assert len(v1.seen) == 5


async def test_pipelined_requests_are_refused_politely(v1: FakeScheduler, v2: FakeScheduler) -> None:
    async with running_router(table(v1.url, v2.url)) as (base, _):
        reader, writer = await _connect(base)
        writer.write(post_chat() + post_chat() + post_chat())
        status, headers, body = await read_response(reader)
        assert status == 200
        assert headers["connection"] == "close"
        assert json.loads(body)["model"] == "v1"
        assert await asyncio.wait_for(reader.read(), WAIT) == b""  # the others are not answered
        writer.close()
        assert len(v1.seen) == 1


async def test_expect_100_continue(v1: FakeScheduler, v2: FakeScheduler) -> None:
    cfg = RouterConfig(max_body_bytes=1024)
    async with running_router(table(v1.url, v2.url), cfg) as (base, _):
        reader, writer = await _connect(base)
        head = post_chat(b"Expect: 100-continue\r\n").removesuffix(CHAT)
        writer.write(head)
        status, _, _ = await read_response(reader)
        assert status == 100
        writer.write(CHAT)
        status, headers, body = await read_response(reader)
        assert (status, json.loads(body)["model"]) == (200, "v1")
        assert "expect" not in {k.lower() for k in v1.seen[-1].headers}

        # Over the limit: a 413 straight away, no 100, and the connection closes.
        reader, writer = await _connect(base)
        writer.write(post_chat(b"Expect: 100-continue\r\n", b"x" * 5000).removesuffix(b"x" * 5000))
        status, headers, body = await read_response(reader)
        assert status == 413
        assert headers["connection"] == "close"
        assert json.loads(body)["error"]["code"] == "request_too_large"
        writer.close()


async def test_head_has_no_body_and_the_connection_goes_on(v1: FakeScheduler, v2: FakeScheduler) -> None:
    async with running_router(table(v1.url, v2.url)) as (base, _):
        reader, writer = await _connect(base)
        writer.write(b"HEAD /v1/models HTTP/1.1\r\nHost: r\r\n\r\n")
        status, headers, _ = await read_response(reader, head_only=True)
        assert status == 200
        assert headers["x-scheduler-active"] == "v1"
        assert int(headers["content-length"]) > 0
        assert v1.seen[-1].method == "HEAD"
        writer.write(b"HEAD /healthz HTTP/1.1\r\nHost: r\r\n\r\n")
        status, headers, _ = await read_response(reader, head_only=True)
        assert (status, headers["content-length"]) == (200, "3")
        writer.write(b"GET /healthz HTTP/1.1\r\nHost: r\r\n\r\n")
        status, _, body = await read_response(reader)
        assert (status, body) == (200, b"ok\n")
        writer.close()


async def test_head_answers_keep_their_upstream_connection(v1: FakeScheduler, v2: FakeScheduler) -> None:
    # Idle upstream connections kept for an hour: however slow the machine, only a HEAD
    # answer could end the connection.
    async with running_router(table(v1.url, v2.url), RouterConfig(keepalive_timeout=3600.0)) as (base, _):
        reader, writer = await _connect(base)
        for method in (b"HEAD", b"HEAD", b"GET", b"HEAD"):
            writer.write(b"%b /v1/models HTTP/1.1\r\nHost: r\r\n\r\n" % method)
            status, _, _ = await read_response(reader, head_only=method == b"HEAD")
            assert status == 200
        writer.close()
    assert [s.method for s in v1.seen] == ["HEAD", "HEAD", "GET", "HEAD"]
    # One upstream connection carried them all: a HEAD answer does not end it.
    assert len({s.peer for s in v1.seen}) == 1


async def test_chunked_request_bodies_both_kinds_of_endpoint(v1: FakeScheduler, v2: FakeScheduler) -> None:
    async with running_router(table(v1.url, v2.url)) as (base, _):
        reader, writer = await _connect(base)
        chunks = b"".join(b"%x\r\n%b\r\n" % (len(p), p) for p in (CHAT[:10], CHAT[10:])) + b"0\r\n\r\n"
        writer.write(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: r\r\nTransfer-Encoding: chunked\r\n\r\n" + chunks
        )
        status, _, body = await read_response(reader)
        assert (status, json.loads(body)["model"]) == (200, "v1")
        assert v1.seen[-1].body == CHAT

        writer.write(b"POST /v1/embeddings HTTP/1.1\r\nHost: r\r\nTransfer-Encoding: chunked\r\n\r\n")
        await writer.drain()
        for part in (b"raw-", b"bytes"):
            writer.write(b"%x\r\n%b\r\n" % (len(part), part))
            await writer.drain()
        writer.write(b"0\r\n\r\n")
        status, _, body = await read_response(reader)
        assert status == 200
        assert json.loads(body)["bytes"] == 9
        assert v1.seen[-1].body == b"raw-bytes"
        writer.close()


async def test_a_large_body_streams_through_to_stable(v1: FakeScheduler, v2: FakeScheduler) -> None:
    big = bytes(range(256)) * 3600  # 900 KiB: over the router's buffers, under the fake's limit
    async with running_router(table(v1.url, v2.url)) as (base, _), aiohttp.ClientSession() as http:
        async with http.put(f"{base}/v1/files", data=big) as r:
            assert r.status == 200
            assert (await r.json())["bytes"] == len(big)
        assert v1.seen[-1].body == big


async def test_http_1_0_client_gets_its_answer_and_a_close(v1: FakeScheduler, v2: FakeScheduler) -> None:
    async with running_router(table(v1.url, v2.url, default_weight=100)) as (base, _):
        reader, writer = await _connect(base)
        writer.write(
            post_chat(
                b"X-Latency-Class: high\r\n", json.dumps({**json.loads(CHAT), "stream": True}).encode()
            ).replace(b"HTTP/1.1", b"HTTP/1.0", 1)
        )
        status, headers, body = await read_response(reader)
        assert status == 200
        assert headers["x-scheduler-active"] == "v2"
        assert "transfer-encoding" not in headers  # no chunking for HTTP/1.0: ends at close
        assert b"data: [DONE]" in body
        writer.close()


async def _raw_backend(answers: list[bytes], seen: list[bytes]) -> tuple[asyncio.Server, str]:
    """A backend that answers the n-th request of each connection with answers[n] (b"" closes)."""

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            for answer in answers:
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":")[1])
                seen.append(head + await reader.readexactly(length))
                if not answer:
                    break
                writer.write(answer)
                await writer.drain()
                if b"Connection: close" in answer:
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    return server, f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"


async def test_a_reused_connection_the_backend_dropped_is_retried_once(v2: FakeScheduler) -> None:
    ok = b'HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 15\r\n\r\n{"model": "v1"}'
    seen: list[bytes] = []
    server, url = await _raw_backend([ok, b""], seen)  # the second request on a connection: dropped
    try:
        async with running_router(table(url, v2.url)) as (base, _), aiohttp.ClientSession() as http:
            for _ in range(3):
                async with http.post(f"{base}/v1/chat/completions", data=CHAT) as r:
                    assert r.status == 200
                    assert (await r.json())["model"] == "v1"
        assert len([s for s in seen if s.startswith(b"POST")]) == 5  # 3 answered, 2 dropped and resent
    finally:
        server.close()


async def test_an_answer_delimited_by_close_reaches_the_client_chunked(v2: FakeScheduler) -> None:
    answer = b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nConnection: close\r\n\r\nuntil the end"
    server, url = await _raw_backend([answer], [])
    try:
        async with running_router(table(url, v2.url)) as (base, _):
            reader, writer = await _connect(base)
            writer.write(b"GET /v1/models HTTP/1.1\r\nHost: r\r\n\r\n")
            status, headers, body = await read_response(reader)
            assert (status, headers["transfer-encoding"], body) == (200, "chunked", b"until the end")
            writer.close()
    finally:
        server.close()


async def test_absolute_form_target_is_sent_upstream_in_origin_form(
    v1: FakeScheduler, v2: FakeScheduler
) -> None:
    async with running_router(table(v1.url, v2.url)) as (base, _):
        reader, writer = await _connect(base)
        writer.write(b"GET http://router.example/v1/models?limit=2 HTTP/1.1\r\nHost: router.example\r\n\r\n")
        status, headers, body = await read_response(reader)
        assert (status, headers["x-scheduler-active"]) == (200, "v1")
        assert json.loads(body)["data"][0]["id"] == "v1"
        assert v1.seen[-1].path == "/v1/models"
        assert v1.seen[-1].headers["Host"] == v1.url.removeprefix("http://")
        writer.close()


async def test_metrics_port_serves_metrics_and_health_apart_from_the_proxy_port(
    v1: FakeScheduler, v2: FakeScheduler
) -> None:
    mport = free_port()
    cfg = RouterConfig(
        trust_role_from=("127.0.0.1/32",), metrics_port=mport, pass_through_prefixes=("/v1/", "/metrics")
    )
    async with running_router(table(v1.url, v2.url), cfg) as (base, _), aiohttp.ClientSession() as http:
        async with http.post(f"{base}/v1/chat/completions", data=CHAT) as r:
            assert r.status == 200
        # On the proxy port /metrics is a path like any other: under a pass-through prefix,
        # stable answers it; /healthz is under none, so no backend sees it.
        async with http.get(f"{base}/metrics") as r:
            assert (await r.json())["served_by"] == "v1"
        async with http.get(f"{base}/healthz") as r:
            assert r.status == 404
            assert (await r.json())["error"]["code"] == "not_found"
        assert [s.path for s in v1.seen] == ["/v1/chat/completions", "/metrics"]
        local = f"http://127.0.0.1:{mport}"
        async with http.get(f"{local}/metrics") as r:
            assert "tinct_router_requests_total{" in await r.text()
        async with http.get(f"{local}/readyz") as r:
            assert r.status == 200
        async with http.get(f"{local}/v1/models") as r:
            assert r.status == 404
            assert r.headers["X-Request-Id"]
