"""Streaming SHA-256 of artifacts, several at once, never the whole file in memory.

Each file is read in blocks of :data:`BLOCK_SIZE` bytes into one reusable buffer, so
memory stays flat however big the file is. ``hashlib`` releases the GIL while it hashes a
block and pyarrow releases it while it reads, so a thread pool hashes files truly in
parallel. None of this runs on the event loop: callers submit to an executor, or hand
:func:`hash_steps` to a :class:`~tinct.artifacts.fair.FairPool`.

A format with several files (shards) gets a *manifest digest*: the SHA-256 of the sorted
lowercase hex digests of its files joined by ``"\\n"`` (no trailing newline). A format
with one file uses that file's digest as is. See :func:`manifest_digest`.
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Callable, Generator, Iterable
from dataclasses import dataclass

from tinct.artifacts.storage import StorageConfig, classify, resolve

__all__ = [
    "BLOCK_SIZE",
    "FileDigest",
    "Progress",
    "format_digests",
    "hash_steps",
    "hash_uri",
    "manifest_digest",
]

#: Read size; large enough that per-call overhead vanishes next to hashing.
BLOCK_SIZE = 8 * 1024 * 1024


@dataclass(frozen=True)
class FileDigest:
    uri: str
    sha256: str
    size: int


class Progress:
    """Thread-safe byte counter shared by the workers hashing one version."""

    def __init__(self, total: int = 0) -> None:
        self._lock = threading.Lock()
        self.total = total
        self.done = 0

    def add(self, n: int) -> None:
        with self._lock:
            self.done += n

    def snapshot(self) -> tuple[int, int]:
        with self._lock:
            return self.done, self.total


_local = threading.local()


def _buffer(size: int) -> memoryview:
    """This thread's reusable read buffer: no 8 MiB allocation per file, no heap churn."""
    buf: bytearray | None = getattr(_local, "buf", None)
    if buf is None or len(buf) != size:
        buf = bytearray(size)
        _local.buf = buf
    return memoryview(buf)


def hash_steps(
    uri: str,
    config: StorageConfig | None = None,
    *,
    on_bytes: Callable[[int], None] | None = None,
    block_size: int = BLOCK_SIZE,
) -> Generator[int, None, FileDigest]:
    """SHA-256 and size of the object at ``uri``, as a generator that yields after each block.

    Yielding lets a :class:`~tinct.artifacts.fair.FairPool` pause a long hash to serve
    other versions, and stop it when it is cancelled (closing the generator closes the
    stream). The digest is the generator's return value.

    Raises:
        ArtifactNotFoundError: the object does not exist.
        StorageUnavailableError: the store failed in a way that may pass.
    """
    h = hashlib.sha256()
    view = _buffer(block_size)
    size = 0
    try:
        fs, path = resolve(uri, config)
        with fs.open_input_stream(path) as stream:
            while True:
                n = stream.readinto(view)
                if not n:
                    break
                h.update(view[:n])
                size += n
                if on_bytes is not None:
                    on_bytes(n)
                yield n
    except Exception as exc:
        raise classify(uri, exc) from exc
    return FileDigest(uri=uri, sha256=h.hexdigest(), size=size)


def hash_uri(
    uri: str,
    config: StorageConfig | None = None,
    *,
    on_bytes: Callable[[int], None] | None = None,
    block_size: int = BLOCK_SIZE,
) -> FileDigest:
    """:func:`hash_steps` run to the end in this thread."""
    steps = hash_steps(uri, config, on_bytes=on_bytes, block_size=block_size)
    while True:
        try:
            next(steps)
        except StopIteration as done:
            digest: FileDigest = done.value
            return digest


def manifest_digest(hex_digests: Iterable[str]) -> str:
    """SHA-256 of the sorted hex digests joined by ``"\\n"``: order of shards does not matter."""
    joined = "\n".join(sorted(d.lower() for d in hex_digests))
    return hashlib.sha256(joined.encode("ascii")).hexdigest()


def format_digests(per_file: Iterable[tuple[str, str]]) -> dict[str, str]:
    """One digest per format from ``(format, sha256)`` pairs.

    One file: its own digest. Several files: :func:`manifest_digest` of theirs.
    """
    grouped: dict[str, list[str]] = {}
    for fmt, digest in per_file:
        grouped.setdefault(fmt, []).append(digest)
    return {fmt: ds[0] if len(ds) == 1 else manifest_digest(ds) for fmt, ds in grouped.items()}
