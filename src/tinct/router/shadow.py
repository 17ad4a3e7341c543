"""Mirroring: a share of the requests stable answers, sent again to judge the candidate.

A classified request (``/v1/chat/completions``, ``/v1/completions``) is **mirrored** when
its live side is stable (the sticky choice did not send it to the candidate), the table
names shadow settings, its cell's ``shadow`` share is above 0 and the request's sticky point
under the salt ``<release>/shadow`` is below that share (:func:`~tinct.router.choose.salted_point`:
a session stays mirrored, or not, while the share holds). The mirror is the same request --
the body the router read to classify it, the same headers -- sent by a task of its own to the
candidate, or for ``noiseShare`` percent of the mirrors (drawn at random) to stable a second
time, with ``X-Tinct-Shadow: 1`` (the client's own ``X-Tinct-Shadow`` never reaches a backend:
the proxy drops it from every request).

The client's answer is stable's, as without mirroring: the proxy hands each chunk to the
client first, then to :meth:`Mirror.tee`'s copy (references to the same bytes, up to the
release's ``maxBytes``; only the chunk that crosses the limit is sliced). The mirror's answer
is read to its end or to ``maxBytes`` (then its connection is closed), within
``timeoutSeconds`` for the whole of it. When both are in, the pair becomes one NDJSON line
(:mod:`tinct.router.pairs`) on the worker's send queue.

Mirrors use an upstream pool of their own (its idle connections capped per backend by
``--upstream-keepalive``, as the live one): a hung or slow candidate holds mirror connections
only, never the live path's. Budgets, per worker and per release, are checked before a
mirror is made; over any of them the request is not mirrored and
``tinct_router_shadow_skipped_total{reason="budget"}`` counts it -- nothing is queued:

- ``maxConcurrent`` mirrors in flight (a mirror leaves the count when its own answer is in);
- ``maxTokensPerMinute`` prompt tokens, the router's estimate (characters / ``charsPerToken``,
  plus token ids), as a bucket that refills continuously and holds a minute's worth;
- the worker's ``--shadow-max-held-bytes``: a mirror reserves its body and twice ``maxBytes``
  until its pair is queued, and queued lines hold their size until sent.

Mirrors are shadow traffic only: none of them is counted in the live series (requests,
latencies, tokens, contract), tried as a fallback, or counted towards the candidate's
ejection. Their own counts are ``tinct_router_shadow_mirrors_total`` and
``tinct_router_shadow_skipped_total`` (:class:`~tinct.router.metrics.ShadowMetrics`).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import math
import random
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from tinct.router.adapter import with_model
from tinct.router.choose import salted_point, sticky_key
from tinct.router.classify import CHAT_PATH, chat_chars, completion_size
from tinct.router.pairs import AnswerCopy, Held, PairSender, ReleaseKey, content_type, pair_line
from tinct.router.proxy import SCHEDULER_VERSION, SHADOW, forward_headers
from tinct.router.response import (
    Response,
    Sink,
    UpstreamConnectError,
    UpstreamError,
    UpstreamRejectedError,
)
from tinct.router.table import CompiledTable, Upstream, salt

if TYPE_CHECKING:
    from tinct.api.v1alpha1.shadow import ShadowTable
    from tinct.router.config import RouterConfig
    from tinct.router.exchange import Exchange
    from tinct.router.metrics import ShadowMetrics
    from tinct.router.upstream import UpstreamPool

_log = logging.getLogger(__name__)


def prompt_tokens(path: str, doc: Mapping[str, Any], table: CompiledTable) -> int:
    """The router's estimate of a classified request's prompt tokens, rounded up."""
    if path == CHAT_PATH:
        return math.ceil(chat_chars(doc) / table.chars_per_token)
    chars, ids = completion_size(doc)
    return math.ceil(chars / table.chars_per_token) + ids


@dataclass(slots=True)
class _Budget:
    """One release's mirroring budget in this worker."""

    in_flight: int = 0
    #: Prompt tokens that may still be mirrored, and the loop time they were counted at.
    tokens: float = 0.0
    stamp: float | None = None

    def spend(self, n: int, per_minute: int, now: float) -> bool:
        """Take ``n`` tokens from the bucket (a minute's worth, refilled continuously)."""
        if self.stamp is None:
            level = float(per_minute)
        else:
            level = min(float(per_minute), self.tokens + (now - self.stamp) * per_minute / 60.0)
        self.stamp = now
        if n > level:
            self.tokens = level
            return False
        self.tokens = level - n
        return True


async def _read(resp: Response, copy: AnswerCopy) -> None:
    """Read ``resp``'s body into ``copy`` until it ends or the copy is full.

    Raises:
        UpstreamError: the backend failed mid-answer.
    """
    waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def add(data: bytes) -> None:
        copy.add(data)
        if copy.truncated and not waiter.done():
            waiter.set_result(None)

    def relay(d: asyncio.Future[None]) -> None:
        exc = None if d.cancelled() else d.exception()  # retrieved even when nobody waits
        if waiter.done():
            return
        if exc is not None:
            waiter.set_exception(exc)
        else:
            waiter.set_result(None)

    done = resp.stream(add)
    if done is None:
        return
    asyncio.ensure_future(done).add_done_callback(relay)
    if not copy.truncated:
        await waiter


class Mirror:
    """One mirrored request: stable's teed copy, the mirror's task and its answer."""

    __slots__ = (
        "_body",
        "_budget",
        "_ended",
        "_ex",
        "_reserved",
        "_shadow",
        "_started",
        "_timeout",
        "_tokens",
        "_up",
        "_wall",
        "candidate",
        "stable",
        "target",
        "task",
    )

    def __init__(
        self,
        shadow: Shadow,
        budget: _Budget,
        ex: Exchange,
        settings: ShadowTable,
        up: Upstream,
        tokens: int,
        reserved: int,
    ) -> None:
        self._shadow = shadow
        self._budget = budget
        self._ex = ex
        # The request body is the mirror's to send and to pair: the proxy lets go of its own
        # once stable's answer is taken (its bytes are counted in ``reserved``).
        assert ex.body is not None
        self._body = ex.body
        route = ex.table.adapter
        if route is not None and up.side == "candidate":
            # A LoRA adapter candidate: the same request under its served name, to a pod holding it.
            pod, rewritten = route.pick(), with_model(ex.body, route.served)
            if pod is not None and rewritten is not None:
                up, self._body = pod, rewritten[0]
        self._up = up
        #: ``candidate``, or ``stable`` for a noise-floor mirror.
        self.target = "stable" if up.side == "stable" else "candidate"
        self._tokens = tokens
        self._reserved = reserved
        self._timeout = float(settings.timeout_seconds)
        self._started = time.perf_counter()
        self._wall = time.time() - (self._started - ex.started)
        self.stable = AnswerCopy(settings.max_bytes)
        #: The mirror's answer (for a noise-floor mirror, stable's second one).
        self.candidate = AnswerCopy(settings.max_bytes)
        loop = asyncio.get_running_loop()
        self._ended: asyncio.Future[bool] = loop.create_future()
        budget.in_flight += 1
        shadow.held.take(reserved)
        self.task = loop.create_task(self._run(), name="tinct-router-mirror")

    # --- the live side ---------------------------------------------------------------------

    def tee(self, resp: Response, sink: Sink) -> Sink:
        """``sink`` that also keeps a copy of stable's answer ``resp`` (after the client's write)."""
        copy = self.stable
        copy.status = resp.status
        copy.content_type = content_type(resp.headers)
        add = copy.add

        def teed(data: bytes) -> None:
            sink(data)
            add(data)

        return teed

    def stable_ended(self, complete: bool) -> None:
        """Stable's answer is over: whole (``complete``), or not (failed, cut, the client gone:
        no pair, and the mirror is called off). Only the first call counts."""
        if self._ended.done():
            return
        ok = complete and self.stable.status is not None
        self.stable.ms = (time.perf_counter() - self._ex.started) * 1000.0
        if not ok:
            self._shadow.skip(self._ex.table, "stable_error")
            self.task.cancel()
        self._ended.set_result(ok)

    # --- the mirror's task -----------------------------------------------------------------

    async def _run(self) -> None:
        shadow = self._shadow
        line: bytes | None = None
        try:
            try:
                await self._ask()
            finally:
                self._budget.in_flight -= 1
            if await self._ended:
                c = self.candidate
                why = c.error or ("too_long" if c.truncated or self.stable.truncated else None)
                if why is not None:
                    shadow.skip(self._ex.table, why)
                line = self._line()
        finally:
            shadow.held.give(self._reserved)
        if line is not None:
            table = self._ex.table
            shadow.sender.put(line, (table.namespace, table.release))

    async def _ask(self) -> None:
        ex, up, answer = self._ex, self._up, self.candidate
        request = ex.request
        headers = b"Host: %b\r\n%b%b: %b\r\n%b: 1\r\n" % (
            up.authority,
            forward_headers(request.fields, request.hops, request.remote),
            SCHEDULER_VERSION,
            up.version_b,
            SHADOW,
        )
        timeout = asyncio.timeout(self._timeout)
        t0 = time.perf_counter()
        try:
            async with timeout:
                resp = await self._shadow.pool.request(
                    up.origin, "POST", up.prefix + request.target, headers, self._body
                )
                try:
                    answer.status = resp.status
                    answer.content_type = content_type(resp.headers)
                    await _read(resp, answer)
                finally:
                    resp.close()
        except TimeoutError:
            if not timeout.expired():
                raise
            answer.error = "timeout"
        except UpstreamConnectError:
            answer.error = "unreachable"
        except UpstreamRejectedError:
            answer.error = "bad_answer"
        except (UpstreamError, OSError) as e:
            _log.debug("mirror to %s failed: %r", up.url, e)
            answer.error = "reset"
        answer.ms = (time.perf_counter() - t0) * 1000.0

    def _line(self) -> bytes:
        ex = self._ex
        table = ex.table
        return pair_line(
            namespace=table.namespace,
            release=table.release,
            uid=table.table.uid or "",
            table_version=table.version,
            dye_tag=ex.tag,
            target=self.target,
            time=self._wall,
            path=ex.request.path,
            body=self._body,
            prompt_tokens=self._tokens,
            stable=self.stable,
            candidate=self.candidate,
        )


class Shadow:
    """A worker's mirroring: the choice, the budgets, the mirrors in flight."""

    def __init__(
        self,
        pool: UpstreamPool,
        sender: PairSender,
        held: Held,
        metrics: ShadowMetrics,
        rng: random.Random | None = None,
    ) -> None:
        #: Upstream connections of the mirrors alone.
        self.pool = pool
        self.sender = sender
        self.held = held
        self.metrics = metrics
        self._rng = rng or random.Random()
        self._budgets: dict[ReleaseKey, _Budget] = {}
        self._salts: dict[str, hashlib.blake2b] = {}
        self._mirrors: set[asyncio.Task[None]] = set()
        metrics.held_bytes.set_function(lambda: float(held.bytes))

    def skip(self, table: CompiledTable, reason: str) -> None:
        self.metrics.skipped.labels(table.namespace, table.release, reason).inc()

    def consider(self, ex: Exchange, cell: int, doc: Mapping[str, Any]) -> Mirror | None:
        """Mirror ``ex`` (classified, going to stable, in table cell ``cell``) if its share
        and the budgets say so; the mirror is under way when it is returned."""
        table = ex.table
        rt = table.table
        settings = rt.shadow
        if settings is None or rt.standing:
            return None
        share = rt.cells[cell].shadow
        if share <= 0.0:
            return None
        if share < 100.0:
            base = self._salts.get(table.release)
            if base is None:
                base = self._salts[table.release] = salt(table.release + "/shadow")
            if salted_point(base, sticky_key(ex.request.headers, table)) >= share:
                return None
        assert ex.body is not None
        key = (table.namespace, table.release)
        budget = self._budgets.get(key)
        if budget is None:
            budget = self._budgets[key] = _Budget()
        reserved = len(ex.body) + 2 * settings.max_bytes
        tokens = prompt_tokens(ex.request.path, doc, table)
        if (
            budget.in_flight >= settings.max_concurrent
            or not self.held.room(reserved)
            or not budget.spend(tokens, settings.max_tokens_per_minute, time.monotonic())
        ):
            self.skip(table, "budget")
            return None
        noise = settings.noise_share > 0.0 and self._rng.random() * 100.0 < settings.noise_share
        mirror = Mirror(
            self, budget, ex, settings, table.stable if noise else table.candidate, tokens, reserved
        )
        self.metrics.mirrors.labels(table.namespace, table.release, ex.tag, mirror.target).inc()
        self._mirrors.add(mirror.task)
        mirror.task.add_done_callback(self._mirror_done)
        return mirror

    def _mirror_done(self, task: asyncio.Task[None]) -> None:
        self._mirrors.discard(task)
        if not task.cancelled() and (exc := task.exception()) is not None:
            _log.error("a mirror failed", exc_info=exc)

    @property
    def in_flight(self) -> int:
        """Mirrors not finished (their answer, or stable's, still to come)."""
        return len(self._mirrors)

    async def close(self) -> None:
        """Call off the mirrors in flight, send what is queued (briefly), close the connections."""
        for task in list(self._mirrors):
            task.cancel()
        if self._mirrors:
            await asyncio.gather(*self._mirrors, return_exceptions=True)
        await self.sender.close()
        with contextlib.suppress(Exception):
            await self.pool.close()


def open_shadow(
    config: RouterConfig, metrics: ShadowMetrics, resolve: Mapping[tuple[str, int], tuple[str, int]]
) -> Shadow:
    """The worker's mirroring for ``config.comparer``, its pair sender started.

    Raises:
        ValueError: ``config.comparer`` is not an http(s) URL.
    """
    from tinct.router.pairs import Destination, TokenSource
    from tinct.router.upstream import UpstreamPool

    assert config.comparer is not None
    destination = Destination.parse(config.comparer)
    held = Held(config.shadow_max_held_bytes)
    sender = PairSender(
        destination,
        TokenSource(config.comparer_token_file),
        UpstreamPool(connect_timeout=min(config.connect_timeout, 5.0), keep_per_origin=2, resolve=resolve),
        held,
        metrics,
        max_pairs=config.comparer_queue,
    )
    sender.start()
    pool = UpstreamPool(
        connect_timeout=config.connect_timeout,
        keep_per_origin=config.upstream_keepalive,
        idle_timeout=config.keepalive_timeout,
        resolve=resolve,
    )
    return Shadow(pool, sender, held, metrics)


__all__ = ["Mirror", "Shadow", "open_shadow", "prompt_tokens"]
