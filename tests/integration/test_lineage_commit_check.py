"""The check a lineage store makes of an S3 server before writing: a store with conditional writes
passes and keeps nothing of the probe; one that lets a second commit replace the first is
refused."""

from __future__ import annotations

from pathlib import Path

import pytest

from tinct.artifacts.storage import StorageConfig
from tinct.lineage.commits import PROBE_PREFIX, UnsafeStoreError, check_commits
from tinct_testing.lineage_artifacts import S3, unconditional_store


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
