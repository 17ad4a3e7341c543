"""What a backend answers, as the router's upstream client hands it to the proxy.

A :class:`Response` has its head fields once :meth:`~tinct.router.upstream.UpstreamPool.request`
returns it; the body then goes from the connection's ``data_received`` straight to a sink (the
client's connection) chunk by chunk, with no task in between; bytes that arrive before the
sink is attached are held until it is. The connection the answer arrives on
(:class:`~tinct.router.upstream.UpstreamConnection`) feeds it through the methods under "fed
by the connection".

Every way a backend can fail is an :class:`UpstreamError`; :class:`UpstreamRejectedError`
carries the ``reason`` the proxy counts.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from typing import Literal, Protocol

from tinct.router.wire import Fields

Sink = Callable[[bytes], None]
#: Why an answer was refused before its body: ``head_too_large``, ``malformed``,
#: ``head_timeout`` (the last one is the proxy's timer).
RejectReason = Literal["head_too_large", "malformed", "head_timeout"]


class UpstreamError(Exception):
    """The backend failed: connection lost, malformed answer."""


class UpstreamConnectError(UpstreamError):
    """The backend could not be connected."""


class ClientBodyError(UpstreamError):
    """The request body streamed to the backend failed on the client's side: broken framing
    (``cause`` a ``ValueError``), too slow (a ``BodyTimeoutError``) or the client went away
    (a ``ConnectionError``). The backend is not to blame."""

    def __init__(self, cause: Exception) -> None:
        super().__init__(f"the request body could not be read from the client: {cause!r}")
        self.cause = cause


class UpstreamIdleError(UpstreamError):
    """The backend sent nothing of its answer's body for the idle timeout."""


class UpstreamTimeoutError(UpstreamError):
    """The backend's response head was not in by the deadline the request was sent with
    (connecting and sending the request included)."""


class UpstreamRejectedError(UpstreamError):
    """The backend's answer was refused: its head over the limits or too slow, or unparsable."""

    def __init__(self, reason: RejectReason, message: str) -> None:
        super().__init__(message)
        self.reason: RejectReason = reason


class Feed(Protocol):
    """What an answer needs of the connection it arrives on."""

    loop: asyncio.AbstractEventLoop
    #: Loop time of the last bytes from the backend (for the idle timeout).
    last_data: float
    #: Reading is paused: the client does not keep up.
    paused: bool
    #: The answer in progress on the connection.
    resp: Response | None

    @property
    def watch(self) -> IdleWatch:
        """Where answers with an idle timeout are checked."""
        ...

    def pause_reading(self) -> None: ...
    def resume_reading(self) -> None: ...
    def close(self) -> None: ...


#: Bounds of the period of an :class:`IdleWatch` (a quarter of the shortest idle timeout it
#: watches): an answer is cut between its idle timeout and that much later.
MIN_TICK, MAX_TICK = 0.025, 1.0


class IdleWatch:
    """Answers streaming with an idle timeout, checked together by one periodic timer.

    One timer per answer cost 544 bytes (a handle, its libuv timer, a bound method) for the
    life of every stream; a set entry costs a few dozen, and a check of ten thousand answers
    a millisecond or two a period.
    """

    __slots__ = ("_handle", "_loop", "_tick", "answers")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self.answers: set[Response] = set()
        self._handle: asyncio.TimerHandle | None = None
        self._tick = MAX_TICK

    def add(self, resp: Response, idle: float) -> None:
        self.answers.add(resp)
        tick = min(MAX_TICK, max(MIN_TICK, idle / 4))
        if self._handle is None or tick < self._tick:
            if self._handle is not None:
                self._handle.cancel()
            self._tick = tick
            self._handle = self._loop.call_later(tick, self._check)

    def discard(self, resp: Response) -> None:
        self.answers.discard(resp)

    def _check(self) -> None:
        now = self._loop.time()
        for resp in [r for r in self.answers if r._quiet_for(now)]:
            resp._idle_out()
        if self.answers:
            self._handle = self._loop.call_later(self._tick, self._check)
        else:
            self._handle = None
            self._tick = MAX_TICK


class _Queue:
    """The answers a :class:`HeadWatch` holds for one timeout, in the order of their deadlines."""

    __slots__ = ("entries", "last", "timer")

    def __init__(self) -> None:
        #: Each answer still waiting for its head, and its deadline (loop time), oldest first.
        self.entries: OrderedDict[Response, float] = OrderedDict()
        #: The latest deadline added: one before it would break the order.
        self.last = 0.0
        #: Set for the first entry's deadline (or an earlier one that left), while any waits.
        self.timer: asyncio.TimerHandle | None = None


class HeadWatch:
    """Answers waiting for their head, met at their deadlines without a timer each.

    A timer per request, started and cancelled around every head, cost about 2 µs of a
    request (uvloop makes a handle and a libuv timer for each, and closes the timer in a later
    loop iteration). Requests sent with one timeout (stable's head timeout, a candidate's
    ``latencyMs``) reach their deadlines in the order they were added, so the watch keeps one
    queue per timeout and one timer per queue, set for its first deadline; an answer whose
    head arrives leaves its queue at once (an ordered dictionary's entry, a few dozen
    nanoseconds). A timer set for an entry that left fires for nothing and is set again for
    the next deadline: with steady traffic, about once per timeout. An answer whose deadline
    would come before the last one of its queue (a request sent again keeps its first
    deadline) is not taken: :meth:`add` says so, and the caller gives it a timer of its own.
    """

    __slots__ = ("_loop", "queues")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        #: Timeout (seconds) -> its queue, while any answer or timer is in it.
        self.queues: dict[float, _Queue] = {}

    def __len__(self) -> int:
        """Answers waiting."""
        return sum(len(q.entries) for q in self.queues.values())

    def add(self, resp: Response, timeout: float, deadline: float) -> bool:
        """Watch ``resp`` until :meth:`discard`, failing it at ``deadline`` (sent with
        ``timeout``); False when that deadline is before its queue's last (not taken)."""
        q = self.queues.get(timeout)
        if q is None:
            q = self.queues[timeout] = _Queue()
        elif deadline < q.last:
            return False
        q.last = deadline
        q.entries[resp] = deadline
        if q.timer is None:
            q.timer = self._loop.call_at(deadline, self._check, timeout)
        return True

    def discard(self, resp: Response, timeout: float) -> None:
        q = self.queues.get(timeout)
        if q is not None:
            q.entries.pop(resp, None)

    def _check(self, timeout: float) -> None:
        q = self.queues[timeout]
        entries = q.entries
        now = self._loop.time()
        while entries:
            resp, deadline = next(iter(entries.items()))
            if deadline > now:  # also when the loop's timer fired a little early
                q.timer = self._loop.call_at(deadline, self._check, timeout)
                return
            del entries[resp]
            resp._head_overdue()
        del self.queues[timeout]


class Response:
    """One upstream answer: head fields once it is returned to the proxy, then the body."""

    __slots__ = (
        "_conn",
        "_done",
        "_error",
        "_held",
        "_idle",
        "_informational",
        "_sink",
        "_watch",
        "chunked",
        "closing",
        "complete",
        "content_length",
        "event_stream",
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

    def __init__(self, conn: Feed, head_only: bool) -> None:
        self._conn: Feed | None = conn
        self.head: asyncio.Future[None] = conn.loop.create_future()
        self.head_only = head_only
        self.status = 0
        self.reason = b""
        self.headers: Fields = []
        self.content_length: int | None = None
        #: Its first ``Content-Type`` says Server-Sent Events (None: it has none).
        self.event_stream: bool | None = None
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
        #: The :class:`IdleWatch` checking this answer, while one does.
        self._watch: IdleWatch | None = None

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

    def _head_overdue(self) -> None:
        """The deadline for the head passed (a timer of the upstream client)."""
        if not self.head.done():
            self._fail(UpstreamTimeoutError("no response head by the deadline"))

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
        watch = self._watch
        if watch is not None:
            self._watch = None
            watch.discard(self)

    def _quiet_for(self, now: float) -> bool:
        """The backend sent nothing for the idle timeout while the client kept up (paused,
        the backend waits for the client, not the other way round; resuming restarts the
        count)."""
        conn = self._conn
        return conn is not None and not conn.paused and now - conn.last_data >= self._idle

    def _idle_out(self) -> None:
        conn = self._conn
        if conn is None or self.complete:
            return
        self._stop_timer()
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
        loop = self.head.get_loop()
        self._done = loop.create_future()
        if idle_timeout is not None and self._conn is not None:
            self._idle = idle_timeout
            self._watch = self._conn.watch
            self._watch.add(self, idle_timeout)
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


__all__ = [
    "ClientBodyError",
    "Feed",
    "HeadWatch",
    "IdleWatch",
    "RejectReason",
    "Response",
    "Sink",
    "UpstreamConnectError",
    "UpstreamError",
    "UpstreamIdleError",
    "UpstreamRejectedError",
    "UpstreamTimeoutError",
]
