"""Versions verified from real artifacts, recorded in the lineage tables, compared back.

Each version is verified as the operator does (:func:`tinct.artifacts.verify.verify`), its
rows written with :func:`tinct.lineage.records.model_version_rows`, and then read with SQL
(the ``interfaces`` table, the ``model_lineage`` view) and ``tinct lineage diff``.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tinct.api.v1alpha1.modelversion import ModelVersion
from tinct.artifacts.fair import FairPool
from tinct.artifacts.verify import verify
from tinct.cli import main
from tinct.lineage.records import model_version_rows
from tinct.lineage.sql import query
from tinct.lineage.store import LineageStore
from tinct.operator.modelversion import build_status
from tinct_testing.interface_artifacts import make_version

#: version -> how its artifacts differ from 1.2.0's.
VERSIONS: dict[str, dict[str, Any]] = {
    "1.2.0": {},
    "1.2.1": {},  # identical interface, PATCH
    "1.3.0": {"inputs": ["input_ids"]},  # input removed, declared MINOR
    "2.0.0": {"inputs": ["input_ids"]},  # the same, declared MAJOR
    "1.4.0": {"words": ["lorem ipsum dolor sit amet", "consectetur adipiscing elit"]},  # vocabulary
    "1.5.0": {"outputs": ["logits", "hidden_states"]},  # output added, MINOR
}


def _name(version: str) -> str:
    return "llama3-8b-" + version.replace(".", "-")


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    base = tmp_path_factory.mktemp("interfaces")
    store = LineageStore(str(base / "lineage"))
    pool = FairPool(2)
    try:
        for i, (version, knobs) in enumerate(VERSIONS.items()):
            files = make_version(base / version, **knobs)
            mv = ModelVersion.model_validate(
                {
                    "metadata": {
                        "name": _name(version),
                        "namespace": "llm",
                        "uid": f"uid-{i}",
                        "generation": 1,
                    },
                    "spec": {
                        "model": "llama3-8b",
                        "version": version,
                        "artifacts": [{"format": fmt, "uri": p.as_uri()} for fmt, p in files],
                        "buildPipelineId": f"ci-{i}",
                    },
                }
            )
            verification = asyncio.run(verify(mv.spec, pool.group(version), artifact_roots=(str(base),)))
            assert verification.ok, verification.failure
            status = build_status(mv, verification, "t", 1, verification_time())
            assert status.interface is not None
            assert status.interface.summary.startswith("onnx model.onnx: inputs ")
            for table, rows in model_version_rows(mv, "registered", verification).items():
                if rows:
                    store.merge(table, rows)
        yield store.root
    finally:
        pool.shutdown()


def verification_time() -> Any:
    from datetime import UTC, datetime

    return datetime.now(UTC)


def test_interfaces_table_has_a_row_per_artifact(root: str) -> None:
    rows = query(
        "SELECT format, count(*) AS n FROM interfaces WHERE version = '1.2.0' GROUP BY format ORDER BY format",
        root,
    ).to_pylist()
    assert rows == [
        {"format": "onnx", "n": 1},
        {"format": "ptx", "n": 1},
        {"format": "safetensors", "n": 3},
        {"format": "tokenizer", "n": 2},
    ]


def test_sql_answers_which_versions_changed_the_vocabulary(root: str) -> None:
    sql = """
        WITH v AS (
            SELECT version, vocab_digest FROM interfaces
            WHERE model = 'llama3-8b' AND format = 'tokenizer' AND vocab_digest IS NOT NULL
        ),
        base AS (SELECT vocab_digest FROM v WHERE version = '1.2.0')
        SELECT v.version FROM v, base WHERE v.vocab_digest <> base.vocab_digest ORDER BY v.version
    """
    assert [r["version"] for r in query(sql, root).to_pylist()] == ["1.4.0"]
    maps = query(
        "SELECT inputs['input_ids'] AS ids, opsets['ai.onnx'] AS opset FROM interfaces "
        "WHERE format = 'onnx' AND version = '1.2.0'",
        root,
    ).to_pylist()
    assert maps == [{"ids": "INT64[batch,seq]", "opset": 17}]


def test_model_lineage_view_speaks_the_common_schema(root: str) -> None:
    rows = query(
        "SELECT model_id, source_hash, onnx_hash, ptx_hash, safetensors_hash, build_pipeline_id "
        "FROM model_lineage WHERE build_pipeline_id = 'ci-0'",
        root,
    ).to_pylist()
    assert len(rows) == 1
    assert rows[0]["model_id"] == "llama3-8b"
    assert len(rows[0]["onnx_hash"]) == 64
    assert rows[0]["source_hash"] is None


def _diff(root: str, capsys: pytest.CaptureFixture[str], a: str, b: str, *extra: str) -> tuple[int, str]:
    code = main(["lineage", "diff", a, b, "--root", root, *extra])
    out = capsys.readouterr()
    return code, out.out + out.err


def test_diff_input_removed_in_a_minor_bump(root: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, out = _diff(root, capsys, "llama3-8b@1.2.0", _name("1.3.0"))
    assert code == 3
    assert "breaking  InputRemoved  onnx model.onnx input attention_mask  INT64[batch,seq] removed" in out
    assert "declared MINOR, measured MAJOR: NOT compatible" in out
    assert "cannot be released as declared" in out


def test_diff_input_removed_in_a_major_bump(root: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, out = _diff(root, capsys, "llama3-8b@1.2.0", "llama3-8b@2.0.0", "-o", "json")
    report = json.loads(out)
    assert code == 0  # the MAJOR step covers it; "breaking" tells scripts it is one
    assert (report["declared"], report["measured"], report["compatible"]) == ("major", "major", True)
    assert report["breaking"] is True
    assert [d["kind"] for d in report["differences"]] == ["InputRemoved"]


def test_diff_vocabulary_change(root: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, out = _diff(root, capsys, "llama3-8b@1.2.0", "llama3-8b@1.4.0", "-o", "json")
    report = json.loads(out)
    assert code == 3
    assert "VocabularyChanged" in {d["kind"] for d in report["differences"]}
    assert not report["compatible"]


def test_diff_added_output(root: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, out = _diff(root, capsys, "llama3-8b@1.2.0", "llama3-8b@1.5.0")
    assert code == 0
    assert "additive  OutputAdded  onnx model.onnx output hidden_states  FLOAT[batch,seq,32] added" in out
    assert "declared MINOR, measured MINOR: compatible" in out


def test_diff_identical_across_a_patch(root: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, out = _diff(root, capsys, "llama3-8b@1.2.0", "llama3-8b@1.2.1")
    assert code == 0
    assert "no interface differences" in out
    assert "declared PATCH, measured PATCH: compatible" in out


def test_diff_of_an_unknown_version_says_so(root: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, out = _diff(root, capsys, "llama3-8b@1.2.0", "llama3-8b@9.9.9")
    assert code == 1
    assert "llama3-8b@9.9.9: no verified interface recorded" in out
    assert "Traceback" not in out


def test_diff_without_tables_says_so(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out = _diff(str(tmp_path / "none"), capsys, "a@1.0.0", "a@1.0.1")
    assert code == 1
    assert "tinct lineage diff:" in out
    assert "Traceback" not in out


def test_diff_backwards_is_not_compatible(root: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, out = _diff(root, capsys, "llama3-8b@1.2.1", "llama3-8b@1.2.0")
    assert code == 3
    assert "1.2.0 is not above 1.2.1" in out


def test_diff_help_gives_each_exit_status_its_meaning(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["lineage", "diff", "--help"])
    text = capsys.readouterr().out
    epilog = text[text.index("exit status:") :]
    assert "\n  0    compatible: the declared version step covers" in epilog
    assert "\n  1    could not compare:" in epilog
    assert "\n  3    NOT compatible:" in epilog
    assert "\n  2    usage" in epilog
