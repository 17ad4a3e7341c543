"""kopf's bookkeeping stays small, and is never what makes a patch fail."""

from __future__ import annotations

import json
from typing import Any

import kopf
from kopf._cogs.structs import diffs

from tinct.operator.bookkeeping import (
    ANNOTATIONS_LIMIT,
    REFUSED,
    DigestDiffBaseStorage,
    GuardedProgressStorage,
    annotations_size,
)

KEY = "tinct.io/last-handled-configuration"


def _body(spec: dict[str, Any], annotations: dict[str, str] | None = None, uid: str = "u1") -> kopf.Body:
    return kopf.Body(
        {
            "apiVersion": "tinct.io/v1alpha1",
            "kind": "GrayRelease",
            "metadata": {"name": "chat", "namespace": "llm", "uid": uid, "annotations": annotations or {}},
            "spec": spec,
            "status": {"phase": "Progressing"},
        }
    )


def _storage() -> DigestDiffBaseStorage:
    return DigestDiffBaseStorage(prefix="tinct.io", key="last-handled-configuration")


def test_the_diff_base_of_a_huge_spec_is_a_few_hundred_bytes() -> None:
    big = {"cells": [{"match": {}, "weights": [1.0] * 100}] * 64, "text": "x" * 150_000}
    body = _body(big, {"team": "y" * 100_000})
    patch = kopf.Patch()
    storage = _storage()
    storage.store(body=body, patch=patch, essence=storage.build(body=body))
    stored = patch["metadata"]["annotations"][KEY]
    assert len(stored) < 400
    assert json.loads(stored)["spec"].keys() == {"sha256"}


def test_a_spec_change_is_a_spec_diff_and_an_annotation_change_is_not() -> None:
    storage = _storage()
    before = _body({"paused": False}, {"team": "a"})
    patch = kopf.Patch()
    storage.store(body=before, patch=patch, essence=storage.build(body=before))
    old = storage.fetch(body=_body({"paused": False}, {"team": "a", **patch["metadata"]["annotations"]}))
    assert old is not None
    spec_changed = diffs.diff(old, storage.build(body=_body({"paused": True}, {"team": "a"})))
    assert [d.field for d in spec_changed] == [("spec", "sha256")]
    noted = diffs.diff(old, storage.build(body=_body({"paused": False}, {"team": "b"})))
    assert [d.field for d in noted] == [("metadata", "annotations", "sha256")]
    # kopf's own records (progress, the action annotation's prefix) change no digest.
    own = diffs.diff(old, storage.build(body=_body({"paused": False}, {"team": "a", "tinct.io/x": "1"})))
    assert list(own) == []


def test_bookkeeping_past_the_annotation_limit_is_left_out_and_remembered() -> None:
    REFUSED.clear()
    near = {"team": "z" * (ANNOTATIONS_LIMIT - 20)}
    body = _body({"paused": False}, near, uid="u-near")
    patch = kopf.Patch()
    patch["metadata"] = {"finalizers": []}  # what else the patch carries goes through
    storage = _storage()
    storage.store(body=body, patch=patch, essence=storage.build(body=body))
    progress = GuardedProgressStorage(prefix="tinct.io")
    progress.store(key=kopf.HandlerId("h"), record={"success": True}, body=body, patch=patch)  # type: ignore[typeddict-item]
    assert "annotations" not in patch["metadata"]
    assert "past the API server's" in REFUSED["u-near"]
    assert annotations_size(near) <= ANNOTATIONS_LIMIT
    # Room again: written, and the refusal forgotten.
    small = _body({"paused": False}, {"team": "z"}, uid="u-near")
    patch = kopf.Patch()
    storage.store(body=small, patch=patch, essence=storage.build(body=small))
    assert KEY in patch["metadata"]["annotations"]
    assert "u-near" not in REFUSED
