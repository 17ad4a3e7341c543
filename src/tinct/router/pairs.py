"""Pairs of a mirrored request's answers, and their way to the comparer.

A mirror (:mod:`tinct.router.shadow`) keeps a bounded copy of each side's answer
(:class:`AnswerCopy`); once both are in, the pair becomes one NDJSON line (:func:`pair_line`,
the wire format of ``tinct comparer``'s ``POST /v1/pairs``) and goes on the worker's
:class:`PairSender` queue, which POSTs batches of up to :data:`BATCH_PAIRS` pairs, or what
:data:`BATCH_SECONDS` gathered, with the bearer token.

Nothing here is on a request's path: a full queue, a byte cap reached (:class:`Held`), a
comparer that is down, slow or refuses the token -- each drops the pairs concerned and counts
them (``tinct_router_shadow_skipped_total{reason="send_dropped"}``); no pair is retried and
nothing waits for room. After a failed send the sender waits 0.5 s, doubling up to 10 s,
before the next one, while the queue fills up to its bound.
"""

from __future__ import annotations

import asyncio
import base64
import collections
import contextlib
import json
import logging
import os
from dataclasses import KW_ONLY, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from yarl import URL

from tinct.router.response import UpstreamError

if TYPE_CHECKING:
    from tinct.router.metrics import ShadowMetrics
    from tinct.router.upstream import Origin, UpstreamPool

_log = logging.getLogger(__name__)

#: Pairs in one POST at most.
BATCH_PAIRS = 64
#: Seconds a pair waits for others to share its POST.
BATCH_SECONDS = 0.25
#: Bytes of one POST at most (the comparer takes 64 MiB): a longer batch is cut in two.
BATCH_BYTES = 32 * 1024 * 1024
#: Seconds one POST may take, connection included.
SEND_TIMEOUT = 10.0
#: Bytes of the comparer's answer read (it is a small JSON object).
_ANSWER_BYTES = 64 * 1024
#: The comparer's path, under the ``--comparer`` URL.
PAIRS_PATH = "/v1/pairs"
#: The token when no ``--comparer-token-file`` is given.
TOKEN_ENV = "TINCT_COMPARER_TOKEN"

#: (namespace, release) a pair counts under.
ReleaseKey = tuple[str, str]


class AnswerCopy:
    """One side's answer as the pair carries it: head facts and up to ``limit`` body bytes."""

    __slots__ = ("chunks", "content_type", "error", "limit", "ms", "size", "status", "truncated")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.chunks: list[bytes] = []
        self.size = 0
        #: More than ``limit`` bytes came: only the first ``limit`` are kept.
        self.truncated = False
        self.status: int | None = None
        self.content_type = ""
        self.ms: float | None = None
        #: How the mirror failed: ``timeout``, ``unreachable``, ``reset``, ``bad_answer``.
        self.error: str | None = None

    def add(self, data: bytes) -> None:
        """Keep ``data`` while under the limit; the bytes beyond it are dropped."""
        if self.truncated:
            return
        room = self.limit - self.size
        if len(data) > room:
            if room:
                self.chunks.append(data[:room])
            self.size = self.limit
            self.truncated = True
        else:
            self.chunks.append(data)
            self.size += len(data)

    def wire(self) -> dict[str, Any]:
        body = b"".join(self.chunks)
        self.chunks = []
        return {
            "status": self.status,
            "content_type": self.content_type,
            "body_b64": base64.b64encode(body).decode("ascii"),
            "truncated": self.truncated,
            "ms": None if self.ms is None else round(self.ms, 3),
            "error": self.error,
        }


def content_type(headers: list[tuple[bytes, bytes, bytes]]) -> str:
    """The first ``Content-Type`` of (lower-cased name, name, value) headers, or ""."""
    for n, _, value in headers:
        if n == b"content-type":
            return value.decode("latin-1")[:256]
    return ""


def pair_line(
    *,
    namespace: str,
    release: str,
    uid: str,
    table_version: int,
    dye_tag: str,
    target: str,
    time: float,
    path: str,
    body: bytes,
    prompt_tokens: int,
    stable: AnswerCopy,
    candidate: AnswerCopy,
) -> bytes:
    """The pair as one NDJSON line (newline included): the comparer's wire format, version 1."""
    doc = {
        "v": 1,
        "namespace": namespace,
        "release": release,
        "uid": uid,
        "table_version": table_version,
        "dye_tag": dye_tag,
        "target": target,
        "time": round(time, 3),
        "request": {
            "path": path,
            "body": body.decode("utf-8", errors="replace"),
            "prompt_tokens": prompt_tokens,
        },
        "stable": stable.wire(),
        "candidate": candidate.wire(),
    }
    return json.dumps(doc, ensure_ascii=False, separators=(",", ":")).encode() + b"\n"


@dataclass
class Held:
    """Bytes a worker holds for pairs: reserved by mirrors in flight, and queued lines."""

    cap: int
    bytes: int = 0

    def room(self, n: int) -> bool:
        return self.bytes + n <= self.cap

    def take(self, n: int) -> None:
        self.bytes += n

    def give(self, n: int) -> None:
        self.bytes -= n


@dataclass
class TokenSource:
    """The bearer token: ``--comparer-token-file`` (re-read when it changes, as a mounted
    Secret does on rotation), else ``$TINCT_COMPARER_TOKEN``, else none."""

    file: Path | None = None
    _stamp: tuple[float, int] | None = field(default=None, repr=False)
    _token: str | None = field(default=None, repr=False)

    def read(self) -> str | None:
        """The token now.

        Raises:
            OSError: the file cannot be read.
        """
        if self.file is None:
            return os.environ.get(TOKEN_ENV) or None
        st = self.file.stat()
        stamp = (st.st_mtime, st.st_size)
        if stamp != self._stamp:
            self._token = self.file.read_text().strip() or None
            self._stamp = stamp
        return self._token


@dataclass(frozen=True)
class Destination:
    """Where pairs go: the comparer's origin, ``Host`` and the path of ``POST /v1/pairs``."""

    origin: Origin
    authority: bytes
    target: bytes

    @classmethod
    def parse(cls, url: str) -> Destination:
        """``--comparer URL``: ``http(s)://host[:port][/prefix]``.

        Raises:
            ValueError: not such a URL.
        """
        u = URL(url)
        if u.scheme not in ("http", "https") or not u.host or u.query_string or u.fragment:
            raise ValueError(f"--comparer {url!r}: give the comparer's http(s)://HOST[:PORT] URL")
        port = u.port
        assert port is not None  # http and https have default ports
        authority = url.split("://", 1)[1].split("/", 1)[0].encode("ascii")
        prefix = u.raw_path.rstrip("/")
        return cls((u.host, port, u.scheme == "https"), authority, (prefix + PAIRS_PATH).encode("ascii"))


@dataclass(eq=False)
class PairSender:
    """A worker's bounded queue of pair lines and the task that POSTs them in batches."""

    destination: Destination
    token: TokenSource
    pool: UpstreamPool
    held: Held
    metrics: ShadowMetrics
    _: KW_ONLY
    max_pairs: int
    _queue: collections.deque[tuple[bytes, ReleaseKey]] = field(default_factory=collections.deque, init=False)
    _some: asyncio.Event = field(default_factory=asyncio.Event, init=False)
    _full: asyncio.Event = field(default_factory=asyncio.Event, init=False)
    _backoff: float = field(default=0.0, init=False)
    #: Pairs dropped since the last failure was logged (failures are logged once a minute).
    _dropped_unlogged: int = field(default=0, init=False)
    _logged_at: float | None = field(default=None, init=False)
    _task: asyncio.Task[None] | None = field(default=None, init=False)
    _closing: bool = field(default=False, init=False)
    _stop: asyncio.Event = field(default_factory=asyncio.Event, init=False)

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="tinct-router-pairs")

    def put(self, line: bytes, key: ReleaseKey) -> bool:
        """Queue ``line``; False (and counted as dropped) when the queue or the byte cap is
        full, or the sender is closing."""
        if self._closing or len(self._queue) >= self.max_pairs or not self.held.room(len(line)):
            self._dropped(key, 1)
            return False
        self.held.take(len(line))
        self._queue.append((line, key))
        self._some.set()
        if len(self._queue) >= BATCH_PAIRS:
            self._full.set()
        return True

    @property
    def queued(self) -> int:
        return len(self._queue)

    def _dropped(self, key: ReleaseKey, n: int) -> None:
        self.metrics.skipped.labels(key[0], key[1], "send_dropped").inc(n)

    def _take(self) -> list[tuple[bytes, ReleaseKey]]:
        batch: list[tuple[bytes, ReleaseKey]] = []
        size = 0
        q = self._queue
        while q and len(batch) < BATCH_PAIRS and (not batch or size + len(q[0][0]) <= BATCH_BYTES):
            item = q.popleft()
            size += len(item[0])
            batch.append(item)
        if not q and not self._closing:
            self._some.clear()
        if len(q) < BATCH_PAIRS and not self._closing:
            self._full.clear()
        return batch

    async def _run(self) -> None:
        while not self._closing:
            await self._some.wait()
            if len(self._queue) < BATCH_PAIRS and not self._closing:
                await self._until(self._full, BATCH_SECONDS)
            if not await self.flush_once() and not self._closing:
                await self._until(self._stop, self._backoff)
        # Closing: what is queued goes out now, in batches, while the comparer takes it.
        while self._queue and await self.flush_once():
            pass

    @staticmethod
    async def _until(event: asyncio.Event, seconds: float) -> None:
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(seconds):
                await event.wait()

    async def flush_once(self) -> bool:
        """POST one batch off the queue (if any); True when the comparer took it."""
        batch = self._take()
        if not batch:
            return True
        try:
            ok, why = await self._post(b"".join(line for line, _ in batch))
        except BaseException:  # cancelled: shutting down
            self._settle(batch, False)
            raise
        self._settle(batch, ok)
        if ok:
            if self._backoff:
                _log.info("comparer takes pairs again")
            self._backoff = 0.0
            self._logged_at = None
            return True
        self._backoff = min(10.0, self._backoff * 2 or 0.5)
        self._dropped_unlogged += len(batch)
        now = asyncio.get_running_loop().time()
        if self._logged_at is None or now - self._logged_at >= 60.0:
            _log.warning(
                "pairs not sent to the comparer (%s); %d pairs dropped; retrying in %.1fs",
                why,
                self._dropped_unlogged,
                self._backoff,
            )
            self._logged_at = now
            self._dropped_unlogged = 0
        return False

    def _settle(self, batch: list[tuple[bytes, ReleaseKey]], sent: bool) -> None:
        """The batch is off the queue: its bytes are free, its pairs sent or dropped."""
        counts: dict[ReleaseKey, int] = {}
        for line, key in batch:
            self.held.give(len(line))
            counts[key] = counts.get(key, 0) + 1
        for key, n in counts.items():
            if sent:
                self.metrics.pairs_sent.labels(*key).inc(n)
            else:
                self._dropped(key, n)

    async def _post(self, body: bytes) -> tuple[bool, str]:
        d = self.destination
        try:
            token = self.token.read()
        except OSError as e:
            return False, f"cannot read the token file {self.token.file}: {e.strerror or e}"
        auth = b"Authorization: Bearer %b\r\n" % token.encode("latin-1") if token else b""
        headers = b"Host: %b\r\nContent-Type: application/x-ndjson\r\nUser-Agent: tinct-router\r\n%b" % (
            d.authority,
            auth,
        )
        answer = bytearray()

        def keep(data: bytes) -> None:
            if len(answer) < _ANSWER_BYTES:
                answer.extend(data[: _ANSWER_BYTES - len(answer)])

        try:
            async with asyncio.timeout(SEND_TIMEOUT):
                resp = await self.pool.request(d.origin, "POST", d.target, headers, body)
                try:
                    done = resp.stream(keep)
                    if done is not None:
                        await done
                finally:
                    resp.close()
        except TimeoutError:
            return False, f"no answer within {SEND_TIMEOUT:g}s"
        except (UpstreamError, OSError) as e:
            return False, str(e) or repr(e)
        if 200 <= resp.status < 300:
            _log.debug("comparer: %s", bytes(answer[:200]).decode("utf-8", "replace"))
            return True, ""
        if resp.status == 401:
            return False, "the comparer refused the token (401): check --comparer-token-file"
        return False, f"the comparer answered {resp.status}: {bytes(answer[:200]).decode('utf-8', 'replace')}"

    async def close(self, timeout: float = 2.0) -> None:
        """Send what is queued (a send under way ends first) for up to ``timeout`` seconds,
        then drop the rest; no later pair is taken."""
        self._closing = True
        for event in (self._stop, self._some, self._full):
            event.set()
        task, self._task = self._task, None
        if task is not None:
            done, _ = await asyncio.wait({task}, timeout=timeout)
            if not done:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        while self._queue:
            line, key = self._queue.popleft()
            self.held.give(len(line))
            self._dropped(key, 1)


__all__ = [
    "BATCH_PAIRS",
    "BATCH_SECONDS",
    "PAIRS_PATH",
    "TOKEN_ENV",
    "AnswerCopy",
    "Destination",
    "Held",
    "PairSender",
    "ReleaseKey",
    "TokenSource",
    "content_type",
    "pair_line",
]
