"""What an LLM answer says as it passes through: tokens, their timing, and the API contract.

A :class:`Meter` sees the body of one classified answer, chunk by chunk, *after* each chunk
was handed to the client's transport (so measuring never delays a byte), and keeps only what
the router's token metrics need. A stream's chunks are only stamped with the time they passed
and queued as they pass; a :class:`MeterSweep` reads them a little later, together (see there
why):

- **Streams** (``Content-Type: text/event-stream``): the Server-Sent Events are split at
  their blank-line boundaries; an event carries content when its data has a non-empty
  ``content``, ``text``, ``reasoning_content`` or ``arguments`` string, found by one regular
  expression over the event's bytes, never by parsing its JSON. The first such event is the
  **time to first token**, the gaps between such events are the **inter-token latencies**,
  their number is the output token count unless a ``usage`` event says
  ``completion_tokens`` (read by a regular expression from an event that names it: in a JSON
  string a quote is escaped, so only a real key matches).
- **Whole answers**: the time to first token is the time to the whole answer; the body is
  kept up to :data:`MAX_WHOLE` bytes and, after its last byte went to the client, scanned
  for its ``choices`` list and ``usage`` the same way (an error answer is parsed, to check
  its shape).

**Contract violations** (the gaps OpenAI-compatible servers are known to have), at most one
of each kind per answer, never changing what the client receives:

- ``sse_framing``: an event whose lines are not SSE fields, with no ``data:`` line, or whose
  data is neither a JSON object nor ``[DONE]``; or an event longer than :data:`MAX_EVENT`
  (the rest of that stream is then not looked at);
- ``sse_no_done``: a stream that ended whole without ``data: [DONE]``;
- ``no_choices``: a successful answer (or a stream event) without ``choices``;
- ``error_body``: a 4xx/5xx answer (a 429 included) whose body is not an OpenAI error
  object, ``{"error": {"message": "...", ...}}``;
- ``not_sse``: a request that asked to stream, answered 2xx without an event stream.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tinct.histogram import Histogram

__all__ = ["KINDS", "MAX_EVENT", "MAX_QUEUED", "MAX_WHOLE", "SWEEP_EVERY", "Meter", "MeterSweep"]

_log = logging.getLogger(__name__)

#: Contract violation kinds, the values of the ``kind`` label.
KINDS = ("sse_framing", "sse_no_done", "no_choices", "error_body", "not_sse")
#: Longest SSE event looked at; a longer one is a framing violation and ends the looking.
MAX_EVENT = 256 * 1024
#: Largest whole answer parsed for its usage and contract; a longer one is not parsed.
MAX_WHOLE = 1024 * 1024
#: Seconds a stream's chunks wait in their meter's queue before a :class:`MeterSweep` reads them.
SWEEP_EVERY = 0.05
#: Bytes a stream's meter may hold queued; a chunk that takes it over has the queue read at once.
MAX_QUEUED = 64 * 1024
#: Bytes a queued chunk costs beyond its data (its time, its bytes object, two list slots):
#: counted, so a backend sending a byte at a time fills the queue no further than any other.
_QUEUED_OVERHEAD = 80

_CONTENT = re.compile(rb'"(?:content|text|reasoning_content|arguments)"\s*:\s*"[^"]')
#: The same keys as written compactly (``content":"`` ends ``reasoning_content`` too): found
#: with ``bytes.find``, the regular expression runs only for JSON written with spaces.
_COMPACT = (b'content":"', b'text":"', b'arguments":"')


def _has_content(buf: bytes, start: int, end: int) -> bool:
    """The event data ``buf[start:end]`` has a non-empty content string (see the module)."""
    for key in _COMPACT:
        i = buf.find(key, start, end)
        while i >= 0:
            after = i + len(key)
            if after == end or buf[after] != 34:  # not '"': the string is not empty
                return True
            i = buf.find(key, after, end)
    return buf.find(b'": "', start, end) >= 0 and _CONTENT.search(buf, start, end) is not None


_USAGE = re.compile(rb'"completion_tokens"\s*:\s*([0-9]{1,9})')
_CHOICES = re.compile(rb'"choices"\s*:\s*\[')
_NONE: frozenset[str] = frozenset()
#: SSE field names (a line ``name`` or ``name:value``; ``""`` is a comment line ``:...``).
_FIELDS = frozenset({b"data", b"event", b"id", b"retry", b""})


class Meter:
    """The token timing, output tokens and contract of one answer (see the module)."""

    __slots__ = (
        "_body",
        "_body_size",
        "_itl",
        "_last",
        "_pending",
        "_stamps",
        "_sweep",
        "done",
        "events",
        "first",
        "looking",
        "started",
        "status",
        "stream",
        "usage",
        "violations",
    )

    def __init__(
        self,
        started: float,
        status: int,
        stream: bool,
        asked_stream: bool,
        itl: Histogram,
        sweep: MeterSweep | None = None,
    ) -> None:
        self.started = started
        self.status = status
        #: The answer is an event stream.
        self.stream = stream
        self._itl = itl
        #: ``perf_counter()`` of the first content event (streams) or the whole answer.
        self.first: float | None = None
        self._last = 0.0
        #: Content events seen.
        self.events = 0
        #: ``completion_tokens`` from the answer's usage, if it said.
        self.usage: int | None = None
        self.done = False
        #: Kinds of contract violation seen (a set once there is one: most answers have none).
        self.violations: set[str] | frozenset[str] = _NONE
        #: Still reading the stream (not after an event too long to look at).
        self.looking = True
        self._pending = b""
        #: A whole answer's body; a stream's chunks not read yet.
        self._body: list[bytes] = []
        #: The times a stream's queued chunks passed, one per chunk in ``_body``.
        self._stamps: list[float] = []
        #: Bytes in ``_body`` (with a stream's queued chunks' overhead).
        self._body_size = 0
        #: Reads a stream's queued chunks; None: each chunk is read as it passes.
        self._sweep = sweep
        if asked_stream and 200 <= status < 300 and not stream:
            self._violated("not_sse")

    def feed(self, data: bytes) -> None:
        """A chunk of the body, already passed on to the client."""
        if not self.stream:
            if self._body_size <= MAX_WHOLE:
                self._body_size += len(data)
                self._body.append(data)
            return
        if not self.looking:
            return
        sweep = self._sweep
        if sweep is None:
            self._read(data, time.perf_counter())
            return
        queue = self._body
        if not queue:
            sweep.add(self)
        self._stamps.append(time.perf_counter())
        queue.append(data)
        self._body_size += len(data) + _QUEUED_OVERHEAD
        if self._body_size > MAX_QUEUED:
            self.read_queued()

    def read_queued(self) -> None:
        """Read the chunks a stream queued, with the times they passed."""
        queue, stamps = self._body, self._stamps
        if not queue:
            return
        self._body, self._stamps = [], []
        self._body_size = 0
        for data, now in zip(queue, stamps, strict=True):
            self._read(data, now)

    def _read(self, data: bytes, now: float) -> None:
        """A chunk of a stream, passed at ``now``."""
        if not self.looking:
            return
        buf = self._pending + data if self._pending else data
        tail = b""
        if b"\r" in buf:
            if buf[-1:] == b"\r":  # maybe half of a CRLF: wait for the next byte
                buf, tail = buf[:-1], b"\r"
            buf = buf.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        nl = buf.find(b"\n")
        size = len(buf)
        if nl == size - 2 and buf[-1] == 10:  # one event of one line: what engines send
            self._pending = tail
            self._data(buf, nl, now)
            return
        end = buf.find(b"\n\n", nl) if nl >= 0 else -1
        if end < 0:
            self._pending = buf + tail
            if size > MAX_EVENT:
                self._too_long()
            return
        events = buf.split(b"\n\n")
        self._pending = events.pop() + tail
        for ev in events:
            if ev:
                self._event(ev, now)
        if len(self._pending) > MAX_EVENT:
            self._too_long()

    def _violated(self, kind: str) -> None:
        v = self.violations
        if not isinstance(v, set):
            v = self.violations = set()
        v.add(kind)

    def _too_long(self) -> None:
        self._violated("sse_framing")
        self.looking = False
        self._pending = b""

    def _event(self, ev: bytes, now: float) -> None:
        """One event (without its blank line), of any shape."""
        if b"\n" in ev:
            self._lines(ev, now)
        else:
            self._data(ev, len(ev), now)

    def _data(self, buf: bytes, end: int, now: float) -> None:
        """The event of one line, ``buf[:end]`` (the line without its end): a ``data:`` line's
        data is read where it lies."""
        if buf[:5] == b"data:":
            self._payload(buf, 6 if buf[5:6] == b" " else 5, end, now)
        else:
            self._lines(buf[:end], now)

    def _lines(self, ev: bytes, now: float) -> None:
        """An event read line by line (:meth:`_fields`)."""
        payload = self._fields(ev)
        if payload is not None:
            self._payload(payload, 0, len(payload), now)

    def _payload(self, buf: bytes, start: int, end: int, now: float) -> None:
        """An event's data, ``buf[start:end]``: read where it lies, not copied."""
        if buf[start : start + 1] != b"{":
            if end - start == 6 and buf.startswith(b"[DONE]", start):
                self.done = True
            else:
                self._violated("sse_framing")
            return
        if buf.find(b'"choices"', start, end) < 0 and buf.find(b'"error"', start, end) < 0:
            self._violated("no_choices")
        if _has_content(buf, start, end):
            if self.first is None:
                self.first = now
            else:
                self._itl.observe(now - self._last)
            self._last = now
            self.events += 1
        if buf.find(b'"completion_tokens"', start, end) >= 0:
            m = _USAGE.search(buf, start, end)
            if m is not None:
                self.usage = int(m.group(1))

    def _fields(self, ev: bytes) -> bytes | None:
        """The data of a multi-line event (None: a comment, or no data); framing checked."""
        data: list[bytes] = []
        for line in ev.split(b"\n"):
            if line.startswith(b"data:"):
                data.append(line[6:] if line[5:6] == b" " else line[5:])
            elif line.partition(b":")[0] not in _FIELDS:
                self._violated("sse_framing")
                return None
        if not data:
            if not ev.startswith(b":"):
                self._violated("sse_framing")
            return None
        return b"\n".join(data)

    def finish(self, complete: bool) -> None:
        """The answer ended (``complete``: whole, not cut); settles what only the end tells."""
        if self.stream:
            self.read_queued()
            if complete and self.looking:
                if self._pending.strip():
                    self._event(self._pending.strip(b"\n"), time.perf_counter())
                if not self.done and 200 <= self.status < 300:
                    self._violated("sse_no_done")
            return
        if not complete:
            return
        if 200 <= self.status < 300:
            self.first = time.perf_counter()
        if self._body_size > MAX_WHOLE:
            return
        body = b"".join(self._body)
        if self.status >= 400:  # rare: parsed, to tell an OpenAI error object from anything else
            try:
                doc = json.loads(body) if body else None
            except (ValueError, UnicodeDecodeError, RecursionError):
                doc = None
            err = doc.get("error") if isinstance(doc, dict) else None
            if not (isinstance(err, dict) and isinstance(err.get("message"), str)):
                self._violated("error_body")
            return
        if not (200 <= self.status < 300):
            return
        # The common case costs two scans of the bytes, no parse: the same checks as for a
        # stream's events.
        if body[:1] != b"{" or _CHOICES.search(body) is None:
            self._violated("no_choices")
        m = _USAGE.search(body)
        if m is not None:
            self.usage = int(m.group(1))

    @property
    def ttft(self) -> float | None:
        """Seconds from the request to its first token (None: no token came)."""
        return None if self.first is None else self.first - self.started

    @property
    def output_tokens(self) -> int | None:
        """Tokens of the answer: its usage, else (streams) its content events; None: unknown."""
        if self.usage is not None:
            return self.usage
        return self.events if self.stream and self.events else None


class MeterSweep:
    """Reads the chunks streams' meters queued, all together, :data:`SWEEP_EVERY` seconds after
    the first of them.

    Work the router does right after it wrote a chunk to the client delays the client's read
    of that chunk on a machine whose CPUs are shared: measured through one router, a chunk a
    meter read as it passed reached its client some 17-21 us later than a chunk passed through
    unmeasured, while the reading takes 1.5 us in a tight loop (cold, right after a wait for
    the next token, it takes longer), and 20 us of busy work after each write added about as
    much. Queued and read here, the meter adds 1-9 us (``bench/router.py --cases sse``,
    ``token_metrics_added_us_paired``). The times are taken as the chunks pass, so time to
    first token and inter-token latency are what they were; the counts reach the metrics up
    to :data:`SWEEP_EVERY` later, and a stream's are read whole before its request is counted
    (:meth:`Meter.finish`). One timer runs while any chunk waits.
    """

    __slots__ = ("_handle", "meters")

    def __init__(self) -> None:
        #: Meters with queued chunks (one that finished since has none left: read for nothing).
        self.meters: list[Meter] = []
        self._handle: asyncio.TimerHandle | None = None

    def add(self, meter: Meter) -> None:
        """``meter`` queued its first chunk since it was last read."""
        self.meters.append(meter)
        if self._handle is None:
            self._handle = asyncio.get_running_loop().call_later(SWEEP_EVERY, self.run)

    def run(self) -> None:
        """Read every queued chunk now."""
        self._handle = None
        meters, self.meters = self.meters, []
        for meter in meters:
            try:
                meter.read_queued()
            except Exception:  # a meter's fault must not stop the others' reading
                _log.exception("reading a stream's chunks for token metrics failed")
                meter.looking = False
