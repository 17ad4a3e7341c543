"""Whether the store under a lineage root keeps two writers from erasing each other's commits.

delta-rs commits version N of a table by writing ``_delta_log/<N>.json`` only if it is not
there yet: a conditional put (``If-None-Match: *`` on S3, which the storage options ask for
with ``aws_conditional_put=etag``; generation and ETag preconditions on GCS and Azure; a
link that does not replace on a local disk). A writer that loses the race gets a
conflict, reads the new version and tries again (:meth:`~tinct.lineage.store.LineageStore.merge`).
On a store that ignores the condition both puts succeed and the later one replaces the
other's commit: rows recorded, acknowledged, then gone. Two operator replicas share the
tables whenever a paused or partitioned leader is still writing after its standby took over.

:func:`check_commits` finds out before the operator writes anything: it races two
commits of version 0 of a scratch table under the root, in an order it controls — the
first writer has looked and seen no table, then the second creates it, then the first
commits. A store with conditional writes refuses the first writer's commit; one without
lets it replace the second's. The scratch table is deleted either way. Run once per root
and process.
"""

from __future__ import annotations

import logging
import re
import shutil
import threading
import uuid
from collections.abc import Iterator

import pyarrow as pa
from deltalake import CommitProperties, DeltaTable, write_deltalake
from deltalake.exceptions import CommitFailedError
from deltalake.fs import DeltaStorageHandler

from tinct.artifacts.storage import StorageConfig, delta_storage_options
from tinct.lineage.errors import LineageError, UnsafeStoreError

__all__ = ["PROBE_PREFIX", "UnsafeStoreError", "check_commits"]

log = logging.getLogger(__name__)

#: The scratch table of a check is ``<root>/<PROBE_PREFIX><random hex>``.
PROBE_PREFIX = "_tinct_commit_check-"

#: Colours delta-rs puts into its error chains.
_ANSI = re.compile(r"\x1b\[[0-9;]*m")

_checked: set[tuple[str, StorageConfig]] = set()
_lock = threading.Lock()


def check_commits(root: str, config: StorageConfig | None = None) -> None:
    """Return if the store under ``root`` refuses a commit of a version another writer has
    committed; a root already checked by this process is not checked again.

    Raises:
        UnsafeStoreError: it does not.
        LineageError: the check could not be made (the message says why: no such bucket,
            credentials, ...).
    """
    config = config or StorageConfig()
    root = root.rstrip("/")
    with _lock:
        if (root, config) in _checked:
            return
        uri = f"{root}/{PROBE_PREFIX}{uuid.uuid4().hex}"
        try:
            kept = _race(uri, config)
        except Exception as exc:
            _remove(uri, config, quiet=True)
            said = " ".join(_ANSI.sub("", str(exc)).split())
            raise LineageError(
                f"cannot check that the store under {root} refuses conflicting commits: {said}"
            ) from exc
        _remove(uri, config)
        if kept == "first":
            raise UnsafeStoreError(root)
        _checked.add((root, config))


def _race(uri: str, config: StorageConfig) -> str:
    """Which writer's version 0 of the table at ``uri`` stands: ``second`` when the store
    refused the first writer's late commit, ``first`` when it let that replace the second's."""
    opts = delta_storage_options(uri, config)
    schema = pa.schema([pa.field("writer", pa.string())])
    failures: list[BaseException] = []

    def second() -> None:
        try:
            write_deltalake(uri, pa.table({"writer": ["second"]}, schema=schema), storage_options=opts)
        except BaseException as exc:  # handed to the first writer's thread
            failures.append(exc)

    def first_rows() -> Iterator[pa.RecordBatch]:
        # The first writer has found no table when it reads its rows; the second commits now,
        # from its own thread (delta-rs waits for these rows on its runtime).
        other = threading.Thread(target=second, name="tinct-commit-check")
        other.start()
        other.join()
        if failures:
            raise failures[0]
        yield pa.record_batch({"writer": ["first"]}, schema=schema)

    try:
        write_deltalake(
            uri,
            pa.RecordBatchReader.from_batches(schema, first_rows()),
            storage_options=opts,
            commit_properties=CommitProperties(max_commit_retries=0),
        )
    except CommitFailedError:
        pass  # refused: the version was taken
    except Exception:
        if failures:  # the second writer's failure says more than what it did to the first
            raise failures[0] from None
        raise
    rows = DeltaTable(uri, storage_options=opts).to_pyarrow_table().column("writer").to_pylist()
    if rows not in (["first"], ["second"]):
        raise LineageError(f"the check's table at {uri} holds {rows}, not one writer's row")
    return str(rows[0])


def _remove(uri: str, config: StorageConfig, *, quiet: bool = False) -> None:
    """Delete the scratch table; what cannot be deleted is logged, not raised.

    On object storage through delta-rs's own store: pyarrow's would leave an empty
    "directory" object behind for the root.
    """
    try:
        if "://" in uri:
            DeltaStorageHandler(uri, delta_storage_options(uri, config)).delete_dir("")
        else:
            shutil.rmtree(uri, ignore_errors=quiet)
    except Exception as exc:
        if not quiet:
            log.warning("could not delete the commit check's table %s (delete it by hand): %s", uri, exc)
