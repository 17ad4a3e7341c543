"""Group commit: many events recorded together land in few Delta commits.

:class:`BatchWriter` owns one background thread. Callers :meth:`~BatchWriter.submit`
rows and get a :class:`concurrent.futures.Future` resolving to the Delta version that holds
them. While a commit is in flight, new submissions queue up; the next commit takes all of
them (up to ``max_batch``) — one MERGE per table instead of one per event. With nothing
in flight a single event is committed at once, so latency stays that of one MERGE.

When idle, the thread runs :meth:`LineageStore.maintain` every ``maintain_every`` commits
or ``maintain_interval`` seconds, so compaction never races the writer it belongs to.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import Future
from dataclasses import KW_ONLY, dataclass, field
from typing import Any

from tinct.lineage.store import LineageStore

__all__ = ["BatchWriter", "Record"]

log = logging.getLogger(__name__)

#: Order tables are committed in a batch: details before the event that refers to them.
_ORDER = ("artifacts", "interfaces", "adapters", "release_events", "model_versions", "shadow_pairs")


@dataclass
class Record:
    """Rows for several tables that belong to one event; ``version_of`` names the table
    whose version the future resolves to."""

    rows: Mapping[str, Sequence[Mapping[str, Any]]]
    version_of: str = "model_versions"
    future: Future[int] = field(default_factory=Future)


@dataclass(eq=False)
class BatchWriter:
    """Commits what callers submit to ``store``, up to ``max_batch`` events a commit, from its
    own thread; maintains the tables every ``maintain_every`` commits or ``maintain_interval``
    seconds."""

    store: LineageStore
    _: KW_ONLY
    max_batch: int = 2000
    maintain_every: int = 200
    maintain_interval: float = 3600.0
    #: Commits made so far.
    commits: int = field(default=0, init=False)
    _queue: queue.Queue[Record | None] = field(default_factory=queue.Queue, init=False, repr=False)
    _since_maintain: int = field(default=0, init=False, repr=False)
    _last_maintain: float = field(default_factory=time.monotonic, init=False, repr=False)
    _started: bool = field(default=False, init=False, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)

    def __post_init__(self) -> None:
        self._thread = threading.Thread(target=self._run, name="tinct-lineage-writer", daemon=True)

    def start(self) -> BatchWriter:
        with self._lock:
            if not self._started:
                self.store.ensure()
                self._thread.start()
                self._started = True
        return self

    def submit(
        self, rows: Mapping[str, Sequence[Mapping[str, Any]]], version_of: str = "model_versions"
    ) -> Future[int]:
        """Queue rows (table -> rows) for the next commit."""
        self.start()
        rec = Record(rows=rows, version_of=version_of)
        self._queue.put(rec)
        return rec.future

    async def record(
        self, rows: Mapping[str, Sequence[Mapping[str, Any]]], version_of: str = "model_versions"
    ) -> int:
        """:meth:`submit` for coroutines: awaits the commit without blocking the loop."""
        return await asyncio.wrap_future(self.submit(rows, version_of))

    def close(self, timeout: float = 30.0) -> None:
        """Commit what is queued and stop the thread."""
        if self._started:
            self._queue.put(None)
            self._thread.join(timeout)

    def _run(self) -> None:
        stop = False
        while not stop:
            try:
                first = self._queue.get(timeout=self._idle_timeout())
            except queue.Empty:
                self._maybe_maintain(idle=True)
                continue
            batch: list[Record] = []
            if first is None:
                stop = True
            else:
                batch.append(first)
            while len(batch) < self.max_batch:
                try:
                    nxt = self._queue.get_nowait()
                except queue.Empty:
                    break
                if nxt is None:
                    stop = True
                    break
                batch.append(nxt)
            if batch:
                self._commit(batch)
            self._maybe_maintain(idle=self._queue.empty())

    def _idle_timeout(self) -> float:
        return max(0.5, min(30.0, self.maintain_interval))

    def _commit(self, batch: list[Record]) -> None:
        versions: dict[str, int] = {}
        try:
            for table in _ORDER:
                rows = [row for rec in batch for row in rec.rows.get(table, ())]
                if rows:
                    versions[table] = self.store.merge(table, rows)
                    self.commits += 1
                    self._since_maintain += 1
            for rec in batch:
                ver = versions.get(rec.version_of)
                if ver is None:
                    ver = int(self.store.table(rec.version_of).version())
                rec.future.set_result(ver)
        except Exception as exc:
            log.warning("lineage commit of %d event(s) failed: %s", len(batch), exc)
            for rec in batch:
                if not rec.future.done():
                    rec.future.set_exception(exc)

    def _maybe_maintain(self, *, idle: bool) -> None:
        if not idle or self._since_maintain == 0:
            return
        due = self._since_maintain >= self.maintain_every or (
            time.monotonic() - self._last_maintain >= self.maintain_interval
        )
        if not due:
            return
        try:
            self.store.maintain()
        except Exception as exc:  # maintenance is best effort; the next round retries
            log.warning("lineage maintenance failed: %s", exc)
        self._since_maintain = 0
        self._last_maintain = time.monotonic()
