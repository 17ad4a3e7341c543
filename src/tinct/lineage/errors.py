"""What can go wrong with the lineage tables, each said so that a person can act on it.

Only the standard library is imported, so ``tinct --help`` stays fast.
"""

from __future__ import annotations

from tinct.errors import AboutError

__all__ = [
    "LineageError",
    "NoTablesError",
    "NotAQueryError",
    "OutsideHistoryError",
    "QueryError",
    "QueryLimitError",
    "RecordedNotFoundError",
    "UnsafeStoreError",
]


class LineageError(ValueError):
    """A lineage read that cannot be answered as asked; the message says why and what to do."""


class _GivenError(AboutError, LineageError):
    """Something a person gave (``about``) and what is wrong with it (``detail``).

    The message is ``<lead>: <detail>``, the lead being the class's :attr:`lead`, else what
    was given.
    """

    lead: str | None = None

    def __str__(self) -> str:
        return f"{self.lead or self.about}: {self.detail}"


class _RootError(LineageError):
    """Something about the tables under ``root`` as a whole."""

    def __init__(self, root: str) -> None:
        super().__init__(root)
        self.root = root


class NoTablesError(_RootError):
    """The root holds no lineage table."""

    def __str__(self) -> str:
        return (
            f"no lineage tables under {self.root}; set --root or TINCT_LINEAGE_ROOT to the operator's "
            "--lineage-root (with the Helm chart's PVC: kubectl exec -n <namespace> "
            "deploy/<release>-operator -- tinct lineage ...)"
        )


class OutsideHistoryError(LineageError):
    """A version or time the tables' history does not cover."""


class NotAQueryError(_GivenError):
    """The SQL (``given``) is not a single read-only query."""

    lead = "only read-only queries are allowed"


class RecordedNotFoundError(_GivenError, LookupError):
    """No verified interface is recorded for the ModelVersion ``given``."""


class QueryError(_GivenError):
    """The SQL (``given``) does not parse, or names what is not there; ``lead`` says which."""

    def __init__(self, given: str, lead: str, detail: str) -> None:
        super().__init__(given, detail)
        self.lead = lead


class QueryLimitError(LineageError):
    """A query passed its memory limit or its timeout (``limit``: ``memory``, ``timeout``)."""

    def __init__(self, limit: str, message: str) -> None:
        super().__init__(message)
        self.limit = limit


class UnsafeStoreError(_RootError):
    """The store under ``root`` lets a second commit of a table version replace the first."""

    def __str__(self) -> str:
        return (
            f"the store under {self.root} does not refuse a second commit of the same table version "
            "(it ignores conditional writes, If-None-Match), so two operator replicas, or a paused "
            "leader and the standby that took over, could erase each other's lineage commits; use a "
            "store with conditional writes (AWS S3 and current S3-compatible stores have them), or "
            "run a single operator replica with --lineage-single-writer (TINCT_LINEAGE_SINGLE_WRITER=true, "
            "chart value operator.lineage.singleWriter)"
        )
