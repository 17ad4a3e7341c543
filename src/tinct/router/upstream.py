"""The router's upstream HTTP/1.1 client: a keep-alive connection pool, parsed by httptools.

:meth:`UpstreamPool.request` writes a request (request line, the caller's header lines, the
body's framing, the body) on an idle connection (or a new one) and returns the
:class:`~tinct.router.response.Response` once its head arrived; the body follows as that
module describes.

A connection goes back to the pool when its response is complete, both sides agreed to keep
it alive and the request was sent whole; it is handed out again only while not known closed
and idle for less than ``idle_timeout`` (by default under common backends' keep-alive
timeouts: :data:`IDLE_TIMEOUT`). A request that fails on a *reused* connection before any response
byte came back (the backend closed the idle connection as it was being reused: end of
stream or a reset) is sent once more, on a *new* connection, when its body can be replayed,
as Go's ``net/http`` does; a failure on a new connection, or after any answer byte, is not
retried.

Backends are untrusted input, bounded like clients: a response head (status line and header
section) over :data:`MAX_RESPONSE_HEAD` bytes or :data:`MAX_RESPONSE_HEADERS` header lines is
refused as it arrives (bytes are counted as they come, so a header value sent without end
is cut at the bound, not buffered), and so is an answer that does not parse; both fail with
:class:`~tinct.router.response.UpstreamRejectedError`, whose ``reason`` the proxy counts.

Responses to ``HEAD`` end at their head; httptools cannot be told to skip the body a
``Content-Length`` announces, so the connection gets a fresh parser and stays in the pool.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from collections.abc import Callable, Mapping
from typing import TypeAlias, cast

import httptools

from tinct.router.flow import WriteFlow
from tinct.router.framing import final_chunked
from tinct.router.request import Body, BodyTimeoutError
from tinct.router.response import (
    ClientBodyError,
    HeadWatch,
    IdleWatch,
    Response,
    UpstreamConnectError,
    UpstreamError,
    UpstreamRejectedError,
    UpstreamTimeoutError,
)
from tinct.router.wire import HOP_BY_HOP_B, LAST_CHUNK, chunk, connection_tokens

_log = logging.getLogger(__name__)

_SSE = b"text/event-stream"

#: (host, port, TLS) of a backend: the pool's key.
Origin: TypeAlias = tuple[str, int, bool]

#: Bytes a response head (status line and header section, interim 1xx answers included) may
#: take, like a client's request head; counted on the wire as they arrive.
MAX_RESPONSE_HEAD = 64 * 1024
#: Header lines a response head may have.
MAX_RESPONSE_HEADERS = 256
#: Seconds an idle connection is kept by default: under the 5 s keep-alive timeout of
#: uvicorn (vLLM, SGLang) and Node.js, so the router lets go of a connection before such a
#: backend closes it; a backend that closes sooner costs a retry (see the module's text).
IDLE_TIMEOUT = 4.0
#: Request bodies shorter than this are joined to the head and sent in one buffer; longer
#: ones go as a second buffer of the same write (no copy).
_JOIN_BELOW = 16 * 1024


class _StaleError(UpstreamError):
    """Closed before any response byte: the request may be sent again."""


class UpstreamConnection(asyncio.Protocol):
    """One keep-alive connection to a backend, one request at a time."""

    __slots__ = (
        "_flow",
        "_parser",
        "closed",
        "last_data",
        "last_used",
        "loop",
        "origin",
        "paused",
        "pool",
        "request_sent",
        "resp",
        "reused",
        "transport",
    )

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
        self._flow = WriteFlow(self.loop)

    @property
    def watch(self) -> IdleWatch:
        return self.pool.idle_watch

    # --- transport events ----------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass

    @property
    def usable(self) -> bool:
        """Not known closed: neither side closed it and its transport is not closing (it
        does from the moment the backend's end of stream is read, before connection_lost)."""
        t = self.transport
        return not self.closed and t is not None and not t.is_closing()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._flow.wake()
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
        self._flow.pause()

    def resume_writing(self) -> None:
        self._flow.resume()

    async def drain(self) -> None:
        """Wait while the backend's socket buffer is full."""
        if not self.closed:
            await self._flow.drain()

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
        if r.head_lines > MAX_RESPONSE_HEADERS or r.head_size > MAX_RESPONSE_HEAD:
            raise UpstreamRejectedError(
                "head_too_large",
                f"the backend's response head has over {MAX_RESPONSE_HEADERS} header lines"
                if r.head_lines > MAX_RESPONSE_HEADERS
                else f"the backend's response head is over {MAX_RESPONSE_HEAD} bytes",
            )
        n = name.lower()
        r.headers.append((n, name, value))
        if n == b"content-length":
            r.content_length = int(value)
        elif n == b"content-type":
            if r.event_stream is None:  # the first one counts
                r.event_stream = value[:17].lower() == _SSE
        elif n == b"connection":
            if value == b"keep-alive":  # what most backends send: nothing to drop or close
                return
            tokens = connection_tokens(value)
            r.closing = r.closing or b"close" in tokens
            r.hops |= tokens - HOP_BY_HOP_B
        elif n == b"transfer-encoding":
            r.chunked = final_chunked([value])

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
            r.event_stream = None
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
    """Keep-alive connections per backend origin: at most ``keep_per_origin`` idle ones each
    (more are closed as they come back), none idle for longer than ``idle_timeout``."""

    def __init__(
        self,
        *,
        connect_timeout: float,
        keep_per_origin: int = 64,
        idle_timeout: float = IDLE_TIMEOUT,
        resolve: Mapping[tuple[str, int], tuple[str, int]] | None = None,
    ) -> None:
        self.loop = asyncio.get_running_loop()
        #: (host, port) -> the (address, port) connected to instead (``tinct router --resolve``)
        self.resolve = dict(resolve or {})
        self.connect_timeout = connect_timeout
        self.keep_per_origin = keep_per_origin
        self.idle_timeout = idle_timeout
        self._idle: dict[Origin, list[UpstreamConnection]] = {}
        #: Answers streaming with an idle timeout, checked together.
        self.idle_watch = IdleWatch(self.loop)
        #: Answers waiting for their head, met at their deadlines.
        self.head_watch = HeadWatch(self.loop)
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
        timeout: float | None = None,
        retried: Callable[[], None] | None = None,
    ) -> Response:
        """Send ``method target`` with the header lines ``headers`` (each ending in CRLF) and ``body``.

        The pool writes the request line and the body's framing: ``Content-Length`` for bytes
        (none at all for None), and for a streamed :class:`Body` chunks when ``chunked``, else
        its declared length. A streamed body is sent by a task. Returns when the response head
        is in. A request that meets a reused connection the backend closed (before any answer
        byte) is sent again once on a new connection, when its body is bytes; ``retried`` is
        called when it is.

        Raises:
            UpstreamConnectError: no connection could be made.
            UpstreamTimeoutError: the head was not in within ``timeout`` seconds (connecting
                and sending included), met by the pool's
                :class:`~tinct.router.response.HeadWatch` (a request sent again, by a timer
                of its own).
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
        deadline = None if timeout is None else self.loop.time() + timeout
        watch = self.head_watch
        for attempt in range(2):
            conn = await self._acquire(origin, deadline, fresh=attempt > 0)
            resp = Response(conn, head_only)
            conn.resp = resp
            assert conn.transport is not None
            if isinstance(body, Body):
                conn.request_sent = False
                conn.transport.write(head)
                resp.pump = self.loop.create_task(self._pump(conn, body, chunked))
            else:
                conn.request_sent = True
                if not body:
                    conn.transport.write(head)
                elif len(body) < _JOIN_BELOW:
                    conn.transport.write(head + body)
                else:
                    # Two buffers, one system call: a long prompt is not copied to be joined.
                    conn.transport.writelines((head, body))
            timer = None
            if timeout is not None and deadline is not None and not watch.add(resp, timeout, deadline):
                timer = self.loop.call_at(deadline, resp._head_overdue)
            try:
                await resp.head
            except _StaleError:
                resp.close()
                if attempt == 0 and conn.reused and not isinstance(body, Body):
                    _log.debug("reused connection to %s:%d was closed; sending again", origin[0], origin[1])
                    if retried is not None:
                        retried()
                    continue
                raise
            except BaseException:
                resp.close()
                raise
            finally:
                if timer is not None:
                    timer.cancel()
                elif timeout is not None:
                    watch.discard(resp, timeout)
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
                r._fail(ClientBodyError(e))
            conn.close()

    async def _acquire(
        self, origin: Origin, deadline: float | None = None, *, fresh: bool = False
    ) -> UpstreamConnection:
        """An idle connection to ``origin`` (newest first) unless ``fresh``, else a new one."""
        idle = None if fresh else self._idle.get(origin)
        if idle:
            horizon = self.loop.time() - self.idle_timeout
            while idle:
                conn = idle.pop()
                if conn.usable and conn.last_used > horizon:
                    conn.reused = True
                    return conn
                conn.close()
        host, port, tls = origin
        address, to = self.resolve.get((host, port), (host, port))
        if tls and self._tls is None:
            self._tls = ssl.create_default_context()
        limit = self.loop.time() + self.connect_timeout
        overdue = deadline is not None and deadline < limit
        timeout = asyncio.timeout_at(deadline if overdue else limit)
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
                if overdue:
                    raise UpstreamTimeoutError(f"connecting to {host}:{port}: past the deadline") from None
                raise UpstreamConnectError(f"connecting to {host}:{port} timed out") from None
            raise
        except OSError as e:
            via = f" (at {address}:{to})" if (address, to) != (host, port) else ""
            raise UpstreamConnectError(f"cannot connect to {host}:{port}{via}: {e}") from e
        return conn

    def release(self, conn: UpstreamConnection) -> None:
        """Back to the idle list, or closed when the pool keeps enough for that origin."""
        idle = self._idle.setdefault(conn.origin, [])
        if len(idle) >= self.keep_per_origin:
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
                keep = [c for c in idle if c.usable and c.last_used > horizon]
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
    "IDLE_TIMEOUT",
    "MAX_RESPONSE_HEAD",
    "MAX_RESPONSE_HEADERS",
    "Origin",
    "UpstreamConnection",
    "UpstreamPool",
]
