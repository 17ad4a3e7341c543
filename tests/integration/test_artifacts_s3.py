"""Artifacts and the lineage root on an S3-compatible server (moto, started here)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from tinct.api.v1alpha1.modelversion import ModelVersion
from tinct.artifacts.fair import FairPool
from tinct.artifacts.storage import ArtifactNotFoundError, StorageConfig, StorageUnavailableError, stat_size
from tinct.artifacts.verify import verify
from tinct.lineage.records import model_version_rows
from tinct.lineage.sql import query
from tinct.lineage.store import LineageStore
from tinct_testing.lineage_artifacts import S3, make_artifact_set, sha256_file


def test_verify_and_record_on_s3(tmp_path: Path, s3: S3) -> None:
    files = make_artifact_set(tmp_path / "art")
    s3.bucket("models")
    s3.bucket("lineage")
    mv = ModelVersion.model_validate(
        {
            "metadata": {"name": "m", "namespace": "ns", "uid": "u-1", "generation": 1},
            "spec": {
                "model": "llama",
                "version": "1.0.0",
                "source": {"uri": s3.put("models", "ckpt/step.pt", files.source)},
                "artifacts": [
                    {"format": "onnx", "uri": s3.put("models", "m/model.onnx", files.onnx)},
                    {"format": "ptx", "uri": s3.put("models", "m/k.ptx", files.ptx)},
                    *[
                        {"format": "safetensors", "uri": s3.put("models", f"m/{p.name}", p)}
                        for p in files.shards
                    ],
                ],
            },
        }
    )
    pool = FairPool(4)
    try:
        result = asyncio.run(verify(mv.spec, pool.group("m"), artifact_roots=(), config=StorageConfig()))
    finally:
        pool.shutdown()
    assert result.ok, result.failure
    by_uri = {d.uri: d.sha256 for _, d in result.files}
    assert by_uri["s3://models/m/model.onnx"] == sha256_file(files.onnx)
    assert result.digests["source"] == sha256_file(files.source)

    store = LineageStore("s3://lineage/root")
    store.merge("artifacts", model_version_rows(mv, "registered", result)["artifacts"])
    store.merge("model_versions", model_version_rows(mv, "registered", result)["model_versions"])
    store.merge("model_versions", model_version_rows(mv, "registered", result)["model_versions"])
    rows = query(
        "SELECT m.event, count(a.uri) AS files FROM model_versions m JOIN artifacts a "
        "ON a.event_id = m.event_id GROUP BY m.event",
        "s3://lineage/root",
    ).to_pylist()
    assert rows == [{"event": "registered", "files": 5}]


def test_missing_object_and_unreachable_store(s3: S3) -> None:
    s3.bucket("empty")
    with pytest.raises(ArtifactNotFoundError):
        stat_size("s3://empty/nothing.onnx")
    dead = StorageConfig(s3_endpoint="http://127.0.0.1:9", s3_region="us-east-1")
    with pytest.raises(StorageUnavailableError):
        stat_size("s3://empty/nothing.onnx", dead)
