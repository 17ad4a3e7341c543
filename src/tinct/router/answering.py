"""Writing the answer to a client's request on its connection.

:class:`Answering` is the answer half of :class:`~tinct.router.connection.ServerConnection`
(which reads requests): the handler begins an answer with a status and header lines, sends
body bytes and ends it, and the answer is framed as the request and the body allow —
``Content-Length`` when the length is known, chunked for HTTP/1.1, close-delimited for
HTTP/1.0, no body for ``HEAD``, 1xx, 204 and 304 — with ``Connection`` and ``Date`` added.
The head waits for the first body bytes so that a small answer leaves in one write. The
router's own error answers (:meth:`Answering.refuse`) carry a fixed message and
``X-Request-Id``; their detail goes to the log with that id (:mod:`tinct.router.errors`).
"""

from __future__ import annotations

import asyncio
import logging

from tinct.router.errors import error_answer, log_refusal
from tinct.router.flow import WriteFlow
from tinct.router.request import Request
from tinct.router.wire import LAST_CHUNK, RawHeaders, chunk, header_block, http_date, reason_phrase

#: How the answer's body is framed.
_NONE, _LENGTH, _CHUNKED, _CLOSE = range(4)


class Answering:
    """The answer in progress on a client connection (a base of its protocol class)."""

    __slots__ = ("_finished", "_framing", "_keep_alive", "_pending", "_started")

    # What the connection provides.
    transport: asyncio.Transport | None
    request: Request | None
    remote: str | None
    #: The request's body was read whole.
    _message_done: bool
    _closed: bool
    _flow: WriteFlow
    #: Set by drain and pipelining: close once the answer in progress is sent.
    close_after_response: bool

    def _new_answer(self) -> None:
        """No answer begun yet (for each request as its head is in)."""
        self._started = self._finished = False
        self._framing = _NONE
        self._keep_alive = False
        self._pending: bytes | None = None

    def _after_response(self) -> None:
        """The answer ended: keep the connection for the next request, or close it."""
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError

    @property
    def started(self) -> bool:
        """Whether the answer's head is on its way: no other answer is possible any more."""
        return self._started

    def start_response(
        self,
        status: int,
        headers: RawHeaders,
        content_length: int | None,
        reason: bytes | None = None,
        has_date: bool = False,
    ) -> None:
        """Begin the answer; the head is written with the first body bytes or at the end.

        Args:
            content_length: the body's length when known; chunked (HTTP/1.1) or
                close-delimited (HTTP/1.0) otherwise.
            has_date: ``headers`` carry a ``Date`` already (from upstream).
        """
        req = self.request
        assert req is not None
        assert not self._started
        self._started = True
        keep = req.keep_alive and self._message_done and not self.close_after_response
        extra: RawHeaders = []
        if req.method == "HEAD" or status in (204, 304) or status < 200:
            self._framing = _NONE
            if content_length is not None and status >= 200 and status != 204:
                extra.append((b"Content-Length", b"%d" % content_length))
        elif content_length is not None:
            self._framing = _LENGTH
            extra.append((b"Content-Length", b"%d" % content_length))
        elif req.version == "1.1":
            self._framing = _CHUNKED
            extra.append((b"Transfer-Encoding", b"chunked"))
        else:
            self._framing = _CLOSE
            keep = False
        if not keep:
            extra.append((b"Connection", b"close"))
        elif req.version == "1.0":
            extra.append((b"Connection", b"keep-alive"))
        if not has_date:
            extra.append((b"Date", http_date()))
        self._keep_alive = keep
        line = b"HTTP/1.1 %d %b\r\n" % (status, reason or reason_phrase(status))
        self._pending = line + header_block(headers) + header_block(extra) + b"\r\n"

    def write(self, data: bytes) -> None:
        """Send body bytes of the answer (framed as the head said)."""
        if not data or self._framing == _NONE or self._closed:
            if self._pending is not None and not self._closed:
                self._flush(b"")
            return
        if self._framing == _CHUNKED:
            data = chunk(data)
        self._flush(data)

    def send_head(self) -> None:
        """Write the answer's head now if no body bytes took it along yet (a slow stream)."""
        if self._pending is not None and not self._closed:
            self._flush(b"")

    def _flush(self, data: bytes) -> None:
        if self._pending is not None:
            data = self._pending + data
            self._pending = None
        assert self.transport is not None
        self.transport.write(data)

    def end_response(self) -> None:
        """The answer is complete: the connection is ready for the next request at once."""
        if not self._closed:
            if self._framing == _CHUNKED:
                self._flush(LAST_CHUNK)
            elif self._pending is not None:
                self._flush(b"")
        self._finished = True
        self._after_response()

    def respond(self, answer: tuple[int, RawHeaders, bytes]) -> None:
        """A whole small answer at once."""
        status, headers, body = answer
        self.start_response(status, headers, len(body))
        self.write(body)
        self.end_response()

    def refuse(
        self,
        code: str,
        detail: str | None = None,
        extra: RawHeaders | None = None,
        *,
        level: int = logging.INFO,
    ) -> int:
        """Answer the request in progress with the router's own error ``code``
        (:data:`~tinct.router.errors.CATALOGUE`); ``detail`` goes to the log with the
        request's id. Returns the status."""
        req = self.request
        assert req is not None
        answer = error_answer(code, req.rid, extra or ())
        if detail is not None:
            log_refusal(req.rid, self.remote, answer[0], code, detail, level)
        self.respond(answer)
        return answer[0]

    def send_continue(self) -> None:
        """``100 Continue``: the handler is about to read a body the client holds back."""
        if self.transport is not None and not self._started and not self._closed:
            self.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")

    async def drain(self) -> None:
        """Wait while the client's socket buffer is full."""
        if not self._closed:
            await self._flow.drain()

    def abort(self) -> None:
        """Cut the connection after what is already written: the client sees a truncated answer."""
        self._finished = True
        self._keep_alive = False
        self.close()


__all__ = ["Answering"]
