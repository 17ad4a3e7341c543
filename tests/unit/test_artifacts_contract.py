"""Interfaces of real artifacts compared: each difference classified, the bump judged."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tinct.artifacts.contract import RULES, declared_bump, diff, measured_bump, verdict
from tinct.artifacts.formats import validate
from tinct.artifacts.interface import Interface, combine
from tinct_testing.interface_artifacts import make_version

DOC = Path(__file__).resolve().parents[2] / "docs" / "concepts" / "modelversions.md"


def _interface(directory: Path, **kw: Any) -> Interface:
    """The interface of one version's artifacts (see :func:`make_version`)."""
    files = make_version(directory, **kw)
    return combine((fmt, p.as_uri(), validate(p.as_uri(), fmt)) for fmt, p in files)


def test_identical_interfaces_have_no_difference_and_pass_a_patch(tmp_path: Path) -> None:
    a, b = _interface(tmp_path / "a"), _interface(tmp_path / "b")
    assert diff(a, b) == []
    v = verdict("1.2.0", "1.2.1", a, b)
    assert (v.declared, v.measured, v.ok, v.breaking) == ("patch", "patch", True, False)


def test_input_removed_is_breaking_and_refuses_a_minor_bump(tmp_path: Path) -> None:
    a = _interface(tmp_path / "a")
    b = _interface(tmp_path / "b", inputs=["input_ids"])
    diffs = diff(a, b)
    assert [(d.kind, d.level, d.where) for d in diffs] == [
        ("InputRemoved", "breaking", "onnx model.onnx input attention_mask")
    ]
    assert (
        str(diffs[0])
        == "breaking InputRemoved: onnx model.onnx input attention_mask: INT64[batch,seq] removed"
    )
    minor = verdict("1.2.0", "1.3.0", a, b)
    assert (minor.declared, minor.measured, minor.ok) == ("minor", "major", False)
    assert "cannot be released as declared; publish it as a MAJOR version" in minor.explain("1.2.0", "1.3.0")
    assert verdict("1.2.0", "2.0.0", a, b).ok


def test_vocabulary_change_is_breaking(tmp_path: Path) -> None:
    a = _interface(tmp_path / "a")
    b = _interface(tmp_path / "b", words=["lorem ipsum dolor sit amet", "consectetur adipiscing"])
    kinds = {d.kind: d.level for d in diff(a, b)}
    assert kinds["VocabularyChanged"] == "breaking"
    assert measured_bump(diff(a, b)) == "major"


def test_added_output_is_additive(tmp_path: Path) -> None:
    a = _interface(tmp_path / "a")
    b = _interface(tmp_path / "b", outputs=["logits", "hidden_states"])
    diffs = diff(a, b)
    assert [(d.kind, d.level) for d in diffs] == [("OutputAdded", "additive")]
    assert not verdict("1.2.0", "1.2.1", a, b).ok
    assert verdict("1.2.0", "1.3.0", a, b).ok


def test_ptx_entry_and_target_and_chat_template(tmp_path: Path) -> None:
    a = _interface(tmp_path / "a")
    b = _interface(tmp_path / "b", entries=["add_one", "scale"], target="sm_90", chat_template=None)
    kinds = {d.kind for d in diff(a, b)}
    assert {"EntryAdded", "TargetRaised", "ChatTemplateChanged"} <= kinds
    c = _interface(tmp_path / "c", entries=["scale"])
    assert {d.kind for d in diff(a, c)} == {"EntryRemoved", "EntryAdded"}


def test_tensor_layout_and_layer_count(tmp_path: Path) -> None:
    a = _interface(tmp_path / "a", layers=2)
    b = _interface(tmp_path / "b", layers=3)
    kinds = {d.kind: d for d in diff(a, b)}
    assert kinds["LayerCountChanged"].detail == "2 -> 3"
    assert kinds["TensorAdded"].level == "breaking"


def test_removing_a_format_is_breaking() -> None:
    a: Interface = {
        "ptx": {"k.ptx": {"version": "8.4", "target": "sm_80", "address_size": 64, "entries": []}}
    }
    assert [d.kind for d in diff(a, {})] == ["ArtifactRemoved"]
    assert [d.kind for d in diff({}, a)] == ["ArtifactAdded"]


@pytest.mark.parametrize(
    ("old", "new", "bump"),
    [
        ("1.2.3", "2.0.0", "major"),
        ("1.2.3", "1.3.0", "minor"),
        ("1.2.3", "1.2.4", "patch"),
        ("1.2.3", "1.2.2", None),
    ],
)
def test_declared_bump(old: str, new: str, bump: str | None) -> None:
    assert declared_bump(old, new) == bump


def test_every_rule_is_in_the_docs_table() -> None:
    text = DOC.read_text()
    for kind, rule in RULES.items():
        assert f"| `{kind}` | {rule.level} |" in text, kind
