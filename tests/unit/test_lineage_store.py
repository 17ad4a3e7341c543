from __future__ import annotations

import multiprocessing
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from tinct.artifacts.storage import StorageConfig
from tinct.lineage.commits import PROBE_PREFIX, UnsafeStoreError, check_commits
from tinct.lineage.records import record_release_event
from tinct.lineage.sql import query
from tinct.lineage.store import LineageStore
from tinct.lineage.writer import BatchWriter
from tinct_testing.lineage_artifacts import S3, lineage_event, unconditional_store


def _count(root: Path | str, table: str = "model_versions") -> tuple[int, int]:
    t = query(f"SELECT count(*) AS n, count(DISTINCT event_id) AS d FROM {table}", str(root))
    return t.column("n")[0].as_py(), t.column("d")[0].as_py()


def test_retried_write_keeps_one_row(tmp_path: Path) -> None:
    store = LineageStore(str(tmp_path))
    v1 = store.merge("model_versions", lineage_event(1)["model_versions"])
    v2 = store.merge("model_versions", lineage_event(1)["model_versions"])
    assert v2 == v1  # nothing new to commit
    store.merge("artifacts", lineage_event(1)["artifacts"])
    store.merge("artifacts", lineage_event(1)["artifacts"])
    assert _count(tmp_path) == (1, 1)
    assert query("SELECT count(*) AS n FROM artifacts", str(tmp_path)).column("n")[0].as_py() == 2


def test_concurrent_writers_never_duplicate(tmp_path: Path) -> None:
    LineageStore(str(tmp_path)).ensure()
    # Separate store objects stand for separate operator processes racing on the log.
    stores = [LineageStore(str(tmp_path)) for _ in range(4)]
    barrier = threading.Barrier(4)

    def work(k: int) -> None:
        barrier.wait()
        for i in range(15):
            stores[k].merge("model_versions", lineage_event(i)["model_versions"])

    with ThreadPoolExecutor(4) as pool:
        list(pool.map(work, range(4)))
    assert _count(tmp_path) == (15, 15)


def test_commit_metadata_names_operator_and_uid(tmp_path: Path) -> None:
    store = LineageStore(str(tmp_path), operator_version="9.9.9")
    store.merge("model_versions", lineage_event(7)["model_versions"])
    last = store.table("model_versions").history(1)[0]
    assert last["tinct.operatorVersion"] == "9.9.9"
    assert last["tinct.uids"] == "uid-7"


def test_writer_batches_and_resolves_versions(tmp_path: Path) -> None:
    store = LineageStore(str(tmp_path))
    writer = BatchWriter(store, maintain_every=10**9)
    store.ensure()
    before = store.table("model_versions").version()
    futures = [writer.submit(lineage_event(i)) for i in range(300)]
    versions = [f.result(timeout=60) for f in futures]
    writer.close()
    after = store.table("model_versions").version()
    assert after - before < 300 / 4  # grouped: far fewer commits than events
    assert all(before < v <= after for v in versions)
    assert _count(tmp_path) == (300, 300)
    assert _count(tmp_path, "artifacts")[0] == 600


def test_maintenance_reduces_files_and_keeps_rows(tmp_path: Path) -> None:
    store = LineageStore(str(tmp_path))
    for i in range(30):
        store.merge("model_versions", lineage_event(i)["model_versions"])
    files_before = len(store.table("model_versions").file_uris())
    metrics = store.maintain()
    assert files_before >= 30
    assert metrics["model_versions"]["files"] == 1
    assert _count(tmp_path) == (30, 30)


def test_release_events_write(tmp_path: Path) -> None:
    writer = BatchWriter(LineageStore(str(tmp_path)))
    kwargs: dict[str, Any] = {
        "release": "chat",
        "namespace": "llm",
        "uid": "gr-1",
        "generation": 1,
        "step": 2,
        "state": "Progressing",
        "from_model_version": "a",
        "to_model_version": "b",
        "weights": {"len:long+role:admin+latency:high": 20.0},
        "metrics": {"success-rate": 99.5},
    }
    record_release_event(writer, **kwargs).result(timeout=30)
    record_release_event(writer, **kwargs).result(timeout=30)
    writer.close()
    rows = query(
        "SELECT release, step, weights['len:long+role:admin+latency:high'] AS w FROM release_events",
        str(tmp_path),
    ).to_pylist()
    assert rows == [{"release": "chat", "step": 2, "w": 20.0}]


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
    """Two processes append 300 events each to one table on a store with conditional writes."""
    s3.bucket("two-writers")
    root = "s3://two-writers/lineage"
    LineageStore(root).ensure()
    spawn = multiprocessing.get_context("spawn")  # deltalake's runtime does not survive a fork
    start, results = spawn.Barrier(2), spawn.Queue()
    writers = [
        spawn.Process(target=_record_one_by_one, args=(root, first, 300, start, results))
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
    assert _count(root) == (600, 600)
    uids = query("SELECT uid FROM model_versions", root).column("uid").to_pylist()
    assert sorted(uids) == sorted(f"uid-{i}" for first in (0, 1000) for i in range(first, first + 300))


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


def _leftovers(s3: S3, bucket: str) -> list[str]:
    listed = s3.client.list_objects_v2(Bucket=bucket).get("Contents", [])
    return [str(o["Key"]) for o in listed]


def test_the_commit_check_passes_a_store_with_conditional_writes_and_leaves_nothing(s3: S3) -> None:
    s3.bucket("checked")
    check_commits("s3://checked/lineage", StorageConfig(s3_endpoint=s3.endpoint))
    assert _leftovers(s3, "checked") == []


def test_the_commit_check_refuses_a_store_without_conditional_writes(s3: S3, tmp_path: Path) -> None:
    s3.bucket("unconditional")
    with unconditional_store(s3.endpoint) as endpoint, pytest.raises(UnsafeStoreError) as refused:
        check_commits("s3://unconditional/lineage", StorageConfig(s3_endpoint=endpoint))
    assert str(refused.value).startswith(
        "the store under s3://unconditional/lineage does not refuse a second commit of the same table "
        "version (it ignores conditional writes, If-None-Match), so two operator replicas"
    )
    assert "--lineage-single-writer" in str(refused.value)
    assert _leftovers(s3, "unconditional") == []
    # A local disk refuses: a commit is a link that does not replace.
    check_commits(str(tmp_path / "lineage"))
    assert not [p for p in (tmp_path / "lineage").iterdir() if p.name.startswith(PROBE_PREFIX)]


def test_the_writer_commits_every_table() -> None:
    from tinct.lineage.schemas import SCHEMAS
    from tinct.lineage.writer import _ORDER

    assert sorted(_ORDER) == sorted(SCHEMAS), "rows of a table the writer does not know are dropped"
