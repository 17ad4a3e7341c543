"""Read-only SQL over the lineage tables, with DataFusion as the judge of "read-only".

All tables are registered under their names from a ``deltalake.DeltaTable`` loaded
at the wanted version: a local table through delta-rs's own DataFusion table provider, a
remote one (``s3://``, ...) through its Arrow dataset. Every query is planned with DataFusion's SQL options refusing DDL
(``CREATE [EXTERNAL] TABLE``, ``DROP``, views), DML (``INSERT``, ``UPDATE``, ``DELETE``,
``COPY``) and statements (``SET``, ``PREPARE``, transactions); only one statement is
accepted. The engine decides at planning time, on its own parse of the SQL, so what it
runs is exactly what it checked. A refused query raises :class:`NotAQueryError` before
anything is executed or written.

**The view** ``model_lineage`` (:data:`MODEL_LINEAGE`) gives ``model_versions`` the
column names lineage schemas for this job commonly use (``model_id``, ``source_hash``,
``onnx_hash``, ``ptx_hash``, ``safetensors_hash``, ``build_pipeline_id``), so a query
written against that schema runs unchanged; it is defined by tinct, not by the query.

**Time travel.** ``as_of_version=N`` reads ``model_versions`` at Delta version ``N``
(the number a ModelVersion's ``status.lineage.version`` carries) and the other tables as
they were at that commit's time. ``as_of=<datetime>`` reads every table as of that time.
A table that did not exist yet at that point is read at its first (empty) version.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime

import pyarrow as pa
from datafusion import SessionContext, SQLOptions
from deltalake import DeltaTable

from tinct.artifacts.storage import StorageConfig, delta_storage_options
from tinct.lineage.schemas import SCHEMAS

__all__ = ["MODEL_LINEAGE", "NotAQueryError", "history", "query"]

#: The ``model_lineage`` view: one row per model_versions row, under common lineage names.
MODEL_LINEAGE = (
    "SELECT model AS model_id, version, namespace, name, uid, generation, event, "
    "source_sha256 AS source_hash, onnx_sha256 AS onnx_hash, ptx_sha256 AS ptx_hash, "
    "safetensors_sha256 AS safetensors_hash, build_pipeline_id, source_uri, recorded_at "
    "FROM model_versions"
)

#: How DataFusion words a planning refusal by :func:`_read_only` options, and a second statement.
#: Only the wording of the error depends on it: should it change, the query is still refused,
#: as a plain error.
_REFUSED = re.compile(
    r"(?P<kind>DDL|DML|Statement) not supported: (?P<what>[A-Za-z ]+)"
    r"|(?P<many>only supports a single SQL statement)"
    r"|(?P<none>No SQL statements were provided)"
)


class NotAQueryError(ValueError):
    """The SQL is not a single read-only query."""

    def __init__(self, sql: str, detail: str) -> None:
        super().__init__(sql, detail)
        self.sql = sql
        self.detail = detail

    def __str__(self) -> str:
        return f"only read-only queries are allowed: {self.detail}"


def _read_only() -> SQLOptions:
    return SQLOptions().with_allow_ddl(False).with_allow_dml(False).with_allow_statements(False)


def _refusal(sql: str, error: Exception) -> NotAQueryError | None:
    """The :class:`NotAQueryError` for an engine error that refuses the kind of statement."""
    found = _REFUSED.search(str(error))
    if found is None:
        return None
    if found["many"]:
        return NotAQueryError(sql, "more than one statement; give a single query")
    if found["none"]:
        return NotAQueryError(sql, "empty statement")
    what = found["what"].strip()
    kind = {"DDL": "changes schemas", "DML": "writes data", "Statement": "changes the session"}[found["kind"]]
    return NotAQueryError(sql, f"{what} {kind} (use SELECT, WITH, VALUES, EXPLAIN, SHOW or DESCRIBE)")


def _as_of_time(root: str, opts: dict[str, str], version: int) -> datetime:
    dt = DeltaTable(f"{root}/model_versions", storage_options=opts, version=version)
    for entry in dt.history():
        if int(entry.get("version", -1)) == version:
            return datetime.fromtimestamp(int(entry["timestamp"]) / 1000, tz=UTC)
    raise ValueError(f"model_versions has no version {version}")


def _load(uri: str, opts: dict[str, str], at: datetime | None) -> DeltaTable:
    dt = DeltaTable(uri, storage_options=opts)
    if at is None:
        return dt
    try:
        dt.load_as_version(at)
    except Exception:
        # Before the table's first commit: its empty version 0.
        dt.load_as_version(0)
    return dt


def query(
    sql: str,
    root: str,
    *,
    as_of_version: int | None = None,
    as_of: datetime | None = None,
    config: StorageConfig | None = None,
) -> pa.Table:
    """Run a read-only query over the lineage tables under ``root``."""
    if as_of_version is not None and as_of is not None:
        raise ValueError("give as_of_version or as_of, not both")
    root = root.rstrip("/")
    opts = delta_storage_options(root, config)
    at = as_of
    if at is not None and at.tzinfo is None:
        at = at.replace(tzinfo=UTC)
    ctx = SessionContext()
    for name in SCHEMAS:
        uri = f"{root}/{name}"
        if not DeltaTable.is_deltatable(uri, storage_options=opts):
            continue  # never written: querying it names a missing table
        if name == "model_versions" and as_of_version is not None:
            dt = DeltaTable(uri, storage_options=opts, version=as_of_version)
        else:
            if as_of_version is not None and at is None:
                at = _as_of_time(root, opts, as_of_version)
            dt = _load(uri, opts, at)
        if "://" in uri:
            # delta-rs's DataFusion table provider cannot find its object store when scanning a
            # remote table from another DataFusion (delta-io/delta-rs#4623); its Arrow dataset can.
            ctx.register_dataset(name, dt.to_pyarrow_dataset())
        else:
            ctx.register_table(name, dt)
        if name == "model_versions":
            ctx.register_view("model_lineage", ctx.sql(MODEL_LINEAGE))
    try:
        frame = ctx.sql_with_options(sql, _read_only())
    except Exception as exc:
        refused = _refusal(sql, exc)
        if refused is None:
            raise
        raise refused from None
    return frame.to_arrow_table()


def history(model: str, root: str, *, config: StorageConfig | None = None) -> pa.Table:
    """Every recorded event of ``model``, oldest first."""
    literal = model.replace("'", "''")
    return query(
        "SELECT recorded_at, event, version, namespace, name, generation, onnx_sha256, ptx_sha256, "
        "safetensors_sha256, source_sha256, quantization_method, runtime, reason "
        f"FROM model_versions WHERE model = '{literal}' ORDER BY recorded_at, generation",
        root,
        config=config,
    )
