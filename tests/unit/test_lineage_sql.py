from __future__ import annotations

import json
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest

from lineage_artifacts import lineage_event as _event
from tinct.cli import main
from tinct.lineage.sql import NotAQueryError, check_query, history, query
from tinct.lineage.store import LineageStore


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT 1",
        "select * from model_versions where event = 'delete'",
        "WITH x AS (SELECT 1 AS a) SELECT a FROM x;",
        '-- comment with DROP\nSELECT "update" FROM (SELECT 1 AS "update")',
    ],
)
def test_queries_pass(sql: str) -> None:
    check_query(sql)


@pytest.mark.parametrize(
    "sql",
    [
        "DROP TABLE model_versions",
        "INSERT INTO model_versions VALUES (1)",
        "SELECT 1; DELETE FROM artifacts",
        "CREATE TABLE x AS SELECT 1",
        "WITH a AS (SELECT 1) INSERT INTO t SELECT * FROM a",
        "COPY model_versions TO '/tmp/x'",
        "",
    ],
)
def test_non_queries_refused(sql: str) -> None:
    with pytest.raises(NotAQueryError):
        check_query(sql)


def test_time_travel(tmp_path: Path) -> None:
    store = LineageStore(str(tmp_path))
    v1 = store.merge("model_versions", _event(1)["model_versions"])
    time.sleep(0.05)
    middle = datetime.now(UTC)
    time.sleep(0.05)
    store.merge("model_versions", _event(2)["model_versions"])
    store.merge("artifacts", _event(2)["artifacts"])
    count = "SELECT count(*) AS n FROM model_versions"
    assert query(count, str(tmp_path)).column("n")[0].as_py() == 2
    assert query(count, str(tmp_path), as_of_version=v1).column("n")[0].as_py() == 1
    assert query(count, str(tmp_path), as_of=middle).column("n")[0].as_py() == 1
    # artifacts at model_versions@v1's time: written later, so none yet
    arts = "SELECT count(*) AS n FROM artifacts"
    assert query(arts, str(tmp_path), as_of_version=v1).column("n")[0].as_py() == 0
    assert query(count, str(tmp_path), as_of=datetime(2000, 1, 1, tzinfo=UTC)).column("n")[0].as_py() == 0


def test_history_and_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    store = LineageStore(str(tmp_path))
    for i in range(6):
        store.merge("model_versions", _event(i)["model_versions"])
    assert history("model-1", str(tmp_path)).num_rows == 2
    assert (
        main(
            [
                "lineage",
                "sql",
                "SELECT uid FROM model_versions ORDER BY uid",
                "--root",
                str(tmp_path),
                "--format",
                "json",
            ]
        )
        == 0
    )
    out = json.loads(capsys.readouterr().out)
    assert [r["uid"] for r in out] == sorted(f"uid-{i}" for i in range(6))
    assert main(["lineage", "sql", "DELETE FROM model_versions", "--root", str(tmp_path)]) == 2
    assert "read-only" in capsys.readouterr().err
    assert main(["lineage", "show", "model-2", "--root", str(tmp_path), "--format", "csv"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[0].startswith("recorded_at,event,version")
    assert len(lines) == 3
    assert query("SELECT count(*) AS n FROM model_versions", str(tmp_path)).column("n")[0].as_py() == 6
