"""A query on the lineage tables is held to its memory limit and its timeout, in the main thread
and in a worker: a cartesian product of millions of rows, an endless scan."""

from __future__ import annotations

import resource
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from tinct.lineage.errors import QueryLimitError
from tinct.lineage.limits import Limits
from tinct.lineage.sql import query
from tinct.lineage.store import LineageStore
from tinct_testing.lineage_artifacts import lineage_event as _event


@pytest.fixture
def wide(tmp_path: Path) -> str:
    """model_versions with 300 rows: a three-way cartesian product of it has 27 million."""
    store = LineageStore(str(tmp_path / "wide"))
    store.merge("model_versions", [row for i in range(300) for row in _event(i)["model_versions"]])
    return store.root


CARTESIAN = (
    "SELECT a.uid, b.event_id, c.recorded_at FROM model_versions a, model_versions b, model_versions c"
)


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _stopped(run: Callable[[], Any]) -> QueryLimitError:
    """The limit ``run`` ends at; afterwards the process does no more work for it."""
    with pytest.raises(QueryLimitError) as stopped:
        run()
    before = _cpu()
    time.sleep(1)
    # A query left running would keep a core busy; this process has nothing else to do.
    assert _cpu() - before < 0.5
    return stopped.value


@pytest.mark.parametrize("in_thread", [False, True], ids=["main thread", "worker thread"])
def test_queries_are_held_to_their_memory_limit_and_timeout(wide: str, in_thread: bool) -> None:
    def run(sql: str, limits: Limits) -> Callable[[], Any]:
        if not in_thread:
            return lambda: query(sql, wide, limits=limits)

        def in_a_thread() -> Any:
            with ThreadPoolExecutor(1) as pool:
                return pool.submit(query, sql, wide, limits=limits).result()

        return in_a_thread

    small = Limits(memory=32 * 2**20)
    sorted_ = _stopped(run(f"{CARTESIAN} ORDER BY a.uid, b.event_id, c.recorded_at", small))
    assert sorted_.limit == "memory"
    assert str(sorted_).startswith(
        "the query needs more than the memory limit of 32 MiB for its joins, sorts or aggregations"
    )
    unsorted = _stopped(run(CARTESIAN, small))
    assert str(unsorted) == (
        "the answer is larger than the memory limit of 32 MiB: add a LIMIT, a filter or an aggregate, "
        "or raise --memory-limit"
    )
    # A row every thousand values, never the whole answer: stopped between its batches.
    sparse = "SELECT value FROM generate_series(1, 1000000000000) WHERE value % 1000 = 0"
    assert str(_stopped(run(sparse, Limits(timeout=1)))) == (
        "the query ran longer than the timeout of 1 s and was stopped: add a filter or a LIMIT, or raise --timeout"
    )
    if not in_thread:
        # Nothing for hours, then one row: the deadline interrupts it where it runs (a signal
        # only the main thread receives; the command runs there).
        endless = "SELECT sum(value) AS s FROM generate_series(1, 1000000000000)"
        assert _stopped(run(endless, Limits(timeout=1))).limit == "timeout"
    # Within the limits the same tables answer.
    pairs = run("SELECT count(*) AS n FROM model_versions a, model_versions b", small)()
    assert pairs.column("n")[0].as_py() == 90000
