"""``confine``: file:// URIs only inside the artifact roots, however they are spelled."""

from __future__ import annotations

from pathlib import Path

import pytest

from tinct.artifacts.storage import ArtifactRefusedError, confine


@pytest.fixture
def root(tmp_path: Path) -> Path:
    models = tmp_path / "models"
    (models / "sub").mkdir(parents=True)
    (models / "sub" / "w.safetensors").write_bytes(b"w")
    (models / "inner").symlink_to(models / "sub")
    (models / "out").symlink_to(tmp_path)
    (tmp_path / "secret").write_bytes(b"s")
    return models


def test_inside_is_read_through_its_real_path(root: Path) -> None:
    assert (
        confine((root / "sub" / "w.safetensors").as_uri(), [str(root)])
        == (root / "sub" / "w.safetensors").as_uri()
    )
    assert (
        confine(f"{root.as_uri()}/inner/w.safetensors", [str(root)])
        == (root / "sub" / "w.safetensors").as_uri()
    )
    assert (
        confine(f"{root.as_uri()}/sub/%77.safetensors", [str(root)])
        == (root / "sub" / "w.safetensors").as_uri()
    )


def test_other_schemes_pass() -> None:
    assert confine("s3://bucket/key", []) == "s3://bucket/key"


@pytest.mark.parametrize(
    "spelling",
    [
        "file:///etc/passwd",
        "{root}/../secret",
        "{root}/%2e%2e/secret",
        "{root}/%2E%2E/%2e%2e/%2e%2e/etc/passwd",
        "{root}/out/secret",
        "{root}",
        "{root}/sub/%00",
        "file:///etc/does-not-exist",
    ],
)
def test_outside_is_refused_alike(root: Path, spelling: str) -> None:
    uri = spelling.format(root=root.as_uri())
    with pytest.raises(ArtifactRefusedError) as refused:
        confine(uri, [str(root)])
    assert (
        refused.value.detail
        == f"not inside an artifact root ({root}); the operator reads local files only there (--artifact-root)"
    )


def test_host_query_and_no_roots(root: Path) -> None:
    inside = root / "sub" / "w.safetensors"
    with pytest.raises(ArtifactRefusedError, match="names no host"):
        confine(f"file://localhost{inside}", [str(root)])
    with pytest.raises(ArtifactRefusedError, match="no \\?query"):
        confine(f"{inside.as_uri()}?x=1", [str(root)])
    with pytest.raises(ArtifactRefusedError, match="--artifact-root DIR"):
        confine(inside.as_uri(), [])
