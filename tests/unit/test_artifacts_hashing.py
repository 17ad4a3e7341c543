from __future__ import annotations

import hashlib
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tinct.artifacts.hashing import Progress, format_digests, hash_uri, manifest_digest
from tinct.artifacts.storage import ArtifactNotFoundError


@pytest.mark.parametrize("size", [0, 1, 4096, 3 * 1024 * 1024 + 7])
def test_hash_matches_hashlib(tmp_path: Path, size: int) -> None:
    path = tmp_path / "blob"
    data = os.urandom(size)
    path.write_bytes(data)
    # A small block size forces many reads, including a short last one.
    got = hash_uri(path.as_uri(), block_size=1024 * 1024)
    assert got.sha256 == hashlib.sha256(data).hexdigest()
    assert got.size == size


def test_progress_counts_every_byte_of_parallel_hashes(tmp_path: Path) -> None:
    blobs = []
    for i in range(5):
        p = tmp_path / f"b{i}"
        p.write_bytes(os.urandom(100_000 + i))
        blobs.append(p)
    total = sum(p.stat().st_size for p in blobs)
    progress = Progress(total)
    with ThreadPoolExecutor(3) as pool:
        futures = [pool.submit(hash_uri, p.as_uri(), on_bytes=progress.add, block_size=4096) for p in blobs]
        out = [f.result() for f in futures]
    assert [d.sha256 for d in out] == [hashlib.sha256(p.read_bytes()).hexdigest() for p in blobs]
    assert progress.snapshot() == (total, total)


def test_missing_file_is_not_found(tmp_path: Path) -> None:
    with pytest.raises(ArtifactNotFoundError):
        hash_uri((tmp_path / "nope").as_uri())


def test_manifest_digest_is_sorted_join() -> None:
    a, b = hashlib.sha256(b"a").hexdigest(), hashlib.sha256(b"b").hexdigest()
    expected = hashlib.sha256("\n".join(sorted([a, b])).encode()).hexdigest()
    assert manifest_digest([b, a]) == manifest_digest([a, b]) == expected
    digests = format_digests([("safetensors", a), ("onnx", b), ("safetensors", b)])
    assert digests == {"safetensors": expected, "onnx": b}
