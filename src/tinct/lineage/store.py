"""The Delta Lake lineage store: idempotent, metadata-stamped writes and maintenance.

All tables live under one root URI (a local directory or an object-store prefix):
``<root>/model_versions``, ``<root>/artifacts``, ``<root>/interfaces``, ``<root>/release_events``,
``<root>/shadow_pairs``. Each has one writer: a store ``owns`` the tables it creates and
maintains (the operator's by default, :data:`~tinct.lineage.schemas.OPERATOR_TABLES`; the
comparer's store owns ``shadow_pairs``). They are created empty on first use, so version 0 of each is its empty schema and time travel to
before any event works.

**Idempotency.** :meth:`LineageStore.merge` has the effect of ``MERGE ... WHEN NOT
MATCHED INSERT`` on the table's key (:data:`~tinct.lineage.schemas.KEYS`) without
scanning the table: the writer keeps a :class:`~tinct.lineage.keyindex.KeyIndex` of the
keys in its snapshot (version V), drops rows already there and appends the rest with
``max_commit_retries=0``, so the commit can only become version V+1. If another writer
committed V+1 first, the commit fails, the index catches up with the new files and the
check runs again. Writing the same event twice, from a retry or from two writers at once,
keeps one row, and a writer that loses a race loses nothing: it tries again, up to
``MERGE_ATTEMPTS`` times (:attr:`LineageStore.conflicts` counts the races lost). A writer
kept busy by another that commits without pause can lose that many in a row (it has the
other's new files to read first); its write then fails, and its caller writes again later
(the ModelVersion handler, with backoff). That holds where the store refuses a second
commit of one version (a conditional put of the log entry); the operator checks that at
start (:mod:`tinct.lineage.commits`), since a paused leader may still be writing when its
standby takes over.

**Maintenance** (:meth:`LineageStore.maintain`): compaction of the table's files into
few, a checkpoint, expired-log cleanup and ``VACUUM`` with a retention of
:data:`VACUUM_RETENTION_HOURS` (readers older than that are not supported).

Compaction rewrites the snapshot it read (streamed, in bounded memory) and commits as an
overwrite that lands exactly after that snapshot or not at all, like a merge. delta-rs'
own ``optimize.compact`` rebases onto a concurrent commit whatever it is told, and lets a
compaction that removes the files another compaction removed commit too: two writers
maintaining at once would each add a copy of the same rows. A compaction that loses a race
is skipped until the next maintenance.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import pyarrow as pa
from deltalake import CommitProperties, DeltaTable, write_deltalake
from deltalake.exceptions import CommitFailedError, TableNotFoundError

from tinct import __version__
from tinct.artifacts.storage import StorageConfig, delta_storage_options
from tinct.lineage.keyindex import KeyIndex, key_hash
from tinct.lineage.schemas import KEYS, OPERATOR_TABLES, SCHEMAS

__all__ = ["MERGE_ATTEMPTS", "VACUUM_RETENTION_HOURS", "LineageStore", "commit_metadata"]

log = logging.getLogger(__name__)

#: Files no snapshot of the last week references are deleted by maintenance.
VACUUM_RETENTION_HOURS = 168
#: How often a MERGE that lost a commit race is retried.
MERGE_ATTEMPTS = 20


def commit_metadata(uids: Iterable[str], operator_version: str = __version__) -> dict[str, str]:
    """``custom_metadata`` for a commit: who wrote it and which objects it records."""
    return {
        "tinct.operatorVersion": operator_version,
        "tinct.uids": ",".join(sorted(set(uids))),
    }


class LineageStore:
    """Handle on the lineage tables under ``root``; safe to share between threads."""

    def __init__(
        self,
        root: str,
        config: StorageConfig | None = None,
        operator_version: str = __version__,
        owns: Iterable[str] = OPERATOR_TABLES,
    ) -> None:
        self.root = root.rstrip("/")
        #: The tables this store creates and maintains: one writer per table.
        self.owns = tuple(owns)
        self.config = config or StorageConfig()
        self.operator_version = operator_version
        self._tables: dict[str, DeltaTable] = {}
        self._locks = {name: threading.Lock() for name in SCHEMAS}
        self._ensured = False
        self._indexes: dict[str, KeyIndex] = {}
        #: Commits that lost a race to another writer and were tried again.
        self.conflicts = 0

    def uri(self, table: str) -> str:
        """URI of ``table`` under the root."""
        if table not in SCHEMAS:
            raise KeyError(f"unknown lineage table {table!r}")
        return f"{self.root}/{table}"

    @property
    def storage_options(self) -> dict[str, str]:
        return delta_storage_options(self.root, self.config)

    def _open(self, table: str) -> DeltaTable:
        dt = self._tables.get(table)
        if dt is not None:
            return dt
        uri = self.uri(table)
        try:
            dt = DeltaTable(uri, storage_options=self.storage_options)
        except TableNotFoundError:
            if "://" not in uri:
                import os

                os.makedirs(uri, exist_ok=True)
            dt = DeltaTable.create(
                uri,
                schema=SCHEMAS[table],
                mode="ignore",
                name=table,
                description=f"tinct lineage: {table}",
                storage_options=self.storage_options,
                commit_properties=CommitProperties(
                    custom_metadata=commit_metadata((), self.operator_version)
                ),
            )
        self._tables[table] = dt
        return dt

    def ensure(self) -> None:
        """Create any missing table this store owns (empty, version 0)."""
        for name in self.owns:
            with self._locks[name]:
                self._open(name)
        self._ensured = True

    def table(self, name: str, *, fresh: bool = True) -> DeltaTable:
        """The live :class:`DeltaTable` for ``name``, reloaded to the latest version."""
        with self._locks[name]:
            dt = self._open(name)
            if fresh:
                _refresh(dt)
            return dt

    def merge(self, table: str, rows: Sequence[Mapping[str, Any]], uids: Iterable[str] = ()) -> int:
        """Insert the ``rows`` whose key is not in ``table`` yet; the table version after.

        Duplicate keys within ``rows`` keep their first occurrence. Safe against retries and
        concurrent writers (see module docs).
        """
        if not self._ensured:
            self.ensure()
        keys = KEYS[table]
        unique: dict[int, Mapping[str, Any]] = {}
        for row in rows:
            unique.setdefault(key_hash([row[k] for k in keys]), row)
        meta = commit_metadata(
            uids or {str(r["uid"]) for r in unique.values()},
            self.operator_version,
        )
        # No silent rebase onto a newer version: a commit lands exactly after the snapshot
        # whose keys were checked, or fails and the check runs again on the new snapshot.
        props = CommitProperties(custom_metadata=meta, max_commit_retries=0)
        with self._locks[table]:
            dt = self._open(table)
            index = self._indexes.setdefault(table, KeyIndex(keys, self.config))
            for attempt in range(MERGE_ATTEMPTS):
                _refresh(dt)
                index.catch_up(dt)
                fresh = {h: r for h, r in unique.items() if h not in index}
                if not fresh:
                    return int(dt.version())
                source = pa.Table.from_pylist(list(fresh.values()), schema=SCHEMAS[table])
                try:
                    write_deltalake(dt, source, mode="append", commit_properties=props)
                except CommitFailedError as exc:
                    self.conflicts += 1
                    log.info("write to %s lost a commit race (%s); checking keys again", table, exc)
                    # Spread out, so that writers that collided do not collide again in step.
                    time.sleep(min(0.5, 0.005 * 2**attempt) * random.uniform(0.5, 1.5))
                    continue
                index.add(fresh)
                return int(dt.version())
            raise CommitFailedError(f"write to {table} kept conflicting after {MERGE_ATTEMPTS} attempts")

    def maintain(self, tables: Iterable[str] | None = None, *, vacuum: bool = True) -> dict[str, Any]:
        """Compact, checkpoint, clean expired logs and vacuum; returns per-table metrics."""
        out: dict[str, Any] = {}
        for name in tables or self.owns:
            with self._locks[name]:
                dt = self._open(name)
                _refresh(dt)
                props = CommitProperties(
                    custom_metadata={"tinct.operatorVersion": self.operator_version, "tinct.op": "maintain"}
                )
                metrics: dict[str, Any] = {"compact": _compact(dt, props)}
                _refresh(dt)
                dt.create_checkpoint()
                dt.cleanup_metadata()
                if vacuum:
                    metrics["vacuumed"] = len(
                        dt.vacuum(
                            retention_hours=VACUUM_RETENTION_HOURS,
                            dry_run=False,
                            enforce_retention_duration=True,
                            commit_properties=props,
                        )
                    )
                _refresh(dt)
                metrics["version"] = dt.version()
                metrics["files"] = len(dt.file_uris())
                out[name] = metrics
        return out


def _compact(dt: DeltaTable, props: CommitProperties) -> dict[str, Any]:
    """Rewrite ``dt``'s snapshot into as few files as its rows need, as the next version only."""
    before = len(dt.file_uris())
    if before <= 1:
        return {"skipped": "one file or none"}
    version = dt.version()
    rows = dt.to_pyarrow_dataset().scanner().to_reader()
    exact = CommitProperties(
        custom_metadata={**(props.custom_metadata or {}), "tinct.compactedVersion": str(version)},
        max_commit_retries=0,
    )
    try:
        write_deltalake(dt, rows, mode="overwrite", commit_properties=exact)
    except CommitFailedError:  # a writer won; compaction waits for next time
        return {"skipped": f"another writer committed after version {version}"}
    _refresh(dt)
    return {"numFilesRemoved": before, "numFilesAdded": len(dt.file_uris())}


def _refresh(dt: DeltaTable) -> None:
    """Bring ``dt`` to the latest version, reading only the new log entries."""
    dt.update_incremental()
