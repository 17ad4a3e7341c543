"""Interfaces of recorded ModelVersions, read back from the ``interfaces`` table.

A ModelVersion is named by its object name (``llama3-8b-1-3-0``) or by
``model@version`` (``llama3-8b@1.3.0``), optionally within a namespace. Its interface is
the one recorded by its latest verified event (the rows of one ``event_id``), rebuilt
with :func:`tinct.artifacts.interface.combine` from the ``facts`` column, so what is
compared is what the operator measured.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from tinct.artifacts.interface import Interface, combine
from tinct.artifacts.storage import StorageConfig
from tinct.lineage.errors import RecordedNotFoundError
from tinct.lineage.sql import literal, query

__all__ = ["Recorded", "RecordedNotFoundError", "recorded_interface"]


@dataclass(frozen=True)
class Recorded:
    model: str
    version: str
    namespace: str | None
    name: str | None
    uid: str
    generation: int
    interface: Interface

    @property
    def label(self) -> str:
        where = f"{self.namespace}/{self.name}" if self.namespace else self.name
        return f"{self.model}@{self.version} ({where})"


def recorded_interface(
    ref: str,
    root: str,
    *,
    namespace: str | None = None,
    uid: str | None = None,
    config: StorageConfig | None = None,
) -> Recorded:
    """The latest recorded interface of the ModelVersion ``ref`` (name or model@version).

    ``uid`` pins one object (the operator's own lookups); ``namespace`` narrows a name
    that several namespaces use.

    Raises:
        RecordedNotFoundError: nothing verified is recorded under that name.
    """
    where: list[str] = []
    if uid is not None:
        where.append(f"uid = {literal(uid)}")
    elif "@" in ref:
        model, _, version = ref.partition("@")
        where.append(f"model = {literal(model)} AND version = {literal(version)}")
    else:
        where.append(f"name = {literal(ref)}")
    if namespace is not None:
        where.append(f"namespace = {literal(namespace)}")
    cond = " AND ".join(where)
    try:
        table = query(
            "SELECT event_id, model, version, namespace, name, uid, generation, format, uri, facts, recorded_at "
            f"FROM interfaces WHERE {cond} ORDER BY recorded_at DESC, generation DESC, uri",
            root,
            config=config,
        )
    except Exception as exc:
        if "interfaces" in str(exc) and "not found" in str(exc):
            raise RecordedNotFoundError(ref, f"no interfaces table under {root} yet") from None
        raise
    rows = table.to_pylist()
    if not rows:
        hint = "a ModelVersion name or model@version" if "@" not in ref else "model@version"
        raise RecordedNotFoundError(
            ref, f"no verified interface recorded (is {hint} right, and is the version Ready?)"
        )
    objects = {(r["namespace"] or "", r["name"] or "") for r in rows}
    if len(objects) > 1 and uid is None:
        others = ", ".join(sorted(f"{n}/{m}" for n, m in objects))
        raise RecordedNotFoundError(
            ref, f"names more than one ModelVersion ({others}): give --namespace, or a name"
        )
    latest = rows[0]["event_id"]
    mine = [r for r in rows if r["event_id"] == latest]
    first = mine[0]
    interface = combine((r["format"], r["uri"], json.loads(r["facts"])) for r in mine)
    return Recorded(
        model=first["model"],
        version=first["version"],
        namespace=first["namespace"],
        name=first["name"],
        uid=first["uid"],
        generation=int(first["generation"]),
        interface=interface,
    )
