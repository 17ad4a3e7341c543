"""Hostile backends against a real ``tinct router`` process: backends are bounded like clients.

Each backend here is a raw asyncio server that answers with a response head over the
limits, one that never ends, a broken status line or a broken chunked body. The router
refuses such an answer while nothing of it reached the client: stable's with a ``502``,
the candidate's with a fallback to stable. Figures (RSS) are printed for the record;
bounds on waiting are never measured figures.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tinct_testing.router_fakes import FakeScheduler, HostileBackend, RouterProcess, router_process, table_doc

WAIT = 30.0  # bound on one wait; never a measured figure
MiB = 1024 * 1024
CHAT = {"messages": [{"role": "user", "content": "hi"}]}
#: One failure ejects the candidate: the refusal must count towards ejection.
FALLBACK = {"consecutiveFailures": 1, "latencyMs": 120_000, "cooldownSeconds": 300}

Answer = Callable[[asyncio.StreamWriter], Awaitable[None]]


def _once(data: bytes) -> Answer:
    async def answer(writer: asyncio.StreamWriter) -> None:
        writer.write(data)

    return answer


def _lines(n: int) -> bytes:
    return (
        b"HTTP/1.1 200 OK\r\n"
        + b"".join(b"X-H%d: v\r\n" % i for i in range(n))
        + b"Content-Length: 2\r\n\r\nok"
    )


ANSWERS: dict[str, tuple[bytes, str]] = {
    # name: (what the backend sends, the reason of its refusal)
    "20000 header lines": (_lines(20_000), "head_too_large"),
    "300 short header lines": (_lines(300), "head_too_large"),  # 3 KiB: the line count refuses it
    "a 1 MiB header": (
        b"HTTP/1.1 200 OK\r\nX-Big: " + b"a" * MiB + b"\r\nContent-Length: 2\r\n\r\nok",
        "head_too_large",
    ),
    "an invalid status line": (b"HTTP/1.1 2x0 OK\r\nContent-Length: 2\r\n\r\nok", "malformed"),
    "a garbage chunk size right after the head": (
        b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"zz\r\ndata: x\r\n\r\n",
        "malformed",
    ),
}


@contextlib.asynccontextmanager
async def _hostile(answer: Answer) -> AsyncIterator[HostileBackend]:
    backend = await HostileBackend(answer).start()
    try:
        yield backend
    finally:
        await backend.stop()


@contextlib.asynccontextmanager
async def _router(
    tmp_path: Path, hostile: HostileBackend, good: FakeScheduler, *args: str
) -> AsyncIterator[RouterProcess]:
    """A router with two releases: model ``s`` has the hostile backend as its stable, model
    ``c`` as its candidate (weight 100) with ``good`` as its stable."""
    s = tmp_path / "s.json"
    s.write_text(json.dumps(table_doc(hostile.url, good.url, release="s", models=["s"], fallback=FALLBACK)))
    c = tmp_path / "c.json"
    doc = table_doc(good.url, hostile.url, release="c", models=["c"], default_weight=100, fallback=FALLBACK)
    c.write_text(json.dumps(doc))
    async with router_process(str(s), "--table", str(c), "--log-level", "error", *args) as rp:
        yield rp


async def _ask(http: aiohttp.ClientSession, rp: RouterProcess, model: str) -> tuple[int, dict[str, str], Any]:
    async with http.post(f"{rp.base}/v1/chat/completions", json={"model": model, **CHAT}) as r:
        return r.status, dict(r.headers), await r.json()


async def _metric(http: aiohttp.ClientSession, rp: RouterProcess, pattern: str) -> float:
    async with http.get(f"{rp.base}/metrics") as r:
        text = await r.text()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if re.match(pattern, line))


def _rejected(release: str, side: str, reason: str) -> str:
    return (
        rf'tinct_router_upstream_rejected_total\{{namespace="llm",reason="{reason}",'
        rf'release="{release}",side="{side}"\}}'
    )


async def _assert_refused(http: aiohttp.ClientSession, rp: RouterProcess, reason: str) -> None:
    """Stable's broken answer is a 502 with a status line; the candidate's falls back to stable."""
    status, headers, body = await _ask(http, rp, "s")
    assert status == 502
    assert body["error"]["code"] == "bad_gateway"
    assert await _metric(http, rp, _rejected("s", "stable", reason)) == 1

    status, headers, body = await _ask(http, rp, "c")
    assert status == 200
    assert headers["X-Scheduler-Active"] == "v1"
    assert headers["X-Fallback-Reason"] == "upstream_error"
    assert body["model"] == "v1"
    assert await _metric(http, rp, _rejected("c", "candidate", reason)) == 1
    assert (
        await _metric(http, rp, r'tinct_router_candidate_ejections_total\{namespace="llm",release="c"\}') == 1
    )


@pytest.mark.parametrize("name", list(ANSWERS))
async def test_a_broken_answer_is_refused_before_any_byte_reaches_the_client(
    tmp_path: Path, v1: FakeScheduler, name: str
) -> None:
    data, reason = ANSWERS[name]
    async with (
        _hostile(_once(data)) as hostile,
        _router(tmp_path, hostile, v1) as rp,
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=WAIT)) as http,
    ):
        await _assert_refused(http, rp, reason)
        assert hostile.requests == 2


@pytest.mark.parametrize("side", ["stable", "candidate"])
async def test_a_header_value_without_end_is_cut_at_the_bound_and_memory_stays_flat(
    tmp_path: Path, v1: FakeScheduler, side: str
) -> None:
    cap = 64 * MiB  # what the backend would send if nobody stopped it
    sent: list[int] = []
    cut = asyncio.Event()

    async def forever(writer: asyncio.StreamWriter) -> None:
        writer.write(b"HTTP/1.1 200 OK\r\nX-Endless: ")
        piece = b"a" * 65536
        n = 0
        try:
            while n < cap:
                writer.write(piece)
                await writer.drain()
                n += len(piece)
        finally:
            sent.append(n)
            cut.set()

    async with (
        _hostile(forever) as hostile,
        _router(tmp_path, hostile, v1) as rp,
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=WAIT)) as http,
    ):
        assert await _metric(http, rp, "tinct_router_upstream_rejected_total") == 0
        before = rp.rss()
        status, headers, body = await _ask(http, rp, "s" if side == "stable" else "c")
        after = rp.rss()
        await asyncio.wait_for(cut.wait(), WAIT)  # the backend learns it was cut
        print(
            f"{side} sending a header value without end: router RSS {before / MiB:.1f} MiB before, "
            f"{after / MiB:.1f} MiB after; the backend wrote {sent[0] // 1024} KiB before it was cut"
        )
        if side == "stable":
            assert status == 502
            assert body["error"]["code"] == "bad_gateway"
        else:
            assert status == 200
            assert headers["X-Fallback-Reason"] == "upstream_error"
            assert body["model"] == "v1"
        release = "s" if side == "stable" else "c"
        assert await _metric(http, rp, _rejected(release, side, "head_too_large")) == 1
    assert after - before < 20 * MiB
    assert sent[0] < cap


async def test_stable_silent_before_its_head_gets_a_502_after_the_upstream_head_timeout(
    tmp_path: Path, v1: FakeScheduler, v2: FakeScheduler
) -> None:
    v1.reset("stall")
    f = tmp_path / "t.json"
    f.write_text(json.dumps(table_doc(v1.url, v2.url)))
    async with (
        router_process(str(f), "--upstream-head-timeout", "1", "--log-level", "error") as rp,
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=WAIT)) as http,
    ):
        status, _, body = await _ask(http, rp, "m")
        assert status == 502
        assert body["error"]["code"] == "bad_gateway"
        assert await _metric(http, rp, _rejected("chat", "stable", "head_timeout")) == 1
        assert len(v1.seen) == 1
    v1.release_stall.set()
