"""Work repeated in the background while a test, the demo or a benchmark goes on: steady
traffic, sampling what a cluster shows, keeping Prometheus' targets current.

A :class:`Repeating` calls :meth:`~Repeating.step` over and over from ``workers`` daemon
threads for as long as its ``with`` block runs, each thread pausing ``pause`` seconds between
steps; the pause paces the work, it never waits for a state. Leaving the block stops the
threads at their next pause and joins them. :meth:`~Repeating.tally` counts outcomes from any
thread.
"""

from __future__ import annotations

import threading
from collections import Counter
from typing import Self


class Repeating:
    """:meth:`step` from ``workers`` threads, ``pause`` seconds apart, until the block ends."""

    #: Threads running :meth:`step`.
    workers: int = 1
    #: Seconds each thread waits after a step (0: none).
    pause: float = 0.01
    #: Seconds leaving the block waits for each thread to finish its step.
    join_timeout: float = 30.0

    def step(self, worker: int, i: int) -> None:
        """The ``i``-th repetition of thread ``worker`` (0-based)."""
        raise NotImplementedError

    @property
    def outcomes(self) -> Counter[object]:
        """A copy of what :meth:`tally` counted so far."""
        with self._lock:
            return self._outcomes.copy()

    def tally(self, outcome: object) -> None:
        """Count one ``outcome`` (thread-safe)."""
        with self._lock:
            self._outcomes[outcome] += 1

    def idle(self, seconds: float) -> bool:
        """Pause ``seconds`` inside a step; True once the block has ended (stop now)."""
        return self._stop.wait(seconds)

    def _run(self, worker: int) -> None:
        i = 0
        while not self._stop.is_set():
            self.step(worker, i)
            i += 1
            if self.pause:
                self._stop.wait(self.pause)

    def __enter__(self) -> Self:
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._outcomes: Counter[object] = Counter()
        name = type(self).__name__
        self._threads = [
            threading.Thread(target=self._run, args=(w,), name=f"{name}-{w}", daemon=True)
            for w in range(self.workers)
        ]
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(self.join_timeout)


__all__ = ["Repeating"]
