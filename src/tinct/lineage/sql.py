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
written against that schema runs unchanged; it is defined by tinct, not by the query. A
LoRA adapter's rows also carry its base (``base_model_version``, ``base_model``,
``base_version``) and facts (``peft_type``, ``lora_rank``, ``lora_alpha``,
``lora_target_modules``, ``lora_hash``, ``served_name``) from the ``adapters`` table.

**Time travel.** ``as_of_version=N`` reads ``model_versions`` at Delta version ``N``
(the number a ModelVersion's ``status.lineage.version`` carries) and the other tables as
they were at that commit's time. ``as_of=<datetime>`` reads every table as of that time.
A table that did not exist yet at that point is read at its first (empty) version; a point
before every table's history, or a version ``model_versions`` never had, is refused with
:class:`OutsideHistoryError` saying where the history begins and ends.

**Limits.** Every query runs within :class:`~tinct.lineage.limits.Limits`: a memory pool
and an answer of at most ``memory`` bytes each, and a timeout (see :mod:`tinct.lineage.limits`);
passing one raises :class:`QueryLimitError` naming it.

**Errors a person can act on**: a root without any lineage table raises
:class:`NoTablesError` (naming the root and how to name another); a query naming a table
that is not there says which tables are; SQL that does not parse, or that names a column or
function that is not there, raises :class:`QueryError` with the engine's complaint as a sentence.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime

import pyarrow as pa
from datafusion import DataFrame, SessionConfig, SessionContext, SQLOptions
from deltalake import DeltaTable

from tinct.artifacts.storage import StorageConfig, delta_storage_options
from tinct.lineage.errors import (
    LineageError,
    NoTablesError,
    NotAQueryError,
    OutsideHistoryError,
    QueryError,
)
from tinct.lineage.limits import Limits, collect, deadline
from tinct.lineage.schemas import SCHEMAS

# The errors these raise are in tinct.lineage.errors.
__all__ = ["MODEL_LINEAGE", "history", "literal", "query"]

#: The ``model_lineage`` view: one row per model_versions row, under common lineage names;
#: a LoRA adapter's row adds its base version and facts from ``adapters`` (NULL for others).
MODEL_LINEAGE = (
    "SELECT m.model AS model_id, m.version, m.namespace, m.name, m.uid, m.generation, m.event, "
    "m.source_sha256 AS source_hash, m.onnx_sha256 AS onnx_hash, m.ptx_sha256 AS ptx_hash, "
    "m.safetensors_sha256 AS safetensors_hash, m.build_pipeline_id, m.source_uri, m.recorded_at, "
    "a.base_model_version, a.base_model, a.base_version, a.peft_type, a.rank AS lora_rank, "
    "a.lora_alpha, a.target_modules AS lora_target_modules, a.lora_sha256 AS lora_hash, a.served_name "
    "FROM model_versions m LEFT JOIN adapters a ON m.event_id = a.event_id"
)
#: The same before an ``adapters`` table exists (lineage written by an older operator).
_MODEL_LINEAGE_BEFORE_ADAPTERS = (
    "SELECT model AS model_id, version, namespace, name, uid, generation, event, "
    "source_sha256 AS source_hash, onnx_sha256 AS onnx_hash, ptx_sha256 AS ptx_hash, "
    "safetensors_sha256 AS safetensors_hash, build_pipeline_id, source_uri, recorded_at, "
    "CAST(NULL AS VARCHAR) AS base_model_version, CAST(NULL AS VARCHAR) AS base_model, "
    "CAST(NULL AS VARCHAR) AS base_version, CAST(NULL AS VARCHAR) AS peft_type, "
    "CAST(NULL AS BIGINT) AS lora_rank, CAST(NULL AS DOUBLE) AS lora_alpha, "
    "CAST(NULL AS VARCHAR) AS lora_target_modules, CAST(NULL AS VARCHAR) AS lora_hash, "
    "CAST(NULL AS VARCHAR) AS served_name FROM model_versions"
)

#: How DataFusion words a planning refusal by :func:`_read_only` options, and a second statement.
#: Only the wording of the error depends on it: should it change, the query is still refused,
#: as a plain error.
_REFUSED = re.compile(
    r"(?P<kind>DDL|DML|Statement) not supported: (?P<what>[A-Za-z ]+)"
    r"|(?P<many>only supports a single SQL statement)"
    r"|(?P<none>No SQL statements were provided)"
)


_MISSING_TABLE = re.compile(r"table '(?:[a-z_]+\.)*(?P<table>[^'.]+)' not found")
#: How DataFusion words SQL it cannot parse, and a query it cannot plan (no such column, ...).
_UNPARSED = re.compile(r'^SQL error: (?:Parser|Tokenizer)Error\("(?P<what>.*)"\)$', re.DOTALL)
_UNPLANNED = re.compile(r"^(?:Schema error|Error during planning): (?P<what>.*)$", re.DOTALL)


def literal(text: str) -> str:
    """``text`` as an SQL string literal."""
    return "'" + text.replace("'", "''") + "'"


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


def _sentence(text: str) -> str:
    """An engine's complaint as a sentence: ``Expected: X, found: Y at Line: 1, Column: 8``
    becomes ``expected X but found Y (line 1, column 8)``; lines become clauses."""
    text = text.replace('\\"', '"')
    text = re.sub(r" at Line: (\d+), Column: (\d+)", r" (line \1, column \2)", text)
    text = re.sub(r"Expected: (.*?), found: ", r"expected \1 but found ", text)
    text = re.sub(r"\bEOF\b\.?", "the end of the query", text)
    clauses = [line.strip().rstrip(".") for line in text.splitlines() if line.strip()]
    return "; ".join(c[:1].lower() + c[1:] for c in clauses)


def _unplannable(sql: str, error: Exception) -> QueryError | None:
    """The :class:`QueryError` for SQL the engine could not parse or plan."""
    text = str(error).strip()
    if found := _UNPARSED.match(text):
        return QueryError(sql, "the query does not parse", _sentence(found["what"]))
    if found := _UNPLANNED.match(text):
        return QueryError(sql, "the query cannot be planned", _sentence(found["what"]))
    return None


def _commits(dt: DeltaTable) -> dict[int, datetime]:
    """Version -> commit time of every version the table's log still holds."""
    return {
        int(e["version"]): datetime.fromtimestamp(int(e["timestamp"]) / 1000, tz=UTC)
        for e in dt.history()
        if "version" in e and "timestamp" in e
    }


def _at_version(uri: str, opts: dict[str, str], version: int) -> tuple[DeltaTable, datetime]:
    """``model_versions`` at ``version`` and that commit's time, or :class:`OutsideHistoryError`."""
    dt = DeltaTable(uri, storage_options=opts)
    commits = _commits(dt)
    if version not in commits:
        span = f"versions {min(commits)} to {max(commits)}" if commits else "no versions"
        raise OutsideHistoryError(
            f"model_versions has {span}; --as-of-version {version} is outside its history "
            "(a ModelVersion's status.lineage.version names a version it has)"
        )
    dt.load_as_version(version)
    return dt, commits[version]


def _load(uri: str, opts: dict[str, str], at: datetime | None) -> tuple[DeltaTable, datetime | None]:
    """The table as of ``at`` (now when None), and the time of its first commit."""
    dt = DeltaTable(uri, storage_options=opts)
    if at is None:
        return dt, None
    commits = _commits(dt)
    first = min(commits.values()) if commits else None
    if first is None or at < first:
        dt.load_as_version(min(commits) if commits else 0)  # not written yet then: its first, empty version
    else:
        dt.load_as_version(at)
    return dt, first


def query(
    sql: str,
    root: str,
    *,
    as_of_version: int | None = None,
    as_of: datetime | None = None,
    config: StorageConfig | None = None,
    limits: Limits | None = None,
) -> pa.Table:
    """Run a read-only query over the lineage tables under ``root``, within ``limits``
    (the defaults of :class:`~tinct.lineage.limits.Limits` when None)."""
    if as_of_version is not None and as_of is not None:
        raise ValueError("give as_of_version or as_of, not both")
    limits = limits or Limits()
    with deadline(limits) as end:
        # The context stays referenced while the answer is collected: a DataFrame alone does
        # not keep its session alive.
        ctx, frame = _plan(sql, root.rstrip("/"), as_of_version, as_of, config, limits)
        answer = collect(frame, limits, end)
        del ctx
        return answer


def _plan(
    sql: str,
    root: str,
    as_of_version: int | None,
    as_of: datetime | None,
    config: StorageConfig | None,
    limits: Limits,
) -> tuple[SessionContext, DataFrame]:
    """A session with the tables under ``root`` as of the time asked, and ``sql`` planned in it."""
    opts = delta_storage_options(root, config)
    at = as_of
    if at is not None and at.tzinfo is None:
        at = at.replace(tzinfo=UTC)
    ctx = SessionContext(SessionConfig(), limits.runtime())
    names = [n for n in SCHEMAS if DeltaTable.is_deltatable(f"{root}/{n}", storage_options=opts)]
    if as_of_version is not None:
        if "model_versions" not in names:
            raise NoTablesError(root)
        _, at = _at_version(f"{root}/model_versions", opts, as_of_version)
    firsts: list[datetime] = []
    for name in names:
        uri = f"{root}/{name}"
        if name == "model_versions" and as_of_version is not None:
            dt, _ = _at_version(uri, opts, as_of_version)
        else:
            dt, first = _load(uri, opts, at)
            if first is not None:
                firsts.append(first)
        if "://" in uri:
            # delta-rs's DataFusion table provider cannot find its object store when scanning a
            # remote table from another DataFusion (delta-io/delta-rs#4623); its Arrow dataset can.
            ctx.register_dataset(name, dt.to_pyarrow_dataset())
        else:
            ctx.register_table(name, dt)
    if "model_versions" in names:
        view = MODEL_LINEAGE if "adapters" in names else _MODEL_LINEAGE_BEFORE_ADAPTERS
        ctx.register_view("model_lineage", ctx.sql(view))
    if as_of is not None and at is not None and firsts and at < min(firsts):
        raise OutsideHistoryError(
            f"--as-of {at.isoformat()} is before the lineage history, which begins at "
            f"{min(firsts).isoformat()}"
        )
    try:
        return ctx, ctx.sql_with_options(sql, _read_only())
    except Exception as exc:
        refused = _refusal(sql, exc)
        if refused is not None:
            raise refused from None
        missing = _MISSING_TABLE.search(str(exc))
        if missing is not None and not names:
            raise NoTablesError(root) from None
        if missing is not None:
            views = " and the view model_lineage" if "model_versions" in names else ""
            raise LineageError(
                f"no table {missing['table']} under {root} (it has {', '.join(names)}{views})"
            ) from None
        unplannable = _unplannable(sql, exc)
        if unplannable is not None:
            raise unplannable from None
        raise


def history(
    model: str, root: str, *, config: StorageConfig | None = None, limits: Limits | None = None
) -> pa.Table:
    """Every recorded event of ``model``, oldest first."""
    return query(
        "SELECT recorded_at, event, version, namespace, name, generation, onnx_sha256, ptx_sha256, "
        "safetensors_sha256, source_sha256, quantization_method, runtime, reason "
        f"FROM model_versions WHERE model = {literal(model)} ORDER BY recorded_at, generation",
        root,
        config=config,
        limits=limits,
    )
