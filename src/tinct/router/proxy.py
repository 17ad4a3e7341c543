"""Forward a request to stable or candidate and stream the answer back.

The candidate is tried first when the sticky choice says so; the proxy falls back to stable
*in the same request* when the candidate answers 5xx (``upstream_error``) or 426
(``version_mismatch``), cannot be connected (``unreachable``), or sends no response headers
within the table's ``latencyMs`` (``latency_too_high``). While it is ejected the candidate is
not tried at all (``ejected``).

Backends are bounded like clients: an answer whose head is over the limits
(:data:`~tinct.router.upstream.MAX_RESPONSE_HEAD`,
:data:`~tinct.router.upstream.MAX_RESPONSE_HEADERS`), that does not parse, or (stable) whose
head is not in within ``upstream_head_timeout`` is refused while nothing of it reached the
client: stable's with a ``502 bad_gateway``, the candidate's with a fallback to stable
(``upstream_error``, counted towards ejection). Each refusal is counted in
``tinct_router_upstream_rejected_total``.

A fallback is only possible before the first byte went to the client: the candidate's
headers decide it, and once they are accepted the body is streamed through as it arrives
(SSE events chunk by chunk, no buffering). A candidate that fails *after* that cannot be
retried — the client has already seen part of an answer — so the proxy cuts the client
connection, which a client sees as a truncated stream, and counts an ``upstream_error``
towards ejection.

While the router measures tokens, each classified answer passes a
:class:`~tinct.router.tokens.Meter` *after* every chunk went to the client's transport: the
time to first token, the gaps between tokens, the output tokens and the API contract are
read off the bytes already sent, never holding one back. A stream's chunks are only stamped
and queued as they pass, and read together a little later
(:class:`~tinct.router.tokens.MeterSweep`): work right after a chunk's write delays its client.

A mirrored request (:mod:`tinct.router.shadow`) has stable's answer teed the same way: each
chunk goes to the client's transport first, then to the mirror's bounded copy; the proxy
tells the mirror when stable's answer ended, whole or not.

Requests are sent with ``X-Scheduler-Version`` of the chosen side (and never with a
client's ``X-Tinct-Shadow``, which marks mirrors); answers carry
``X-Scheduler-Active`` (the version that answered) and ``X-Fallback-Reason`` after a
fallback. Hop-by-hop headers are dropped both ways; bodies pass unchanged (no
decompression), so ``Content-Encoding`` stays true. The backend's ``Date`` is kept.
"""

from __future__ import annotations

import logging
import time

from tinct.router import adapter as adapter_
from tinct.router.exchange import Exchange
from tinct.router.fallback import CandidateHealth, Reason, reason_for_status
from tinct.router.framing import FramingError
from tinct.router.metrics import RouterMetrics
from tinct.router.request import Body, BodyTimeoutError
from tinct.router.response import (
    ClientBodyError,
    Response,
    Sink,
    UpstreamConnectError,
    UpstreamError,
    UpstreamIdleError,
    UpstreamRejectedError,
    UpstreamTimeoutError,
)
from tinct.router.table import CompiledTable, Upstream
from tinct.router.upstream import UpstreamPool
from tinct.router.wire import HOP_BY_HOP_B, Fields, RawHeaders

_log = logging.getLogger(__name__)

#: Sent to the chosen backend: the scheduler version the table names for its side.
SCHEDULER_VERSION = b"X-Scheduler-Version"
#: On every answer from a backend: the scheduler version of the side that answered.
SCHEDULER_ACTIVE = b"X-Scheduler-Active"
#: On an answer after a fallback (or a 502 from stable after one): why the candidate's was not taken.
FALLBACK_REASON = b"X-Fallback-Reason"

#: ``Upgrade`` of a 426 whose backend named no protocol: the scheduler protocol that
#: ``X-Scheduler-Version`` negotiates.
UPGRADE_TO = b"tinct-scheduler"

#: Marks a mirrored request (:mod:`tinct.router.shadow`); a client's own never reaches a backend.
SHADOW = b"X-Tinct-Shadow"

_DROP_REQUEST = HOP_BY_HOP_B | {
    b"host",
    b"content-length",
    b"expect",
    SCHEDULER_VERSION.lower(),
    SHADOW.lower(),
}
_DROP_RESPONSE = HOP_BY_HOP_B | {b"content-length", b"server"}
_XFF = b"x-forwarded-for"


def forward_headers(fields: Fields, hops: frozenset[bytes], remote: str | None) -> bytes:
    """The client's request headers as sent upstream (header lines): hop-by-hop (standard
    and ``hops``), Host, length and any ``X-Scheduler-Version`` and ``X-Tinct-Shadow``
    removed, ``X-Forwarded-For`` extended."""
    drop = _DROP_REQUEST | hops if hops else _DROP_REQUEST
    out: list[bytes] = []
    prior: bytes | None = None
    for n, name, value in fields:
        if n in drop:
            continue
        if n == _XFF:
            if prior is None:
                prior = value
            continue
        out.append(b"%b: %b\r\n" % (name, value))
    if remote:
        r = remote.encode()
        out.append(b"X-Forwarded-For: %b\r\n" % (prior + b", " + r if prior else r))
    elif prior is not None:
        out.append(b"X-Forwarded-For: %b\r\n" % prior)
    return b"".join(out)


def _answer_headers(resp: Response) -> tuple[RawHeaders, bool]:
    """The backend's answer headers as sent to the client, and whether they carry a Date."""
    drop = _DROP_RESPONSE | resp.hops if resp.hops else _DROP_RESPONSE
    out: RawHeaders = []
    has_date = False
    for n, name, value in resp.headers:
        if n not in drop:
            out.append((name, value))
            if n == b"date":
                has_date = True
    return out, has_date


def _upgrade_headers(resp: Response) -> RawHeaders:
    """``Upgrade`` for a 426 relayed to the client, as RFC 9110 §15.5.22 requires (with the
    ``Upgrade`` connection option, §7.8): the backend's own value, else :data:`UPGRADE_TO`."""
    value = b", ".join(v for n, _, v in resp.headers if n == b"upgrade" and v.strip()) or UPGRADE_TO
    return [(b"Upgrade", value), (b"Connection", b"Upgrade")]


class Proxy:
    """Sends requests upstream over one keep-alive connection pool and streams answers back."""

    def __init__(
        self,
        pool: UpstreamPool,
        metrics: RouterMetrics,
        *,
        head_timeout: float = 300.0,
        measure_tokens: bool = True,
    ) -> None:
        self.pool = pool
        self.metrics = metrics
        #: Read tokens, their timing and the contract off classified answers.
        self.measure_tokens = measure_tokens
        #: Seconds until stable's response head must be in (the candidate has latencyMs).
        self.head_timeout = head_timeout
        self._health: dict[tuple[str, str, str, str, int, float], CandidateHealth] = {}

    def health(self, table: CompiledTable) -> CandidateHealth:
        """Ejection state of the table's candidate, per (namespace, release); kept across
        table swaps that keep the candidate and its fallback rules."""
        key = table.health_key
        h = self._health.get(key)
        if h is None:
            release = key[:2]
            self._health = {k: v for k, v in self._health.items() if k[:2] != release}
            h = self._health[key] = CandidateHealth(table.consecutive_failures, table.cooldown)
            gauge = self.metrics.ejected.labels(table.namespace, table.release)
            gauge.set_function(lambda: 1.0 if h.ejected() else 0.0)
        return h

    async def _send(
        self, up: Upstream, ex: Exchange, headers: bytes, timeout: float | None, sent: bytes | None = None
    ) -> Response:
        """``ex``'s request sent to ``up``; its head in within ``timeout`` seconds, else
        :class:`~tinct.router.response.UpstreamTimeoutError`. A request the pool sends again
        (a reused connection the backend had closed) is counted in
        ``tinct_router_upstream_retries_total``."""
        request = ex.request
        head_only = request.method == "HEAD"
        lines = b"Host: %b\r\n%b%b: %b\r\n" % (up.authority, headers, SCHEDULER_VERSION, up.version_b)
        target = up.prefix + request.target
        body: bytes | Body | None = ex.body if sent is None else sent
        if body is None:
            rb = request.body
            if rb.done:  # the whole body (or none) is in already: one write, and replayable
                data = await rb.read_all(1 << 62)
                body = data if data or request.has_body else None
            else:
                body = rb
        table, side = ex.table, up.side
        return await self.pool.request(
            up.origin,
            request.method,
            target,
            lines,
            body,
            chunked=request.chunked,
            head_only=head_only,
            timeout=timeout,
            retried=lambda: self.metrics.upstream_retry(table, side),
        )

    async def _try_candidate(
        self, ex: Exchange, headers: bytes
    ) -> tuple[Response | None, Reason | None, Upstream]:
        table = ex.table
        health = self.health(table)
        up, sent = table.candidate, None
        if health.ejected():
            return None, "ejected", up
        route = table.adapter
        if route is not None:
            pod = route.pick()
            rewritten = adapter_.with_model(ex.body or b"", route.served) if pod is not None else None
            if pod is None or rewritten is None:
                return None, "adapter_missing", up
            up, (sent, ex.base_model) = pod, rewritten
        try:
            resp = await self._send(up, ex, headers, table.latency_limit, sent)
        except (UpstreamError, OSError) as e:
            reason: Reason = (
                "latency_too_high"
                if isinstance(e, UpstreamTimeoutError)
                else "unreachable"
                if isinstance(e, UpstreamConnectError)
                else "upstream_error"
            )
            _log.debug("candidate failed (%s): %r", reason, e)
            if isinstance(e, UpstreamRejectedError):
                self._rejected(ex, "candidate", e)
        else:
            reason_ = reason_for_status(resp.status)
            if reason_ is None and route is not None:
                reason_ = adapter_.reason_for_adapter(resp.status)
            if reason_ == "version_mismatch":
                self.metrics.version_mismatch(table, "candidate")
            failed = resp.failed
            if reason_ is None and failed is not None:
                # Broken right after its head, and nothing of it went to the client yet.
                _log.debug("candidate failed after its head: %r", failed)
                if isinstance(failed, UpstreamRejectedError):
                    self._rejected(ex, "candidate", failed)
                reason_ = "upstream_error"
            if reason_ is None:
                health.success()
                return resp, None, up
            resp.close()
            reason = reason_
        if reason != "latency_too_high":
            # What the fallback cost is the candidate's (the latency limit is accounted for
            # apart, by the analysis).
            self.metrics.candidate_failed(ex, time.perf_counter() - ex.started)
        self.metrics.candidate_failure(table, reason)
        if health.failure():
            self.metrics.ejection(table)
            _log.warning(
                "candidate %s (%s) ejected for %.0fs after %d consecutive failures, last: %s",
                table.candidate.url,
                table.candidate.scheduler_version,
                table.cooldown,
                table.consecutive_failures,
                reason,
            )
        ex.base_model = None
        return None, reason, up

    async def forward(self, ex: Exchange) -> None:
        """Answer ``ex.request`` from the chosen side, falling back to stable as documented.

        ``ex.body`` is the already-read body of a classified request, or None to stream the
        client's body through (other endpoints, which only go to stable).
        """
        request = ex.request
        table = ex.table
        headers = forward_headers(request.fields, request.hops, request.remote)
        resp: Response | None = None
        reason: Reason | None = None
        up = table.stable
        if ex.candidate and ex.body is not None:
            resp, reason, tried = await self._try_candidate(ex, headers)
            if resp is not None:
                up = tried
            else:
                self.metrics.fallback(table, reason or "upstream_error", ex.tag)
        ex.side = up.side
        ex.scheduler_version = up.scheduler_version
        # Stable's time to first byte after a fallback is its own, from its attempt on.
        since = ex.started if reason is None else time.perf_counter()
        if resp is None:
            try:
                try:
                    resp = await self._send(up, ex, headers, self.head_timeout)
                except UpstreamTimeoutError:
                    raise UpstreamRejectedError(
                        "head_timeout", f"no response head within {self.head_timeout:g}s"
                    ) from None
                failed = resp.failed
                if failed is not None:  # broken right after its head; the client has nothing yet
                    resp.close()
                    raise failed
            except ClientBodyError as e:
                self._client_failed(ex, e)
                return
            except (UpstreamError, TimeoutError, OSError) as e:
                if isinstance(e, UpstreamRejectedError):
                    self._rejected(ex, "stable", e)
                    code = "bad_gateway"
                else:
                    code = "stable_unavailable"
                extra = [(FALLBACK_REASON, reason.encode())] if reason else None
                detail = f"stable {up.url} failed: {e!r}"
                ex.status = ex.conn.refuse(code, detail, extra, level=logging.WARNING)
                self.metrics.request(ex)
                return
        await self._stream(ex, resp, up, reason, since)

    def _client_failed(self, ex: Exchange, e: ClientBodyError) -> None:
        """The client's streamed body failed before stable answered: its fault, not stable's."""
        conn, cause = ex.conn, e.cause
        conn.close_after_response = True
        if isinstance(cause, ConnectionError):
            conn.abort()  # the client is gone: nobody to answer
            return
        code = (
            cause.code
            if isinstance(cause, FramingError)
            else "request_timeout"
            if isinstance(cause, BodyTimeoutError)
            else "bad_request"
        )
        ex.status = conn.refuse(code, str(e))
        self.metrics.request(ex)

    def _rejected(self, ex: Exchange, side: str, e: UpstreamRejectedError) -> None:
        table = ex.table
        self.metrics.upstream_rejected.labels(table.namespace, table.release, side, e.reason).inc()

    async def _stream(
        self, ex: Exchange, resp: Response, up: Upstream, reason: Reason | None, since: float
    ) -> None:
        conn = ex.conn
        table = ex.table
        headers, has_date = _answer_headers(resp)
        if resp.status == 426:
            self.metrics.version_mismatch(table, up.side)
            headers += _upgrade_headers(resp)
        headers.append((SCHEDULER_ACTIVE, up.version_b))
        if reason is not None:
            headers.append((FALLBACK_REASON, reason.encode()))
        ex.status = resp.status
        length = resp.content_length
        write = conn.write
        back: adapter_.NameBack | None = None
        if ex.base_model is not None and up.side == "candidate":
            # The adapter answers under its served name; the client hears the name it sent.
            back = adapter_.NameBack(
                ex.table.adapter.served if ex.table.adapter else "", ex.base_model, write
            )
            write, length = back, None
        meter = None
        if ex.body is not None:
            if self.measure_tokens:
                meter = ex.meter = self.metrics.meter(ex, resp.status, resp.event_stream is True, ex.stream)
            # No retry once an answer is taken: a long prompt is not held for a whole stream.
            ex.body = b""
        complete = False
        mirror = ex.mirror
        try:
            conn.start_response(resp.status, headers, length, resp.reason, has_date)
            ex.ttfb = time.perf_counter() - since
            conn.source = resp
            sink: Sink
            if meter is None:
                sink = write
            else:
                feed = meter.feed

                def measured(data: bytes) -> None:
                    write(data)  # to the client first: measuring never holds a byte back
                    feed(data)

                sink = measured

            if mirror is not None:  # teed after the client's write: the copy holds nothing back
                sink = mirror.tee(resp, sink)
            resp.headers = []  # sent (and teed): a stream need not hold them (trailers would land here)
            done = resp.stream(sink, table.idle_timeout)
            if done is not None:
                conn.send_head()  # the client learns the answer started even if the body waits
                await done
            if back is not None:
                back.flush()
            conn.end_response()
            complete = True
        except ClientBodyError as e:
            # The backend answered early and the client's body then broke: cut, as there
            # is no telling what the backend read; nothing to count against it.
            _log.info("request %s: %s", ex.request.rid.decode(), e)
            conn.abort()
        except UpstreamError as e:
            # Bytes may already be with the client: no retry. Cut the connection so the
            # client sees a truncated answer instead of a well-formed short one.
            why = "idle_timeout" if isinstance(e, UpstreamIdleError) else "upstream_error"
            _log.warning("%s %s failed mid-answer (%s), no retry possible: %s", up.side, up.url, why, e)
            self.metrics.truncated.labels(table.namespace, table.release, up.side, why, ex.tag).inc()
            if up.side == "candidate":
                self.metrics.candidate_failure(table, "truncated" if why == "upstream_error" else why)
                if self.health(table).failure():
                    self.metrics.ejection(table)
            conn.abort()
        finally:
            conn.source = None
            resp.close()
            if meter is not None:
                meter.finish(complete)
            if mirror is not None:
                mirror.stable_ended(complete)
            self.metrics.request(ex)


__all__ = [
    "FALLBACK_REASON",
    "SCHEDULER_ACTIVE",
    "SCHEDULER_VERSION",
    "SHADOW",
    "Proxy",
    "forward_headers",
]
