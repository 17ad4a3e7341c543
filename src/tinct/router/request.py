"""A request as the router's server hands it to the handler: head parsed, body arriving.

Headers stay raw (``bytes`` pairs, in order) for forwarding; :attr:`Request.headers` decodes
them into a case-insensitive mapping only when something reads them (classification,
sticky key). The :class:`Body` fills as the client sends it; reading it sends
``100 Continue`` first when the client asked for it, and a body that piles up unread pauses
reading from the client until it is consumed.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator, Mapping
from typing import Protocol, TypeVar, overload

from tinct.router.errors import request_id
from tinct.router.framing import request_framing
from tinct.router.wire import HOP_BY_HOP_B, Fields, RawHeaders, connection_tokens

_T = TypeVar("_T")

#: Buffered request body above which reading from the client pauses (and below which it resumes).
HIGH_WATER = 256 * 1024
LOW_WATER = 64 * 1024


class BodyTooLargeError(Exception):
    """The body is over the limit given to :meth:`Body.read_all`."""


class BodyTimeoutError(Exception):
    """The client did not send its body in time (:attr:`Body.timeout`)."""


class BodySource(Protocol):
    """The connection a body comes from."""

    loop: asyncio.AbstractEventLoop

    def pause_reading(self) -> None: ...
    def resume_reading(self) -> None: ...
    def send_continue(self) -> None: ...


class Body:
    """A request body as it arrives."""

    __slots__ = (
        "_buffered",
        "_chunks",
        "_discard",
        "_error",
        "_high",
        "_overdue",
        "_paused",
        "_source",
        "_waiter",
        "_wake_above",
        "declared",
        "done",
        "expect_continue",
        "received",
        "timeout",
    )

    def __init__(self, source: BodySource, timeout: float | None = None) -> None:
        self._source = source
        # A list, not a deque: a deque's first block is 600 bytes, per request (streams hold
        # theirs for their whole life), and a piece is taken from the front rarely.
        self._chunks: list[bytes] = []
        self._buffered = 0
        self._paused = False
        self._discard = False
        self._error: BaseException | None = None
        self._waiter: asyncio.Future[None] | None = None
        #: Buffered bytes above which reading from the client pauses.
        self._high = HIGH_WATER
        #: A piece wakes the reader only once more than this was received (-1: every piece):
        #: :meth:`read_all` waits for the end, or for the limit to be crossed.
        self._wake_above = -1
        self._overdue = False
        #: Seconds :meth:`read_all` may take in all, and :meth:`read` may wait for a piece.
        self.timeout = timeout
        #: Content-Length the client declared, if any.
        self.declared: int | None = None
        self.expect_continue = False
        self.done = False
        self.received = 0

    # --- fed by the connection ---------------------------------------------------------

    def feed(self, data: bytes) -> None:
        if self._discard:
            return
        self._chunks.append(data)
        self._buffered += len(data)
        self.received += len(data)
        if self._buffered > self._high and not self._paused:
            self._paused = True
            self._source.pause_reading()
        if self.received > self._wake_above:
            self._wake()

    def finish(self) -> None:
        self.done = True
        self._wake()

    def fail(self, exc: BaseException) -> None:
        if not self.done:
            self._error = exc
            self._wake()

    def discard(self) -> None:
        """Drop what is buffered and whatever still comes (the answer is already sent)."""
        self._discard = True
        self._chunks.clear()
        self._buffered = 0
        if self._paused:
            self._paused = False
            self._source.resume_reading()

    def _wake(self) -> None:
        w = self._waiter
        if w is not None:
            self._waiter = None
            if not w.done():
                w.set_result(None)

    async def _wait(self) -> None:
        if self._error is not None:
            raise self._error
        if self.expect_continue:
            self.expect_continue = False
            self._source.send_continue()
        w = self._waiter = self._source.loop.create_future()
        await w

    def _expire(self) -> None:
        self._overdue = True
        self._wake()

    def _resume(self) -> None:
        if self._paused:
            self._paused = False
            self._source.resume_reading()

    # --- read by the handler -----------------------------------------------------------

    @property
    def empty(self) -> bool:
        """The request has no body at all (complete, nothing received)."""
        return self.done and self.received == 0

    async def read(self) -> bytes:
        """The next piece of the body; ``b""`` once it is complete."""
        while not self._chunks:
            if self.done:
                return b""
            if self.timeout is None:
                await self._wait()
            else:
                try:
                    async with asyncio.timeout(self.timeout):
                        await self._wait()
                except TimeoutError:
                    raise BodyTimeoutError(f"no request body bytes for {self.timeout:g}s") from None
        data = self._chunks.pop(0)
        self._buffered -= len(data)
        if self._paused and self._buffered < LOW_WATER:
            self._resume()
        return data

    async def read_all(self, limit: int) -> bytes:
        """The whole body, read within :attr:`timeout` seconds.

        Reading does not pause below ``limit``: the limit bounds what is buffered, and a body
        over it is refused as soon as its first byte past the limit arrives.

        Raises:
            BodyTooLargeError: it is (or is declared) longer than ``limit`` bytes; nothing more is
                read then (the connection drops the rest).
            BodyTimeoutError: it did not arrive whole within :attr:`timeout`.
        """
        if self.declared is not None and self.declared > limit:
            raise BodyTooLargeError
        if not self.done:
            self._high = max(HIGH_WATER, limit)
            self._wake_above = limit
            self._resume()
            # A timer, not a cancel scope: this runs for every body not in with its head.
            timer = None if self.timeout is None else self._source.loop.call_later(self.timeout, self._expire)
            try:
                while not self.done:
                    if self.received > limit:
                        raise BodyTooLargeError
                    if self._overdue:
                        raise BodyTimeoutError(f"the request body did not arrive within {self.timeout:g}s")
                    await self._wait()
            finally:
                self._wake_above = -1
                if timer is not None:
                    timer.cancel()
        if self.received > limit:
            raise BodyTooLargeError
        data = b"".join(self._chunks)
        self._chunks.clear()
        self._buffered = 0
        self._resume()
        return data


class HeaderView(Mapping[str, str]):
    """Case-insensitive read access to request headers (the first value of each name)."""

    __slots__ = ("_by_name",)

    def __init__(self, by_name: dict[bytes, bytes]) -> None:
        self._by_name = by_name

    @overload
    def get(self, key: str, /) -> str | None: ...
    @overload
    def get(self, key: str, /, default: str | _T) -> str | _T: ...
    def get(self, key: str, /, default: object = None) -> object:
        v = self._by_name.get(key.lower().encode("latin-1"))
        return default if v is None else v.decode("latin-1")

    def __getitem__(self, key: str) -> str:
        v = self._by_name.get(key.lower().encode("latin-1"))
        if v is None:
            raise KeyError(key)
        return v.decode("latin-1")

    def __iter__(self) -> Iterator[str]:
        return (k.decode("latin-1") for k in self._by_name)

    def __len__(self) -> int:
        return len(self._by_name)


class Request:
    """One parsed request head and its body.

    Raises:
        FramingError: the head leaves the body's framing in doubt
            (:func:`~tinct.router.framing.request_framing`).
    """

    __slots__ = (
        "_by_name",
        "_rid",
        "body",
        "chunked",
        "fields",
        "hops",
        "keep_alive",
        "method",
        "path",
        "remote",
        "target",
        "version",
    )

    def __init__(
        self,
        method: str,
        target: bytes,
        path: str,
        version: str,
        raw_headers: RawHeaders,
        keep_alive: bool,
        remote: str | None,
        body: Body,
    ) -> None:
        self.method = method
        #: The request target as sent upstream: path and query, undecoded.
        self.target = target
        #: The decoded path, for routing.
        self.path = path
        self.version = version
        self.keep_alive = keep_alive
        self.remote = remote
        self.body = body
        self.chunked = False
        #: Header names the client's ``Connection`` header makes hop-by-hop (beyond the standard ones).
        self.hops: frozenset[bytes] = frozenset()
        self._rid: bytes | None = None
        fields: Fields = []
        by_name: dict[bytes, bytes] = {}
        te: list[bytes] | None = None
        cl: list[bytes] | None = None
        for name, value in raw_headers:
            n = name.lower()
            fields.append((n, name, value))
            if n not in by_name:
                by_name[n] = value
            if n == b"content-length":
                cl = [value] if cl is None else [*cl, value]
            elif n == b"transfer-encoding":
                te = [value] if te is None else [*te, value]
            elif n == b"connection":
                self.hops |= connection_tokens(value) - HOP_BY_HOP_B
            elif n == b"expect" and version == "1.1":
                body.expect_continue = value.strip().lower() == b"100-continue"
        if te is not None or cl is not None:
            self.chunked, body.declared = request_framing(te or [], cl or [], version)
        self.fields = fields
        self._by_name = by_name

    @property
    def has_body(self) -> bool:
        """The client sends a body (length-delimited or chunked)."""
        return self.chunked or self.body.declared is not None

    @property
    def rid(self) -> bytes:
        """The request's id: its ``X-Request-Id`` when sane, else one made up once
        (:func:`~tinct.router.errors.request_id`)."""
        if self._rid is None:
            self._rid = request_id(self._by_name.get(b"x-request-id"))
        return self._rid

    @property
    def headers(self) -> HeaderView:
        """The headers, decoded on access, case-insensitive."""
        return HeaderView(self._by_name)


__all__ = [
    "HIGH_WATER",
    "LOW_WATER",
    "Body",
    "BodySource",
    "BodyTimeoutError",
    "BodyTooLargeError",
    "HeaderView",
    "Request",
]
