"""A client's connection to the router: one ``asyncio.Protocol``, parsed by httptools.

Each request is handed to the handler as soon as its headers are parsed, so a body can be
streamed onward while it arrives (:class:`~tinct.router.request.Body`); the handler answers
through the connection's answer methods (:class:`~tinct.router.answering.Answering`), which
frame the body and write straight to the transport.

Connections are kept alive between requests. Pipelining is refused politely: a request that
arrives before the previous one is answered is not read, the answer in progress carries
``Connection: close`` when it still can, and the connection closes after it, so the client
sends the rest again on a new connection. A request that cannot be parsed gets a 400 (414,
431 for an over-long target or header section) and the connection closes; so does one whose
body framing is in doubt (:mod:`tinct.router.framing`: 400, or 501 for a transfer coding
other than chunked) or whose path is refused (:mod:`tinct.router.paths`), decided when the
head is complete and before the handler starts, so nothing of it is forwarded. An answer
that ends before its request body was read whole closes the connection too, after reading
and dropping the rest of the body for a moment so the client sees the answer, not a reset.

Flow control goes both ways: a request body that piles up pauses reading from the client,
and a client that does not keep up pauses the upstream that feeds it (:attr:`source`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from typing import Any, Protocol, cast

import httptools

from tinct.router.answering import Answering
from tinct.router.errors import error_answer, log_refusal, request_id, status_of
from tinct.router.flow import WriteFlow
from tinct.router.framing import FramingError
from tinct.router.paths import PathError, check_target
from tinct.router.request import Body, Request
from tinct.router.wire import RawHeaders, header_block, reason_phrase

_log = logging.getLogger(__name__)

MAX_TARGET = 8190
MAX_HEAD = 64 * 1024
#: Bytes a request head (request line and header section) may take on the wire; counted as
#: they arrive, so a header value sent without end is cut here, not when it completes.
MAX_HEAD_BYTES = MAX_TARGET + MAX_HEAD + 1024
#: Seconds an answered connection keeps reading (and dropping) an unread request body.
LINGER = 2.0

Handler = Callable[[Request, "ServerConnection"], Coroutine[Any, Any, None]]

#: Words of llhttp's errors about a body's framing (answered ``invalid_framing``).
_FRAMING_WORDS = ("Content-Length", "Transfer-Encoding", "chunk")


class Pausable(Protocol):
    """What feeds a response: paused while the client's socket buffer is full."""

    def pause_reading(self) -> None: ...
    def resume_reading(self) -> None: ...


class Listener(Protocol):
    """What a connection needs of the server that accepted it
    (:class:`~tinct.router.server.HttpServer`)."""

    loop: asyncio.AbstractEventLoop
    handler: Handler
    #: Seconds a classified body may take in all; a streamed one may pause between pieces.
    body_timeout: float | None
    #: The server is shutting down: no request after the one in progress.
    draining: bool
    connections: set[ServerConnection]

    def forget(self, conn: ServerConnection) -> None: ...


class _RejectError(Exception):
    def __init__(self, code: str, detail: str) -> None:
        super().__init__(detail)
        self.code = code


class _PipelinedError(Exception):
    pass


class ServerConnection(Answering, asyncio.Protocol):
    """One client connection: parses requests, runs the handler; the answers are written by
    :class:`~tinct.router.answering.Answering`."""

    # Slots: ten thousand open streams hold ten thousand of these.
    __slots__ = (
        "_closed",
        "_eof",
        "_flow",
        "_head_seen",
        "_head_since",
        "_head_size",
        "_headers",
        "_ignore_input",
        "_in_head",
        "_lingering",
        "_message_done",
        "_parser",
        "_target",
        "_task",
        "close_after_response",
        "last_active",
        "loop",
        "remote",
        "request",
        "server",
        "source",
        "transport",
    )

    def __init__(self, server: Listener) -> None:
        self.server = server
        self.loop = server.loop
        self.transport: asyncio.Transport | None = None
        self.remote: str | None = None
        self._parser = httptools.HttpRequestParser(self)
        self._target = b""
        self._headers: RawHeaders = []
        self._head_size = 0
        #: Reading a request head: bytes of it seen so far, and since when.
        self._in_head = True
        self._head_seen = 0
        self._head_since = 0.0
        self.request: Request | None = None
        self._task: asyncio.Task[None] | None = None
        self._message_done = False
        self._ignore_input = False
        self._closed = False
        #: The client half-closed: no request follows the one in progress.
        self._eof = False
        self._lingering: asyncio.TimerHandle | None = None
        #: Set by drain and pipelining: close once the answer in progress is sent.
        self.close_after_response = False
        self.last_active = self.loop.time()
        self._new_answer()
        self._flow = WriteFlow(self.loop)
        #: The upstream feeding the answer; paused while the client does not keep up.
        self.source: Pausable | None = None

    # --- transport events ----------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass
        peer = transport.get_extra_info("peername")
        self.remote = str(peer[0]) if isinstance(peer, tuple) and peer else None
        self.server.connections.add(self)

    def connection_lost(self, exc: Exception | None) -> None:
        self._closed = True
        self.server.forget(self)
        if self._lingering is not None:
            self._lingering.cancel()
        if self.request is not None and not self._message_done:
            self.request.body.fail(ConnectionResetError("client closed the connection"))
        if self._task is not None:
            self._task.cancel()
        self._flow.wake()

    def eof_received(self) -> bool | None:
        self._eof = True
        if self.request is None or self._lingering is not None:
            return None  # nothing in progress (or only a body being dropped): close
        return True  # keep the write side open for the answer in progress

    def pause_writing(self) -> None:
        self._flow.pause()
        if self.source is not None:
            self.source.pause_reading()

    def resume_writing(self) -> None:
        self._flow.resume()
        if self.source is not None:
            self.source.resume_reading()

    def data_received(self, data: bytes) -> None:
        if self._ignore_input:
            return
        if self._in_head:
            if not self._head_seen:
                self._head_since = self.loop.time()
            self._head_seen += len(data)
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            # The request is whole; what follows is not HTTP. Answer it, then close.
            self._refuse_more()
        except httptools.HttpParserCallbackError as e:
            cause = e.__context__
            if isinstance(cause, _PipelinedError):
                self._refuse_more()
            elif isinstance(cause, _RejectError):
                self._bad_input(cause.code, str(cause))
            else:
                _log.error("request parsing failed", exc_info=cause or e)
                self._bad_input("bad_request", f"parsing failed: {cause!r}")
        except httptools.HttpParserError as e:
            text = str(e)
            framing = any(w in text for w in _FRAMING_WORDS)
            self._bad_input(
                "invalid_framing" if framing else "bad_request", f"malformed HTTP request: {text}"
            )
        else:
            if self._in_head and self._head_seen > MAX_HEAD_BYTES and not self._ignore_input:
                self._bad_input("header_too_large", f"request head over {MAX_HEAD_BYTES} bytes")

    def _refuse_more(self) -> None:
        self._ignore_input = True
        self.close_after_response = True
        if self.request is None:
            self.close()

    def _bad_input(self, code: str, detail: str) -> None:
        self._ignore_input = True
        req = self.request
        if req is not None:
            # A request is being answered: its body is broken, or garbage follows it.
            if not self._message_done:
                req.body.fail(FramingError(status_of(code), code, detail))
            self.close_after_response = True
            if self._finished:
                self.close()
            return
        given = next((v for n, v in self._headers if n.lower() == b"x-request-id"), None)
        rid = request_id(given)
        status, headers, body = error_answer(code, rid)
        log_refusal(rid, self.remote, status, code, detail)
        head = b"HTTP/1.1 %d %b\r\n" % (status, reason_phrase(status))
        head += header_block([*headers, (b"Content-Length", b"%d" % len(body)), (b"Connection", b"close")])
        if self.transport is not None:
            self.transport.write(head + b"\r\n" + body)
        self._close_lingering()

    def _close_lingering(self) -> None:
        # Closing with unread input would reset the connection, and a reset can destroy the
        # answer before the client reads it: end the write side, drop input for a moment.
        t = self.transport
        if t is None or self._closed or not t.can_write_eof():
            self.close()
            return
        t.write_eof()
        self._lingering = self.loop.call_later(LINGER, self.close)

    # --- parser callbacks ----------------------------------------------------------------

    def on_message_begin(self) -> None:
        if self.request is not None:
            raise _PipelinedError
        self._target = b""
        self._headers = []
        self._head_size = 0

    def on_url(self, url: bytes) -> None:
        self._target += url
        if len(self._target) > MAX_TARGET:
            raise _RejectError("uri_too_long", f"request target over {MAX_TARGET} bytes")

    def on_header(self, name: bytes, value: bytes) -> None:
        self._headers.append((name, value))
        self._head_size += len(name) + len(value) + 4
        if self._head_size > MAX_HEAD:
            raise _RejectError("header_too_large", f"request header section over {MAX_HEAD} bytes")

    def on_headers_complete(self) -> None:
        self._in_head = False
        self._head_seen = 0
        p = self._parser
        # Framing and path are decided here, before the handler starts: nothing of a refused
        # request is forwarded (llhttp would refuse some heads only after this callback).
        try:
            target, path = check_target(self._target)
            req = Request(
                p.get_method().decode("ascii"),
                target,
                path,
                p.get_http_version(),
                self._headers,
                p.should_keep_alive(),
                self.remote,
                Body(self, self.server.body_timeout),
            )
        except PathError as e:
            raise _RejectError("invalid_path", str(e)) from None
        except FramingError as e:
            raise _RejectError(e.code, e.detail) from None
        self._headers = []  # the request holds them now (a stream holds its connection for minutes)
        self.request = req
        self._message_done = False
        self._new_answer()
        self.source = None
        task = self.loop.create_task(self.server.handler(req, self))
        self._task = task
        task.add_done_callback(self._handler_done)

    def on_body(self, body: bytes) -> None:
        assert self.request is not None
        self.request.body.feed(body)

    def on_message_complete(self) -> None:
        self._message_done = True
        assert self.request is not None
        self.request.body.finish()
        if self._lingering is not None:
            self.close()

    # --- after an answer ------------------------------------------------------------

    def _after_response(self) -> None:
        # Runs as the answer ends, not when the handler's task is reaped: the client may
        # send its next request before that.
        if self._closed:
            return
        if not self._keep_alive or self.close_after_response or self._eof:
            if self._message_done or self._eof:
                self.close()
            else:
                self._linger()
            return
        self.request = None
        self._in_head = True
        self.last_active = self.loop.time()
        if self.server.draining:
            self.close()

    def pause_reading(self) -> None:
        if self.transport is not None and not self._closed:
            self.transport.pause_reading()

    def resume_reading(self) -> None:
        if self.transport is not None and not self._closed:
            self.transport.resume_reading()

    def close(self) -> None:
        if self.transport is not None and not self._closed:
            self.transport.close()
        self._closed = True

    # --- after the handler ---------------------------------------------------------------

    def _handler_done(self, task: asyncio.Task[None]) -> None:
        exc = None if task.cancelled() else task.exception()
        if exc is not None:
            req = self.request if self._task is task else None
            _log.error("request %s: the handler failed", req.rid.decode() if req else "-", exc_info=exc)
        if self._task is not task:
            return  # its answer ended and the next request runs already
        self._task = None
        self.source = None
        if self._finished:
            return
        if task.cancelled() or self._started or self._closed:
            self.abort()
        else:
            self.refuse("internal_error")

    def _linger(self) -> None:
        assert self.request is not None
        self.request.body.discard()
        self._ignore_input = False
        self._lingering = self.loop.call_later(LINGER, self.close)

    @property
    def idle(self) -> bool:
        """No request in progress."""
        return self.request is None

    def head_overdue(self, since: float) -> bool:
        """A request head started arriving before ``since`` and is still not complete."""
        return self.request is None and self._head_seen > 0 and self._head_since < since

    @property
    def receiving(self) -> bool:
        """A request is still arriving and no answer has begun: nothing is in flight yet."""
        return self.request is None or (not self._message_done and not self._started)

    def shut_down(self) -> None:
        """For a drain: close now when idle or still receiving, else after the answer in progress."""
        if self.receiving:
            self.cancel()
        else:
            self.close_after_response = True

    def cancel(self) -> None:
        """End a drain that ran out of time: stop the handler and close."""
        if self._task is not None:
            self._task.cancel()
        self.close()


__all__ = ["LINGER", "MAX_HEAD_BYTES", "Handler", "Listener", "Pausable", "ServerConnection"]
