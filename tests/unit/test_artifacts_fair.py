"""FairPool: groups take turns on the workers, and cancelled work stops at its next pause."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from concurrent.futures import wait

import pytest

from tinct.artifacts.fair import FairPool, Job, WorkCancelledError
from tinct_testing.wait import eventually


@pytest.fixture
def pool() -> Iterator[FairPool]:
    p = FairPool(1, slice_seconds=0.01)
    yield p
    p.shutdown()


def _ticks(n: int, log: list[str], name: str, pause: float = 0.002) -> Job[int]:
    for _ in range(n):
        time.sleep(pause)
        log.append(name)
        yield None
    return n


def test_a_small_group_runs_between_slices_of_a_big_one(pool: FairPool) -> None:
    log: list[str] = []
    big = [pool.group("big").submit(_ticks(500, log, "big")) for _ in range(4)]
    eventually(lambda: "big" in log, timeout=5, interval=0.005, what="the big group running")
    small = pool.group("small").submit(_ticks(3, log, "small"))
    assert small.result(timeout=5) == 3
    big_before_small_done = log[: len(log) - log[::-1].index("small")].count("big")
    total_big = 4 * 500
    print(f"big ticks before the small group finished: {big_before_small_done} of {total_big}")
    assert big_before_small_done < total_big / 4
    assert [f.result(timeout=30) for f in big] == [500] * 4


def test_cancel_drops_queued_and_stops_running_work(pool: FairPool) -> None:
    started, cancelled = threading.Event(), threading.Event()
    log: list[str] = []

    def endless() -> Job[None]:
        started.set()
        # Holds the only worker until the group is cancelled, so the second job is still
        # queued then (on a loaded machine a slice can end before the test cancels).
        cancelled.wait(5)
        while True:
            log.append("x")
            yield None

    group = pool.group("v")
    running = group.submit(endless())
    queued = group.submit(_ticks(1, log, "never"))
    assert started.wait(5)
    group.cancel()
    cancelled.set()
    wait([running, queued], timeout=5)
    for f in (running, queued):
        with pytest.raises(WorkCancelledError):
            f.result()
    seen = len(log)
    time.sleep(0.05)  # slices a job still running would take
    assert len(log) == seen
    assert "never" not in log
    with pytest.raises(WorkCancelledError):
        group.call(len, "late").result(timeout=5)
