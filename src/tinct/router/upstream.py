"""The router's upstream HTTP/1.1 client: a keep-alive connection pool, parsed by httptools.

:meth:`UpstreamPool.request` writes a request (request line, the caller's header lines, the
body's framing, the body) on an idle connection (or a new one) and returns the :class:`Response` once its head arrived. The body then goes straight from the
connection's ``data_received`` to a sink (the client's connection) chunk by chunk, with no
task in between; bytes that arrive before the sink is attached are held until it is.

A connection goes back to the pool when its response is complete, both sides agreed to keep
it alive and the request was sent whole. A request that fails on a *reused* connection
before any response byte came back (the backend closed an idle connection as it was being
reused) is sent once more on a new connection when its body can be replayed.

Backends are untrusted input, bounded like clients: a response head (status line and header
section) over :data:`MAX_RESPONSE_HEAD` bytes or :data:`MAX_RESPONSE_HEADERS` header lines is
refused as it arrives (bytes are counted as they come, so a header value sent without end
is cut at the bound, not buffered), and so is an answer that does not parse; both fail with
:class:`UpstreamRejectedError`, whose ``reason`` the proxy counts.

Responses to ``HEAD`` end at their head; httptools cannot be told to skip the body a
``Content-Length`` announces, so the connection gets a fresh parser and stays in the pool.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from collections.abc import Awaitable, Callable, Mapping
from typing import Literal, TypeAlias, cast

import httptools

from tinct.router.request import Body, BodyTimeoutError
from tinct.router.wire import HOP_BY_HOP_B, LAST_CHUNK, Fields, chunk, connection_tokens

_log = logging.getLogger(__name__)

#: (host, port, TLS) of a backend: the pool's key.
Origin: TypeAlias = tuple[str, int, bool]
Sink = Callable[[bytes], None]
#: Why an answer was refused before its body: ``head_too_large``, ``malformed``,
#: ``head_timeout`` (the last one is the proxy's timer).
RejectReason = Literal["head_too_large", "malformed", "head_timeout"]

#: Bytes a response head (status line and header section, interim 1xx answers included) may
#: take, like a client's request head; counted on the wire as they arrive.
MAX_RESPONSE_HEAD = 64 * 1024
#: Header lines a response head may have.
MAX_RESPONSE_HEADERS = 256


class UpstreamError(Exception):
    """The backend failed: connection lost, malformed answer."""


class UpstreamConnectError(UpstreamError):
    """The backend could not be connected."""


class UpstreamIdleError(UpstreamError):
    """The backend sent nothing of its answer's body for the idle timeout."""


class UpstreamRejectedError(UpstreamError):
    """The backend's answer was refused: its head over the limits or too slow, or unparsable."""

    def __init__(self, reason: RejectReason, message: str) -> None:
        super().__init__(message)
        self.reason: RejectReason = reason


class _StaleError(UpstreamError):
    """Closed before any response byte: the request may be sent again."""


class Response:
    """One upstream answer: head fields once :meth:`UpstreamPool.request` returns it, then the body."""

    __slots__ = (
        "_conn",
        "_done",
        "_error",
        "_held",
        "_idle",
        "_informational",
        "_sink",
        "_timer",
        "chunked",
        "closing",
        "complete",
        "content_length",
        "head",
        "head_lines",
        "head_only",
        "head_seen",
        "head_size",
        "headers",
        "hops",
        "keep_alive",
        "pump",
        "reason",
        "started",
        "status",
    )

    def __init__(self, conn: UpstreamConnection, head_only: bool) -> None:
        self._conn: UpstreamConnection | None = conn
        self.head: asyncio.Future[None] = conn.loop.create_future()
        self.head_only = head_only
        self.status = 0
        self.reason = b""
        self.headers: Fields = []
        self.content_length: int | None = None
        self.chunked = False
        #: Header names the backend's ``Connection`` header makes hop-by-hop (beyond the standard ones).
        self.hops: frozenset[bytes] = frozenset()
        #: The backend said ``Connection: close``.
        self.closing = False
        self.keep_alive = False
        self.complete = False
        #: Any byte of this answer came back.
        self.started = False
        #: Bytes received while the head was incomplete (whole reads, counted after each).
        self.head_seen = 0
        #: Bytes of the parsed head (status reason and header lines) and its header lines.
        self.head_size = 0
        self.head_lines = 0
        self.pump: asyncio.Task[None] | None = None
        self._informational = False
        self._held: list[bytes] = []
        self._sink: Sink | None = None
        self._done: asyncio.Future[None] | None = None
        self._error: UpstreamError | None = None
        self._idle = 0.0
        self._timer: asyncio.TimerHandle | None = None

    # --- fed by the connection ---------------------------------------------------------

    def _got_head(self, status: int, keep_alive: bool) -> None:
        self.status = status
        self.keep_alive = keep_alive and not self.closing
        if self.chunked:
            self.content_length = None
        if not self.head.done():
            self.head.set_result(None)

    def _body(self, data: bytes) -> None:
        sink = self._sink
        if sink is not None:
            sink(data)
        else:
            self._held.append(data)

    def _complete(self) -> None:
        self.complete = True
        self._conn = None
        self._stop_timer()
        d = self._done
        if d is not None and not d.done():
            d.set_result(None)

    def _fail(self, exc: UpstreamError) -> None:
        self._conn = None
        self._stop_timer()
        if not self.head.done():
            self.head.set_exception(exc)
            return
        self._error = exc
        d = self._done
        if d is not None and not d.done():
            d.set_exception(exc)

    @property
    def failed(self) -> UpstreamError | None:
        """How the answer failed after its head, before any of it was sent on; None: it did not."""
        return self._error

    @property
    def until_eof(self) -> bool:
        """The body runs until the backend closes (no length, not chunked)."""
        return (
            self.content_length is None
            and not self.chunked
            and not self.head_only
            and self.status >= 200
            and self.status not in (204, 304)
        )

    # --- used by the proxy -------------------------------------------------------------

    def _stop_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _check_idle(self) -> None:
        self._timer = None
        conn = self._conn
        if conn is None or self.complete:
            return
        loop = conn.loop
        quiet = loop.time() - conn.last_data
        if conn.paused or quiet < self._idle:
            # Paused, the backend waits for the client (flow control), not the other way round.
            delay = self._idle if conn.paused else self._idle - quiet
            self._timer = loop.call_later(delay, self._check_idle)
            return
        conn.resp = None
        self._fail(UpstreamIdleError(f"the backend sent nothing for {self._idle:g}s mid-answer"))
        conn.close()

    def stream(self, sink: Sink, idle_timeout: float | None = None) -> Awaitable[None] | None:
        """Send the body to ``sink`` as it arrives; None when it is already all sent.

        The awaitable ends when the body is complete, or raises :class:`UpstreamError` when
        the backend failed mid-answer (:class:`UpstreamIdleError` when it sent nothing for
        ``idle_timeout`` seconds while the client was keeping up).
        """
        held, self._held = self._held, []
        for data in held:
            sink(data)
        if self._error is not None:
            raise self._error
        if self.complete:
            return None
        self._sink = sink
        loop = asyncio.get_running_loop()
        self._done = loop.create_future()
        if idle_timeout is not None and self._conn is not None:
            self._idle = idle_timeout
            self._timer = loop.call_later(idle_timeout, self._check_idle)
        return self._done

    def pause_reading(self) -> None:
        if self._conn is not None:
            self._conn.pause_reading()

    def resume_reading(self) -> None:
        if self._conn is not None:
            self._conn.resume_reading()

    def close(self) -> None:
        """Done with this answer: an unfinished one takes its connection down with it."""
        self._sink = None
        self._stop_timer()
        if self.pump is not None and not self.pump.done():
            self.pump.cancel()
        conn = self._conn
        if conn is not None:
            self._conn = None
            conn.close()


class UpstreamConnection(asyncio.Protocol):
    """One keep-alive connection to a backend, one request at a time."""

    def __init__(self, pool: UpstreamPool, origin: Origin) -> None:
        self.pool = pool
        self.origin = origin
        self.loop = pool.loop
        self.transport: asyncio.Transport | None = None
        self._parser = httptools.HttpResponseParser(self)
        self.resp: Response | None = None
        self.request_sent = False
        self.closed = False
        self.reused = False
        self.last_used = 0.0
        #: Loop time of the last bytes from the backend (for the idle timeout).
        self.last_data = 0.0
        self.paused = False
        self._write_paused = False
        self._drain: asyncio.Future[None] | None = None

    # --- transport events ----------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._wake_drain()
        r = self.resp
        self.resp = None
        if r is None:
            return
        if r.head.done() and r.until_eof and exc is None and r._error is None:
            r._complete()
        elif not r.started:
            r._fail(_StaleError(f"the backend closed the connection before answering ({exc!r})"))
        else:
            r._fail(UpstreamError(f"the backend closed the connection mid-answer ({exc!r})"))

    def pause_writing(self) -> None:
        self._write_paused = True

    def resume_writing(self) -> None:
        self._write_paused = False
        self._wake_drain()

    def _wake_drain(self) -> None:
        d, self._drain = self._drain, None
        if d is not None and not d.done():
            d.set_result(None)

    async def drain(self) -> None:
        if self._write_paused and not self.closed:
            self._drain = self.loop.create_future()
            await self._drain

    def data_received(self, data: bytes) -> None:
        r = self.resp
        if r is None:
            self.close()  # nothing was asked: the connection is out of step
            return
        r.started = True
        self.last_data = self.loop.time()
        in_head = not r.head.done()
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserCallbackError as e:
            cause = e.__context__
            if isinstance(cause, UpstreamRejectedError):
                self._refuse(cause)
            else:
                self._refuse(
                    UpstreamRejectedError("malformed", f"malformed answer from the backend: {cause!r}")
                )
        except httptools.HttpParserError as e:
            self._refuse(UpstreamRejectedError("malformed", f"malformed answer from the backend: {e}"))
        except httptools.HttpParserUpgrade:
            self.close()
        else:
            if in_head and self.resp is r and not r.head.done():
                r.head_seen += len(data)
                if r.head_seen > MAX_RESPONSE_HEAD:
                    self._refuse(
                        UpstreamRejectedError(
                            "head_too_large", f"the backend's response head is over {MAX_RESPONSE_HEAD} bytes"
                        )
                    )

    def _refuse(self, exc: UpstreamError) -> None:
        """Fail the answer in progress with ``exc`` and close: the connection is out of step."""
        r = self.resp
        if r is not None:
            self.resp = None
            r._fail(exc)
        self.close()

    def pause_reading(self) -> None:
        if not self.paused and self.transport is not None and not self.closed:
            self.paused = True
            self.transport.pause_reading()

    def resume_reading(self) -> None:
        if self.paused and self.transport is not None and not self.closed:
            self.paused = False
            self.last_data = self.loop.time()
            self.transport.resume_reading()

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            if self.transport is not None:
                self.transport.close()

    # --- parser callbacks ----------------------------------------------------------------

    def on_status(self, status: bytes) -> None:
        r = self.resp
        if r is not None:
            r.reason += status  # the parser may hand the reason phrase over in pieces
            r.head_size += len(status)

    def on_header(self, name: bytes, value: bytes) -> None:
        r = self.resp
        if r is None:
            return
        r.head_lines += 1
        r.head_size += len(name) + len(value) + 4
        if r.head_lines > MAX_RESPONSE_HEADERS:
            raise UpstreamRejectedError(
                "head_too_large", f"the backend's response head has over {MAX_RESPONSE_HEADERS} header lines"
            )
        if r.head_size > MAX_RESPONSE_HEAD:
            raise UpstreamRejectedError(
                "head_too_large", f"the backend's response head is over {MAX_RESPONSE_HEAD} bytes"
            )
        n = name.lower()
        r.headers.append((n, name, value))
        if n == b"content-length":
            r.content_length = int(value)
        elif n == b"transfer-encoding":
            r.chunked = b"chunked" in value.lower()
        elif n == b"connection":
            tokens = connection_tokens(value)
            r.closing = r.closing or b"close" in tokens
            r.hops |= tokens - HOP_BY_HOP_B

    def on_headers_complete(self) -> None:
        r = self.resp
        if r is None:
            return
        status = self._parser.get_status_code()
        if status == 101:
            raise UpstreamRejectedError("malformed", "the backend switched protocols unasked")
        if status < 200:
            r._informational = True  # 100 Continue and the like: skip, the answer follows
            r.headers = []
            r.reason = b""
            r.content_length = None
            r.chunked = r.closing = False
            r.hops = frozenset()
            return
        r._got_head(status, self._parser.should_keep_alive())
        if r.head_only:
            # The answer ends at its head, but the parser expects the body its length
            # announces: a fresh parser takes the connection's next answer.
            self.resp = None
            keep = r.keep_alive and self.request_sent and not self.closed
            r._complete()
            if keep:
                self._parser = httptools.HttpResponseParser(self)
                self.pool.release(self)
            else:
                self.close()

    def on_body(self, body: bytes) -> None:
        if self.resp is not None:
            self.resp._body(body)

    def on_message_complete(self) -> None:
        r = self.resp
        if r is None:
            return
        if r._informational:
            r._informational = False
            return
        self.resp = None
        keep = r.keep_alive and self.request_sent and not self.closed
        r._complete()
        if keep:
            self.resume_reading()
            self.pool.release(self)
        else:
            self.close()


class UpstreamPool:
    """Keep-alive connections per backend origin."""

    def __init__(
        self,
        *,
        connect_timeout: float,
        keep_per_origin: int = 0,
        idle_timeout: float = 60.0,
        resolve: Mapping[tuple[str, int], tuple[str, int]] | None = None,
    ) -> None:
        self.loop = asyncio.get_running_loop()
        #: (host, port) -> the (address, port) connected to instead (``tinct router --resolve``)
        self.resolve = dict(resolve or {})
        self.connect_timeout = connect_timeout
        self.keep_per_origin = keep_per_origin
        self.idle_timeout = idle_timeout
        self._idle: dict[Origin, list[UpstreamConnection]] = {}
        self._tls: ssl.SSLContext | None = None
        self._sweeper = self.loop.create_task(self._sweep(), name="tinct-upstream-idle-sweep")

    async def request(
        self,
        origin: Origin,
        method: str,
        target: bytes,
        headers: bytes,
        body: bytes | Body | None,
        *,
        chunked: bool = False,
        head_only: bool = False,
    ) -> Response:
        """Send ``method target`` with the header lines ``headers`` (each ending in CRLF) and ``body``.

        The pool writes the request line and the body's framing: ``Content-Length`` for bytes
        (none at all for None), and for a streamed :class:`Body` chunks when ``chunked``, else
        its declared length. A streamed body is sent by a task. Returns when the response head
        is in.

        Raises:
            UpstreamConnectError: no connection could be made.
            UpstreamError: the backend failed before its response head.
        """
        if isinstance(body, Body):
            framing = (
                b"Transfer-Encoding: chunked\r\n"
                if chunked
                else b"Content-Length: %d\r\n" % (body.declared or 0)
            )
        elif body is not None:
            framing = b"Content-Length: %d\r\n" % len(body)
        else:
            framing = b""
        head = b"%b %b HTTP/1.1\r\n%b%b\r\n" % (method.encode("ascii"), target, headers, framing)
        for attempt in range(2):
            conn = await self._acquire(origin)
            resp = Response(conn, head_only)
            conn.resp = resp
            assert conn.transport is not None
            if isinstance(body, Body):
                conn.request_sent = False
                conn.transport.write(head)
                resp.pump = self.loop.create_task(self._pump(conn, body, chunked))
            else:
                conn.request_sent = True
                conn.transport.write(head + body if body else head)
            try:
                await resp.head
            except _StaleError:
                resp.close()
                if attempt == 0 and conn.reused and not isinstance(body, Body):
                    _log.debug("reused connection to %s:%d was closed; sending again", origin[0], origin[1])
                    continue
                raise
            except BaseException:
                resp.close()
                raise
            return resp
        raise AssertionError("unreachable")  # pragma: no cover

    async def _pump(self, conn: UpstreamConnection, body: Body, chunked: bool) -> None:
        try:
            while True:
                data = await body.read()
                if not data:
                    break
                if conn.closed:
                    return
                assert conn.transport is not None
                conn.transport.write(chunk(data) if chunked else data)
                await conn.drain()
            if chunked and not conn.closed:
                assert conn.transport is not None
                conn.transport.write(LAST_CHUNK)
            conn.request_sent = True
        except (ConnectionError, ValueError, BodyTimeoutError) as e:
            _log.debug("request body from the client failed: %r", e)
            r = conn.resp
            conn.resp = None
            if r is not None:
                r._fail(UpstreamError(f"the request body could not be read from the client: {e}"))
            conn.close()

    async def _acquire(self, origin: Origin) -> UpstreamConnection:
        idle = self._idle.get(origin)
        if idle:
            horizon = self.loop.time() - self.idle_timeout
            while idle:
                conn = idle.pop()
                if not conn.closed and conn.last_used > horizon:
                    conn.reused = True
                    return conn
                conn.close()
        host, port, tls = origin
        address, to = self.resolve.get((host, port), (host, port))
        if tls and self._tls is None:
            self._tls = ssl.create_default_context()
        timeout = asyncio.timeout(self.connect_timeout)
        try:
            async with timeout:
                _, conn = await self.loop.create_connection(
                    lambda: UpstreamConnection(self, origin),
                    address,
                    to,
                    ssl=self._tls if tls else None,
                    server_hostname=host if tls else None,
                )
        except TimeoutError:
            if timeout.expired():
                raise UpstreamConnectError(f"connecting to {host}:{port} timed out") from None
            raise
        except OSError as e:
            via = f" (at {address}:{to})" if (address, to) != (host, port) else ""
            raise UpstreamConnectError(f"cannot connect to {host}:{port}{via}: {e}") from e
        return conn

    def release(self, conn: UpstreamConnection) -> None:
        """Back to the idle list, or closed when the pool keeps enough for that origin."""
        idle = self._idle.setdefault(conn.origin, [])
        if self.keep_per_origin and len(idle) >= self.keep_per_origin:
            conn.close()
            return
        conn.last_used = self.loop.time()
        idle.append(conn)

    async def _sweep(self) -> None:
        every = max(1.0, min(10.0, self.idle_timeout / 2))
        while True:
            await asyncio.sleep(every)
            horizon = self.loop.time() - self.idle_timeout
            for origin, idle in self._idle.items():
                keep = [c for c in idle if not c.closed and c.last_used > horizon]
                for c in idle:
                    if c not in keep:
                        c.close()
                self._idle[origin] = keep

    async def close(self) -> None:
        """Close every idle connection (answers in progress close their own)."""
        self._sweeper.cancel()
        for idle in self._idle.values():
            for c in idle:
                c.close()
        self._idle.clear()
        await asyncio.sleep(0)


__all__ = [
    "MAX_RESPONSE_HEAD",
    "MAX_RESPONSE_HEADERS",
    "Origin",
    "RejectReason",
    "Response",
    "UpstreamConnectError",
    "UpstreamConnection",
    "UpstreamError",
    "UpstreamIdleError",
    "UpstreamPool",
    "UpstreamRejectedError",
]
