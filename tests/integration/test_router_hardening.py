"""Hostile and heavy inputs against a real ``tinct router`` process on real sockets.

Each test drives the router the way a misbehaving client or backend would and checks that
it answers, cuts, bounds its memory or exits as documented. Figures (sizes, RSS, times)
are printed for the record; bounds on waiting are never measured figures.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import signal
import time
from pathlib import Path
from typing import Any

import aiohttp

from tinct_testing.router_fakes import FakeScheduler, RouterProcess, router_process, table_doc

WAIT = 30.0  # bound on one read or one wait; never a measured figure
MiB = 1024 * 1024


def _write_table(tmp_path: Path, v1: FakeScheduler, v2: FakeScheduler, **kw: Any) -> str:
    f = tmp_path / "table.json"
    f.write_text(json.dumps(table_doc(v1.url, v2.url, **kw)))
    return str(f)


def _chat_of_size(size: int) -> bytes:
    """A chat request body of exactly ``size`` bytes."""
    empty = json.dumps({"model": "m", "messages": [{"role": "user", "content": ""}]}).encode()
    body = empty.replace(b'"content": ""', b'"content": "' + b"x" * (size - len(empty)) + b'"')
    assert len(body) == size
    return body


async def _connect(rp: RouterProcess) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    return await asyncio.open_connection("127.0.0.1", rp.port)


async def _status(reader: asyncio.StreamReader) -> tuple[int, bytes]:
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), WAIT)
    return int(head.split(b" ", 2)[1]), head


async def _metric(http: aiohttp.ClientSession, base: str, pattern: str) -> float:
    async with http.get(f"{base}/metrics") as r:
        text = await r.text()
    total = 0.0
    for line in text.splitlines():
        if re.match(pattern, line):
            total += float(line.rsplit(" ", 1)[1])
    return total


async def test_bodies_up_to_the_limit_are_served_and_larger_ones_get_413_while_sending(
    tmp_path: Path, v1: FakeScheduler, v2: FakeScheduler
) -> None:
    limit = 2 * MiB
    async with router_process(_write_table(tmp_path, v1, v2), "--max-body-bytes", str(limit)) as rp:
        timeout = aiohttp.ClientTimeout(total=WAIT)
        async with aiohttp.ClientSession(timeout=timeout) as http:
            for size in (100_000, 500_000, 1_500_000, limit):
                body = _chat_of_size(size)
                async with http.post(
                    f"{rp.base}/v1/chat/completions",
                    data=body,
                    headers={"Content-Type": "application/json"},
                ) as r:
                    assert r.status == 200, (size, await r.text())
                assert v1.seen[-1].body == body
                print(f"body of {size} bytes: served")

        # Declared over the limit: the 413 comes before a single body byte is sent.
        reader, writer = await _connect(rp)
        writer.write(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: r\r\nContent-Length: %d\r\n\r\n" % (limit + 1)
        )
        status, head = await _status(reader)
        assert status == 413
        assert b"connection: close" in head.lower()
        writer.close()

        # Chunked, no length announced: the 413 comes while the client is still sending.
        reader, writer = await _connect(rp)
        writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: r\r\nTransfer-Encoding: chunked\r\n\r\n")
        piece = b"x" * 65536
        total = 8 * limit
        sent = 0

        async def send() -> None:
            nonlocal sent
            try:
                while sent < total:
                    writer.write(b"%x\r\n%b\r\n" % (len(piece), piece))
                    await writer.drain()
                    sent += len(piece)
                    await asyncio.sleep(0)  # drain() does not yield while the buffer has room
            except ConnectionError:
                pass

        sender = asyncio.create_task(send())
        status, _ = await _status(reader)
        sent_at_answer = sent
        sender.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await sender
        writer.close()
        print(f"chunked body over {limit}: 413 after {sent_at_answer} bytes of {total}")
        assert status == 413
        assert sent_at_answer < total


async def test_a_backend_silent_after_its_headers_is_cut_counted_and_ejected(
    tmp_path: Path, v1: FakeScheduler, v2: FakeScheduler
) -> None:
    fallback = {"consecutiveFailures": 1, "latencyMs": 800, "cooldownSeconds": 300, "idleTimeoutMs": 500}
    v2.reset("hang")
    v1.reset("hang")
    f = _write_table(tmp_path, v1, v2, default_weight=100, fallback=fallback)
    async with router_process(f, "--log-level", "warning") as rp, aiohttp.ClientSession() as http:
        stream = {"model": "m", "stream": True, "messages": [{"role": "user", "content": "hi"}]}
        for side in ("v2", "v1"):  # candidate first; once ejected, the same request goes to stable
            async with http.post(f"{rp.base}/v1/chat/completions", json=stream) as r:
                assert r.headers["X-Scheduler-Active"] == side
                assert (await r.content.readline()).startswith(b"data: ")
                started = time.monotonic()
                try:
                    await asyncio.wait_for(r.content.read(), WAIT)
                    cut = False
                except aiohttp.ClientPayloadError:
                    cut = True
                print(f"{side}: cut after {time.monotonic() - started:.2f}s of silence")
                assert cut, "the truncated answer must be visible to the client"
        # Counted against the side that went silent, in the cell of the request (a stream:
        # latency class "high"), so it joins with that cell's requests.
        truncated = (
            r'tinct_router_truncated_responses_total\{dye_tag="len:short\+role:user\+latency:high",'
            r'namespace="llm",reason="idle_timeout",release="chat",side="%s"\}'
        )
        assert await _metric(http, rp.base, truncated % "candidate") == 1
        assert await _metric(http, rp.base, truncated % "stable") == 1
        assert await _metric(http, rp.base, r"tinct_router_candidate_ejected\{") == 1
        assert await _metric(http, rp.base, r"tinct_router_candidate_ejections_total\{") == 1
        v1.release_stall.set()
        v2.release_stall.set()


async def _stream_header_forever(rp: RouterProcess, cap: int) -> tuple[int, int | None]:
    """Send one header value without end (up to ``cap`` bytes) until the router answers;
    (bytes sent by then, status)."""
    reader, writer = await _connect(rp)
    answer = asyncio.create_task(_status(reader))
    writer.write(b"GET /v1/models HTTP/1.1\r\nHost: r\r\nX-Endless: ")
    sent = 0
    piece = b"a" * 16384
    with contextlib.suppress(ConnectionError):
        while sent < cap and not answer.done():
            writer.write(piece)
            await writer.drain()
            sent += len(piece)
            await asyncio.sleep(0)  # drain() does not yield while the buffer has room
    status: int | None = None
    with contextlib.suppress(ConnectionError, asyncio.IncompleteReadError):
        status, _ = await answer
    writer.close()
    return sent, status


async def test_memory_stays_flat_under_a_hundred_hostile_connections(
    tmp_path: Path, v1: FakeScheduler, v2: FakeScheduler
) -> None:
    f = _write_table(tmp_path, v1, v2)
    async with router_process(f, "--body-timeout", "1") as rp:
        # Reference: the same hundred connections, each sending one ordinary request.
        async def ordinary() -> None:
            reader, writer = await _connect(rp)
            writer.write(b"GET /v1/models HTTP/1.1\r\nHost: r\r\nX-Pad: " + b"a" * 4000 + b"\r\n\r\n")
            assert (await _status(reader))[0] == 200
            writer.close()

        await asyncio.gather(*(ordinary() for _ in range(100)))
        before = rp.rss()

        # A hundred connections, each streaming one header value without end.
        cap = 4 * MiB
        results = await asyncio.gather(*(_stream_header_forever(rp, cap) for _ in range(100)))
        after_headers = rp.rss()
        statuses = {s for _, s in results}
        print(
            f"header streams: statuses {statuses}, bytes accepted per connection: {max(s for s, _ in results)}"
        )

        # A hundred connections trickling a classified body: closed after --body-timeout.
        async def trickle() -> int:
            reader, writer = await _connect(rp)
            writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: r\r\nContent-Length: 1000000\r\n\r\n{")
            status, _ = await _status(reader)
            writer.close()
            return status

        trickled = await asyncio.gather(*(trickle() for _ in range(100)))
        after = rp.rss()
        print(
            f"RSS: {before / MiB:.1f} MiB after 100 ordinary requests, "
            f"{after_headers / MiB:.1f} MiB after 100 endless headers "
            f"({100 * cap / MiB:.0f} MiB offered), {after / MiB:.1f} MiB after 100 trickled bodies"
        )
        assert statuses == {431}  # every endless header was cut short with an answer
        assert set(trickled) == {408}
        # Bounded buffers: growth is a small fraction of what the clients sent.
        assert after_headers - before < 100 * cap / 16
        assert after - before < 100 * cap / 16
        async with aiohttp.ClientSession() as http, http.get(f"{rp.base}/healthz") as r:
            assert r.status == 200


async def test_deeply_nested_json_gets_a_400_and_no_traceback(
    tmp_path: Path, v1: FakeScheduler, v2: FakeScheduler
) -> None:
    async with router_process(_write_table(tmp_path, v1, v2)) as rp, aiohttp.ClientSession() as http:
        for body in (b"[" * 200_000, b'{"messages": ' + b"[" * 200_000 + b"]" * 200_000 + b"}"):
            async with http.post(
                f"{rp.base}/v1/chat/completions", data=body, headers={"Content-Type": "application/json"}
            ) as r:
                assert r.status == 400
                doc = await r.json()
        assert doc["error"]["code"] == "invalid_json"
        assert doc["error"]["type"] == "invalid_request_error"
        assert v1.seen == []
        rp.proc.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(rp.proc.wait(), WAIT) == 0
    log = bytes(rp.stderr).decode()
    assert "Traceback" not in log
    assert "RecursionError" not in log


async def test_sigterm_with_slow_senders_connected_exits_without_waiting_for_them(
    tmp_path: Path, v1: FakeScheduler, v2: FakeScheduler
) -> None:
    v1.reset("gated")
    f = _write_table(tmp_path, v1, v2)
    grace = 120.0  # longer than any wait below: the exit must not depend on it
    async with router_process(f, "--shutdown-timeout", str(grace)) as rp:
        writers = []
        for i in range(30):  # slow senders: half a head, or half a classified body
            _, w = await _connect(rp)
            if i % 2:
                w.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: r\r\nX-Slow: ")
            else:
                w.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: r\r\nContent-Length: 1000\r\n\r\n{")
            await w.drain()
            writers.append(w)
        # One idle keep-alive connection and one stream in flight.
        idle_r, idle_w = await _connect(rp)
        idle_w.write(b"GET /healthz HTTP/1.1\r\nHost: r\r\n\r\n")
        assert (await _status(idle_r))[0] == 200
        async with aiohttp.ClientSession() as http:
            stream = {"model": "m", "stream": True, "messages": [{"role": "user", "content": "hi"}]}
            async with http.post(f"{rp.base}/v1/chat/completions", json=stream) as r:
                assert (await r.content.readline()).startswith(b"data: ")
                started = time.monotonic()
                rp.proc.send_signal(signal.SIGTERM)
                # The idle connection is closed at once.
                assert await asyncio.wait_for(idle_r.read(), WAIT) == b"ok\n"  # then EOF
                rest = b"".join(await v1.ungate(r.content))
                assert b"data: [DONE]" in rest  # the request in flight finished
        rc = await asyncio.wait_for(rp.proc.wait(), WAIT)
        print(f"exit {rc} {time.monotonic() - started:.2f}s after SIGTERM (grace {grace:.0f}s)")
        assert rc == 0
        for w in writers:
            w.close()
