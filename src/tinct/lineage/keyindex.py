"""An in-memory index of the keys a Delta table holds, kept current file by file.

Checking "is this event already recorded?" with a MERGE scans the whole table on every
write. Instead each writer keeps the 64-bit BLAKE2b hashes of every row key it has seen,
in a sorted numpy array (8 bytes a key: 5 million keys take 40 MB) plus a small set of
recent ones. :meth:`KeyIndex.catch_up` reads the key columns of data files that appeared
since the last call (new commits, or compaction output) and nothing else.

A hash collision would make a new key look recorded; with 64-bit hashes the chance is
about n / 2**64 per lookup (n = keys in the table), i.e. never in practice.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
import pyarrow.parquet as pq
from deltalake import DeltaTable

from tinct.artifacts.storage import StorageConfig, resolve

__all__ = ["KeyIndex", "key_hash"]

_SEP = "\x1f"


def key_hash(values: Sequence[Any]) -> int:
    raw = _SEP.join(str(v) for v in values).encode()
    return int.from_bytes(hashlib.blake2b(raw, digest_size=8).digest(), "little")


class KeyIndex:
    """Hashes of the key columns ``keys`` of every row of one table."""

    def __init__(self, keys: Sequence[str], config: StorageConfig | None = None) -> None:
        self.keys = tuple(keys)
        self.config = config
        self._sorted = np.empty(0, dtype=np.uint64)
        self._recent: set[int] = set()
        self._files: set[str] = set()

    def __len__(self) -> int:
        return len(self._sorted) + len(self._recent)

    def __contains__(self, h: int) -> bool:
        if h in self._recent:
            return True
        i = int(np.searchsorted(self._sorted, np.uint64(h)))
        return i < len(self._sorted) and int(self._sorted[i]) == h

    def add(self, hashes: Iterable[int]) -> None:
        self._recent.update(hashes)
        if len(self._recent) > 65536:
            self._compact()

    def _compact(self) -> None:
        fresh = np.fromiter(self._recent, dtype=np.uint64, count=len(self._recent))
        self._sorted = np.unique(np.concatenate([self._sorted, fresh]))
        self._recent.clear()

    def catch_up(self, dt: DeltaTable) -> int:
        """Index the data files of ``dt``'s snapshot not seen yet; how many were read."""
        current = set(dt.file_uris())
        new = current - self._files
        for uri in new:
            fs, path = resolve(uri, self.config)
            with fs.open_input_file(path) as f:
                table = pq.read_table(f, columns=list(self.keys))
            cols = [table.column(k).to_pylist() for k in self.keys]
            self.add(key_hash(vals) for vals in zip(*cols, strict=True))
        # Files compacted away hold keys that live on in their replacement: forget the names only.
        self._files = current
        return len(new)
