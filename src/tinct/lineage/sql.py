"""Read-only SQL over the lineage tables (DataFusion through ``deltalake.QueryBuilder``).

All three tables are registered under their names. Only a single query is accepted:
a statement that starts with ``SELECT``, ``WITH``, ``VALUES``, ``EXPLAIN``, ``SHOW`` or
``DESCRIBE`` and contains no data- or schema-changing keyword outside string literals and
quoted identifiers. Anything else raises :class:`NotAQueryError` before DataFusion sees it.

**Time travel.** ``as_of_version=N`` reads ``model_versions`` at Delta version ``N``
(the number a ModelVersion's ``status.lineage.version`` carries) and the other tables as
they were at that commit's time. ``as_of=<datetime>`` reads every table as of that time.
A table that did not exist yet at that point is read at its first (empty) version.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime

import pyarrow as pa
from deltalake import DeltaTable, QueryBuilder

from tinct.artifacts.storage import StorageConfig, delta_storage_options
from tinct.lineage.schemas import SCHEMAS

__all__ = ["NotAQueryError", "check_query", "history", "query"]

_ALLOWED_START = {"SELECT", "WITH", "VALUES", "EXPLAIN", "SHOW", "DESCRIBE"}
_FORBIDDEN = {
    "INSERT",
    "UPDATE",
    "DELETE",
    "MERGE",
    "CREATE",
    "DROP",
    "ALTER",
    "TRUNCATE",
    "COPY",
    "SET",
    "GRANT",
    "REVOKE",
    "REPLACE",
    "ATTACH",
    "DETACH",
    "VACUUM",
    "OPTIMIZE",
    "PREPARE",
    "EXECUTE",
    "DEALLOCATE",
}
_STRIP = re.compile(
    r"""('(?:[^']|'')*')"""  # 'string'
    r"""|("(?:[^"]|"")*")"""  # "identifier"
    r"|(--[^\n]*)"  # -- comment
    r"|(/\*.*?\*/)",  # /* comment */
    re.DOTALL,
)
_WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


class NotAQueryError(ValueError):
    """The SQL is not a single read-only query."""

    def __init__(self, sql: str, detail: str) -> None:
        super().__init__(sql, detail)
        self.sql = sql
        self.detail = detail

    def __str__(self) -> str:
        return f"only read-only queries are allowed: {self.detail}"


def check_query(sql: str) -> None:
    """Raise :class:`NotAQueryError` unless ``sql`` is one read-only statement."""
    bare = _STRIP.sub(" ", sql).strip()
    if "'" in bare or '"' in bare:
        raise NotAQueryError(sql, "unterminated string or quoted identifier")
    statements = [s for s in bare.split(";") if s.strip()]
    if not statements:
        raise NotAQueryError(sql, "empty statement")
    if len(statements) > 1:
        raise NotAQueryError(sql, "more than one statement")
    words = [w.upper() for w in _WORD.findall(statements[0])]
    first = statements[0].lstrip("( \t\n").split(None, 1)[0].upper() if statements[0].strip("( \t\n") else ""
    if first not in _ALLOWED_START:
        raise NotAQueryError(sql, f"{first or 'this'} statements are not queries (use SELECT or WITH)")
    bad = sorted(_FORBIDDEN.intersection(words))
    if bad:
        raise NotAQueryError(sql, f"{', '.join(bad)} is not allowed")


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
    check_query(sql)
    if as_of_version is not None and as_of is not None:
        raise ValueError("give as_of_version or as_of, not both")
    root = root.rstrip("/")
    opts = delta_storage_options(root, config)
    at = as_of
    if at is not None and at.tzinfo is None:
        at = at.replace(tzinfo=UTC)
    qb = QueryBuilder()
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
        qb.register(name, dt)
    return pa.table(qb.execute(sql).read_all())


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
