from __future__ import annotations

import json
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest

from tinct.cli import main
from tinct.lineage.errors import NotAQueryError, OutsideHistoryError, QueryError
from tinct.lineage.sql import history, query
from tinct.lineage.store import LineageStore
from tinct_testing.lineage_artifacts import lineage_event as _event


def _files(root: Path) -> set[Path]:
    return {p for p in root.rglob("*") if p.is_file()}


@pytest.fixture
def store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> LineageStore:
    """Two model_versions commits and one artifacts commit, with the working directory inside."""
    monkeypatch.chdir(tmp_path)
    store = LineageStore(str(tmp_path / "lineage"))
    store.merge("model_versions", _event(1)["model_versions"])
    store.merge("model_versions", _event(2)["model_versions"])
    store.merge("artifacts", _event(2)["artifacts"])
    return store


@pytest.mark.parametrize(
    ("sql", "rows"),
    [
        ("SELECT 1", 1),
        ("select * from model_versions where event = 'registered'", 2),
        ("WITH x AS (SELECT 1 AS a) SELECT a FROM x;", 1),
        ('-- comment with DROP\nSELECT "update" FROM (SELECT 1 AS "update")', 1),
        ("/* COPY in a comment */ SELECT 'INSERT; DELETE' AS s", 1),
        ("VALUES (1), (2)", 2),
        (
            "SELECT m.uid, count(a.uri) FROM model_versions m LEFT JOIN artifacts a USING (event_id) GROUP BY m.uid",
            2,
        ),
    ],
)
def test_queries_run(store: LineageStore, sql: str, rows: int) -> None:
    assert query(sql, store.root).num_rows == rows


@pytest.mark.parametrize(
    ("sql", "detail"),
    [
        # The old keyword scan saw only "SELECT 1" here; the engine sees the COPY.
        ("/* /* */ SELECT 1 ' */ COPY (SELECT 1) TO 'x.csv' --'", "COPY writes data"),
        ("COPY (SELECT 1 AS a) TO '{root}/model_versions/_delta_log/00000000000000000002.json'", "COPY"),
        ("COPY model_versions TO '{root}/copy.parquet'", "COPY"),
        ("CREATE TABLE x AS SELECT 1", "changes schemas"),
        ("CREATE EXTERNAL TABLE y (a INT) STORED AS CSV LOCATION '{root}/y.csv'", "changes schemas"),
        ("CREATE VIEW v AS SELECT 1", "changes schemas"),
        ("DROP TABLE model_versions", "changes schemas"),
        ("INSERT INTO model_versions (uid) VALUES ('forged')", "writes data"),
        ("DELETE FROM artifacts", "writes data"),
        ("UPDATE model_versions SET event = 'retired'", "writes data"),
        ("SET datafusion.execution.target_partitions = 1", "changes the session"),
        ("SELECT 1; DELETE FROM artifacts", "more than one statement"),
        ("SELECT 1; SELECT 2", "more than one statement"),
        ("", "empty statement"),
    ],
)
def test_non_queries_refused_and_nothing_written(store: LineageStore, sql: str, detail: str) -> None:
    root = Path(store.root)
    before = _files(root.parent)
    history_before = store.table("model_versions").history()
    with pytest.raises(NotAQueryError, match="only read-only queries are allowed") as refused:
        query(sql.format(root=root), str(root))
    assert detail in str(refused.value)
    assert _files(root.parent) == before
    assert store.table("model_versions").history() == history_before
    count = "SELECT count(*) AS n FROM model_versions"
    assert query(count, str(root)).column("n")[0].as_py() == 2


def test_unplannable_write_fails_and_writes_nothing(store: LineageStore) -> None:
    """A write DataFusion cannot even plan is an error too, and still nothing is written."""
    root = Path(store.root)
    before = _files(root.parent)
    with pytest.raises(ValueError, match="not implemented"):
        query("WITH a AS (SELECT 1) INSERT INTO artifacts SELECT * FROM a", str(root))
    assert _files(root.parent) == before


def test_time_travel(tmp_path: Path) -> None:
    store = LineageStore(str(tmp_path))
    v1 = store.merge("model_versions", _event(1)["model_versions"])
    time.sleep(0.05)  # a moment strictly between the two commits' timestamps
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
    # Before every table's history, or a version model_versions never had: said, not an empty answer.
    with pytest.raises(
        OutsideHistoryError, match=r"--as-of 2000-01-01T00:00:00\+00:00 is before the lineage"
    ):
        query(count, str(tmp_path), as_of=datetime(2000, 1, 1, tzinfo=UTC))
    with pytest.raises(
        OutsideHistoryError, match=r"model_versions has versions 0 to 2; --as-of-version 57 is"
    ):
        query(count, str(tmp_path), as_of_version=57)


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
    assert capsys.readouterr().err == (
        "tinct lineage sql: only read-only queries are allowed: Delete writes data "
        "(use SELECT, WITH, VALUES, EXPLAIN, SHOW or DESCRIBE)\n"
    )
    assert main(["lineage", "sql", "SELECT * FROM nowhere", "--root", str(tmp_path)]) == 1
    assert "nowhere" in capsys.readouterr().err
    assert main(["lineage", "sql", "SELECT 1", "--as-of", "yesterday", "--root", str(tmp_path)]) == 2
    assert capsys.readouterr().err == (
        "tinct lineage sql: --as-of 'yesterday' is not an ISO-8601 time (e.g. 2026-01-01 or 2026-01-01T12:00:00Z)\n"
    )
    assert main(["lineage", "show", "model-2", "--root", str(tmp_path), "--format", "csv"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[0].startswith("recorded_at,event,version")
    assert len(lines) == 3
    assert query("SELECT count(*) AS n FROM model_versions", str(tmp_path)).column("n")[0].as_py() == 6


@pytest.mark.parametrize(
    ("sql", "said"),
    [
        ("SELEC 1", "the query does not parse: expected an SQL statement but found SELEC (line 1, column 1)"),
        (
            "SELECT * FORM model_versions",
            "the query does not parse: expected end of statement but found FORM (line 1, column 10)",
        ),
        (
            "SELECT uid FROM model_versions WHERE",
            "the query does not parse: expected an expression but found the end of the query",
        ),
        ("SELECT 'it''s", "the query does not parse: unterminated string literal (line 1, column 8)"),
        (
            "SELECT sum(value) FROM generate_series(1, 1e10)",
            "the query cannot be planned: argument #2 must be an INTEGER or NULL, got "
            "Literal(Float64(10000000000), None)",
        ),
        (
            "SELECT 'a' + 1",
            "the query cannot be planned: cannot coerce arithmetic expression Utf8 + Int64 to valid types",
        ),
    ],
)
def test_mistyped_sql_is_said_in_a_sentence(store: LineageStore, sql: str, said: str) -> None:
    with pytest.raises(QueryError) as mistyped:
        query(sql, store.root)
    assert str(mistyped.value) == said


def test_a_missing_column_is_named_with_the_ones_there(store: LineageStore) -> None:
    with pytest.raises(QueryError) as mistyped:
        query("SELECT nope FROM model_versions", store.root)
    said = str(mistyped.value)
    assert said.startswith("the query cannot be planned: no field named nope")
    assert "valid fields are model_versions.event_id, " in said
    assert "\n" not in said


def test_model_lineage_links_an_adapter_to_its_base(tmp_path: Path) -> None:
    from tinct.lineage.schemas import OPERATOR_TABLES

    before = LineageStore(str(tmp_path / "old"), owns=[t for t in OPERATOR_TABLES if t != "adapters"])
    before.merge("model_versions", _event(1)["model_versions"])
    old = query("SELECT model_id, base_model_version, lora_rank FROM model_lineage", str(tmp_path / "old"))
    assert old.to_pylist() == [{"model_id": "model-1", "base_model_version": None, "lora_rank": None}]

    store = LineageStore(str(tmp_path / "lineage"))
    store.merge("model_versions", _event(1)["model_versions"])
    adapter = dict(_event(2)["model_versions"][0], model="support", version="1.0.0")
    store.merge("model_versions", [adapter])
    store.merge(
        "adapters",
        [
            {
                "event_id": adapter["event_id"],
                "uid": adapter["uid"],
                "generation": adapter["generation"],
                "model": "support",
                "version": "1.0.0",
                "base_model_version": "llama3-8b-1",
                "base_model": "llama3-8b",
                "rank": 8,
                "lora_alpha": 16.0,
                "target_modules": ["q_proj"],
                "lora_sha256": "e" * 64,
                "served_name": "support-eeeeeeeeeeee",
                "recorded_at": datetime.now(UTC),
            }
        ],
    )
    got = query(
        "SELECT model_id, base_model_version, lora_rank, lora_target_modules, served_name FROM model_lineage "
        "ORDER BY model_id",
        str(tmp_path / "lineage"),
    ).to_pylist()
    assert got == [
        {
            "model_id": "model-1",
            "base_model_version": None,
            "lora_rank": None,
            "lora_target_modules": None,
            "served_name": None,
        },
        {
            "model_id": "support",
            "base_model_version": "llama3-8b-1",
            "lora_rank": 8,
            "lora_target_modules": ["q_proj"],
            "served_name": "support-eeeeeeeeeeee",
        },
    ]
