"""The router's own error answers carry no internal text, and a request id that leads to the log.

Against real ``tinct router`` processes: each error the router makes itself (a backend down
or answering garbage, a malformed request, a body too large or too slow, a path it does not
serve) is answered with the fixed message of its code and ``X-Request-Id`` — the client's
own when sane, else a new one — and the router's log line with that id has the detail the
answer leaves out (the backend's address, the parser's complaint, the limit).
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Mapping
from pathlib import Path

import aiohttp

from tinct.router.errors import CATALOGUE, MAX_ID
from tinct_testing.router_fakes import (
    CHAT,
    FakeScheduler,
    HostileBackend,
    RouterProcess,
    free_port,
    router_process,
    running_router,
    table_doc,
)
from tinct_testing.wait import eventually_async

WAIT = 30.0  # bound on one wait; never a measured figure
#: What an answer must never show: exception names, socket errors, addresses, paths.
INTERNAL = re.compile(
    r"127\.0\.0\.1|Error|errno|[Cc]onnection refused|Traceback|\.py|/tmp|llhttp|[Ii]nvalid method", re.S
)


def _write(tmp_path: Path, stable: str, candidate: str, **kw: object) -> str:
    f = tmp_path / "table.json"
    f.write_text(json.dumps(table_doc(stable, candidate, **kw)))
    return str(f)


async def _log_line(rp: RouterProcess, rid: str) -> str:
    """The router's log line about request ``rid`` (written as the answer goes out)."""

    def line() -> str | None:
        return next((x for x in bytes(rp.stderr).decode().splitlines() if f"request {rid} " in x), None)

    return await eventually_async(line, timeout=WAIT, interval=0.05, what=f"a log line for request {rid}")


def _assert_fixed(status: int, headers: Mapping[str, str], body: bytes, code: str) -> str:
    """The answer is the fixed one of ``code``, with nothing internal in it; its request id."""
    want_status, message = CATALOGUE[code]
    assert status == want_status, (code, body)
    doc = json.loads(body)
    assert doc["error"]["message"] == message
    assert doc["error"]["code"] == code
    fields = {k.lower(): v for k, v in headers.items()}
    shown = body.decode() + "".join(f"{k}: {v}\n" for k, v in fields.items() if k != "date")
    assert not INTERNAL.search(shown), shown
    rid = fields["x-request-id"]
    assert rid
    return str(rid)


async def test_a_backend_down_or_broken_is_a_fixed_502_whose_id_finds_the_detail_in_the_log(
    tmp_path: Path,
) -> None:
    garbage = HostileBackend(_write_garbage)
    await garbage.start()
    port = free_port()
    dead = f"http://127.0.0.1:{port}"  # nothing listens
    try:
        for stable, code, detail in (
            (dead, "stable_unavailable", f"127.0.0.1:{port}"),
            (garbage.url, "bad_gateway", garbage.url),
        ):
            candidate = f"http://127.0.0.1:{free_port()}"
            async with (
                router_process(_write(tmp_path, stable, candidate)) as rp,
                aiohttp.ClientSession() as http,
            ):
                given = "req-7f3a/2026:12+04=@x_y.z"
                async with http.post(
                    f"{rp.base}/v1/chat/completions", json=CHAT, headers={"X-Request-Id": given}
                ) as r:
                    rid = _assert_fixed(r.status, r.headers, await r.read(), code)
                assert rid == given  # the client's own id, when sane
                line = await _log_line(rp, rid)
                assert f"502 {code}" in line
                assert detail in line
                # Without an id of its own the client gets a new one, different each time.
                ids = set()
                for _ in range(3):
                    async with http.get(f"{rp.base}/v1/models") as r:
                        ids.add(_assert_fixed(r.status, r.headers, await r.read(), code))
                assert len(ids) == 3
                assert all(re.fullmatch(r"[0-9a-f]{32}", i) for i in ids), ids
                for i in ids:
                    assert detail in await _log_line(rp, i)
    finally:
        await garbage.stop()


async def _write_garbage(writer: asyncio.StreamWriter) -> None:
    writer.write(b"HTTP/1.1 2x0 OK\r\nContent-Length: 2\r\n\r\nok")


async def test_request_ids_are_repeated_only_when_sane(
    tmp_path: Path, v1: FakeScheduler, v2: FakeScheduler
) -> None:
    async with router_process(_write(tmp_path, v1.url, v2.url)) as rp, aiohttp.ClientSession() as http:
        for given, kept in (
            ("a" * MAX_ID, True),
            ("0f8fad5b-d9cb-469f-a165-70867728950e", True),
            ("a" * (MAX_ID + 1), False),
            ("has space", False),
            ('quote"d', False),
            ("<script>", False),
            ("", False),
        ):
            async with http.get(f"{rp.base}/admin", headers={"X-Request-Id": given}) as r:
                rid = _assert_fixed(r.status, r.headers, await r.read(), "not_found")
            assert (rid == given) is kept, given
            assert "/admin" in await _log_line(rp, rid)


async def test_refused_requests_get_fixed_messages_and_their_detail_goes_to_the_log(
    tmp_path: Path, v1: FakeScheduler, v2: FakeScheduler
) -> None:
    f = _write(tmp_path, v1.url, v2.url, models=["m"])
    async with router_process(f, "--max-body-bytes", "1000", "--body-timeout", "1") as rp:
        # A malformed length after the id: the id is repeated, the parser's words are not.
        reader, writer = await asyncio.open_connection("127.0.0.1", rp.port)
        writer.write(b"POST /v1/embeddings HTTP/1.1\r\nX-Request-Id: bad-1\r\nContent-Length: 1e3\r\n\r\n")
        status, headers, body = await _raw(reader)
        assert _assert_fixed(status, headers, body, "invalid_framing") == "bad-1"
        assert "Invalid character in Content-Length" in await _log_line(rp, "bad-1")
        writer.close()
        # Garbage from the first byte: no id to repeat, a new one.
        reader, writer = await asyncio.open_connection("127.0.0.1", rp.port)
        writer.write(b"NOT HTTP AT ALL\r\n\r\n")
        status, headers, body = await _raw(reader)
        rid = _assert_fixed(status, headers, body, "bad_request")
        assert "Invalid method" in await _log_line(rp, rid)
        writer.close()
        async with aiohttp.ClientSession() as http:
            big = {**CHAT, "messages": [{"role": "user", "content": "x" * 2000}]}
            async with http.post(
                f"{rp.base}/v1/chat/completions", json=big, headers={"X-Request-Id": "big"}
            ) as r:
                _assert_fixed(r.status, r.headers, await r.read(), "request_too_large")
            assert "--max-body-bytes 1000" in await _log_line(rp, "big")
            # The model check is the API's: its message names the mistake, and the id is there too.
            async with http.post(f"{rp.base}/v1/chat/completions", json={**CHAT, "model": "nope"}) as r:
                assert r.status == 404
                assert (await r.json())["error"]["code"] == "model_not_found"
                assert r.headers["X-Request-Id"]
        reader, writer = await asyncio.open_connection("127.0.0.1", rp.port)
        writer.write(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: r\r\nX-Request-Id: slow\r\nContent-Length: 100\r\n\r\n{"
        )
        status, headers, body = await _raw(reader)
        _assert_fixed(status, headers, body, "request_timeout")
        assert "did not arrive within 1s" in await _log_line(rp, "slow")
        writer.close()
    assert v1.seen == []
    assert v2.seen == []


async def test_without_a_table_the_answers_are_fixed_and_carry_an_id_too() -> None:
    async with running_router(None) as (base, _), aiohttp.ClientSession() as http:
        async with http.get(f"{base}/v1/models", headers={"X-Request-Id": "early"}) as r:
            assert _assert_fixed(r.status, r.headers, await r.read(), "no_routing_table") == "early"
        async with http.get(f"{base}/etc/passwd") as r:
            _assert_fixed(r.status, r.headers, await r.read(), "not_found")
        reader, writer = await asyncio.open_connection("127.0.0.1", int(base.rsplit(":", 1)[1]))
        writer.write(b"GET /v1/../metrics HTTP/1.1\r\nHost: r\r\n\r\n")
        status, headers, body = await _raw(reader)
        _assert_fixed(status, headers, body, "invalid_path")
        writer.close()


async def _raw(reader: asyncio.StreamReader) -> tuple[int, dict[str, str], bytes]:
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), WAIT)
    lines = head.decode("latin-1").split("\r\n")
    headers = dict(line.split(": ", 1) for line in lines[1:] if line)
    body = await asyncio.wait_for(reader.readexactly(int(headers["Content-Length"])), WAIT)
    return int(lines[0].split()[1]), headers, body
