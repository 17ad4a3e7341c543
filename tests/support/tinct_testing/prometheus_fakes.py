"""Prometheus stand-ins for unit tests: real HTTP servers on 127.0.0.1.

:class:`FakePrometheus` answers ``/api/v1/query`` the way Prometheus would for the queries
tinct sends (``sum by (...) (increase(metric{matchers}[window]))`` and
``min(metric{matchers})``) over fixed series, each given as its increase over the window (or,
for a gauge, its value); other queries answer what ``custom`` maps them to. Its ``mode``
makes it misbehave instead: hang, drip its answer, answer a huge body, an error with a
secret in it, or something that is not JSON.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
from collections.abc import Iterable
from typing import Any

from aiohttp import web

#: (metric name, labels, value over the window)
Series = tuple[str, dict[str, str], float]

#: A string each misbehaving answer carries, in its body and headers: no message may show it.
SECRET = "s3cr3t-token-7f1e"
MiB = 1024 * 1024

_SUM_BY = re.compile(r"^sum by \(([^)]*)\) \(increase\((\w+)\{(.*)\}\[(\w+)\]\)\)$")
_MIN = re.compile(r"^min\((\w+)\{(.*)\}\)$")
_MATCHER = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def vec(metric: dict[str, str], value: float) -> dict[str, Any]:
    """One sample of an instant query's result, as Prometheus' HTTP API gives it."""
    return {"metric": metric, "value": [1700000000.0, str(value)]}


def buckets(side: str, tag: str, counts: dict[str, float]) -> list[dict[str, Any]]:
    """A histogram's buckets of one side and dye tag (``le`` -> count) as result rows."""
    return [vec({"side": side, "dye_tag": tag, "le": le}, n) for le, n in counts.items()]


def merged(*parts: dict[str, list[dict[str, Any]]]) -> dict[str, list[dict[str, Any]]]:
    """The rows of each query name over all ``parts``."""
    out: dict[str, list[dict[str, Any]]] = {}
    for p in parts:
        for k, rows in p.items():
            out.setdefault(k, []).extend(rows)
    return out


def _matchers(text: str) -> dict[str, str]:
    return {k: re.sub(r"\\(.)", r"\1", v) for k, v in _MATCHER.findall(text)}


def _number(v: float) -> str:
    return {float("inf"): "+Inf", float("-inf"): "-Inf"}.get(v, "NaN" if v != v else repr(v))


def vector(rows: Iterable[tuple[dict[str, str], float]]) -> dict[str, Any]:
    result = [{"metric": m, "value": [1767225600.0, _number(v)]} for m, v in rows]
    return {"status": "success", "data": {"resultType": "vector", "result": result}}


def answer(promql: str, series: Iterable[Series], custom: dict[str, Any]) -> dict[str, Any]:
    """What Prometheus answers for ``promql`` over ``series``."""
    if promql in custom:
        got = custom[promql]
        return got if isinstance(got, dict) else vector([({}, float(got))])
    if m := _SUM_BY.match(promql):
        by = [label.strip() for label in m.group(1).split(",")]
        name, want = m.group(2), _matchers(m.group(3))
        sums: dict[tuple[str, ...], float] = {}
        for metric, labels, value in series:
            if metric == name and all(labels.get(k) == v for k, v in want.items()):
                key = tuple(labels.get(label, "") for label in by)
                sums[key] = sums.get(key, 0.0) + value
        return vector(({k: v for k, v in zip(by, key, strict=True) if v}, n) for key, n in sums.items())
    if m := _MIN.match(promql):
        name, want = m.group(1), _matchers(m.group(2))
        values = [
            v
            for metric, labels, v in series
            if metric == name and all(labels.get(k) == x for k, x in want.items())
        ]
        return vector([({}, min(values))] if values else [])
    return {"status": "error", "errorType": "bad_data", "error": "the stand-in does not know this query"}


class FakePrometheus:
    """One stand-in server; ``async with FakePrometheus(...) as prom: prom.url``."""

    def __init__(
        self,
        series: Iterable[Series] = (),
        *,
        custom: dict[str, Any] | None = None,
        mode: str = "ok",
        body: bytes = b"",
    ) -> None:
        self.series = list(series)
        self.custom = custom or {}
        self.mode = mode
        self.body = body
        self.queries: list[dict[str, str]] = []
        self.url = ""
        self._released = asyncio.Event()
        self._runner: web.AppRunner | None = None

    async def __aenter__(self) -> FakePrometheus:
        app = web.Application()
        app.router.add_get("/api/v1/query", self._query)
        self._runner = web.AppRunner(app, shutdown_timeout=1.0, handle_signals=False)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        host, port = self._runner.addresses[0][:2]
        self.url = f"http://{host}:{port}"
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._released.set()
        if self._runner is not None:
            await self._runner.cleanup()

    async def _query(self, request: web.Request) -> web.StreamResponse:
        self.queries.append(dict(request.query))
        ok = json.dumps(answer(request.query.get("query", ""), self.series, self.custom)).encode()
        if self.mode == "hang":
            await self._released.wait()
            return web.Response(status=204)
        if self.mode in ("drip", "huge-chunked"):
            resp = web.StreamResponse(headers={"Content-Type": "application/json", "X-Token": SECRET})
            resp.enable_chunked_encoding()
            await resp.prepare(request)
            with contextlib.suppress(ConnectionError):
                if self.mode == "drip":  # one byte per 100 ms, forever
                    while not self._released.is_set():
                        for byte in ok:
                            await resp.write(bytes([byte]))
                            await asyncio.sleep(0.1)
                else:
                    await resp.write(b'{"status":"success","data":{"resultType":"vector","result":[')
                    for _ in range(10 * 16):
                        await resp.write(b" " * (MiB // 16))
                    await resp.write(b"]}}")
            return resp
        if self.mode == "huge":
            padding = b" " * (10 * MiB)
            return web.Response(body=ok[:-1] + padding + ok[-1:], content_type="application/json")
        if self.mode == "error":
            doc = {"status": "error", "errorType": "unavailable", "error": f"overloaded {SECRET}"}
            return web.json_response(doc, status=503, reason=f"Busy {SECRET}", headers={"X-Token": SECRET})
        if self.mode == "error-hang":  # the status, then nothing
            resp = web.StreamResponse(status=503, headers={"Content-Type": "application/json"})
            resp.enable_chunked_encoding()
            await resp.prepare(request)
            await resp.write(b'{"status":"error","errorType":')
            await self._released.wait()
            return resp
        if self.mode == "garbage":
            return web.Response(text=f"<html>{SECRET}</html>", content_type="text/html")
        if self.mode == "body":
            return web.Response(body=self.body, content_type="application/json")
        return web.Response(
            body=ok, status=400 if b'"status": "error"' in ok else 200, content_type="application/json"
        )
