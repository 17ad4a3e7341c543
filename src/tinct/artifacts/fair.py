"""Worker threads shared fairly between versions, with work that stops when cancelled.

A plain thread pool serves files first come, first served: one version with four 40 GiB
artifacts holds every worker for minutes while a 3 KB version waits behind it. Here each
version gets a :class:`Group`; the workers take groups in turn (round robin) and run one
*slice* of a job of that group — up to :data:`SLICE_SECONDS` of it — before going to the
next group. A job is a generator that yields between blocks (hashing yields after every
block read), so a long hash is resumed where it stopped, possibly on another worker. A
version that arrives while others hash starts within one slice, and versions share the
workers equally whatever their sizes.

:meth:`Group.cancel` (a delete, a new generation, shutdown) drops the group's queued jobs
and stops its running ones at their next yield, within one block; their futures fail with
:class:`WorkCancelledError`. Workers are daemon threads: a process that is exiting never waits for
a hash.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections import deque
from collections.abc import Callable, Generator
from concurrent.futures import Future, InvalidStateError
from dataclasses import dataclass, field
from typing import Any, TypeVar

__all__ = ["SLICE_SECONDS", "FairPool", "Group", "Job", "WorkCancelledError"]

T = TypeVar("T")
#: A unit of work: yields whenever it may be paused, returns its result.
Job = Generator[object, None, T]

#: How long a worker stays on one job before it serves the next group.
SLICE_SECONDS = 0.1


class WorkCancelledError(Exception):
    """The work was cancelled: its version was deleted, changed, or the operator stops."""


@dataclass(eq=False)
class _Task:
    job: Job[Any]
    future: Future[Any]
    started: bool = False

    def fail(self, exc: BaseException) -> None:
        self.job.close()
        with contextlib.suppress(InvalidStateError):  # the waiter cancelled it first
            self.future.set_exception(exc)


@dataclass(eq=False)
class Group:
    """The work of one version; made by :meth:`FairPool.group`."""

    pool: FairPool
    key: str
    tasks: deque[_Task] = field(default_factory=deque)
    cancelled: bool = False
    queued: bool = False  # in the pool's rotation

    def submit(self, job: Job[T]) -> Future[T]:
        """Run ``job`` (a started generator) on the pool; its result or exception in the future."""
        future: Future[T] = Future()
        self.pool._put(self, _Task(job, future))
        return future

    def call(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> Future[T]:
        """Run a plain function as one job (it cannot be paused, so keep it short)."""
        return self.submit(_once(fn, *args, **kwargs))

    def cancel(self) -> None:
        """Drop the queued work and stop the running work at its next pause."""
        self.pool._cancel(self)


def _once(fn: Callable[..., T], *args: Any, **kwargs: Any) -> Job[T]:
    return fn(*args, **kwargs)
    yield  # a generator that never pauses


class FairPool:
    """``workers`` daemon threads serving :class:`Group` s in turn."""

    def __init__(
        self, workers: int, *, name: str = "tinct-hash", slice_seconds: float = SLICE_SECONDS
    ) -> None:
        self.slice_seconds = slice_seconds
        self._cond = threading.Condition()
        self._rotation: deque[Group] = deque()
        self._closed = False
        self._threads = [
            threading.Thread(target=self._work, name=f"{name}-{i}", daemon=True)
            for i in range(max(1, workers))
        ]
        for t in self._threads:
            t.start()

    def group(self, key: str) -> Group:
        return Group(self, key)

    def shutdown(self) -> None:
        """Cancel everything queued or running and let the workers end."""
        with self._cond:
            self._closed = True
            groups = list(self._rotation)
            self._cond.notify_all()
        for g in groups:
            g.cancel()

    # --- internals, under self._cond --------------------------------------------------

    def _put(self, group: Group, task: _Task) -> None:
        with self._cond:
            if group.cancelled or self._closed:
                task.fail(WorkCancelledError(group.key))
                return
            group.tasks.append(task)
            self._enqueue(group)

    def _enqueue(self, group: Group) -> None:
        if not group.queued and group.tasks and not group.cancelled:
            group.queued = True
            self._rotation.append(group)
            self._cond.notify()

    def _cancel(self, group: Group) -> None:
        with self._cond:
            group.cancelled = True
            dropped = list(group.tasks)
            group.tasks.clear()
            if group.queued:
                self._rotation.remove(group)
                group.queued = False
        for task in dropped:
            task.fail(WorkCancelledError(group.key))

    def _next(self) -> tuple[Group, _Task] | None:
        with self._cond:
            while not self._rotation:
                if self._closed:
                    return None
                self._cond.wait()
            group = self._rotation.popleft()
            group.queued = False
            task = group.tasks.popleft()
            self._enqueue(group)  # back at the end of the rotation if it has more
            return group, task

    def _work(self) -> None:
        while (picked := self._next()) is not None:
            group, task = picked
            if not task.started:
                task.started = True
                if not task.future.set_running_or_notify_cancel():  # the waiter gave up
                    task.job.close()
                    continue
            self._run_slice(group, task)

    def _run_slice(self, group: Group, task: _Task) -> None:
        deadline = time.monotonic() + self.slice_seconds
        try:
            while True:
                if group.cancelled:
                    task.fail(WorkCancelledError(group.key))
                    return
                next(task.job)
                if time.monotonic() >= deadline:
                    break
        except StopIteration as done:
            task.future.set_result(done.value)
            return
        except Exception as exc:
            task.future.set_exception(exc)
            return
        # The slice is over: the job waits for the group's next turn.
        with self._cond:
            if group.cancelled:
                cancelled = True
            else:
                cancelled = False
                group.tasks.append(task)
                self._enqueue(group)
        if cancelled:
            task.fail(WorkCancelledError(group.key))
