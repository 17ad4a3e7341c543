"""``verify`` on real files: each step's failure, and declared digests checked byte for byte."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tinct.api.v1alpha1.modelversion import ModelVersionSpec
from tinct.artifacts.fair import FairPool
from tinct.artifacts.hashing import Progress, manifest_digest
from tinct.artifacts.verify import Verification, spec_files, verify
from tinct_testing.lineage_artifacts import make_artifact_set, make_onnx, make_ptx, sha256_file


@pytest.fixture
def pool() -> Iterator[FairPool]:
    p = FairPool(2)
    yield p
    p.shutdown()


def _spec(artifacts: list[dict[str, Any]], **extra: Any) -> ModelVersionSpec:
    return ModelVersionSpec.model_validate(
        {"model": "m", "version": "1.0.0", "artifacts": artifacts, **extra}
    )


def _run(spec: ModelVersionSpec, pool: FairPool, roots: tuple[str, ...] = ("/",), **kw: Any) -> Verification:
    return asyncio.run(verify(spec, pool.group("v"), artifact_roots=roots, **kw))


def test_declared_digests_that_match_give_ready_digests(tmp_path: Path, pool: FairPool) -> None:
    files = make_artifact_set(tmp_path)
    spec = _spec(
        [
            {"format": "onnx", "uri": files.onnx.as_uri(), "sha256": sha256_file(files.onnx)},
            {"format": "ptx", "uri": files.ptx.as_uri()},
            *[{"format": "safetensors", "uri": p.as_uri(), "sha256": sha256_file(p)} for p in files.shards],
        ],
        source={"uri": files.source.as_uri(), "sha256": sha256_file(files.source)},
    )
    progress = Progress()
    result = _run(spec, pool, progress=progress)
    assert result.ok, result.failure
    assert result.digests == {
        "onnx": sha256_file(files.onnx),
        "ptx": sha256_file(files.ptx),
        "safetensors": manifest_digest(sha256_file(p) for p in files.shards),
        "source": sha256_file(files.source),
    }
    assert [fmt for fmt, _ in result.files] == ["onnx", "ptx", "safetensors", "safetensors", "source"]
    total = sum(p.stat().st_size for p in (files.onnx, files.ptx, *files.shards, files.source))
    assert progress.snapshot() == (total, total)


@pytest.mark.parametrize("where", ["artifact", "source"])
def test_one_wrong_declared_digest_fails_the_version(tmp_path: Path, pool: FairPool, where: str) -> None:
    files = make_artifact_set(tmp_path)
    right = sha256_file(files.onnx)
    wrong = ("0" if right[0] != "0" else "1") + right[1:]  # one hex digit off
    onnx_digest, source_digest = (wrong, None) if where == "artifact" else (right, wrong)
    spec = _spec(
        [
            {"format": "ptx", "uri": files.ptx.as_uri(), "sha256": sha256_file(files.ptx)},
            {"format": "onnx", "uri": files.onnx.as_uri(), "sha256": onnx_digest},
        ],
        source={"uri": files.onnx.as_uri(), "sha256": source_digest},
    )
    result = _run(spec, pool)
    assert result.failure is not None
    assert (result.failure.condition, result.failure.reason) == ("Verified", "DigestMismatch")
    field = "spec.artifacts[1].sha256" if where == "artifact" else "spec.source.sha256"
    assert field in result.failure.message
    assert f"has sha256 {right} but {field} declares {wrong}" in result.failure.message
    assert result.digests == {}


def test_missing_file_names_the_field(tmp_path: Path, pool: FairPool) -> None:
    ptx = make_ptx(tmp_path / "k.ptx")
    spec = _spec(
        [{"format": "ptx", "uri": ptx.as_uri()}, {"format": "onnx", "uri": (tmp_path / "gone.onnx").as_uri()}]
    )
    result = _run(spec, pool)
    assert result.failure is not None
    assert result.failure.reason == "ArtifactMissing"
    assert "onnx artifact" in result.failure.message
    assert "upload it or fix spec.artifacts[1].uri" in result.failure.message


def test_invalid_format_is_reported_before_hashing(tmp_path: Path, pool: FairPool) -> None:
    ptx = make_ptx(tmp_path / "k.ptx")
    progress = Progress()
    spec = _spec([{"format": "onnx", "uri": ptx.as_uri()}])
    result = _run(spec, pool, progress=progress)
    assert result.failure is not None
    assert result.failure.reason == "InvalidFormat"
    assert "(spec.artifacts[0].uri)" in result.failure.message
    assert progress.snapshot() == (0, ptx.stat().st_size)  # not one byte hashed


def test_incompatible_quantization_reads_nothing(tmp_path: Path, pool: FairPool) -> None:
    spec = _spec(
        [{"format": "onnx", "uri": (tmp_path / "never-read.onnx").as_uri()}],
        quantization={"method": "awq", "bits": 4, "symmetric": False, "groupSize": 128},
        runtime="tensorrt-llm",
    )
    result = _run(spec, pool)
    assert result.failure is not None
    assert (result.failure.condition, result.failure.reason) == ("Compatible", "AsymmetricAWQUnsupported")


def test_spec_files_name_their_fields(tmp_path: Path) -> None:
    onnx = make_onnx(tmp_path / "m.onnx")
    spec = _spec([{"format": "onnx", "uri": onnx.as_uri()}], source={"uri": onnx.as_uri()})
    assert [(f.format, f.field, f.what) for f in spec_files(spec)] == [
        ("onnx", "spec.artifacts[0]", "onnx artifact"),
        ("source", "spec.source", "source checkpoint"),
    ]
