"""Forward a request to stable or candidate and stream the answer back.

The candidate is tried first when the sticky choice says so; the proxy falls back to stable
*in the same request* when the candidate answers 5xx (``upstream_error``) or 426
(``version_mismatch``), cannot be connected (``unreachable``), or sends no response headers
within the table's ``latencyMs`` (``latency_too_high``). While it is ejected the candidate is
not tried at all (``ejected``).

A fallback is only possible before the first byte went to the client: the candidate's
headers decide it, and once they are accepted the body is streamed through as it arrives
(SSE events chunk by chunk, no buffering). A candidate that fails *after* that cannot be
retried — the client has already seen part of an answer — so the proxy cuts the client
connection, which a client sees as a truncated stream, and counts an ``upstream_error``
towards ejection.

Requests are sent with ``X-Scheduler-Version`` of the chosen side; answers carry
``X-Scheduler-Active`` (the version that answered) and ``X-Fallback-Reason`` after a
fallback. Hop-by-hop headers are dropped both ways; bodies pass unchanged (no
decompression), so ``Content-Encoding`` stays true.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from typing import Any

import aiohttp
from aiohttp import web
from multidict import CIMultiDict
from yarl import URL

from tinct.router.fallback import CandidateHealth, Reason, reason_for_status
from tinct.router.metrics import RouterMetrics
from tinct.router.table import CompiledTable, Upstream

_log = logging.getLogger(__name__)

SCHEDULER_VERSION = "X-Scheduler-Version"
SCHEDULER_ACTIVE = "X-Scheduler-Active"
FALLBACK_REASON = "X-Fallback-Reason"

#: RFC 9110 §7.6.1 connection-specific headers, plus the legacy ones proxies drop.
HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "proxy-connection",
        "te",
        "trailer",
        "trailers",
        "transfer-encoding",
        "upgrade",
    }
)
_DROP_REQUEST = HOP_BY_HOP | {"host", "content-length", "expect"}
_DROP_RESPONSE = HOP_BY_HOP | {"content-length", "date", "server"}
#: Headers aiohttp's client would invent; the proxy sends only what the client sent.
SKIP_AUTO_HEADERS = frozenset({"Accept", "Accept-Encoding", "User-Agent"})


def _dropped(headers: Any, base: frozenset[str]) -> frozenset[str]:
    conn = headers.get("Connection")
    if not conn:
        return base
    return base | {t.strip().lower() for t in conn.split(",")}


def forward_headers(headers: Any, remote: str | None) -> CIMultiDict[str]:
    """The client's request headers as sent upstream: hop-by-hop, Host and length removed."""
    drop = _dropped(headers, _DROP_REQUEST)
    out: CIMultiDict[str] = CIMultiDict()
    for k, v in headers.items():
        if k.lower() not in drop:
            out.add(k, v)
    if remote:
        prior = out.get("X-Forwarded-For")
        out["X-Forwarded-For"] = f"{prior}, {remote}" if prior else remote
    return out


def error_response(
    status: int, code: str, message: str, headers: dict[str, str] | None = None
) -> web.Response:
    """An OpenAI-shaped JSON error."""
    body = {"error": {"message": message, "type": "router_error", "code": code}}
    return web.Response(
        status=status, text=json.dumps(body), content_type="application/json", headers=headers
    )


def _failure_reason(exc: BaseException, timed_out: bool) -> Reason:
    if timed_out:
        return "latency_too_high"
    if isinstance(exc, aiohttp.ClientConnectorError | aiohttp.ConnectionTimeoutError):
        return "unreachable"
    return "upstream_error"


class Proxy:
    """Sends requests upstream over one keep-alive connection pool and streams answers back."""

    def __init__(self, session: aiohttp.ClientSession, metrics: RouterMetrics) -> None:
        self.session = session
        self.metrics = metrics
        self._health: dict[tuple[str, str, str, int, float], CandidateHealth] = {}

    def health(self, table: CompiledTable) -> CandidateHealth:
        """Ejection state of the table's candidate; kept across table swaps that keep it."""
        key = (
            table.release,
            str(table.candidate.url),
            table.candidate.scheduler_version,
            table.consecutive_failures,
            table.cooldown,
        )
        h = self._health.get(key)
        if h is None:
            self._health = {k: v for k, v in self._health.items() if k[0] != table.release}
            h = self._health[key] = CandidateHealth(table.consecutive_failures, table.cooldown)
            gauge = self.metrics.ejected.labels(table.release)
            gauge.set_function(lambda: 1.0 if h.ejected() else 0.0)
        return h

    async def _send(
        self, up: Upstream, request: web.Request, headers: CIMultiDict[str], data: Any
    ) -> aiohttp.ClientResponse:
        headers[SCHEDULER_VERSION] = up.scheduler_version
        url = URL(str(up.url) + request.raw_path, encoded=True)
        return await self.session.request(
            request.method,
            url,
            headers=headers,
            data=data,
            allow_redirects=False,
        )

    async def _try_candidate(
        self,
        table: CompiledTable,
        request: web.Request,
        headers: CIMultiDict[str],
        body: bytes,
    ) -> tuple[aiohttp.ClientResponse | None, Reason | None]:
        health = self.health(table)
        if health.ejected():
            return None, "ejected"
        timeout = asyncio.timeout(table.latency_limit)
        try:
            async with timeout:
                resp = await self._send(table.candidate, request, headers, body)
        except (aiohttp.ClientError, TimeoutError, OSError) as e:
            reason = _failure_reason(e, timeout.expired())
            _log.debug("candidate failed (%s): %r", reason, e)
        else:
            reason_ = reason_for_status(resp.status)
            if reason_ is None:
                health.success()
                return resp, None
            resp.close()
            reason = reason_
        if health.failure():
            self.metrics.ejection(table.release)
            _log.warning(
                "candidate %s (%s) ejected for %.0fs after %d consecutive failures, last: %s",
                table.candidate.url,
                table.candidate.scheduler_version,
                table.cooldown,
                table.consecutive_failures,
                reason,
            )
        return None, reason

    async def forward(
        self,
        request: web.Request,
        body: bytes | None,
        table: CompiledTable,
        tag: str,
        candidate: bool,
        started: float,
    ) -> web.StreamResponse:
        """Answer ``request`` from the chosen side, falling back to stable as documented.

        ``body`` is the already-read body of a classified request, or None to stream the
        client's body through (other endpoints, which only go to stable).
        """
        headers = forward_headers(request.headers, request.remote)
        resp: aiohttp.ClientResponse | None = None
        reason: Reason | None = None
        up = table.stable
        if candidate and body is not None:
            resp, reason = await self._try_candidate(table, request, headers, body)
            if resp is not None:
                up = table.candidate
            else:
                self.metrics.fallback(table.release, reason or "upstream_error", tag)
        if resp is None:
            data: Any = body if body is not None else (request.content if request.body_exists else None)
            if body is None and "Content-Length" in request.headers:
                headers["Content-Length"] = request.headers["Content-Length"]
            try:
                resp = await self._send(up, request, headers, data)
            except (aiohttp.ClientError, TimeoutError, OSError) as e:
                _log.warning("stable %s failed: %r", up.url, e)
                extra: dict[str, str] | None = {FALLBACK_REASON: reason} if reason else None
                err = error_response(502, "stable_unavailable", f"stable backend failed: {e!r}", extra)
                self.metrics.request(
                    table.release,
                    up.side,
                    up.scheduler_version,
                    tag,
                    502,
                    None,
                    time.perf_counter() - started,
                )
                return err
        return await self._stream(request, resp, table, up, tag, reason, started)

    async def _stream(
        self,
        request: web.Request,
        resp: aiohttp.ClientResponse,
        table: CompiledTable,
        up: Upstream,
        tag: str,
        reason: Reason | None,
        started: float,
    ) -> web.StreamResponse:
        out = web.StreamResponse(status=resp.status, reason=resp.reason)
        drop = _dropped(resp.headers, _DROP_RESPONSE)
        oh = out.headers
        for k, v in resp.headers.items():
            if k.lower() not in drop:
                oh.add(k, v)
        oh[SCHEDULER_ACTIVE] = up.scheduler_version
        if reason is not None:
            oh[FALLBACK_REASON] = reason
        chunked = "chunked" in resp.headers.get("Transfer-Encoding", "").lower()
        if resp.content_length is not None and not chunked:
            out.content_length = resp.content_length
        ttfb: float | None = None
        try:
            await out.prepare(request)
            ttfb = time.perf_counter() - started
            async for chunk in resp.content.iter_any():
                await out.write(chunk)
            await out.write_eof()
        except (ConnectionResetError, aiohttp.ClientConnectionResetError):
            _log.debug("client went away during the answer from %s", up.url)
        except (aiohttp.ClientError, TimeoutError, OSError) as e:
            # Bytes may already be with the client: no retry. Cut the connection so the
            # client sees a truncated answer instead of a well-formed short one.
            _log.warning("%s failed mid-answer, no retry possible: %r", up.url, e)
            if up.side == "candidate" and self.health(table).failure():
                self.metrics.ejection(table.release)
            if request.transport is not None:
                request.transport.close()
        finally:
            resp.release()
            self.metrics.request(
                table.release,
                up.side,
                up.scheduler_version,
                tag,
                resp.status,
                ttfb,
                time.perf_counter() - started,
            )
        return out


__all__ = [
    "FALLBACK_REASON",
    "HOP_BY_HOP",
    "SCHEDULER_ACTIVE",
    "SCHEDULER_VERSION",
    "SKIP_AUTO_HEADERS",
    "Proxy",
    "error_response",
    "forward_headers",
]
