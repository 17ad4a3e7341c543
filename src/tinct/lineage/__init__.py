"""Delta Lake lineage store: the tables, idempotent writes, read-only SQL.

The Python API behind ``tinct lineage``::

    from tinct import lineage

    lineage.query("SELECT model, version, event FROM model_versions", root="/var/lib/tinct/lineage")
    lineage.history("llama3-8b", root="s3://lineage/prod")
    lineage.query("SELECT count(*) FROM artifacts", root=..., as_of_version=57)
    lineage.query("SELECT version, vocab_size FROM interfaces WHERE format = 'tokenizer'", root=...)

The recorded interface of one version comes back with
:func:`tinct.lineage.interfaces.recorded_interface`.

Hashing and validating artifacts live in :mod:`tinct.artifacts`. Heavy modules (deltalake)
load on first use of a name that needs them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tinct.lineage.errors import NotAQueryError
    from tinct.lineage.sql import history, query
    from tinct.lineage.store import LineageStore
    from tinct.lineage.writer import BatchWriter

__all__ = ["BatchWriter", "LineageStore", "NotAQueryError", "history", "query"]

_WHERE = {
    "BatchWriter": "tinct.lineage.writer",
    "LineageStore": "tinct.lineage.store",
    "NotAQueryError": "tinct.lineage.errors",
    "history": "tinct.lineage.sql",
    "query": "tinct.lineage.sql",
}


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'tinct.lineage' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)
