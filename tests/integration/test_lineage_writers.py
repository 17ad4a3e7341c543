"""Lineage writers in processes of their own racing on one table of the S3 server: nothing is lost,
nothing is written twice."""

from __future__ import annotations

import multiprocessing
import time
from typing import Any

from tinct.lineage.sql import query
from tinct.lineage.store import LineageStore
from tinct.lineage.writer import BatchWriter
from tinct_testing.lineage_artifacts import S3, lineage_event
from tinct_testing.lineage_artifacts import count_events as _count


def _record_one_by_one(root: str, first: int, count: int, start: Any, results: Any) -> None:
    """One operator process's lineage writer: ``count`` events, each awaited before the next.

    A write that lost every race it ran (the other process commits without pause) is written
    again a moment later, as the ModelVersion handler does with backoff.
    """
    from deltalake.exceptions import CommitFailedError

    try:
        store = LineageStore(root)
        writer = BatchWriter(store).start()
        again = 0
        start.wait()
        for i in range(first, first + count):
            while True:
                try:
                    writer.submit({"model_versions": lineage_event(i)["model_versions"]}).result(timeout=300)
                    break
                except CommitFailedError:
                    again += 1
                    time.sleep(1)
        writer.close()
        results.put((first, store.conflicts, again, None))
    except BaseException as exc:
        results.put((first, -1, -1, repr(exc)))


def test_two_writer_processes_on_s3_lose_nothing(s3: S3) -> None:
    """Two processes append 150 events each to one table on a store with conditional writes."""
    s3.bucket("two-writers")
    root = "s3://two-writers/lineage"
    LineageStore(root).ensure()
    spawn = multiprocessing.get_context("spawn")  # deltalake's runtime does not survive a fork
    start, results = spawn.Barrier(2), spawn.Queue()
    writers = [
        spawn.Process(target=_record_one_by_one, args=(root, first, 150, start, results))
        for first in (0, 1000)
    ]
    for w in writers:
        w.start()
    outcomes = sorted(results.get(timeout=1200) for _ in writers)
    for w in writers:
        w.join(60)
    assert [error for *_, error in outcomes] == [None, None]
    conflicts = sum(c for _, c, _, _ in outcomes)
    again = sum(a for _, _, a, _ in outcomes)
    print(f"commit races lost and tried again: {conflicts}; writes given up and written again: {again}")
    assert conflicts > 0, "the writers never raced: the test proves nothing"
    assert _count(root) == (300, 300)
    uids = query("SELECT uid FROM model_versions", root).column("uid").to_pylist()
    assert sorted(uids) == sorted(f"uid-{i}" for first in (0, 1000) for i in range(first, first + 150))


def _maintain_when_started(root: str, start: Any, results: Any) -> None:
    try:
        store = LineageStore(root)
        store.table("model_versions")
        start.wait()
        results.put(store.maintain(["model_versions"], vacuum=False)["model_versions"]["compact"])
    except BaseException as exc:
        results.put({"error": repr(exc)})


def test_two_writers_maintaining_at_once_keep_one_copy_of_each_row(s3: S3) -> None:
    """Both compact the same 40 files at the same moment: one commits, the other waits."""
    s3.bucket("two-compactions")
    root = "s3://two-compactions/lineage"
    store = LineageStore(root)
    for i in range(40):
        store.merge("model_versions", lineage_event(i)["model_versions"])
    spawn = multiprocessing.get_context("spawn")
    start, results = spawn.Barrier(2), spawn.Queue()
    writers = [spawn.Process(target=_maintain_when_started, args=(root, start, results)) for _ in range(2)]
    for w in writers:
        w.start()
    outcomes = [results.get(timeout=300) for _ in writers]
    for w in writers:
        w.join(60)
    assert not [o for o in outcomes if "error" in o], outcomes
    assert any(o.get("numFilesRemoved") == 40 for o in outcomes), outcomes
    assert _count(root) == (40, 40), outcomes
    assert len(LineageStore(root).table("model_versions").file_uris()) == 1
