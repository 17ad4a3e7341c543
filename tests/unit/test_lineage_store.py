from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from tinct.lineage.records import record_release_event
from tinct.lineage.sql import query
from tinct.lineage.store import LineageStore
from tinct.lineage.writer import BatchWriter
from tinct_testing.lineage_artifacts import count_events as _count
from tinct_testing.lineage_artifacts import lineage_event


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


def test_the_writer_commits_every_table() -> None:
    from tinct.lineage.schemas import SCHEMAS
    from tinct.lineage.writer import _ORDER

    assert sorted(_ORDER) == sorted(SCHEMAS), "rows of a table the writer does not know are dropped"
