"""The routing table: what the GrayRelease operator tells the routers, as JSON in a ConfigMap.

One table per GrayRelease. The operator builds it with :func:`routing_table_from` at every
step, promotion and rollback and writes it with :func:`routing_configmap`; routers watch the
ConfigMaps labelled :data:`TABLE_LABEL` and swap to a new table as soon as it validates.

The dye, cell-match and fallback models are those of ``GrayRelease``; what the table adds is
the state of one moment: resolved endpoints, one weight per cell, the step, a version.

The CRD's CEL rules only run in the API server, and a table arrives through a ConfigMap that
anyone with write access can edit, so :class:`RoutingTable` checks the same rules itself.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any, Literal

from pydantic import Field, ValidationError, model_validator

from tinct.api.v1alpha1.common import Model
from tinct.api.v1alpha1.grayrelease import (
    Backend,
    CellMatch,
    Dye,
    Fallback,
    GrayRelease,
    GrayReleasePhase,
    ModelName,
    Weight,
)

#: Schema version of the table document; bumped on an incompatible change.
SCHEMA = "tinct.io/routing/v1"
#: Label every routing-table ConfigMap carries; routers select on it.
TABLE_LABEL = "tinct.io/routing-table"
#: Label naming the GrayRelease a table belongs to.
RELEASE_LABEL = "tinct.io/release"
#: Key of the JSON document in the ConfigMap's ``data``.
DATA_KEY = "table.json"
#: Annotation mirroring the table version, for ``kubectl get cm -o yaml`` readers.
VERSION_ANNOTATION = "tinct.io/table-version"

Side = Literal["stable", "candidate"]


class Endpoint(Model):
    """A backend as the router reaches it."""

    url: str = Field(
        pattern=r"^https?://[A-Za-z0-9.\-\[\]:]+(:[0-9]{1,5})?$",
        max_length=512,
        description="Base URL without a path; the request path is appended as is.",
    )
    scheduler_version: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$", max_length=63)
    model_version: str | None = Field(default=None, max_length=253)


class RoutingCell(Model):
    """A cell of the table: which requests, and the percent of them that go to the candidate."""

    match: CellMatch = Field(default_factory=CellMatch)
    weight: Weight


def _is_wild(value: str | None) -> bool:
    return value is None or value == "*"


class RoutingTable(Model):
    """The routing state of one GrayRelease at one moment."""

    schema_: Literal["tinct.io/routing/v1"] = Field(default="tinct.io/routing/v1", alias="schema")
    release: str = Field(min_length=1, max_length=253, description="GrayRelease name; salts the sticky hash.")
    namespace: str | None = Field(default=None, max_length=63)
    version: int = Field(ge=0, description="Increases with every table the operator writes.")
    state: GrayReleasePhase = "Progressing"
    step: int = Field(default=0, ge=0)
    stable: Endpoint
    candidate: Endpoint
    models: list[ModelName] = Field(
        default_factory=list,
        max_length=32,
        description="OpenAI model names whose requests this table routes; empty: any model.",
    )
    dye: Dye
    cells: list[RoutingCell] = Field(min_length=1, max_length=64)
    fallback: Fallback = Field(default_factory=Fallback)

    @model_validator(mode="after")
    def _check(self) -> RoutingTable:
        problems = _problems(self)
        if problems:
            raise ValueError("; ".join(problems))
        return self

    def to_json(self) -> str:
        """The document as stored under :data:`DATA_KEY`."""
        return json.dumps(self.wire(), sort_keys=True, separators=(",", ":"))


def _problems(t: RoutingTable) -> list[str]:
    """The CEL rules of the GrayRelease CRD, applied to a table (which never saw the API server)."""
    out: list[str] = []
    buckets = t.dye.prompt_length.buckets
    names = [b.name for b in buckets]
    if len(set(names)) != len(names):
        out.append("dye.promptLength.buckets: bucket names must be unique")
    if buckets[-1].max_tokens is not None:
        out.append("dye.promptLength.buckets: the last bucket is the catch-all: leave its maxTokens out")
    bounds = [b.max_tokens for b in buckets[:-1]]
    if any(b is None for b in bounds):
        out.append("dye.promptLength.buckets: only the last bucket may leave maxTokens out")
    ints = [b for b in bounds if b is not None]
    if ints != sorted(ints) or len(set(ints)) != len(ints):
        out.append("dye.promptLength.buckets: maxTokens must increase from one bucket to the next")
    role, latency = t.dye.role, t.dye.latency
    if role.default not in role.values:
        out.append("dye.role.default must be one of dye.role.values")
    if latency.default not in latency.values:
        out.append("dye.latency.default must be one of dye.latency.values")
    if latency.stream_class is not None and latency.stream_class not in latency.values:
        out.append("dye.latency.streamClass must be one of dye.latency.values")
    defaults = 0
    for i, c in enumerate(t.cells):
        m = c.match
        if _is_wild(m.prompt_length) and _is_wild(m.role) and _is_wild(m.latency):
            defaults += 1
        if not _is_wild(m.prompt_length) and m.prompt_length not in names:
            out.append(f"cells[{i}].match.promptLength {m.prompt_length!r} names no bucket")
        if not _is_wild(m.role) and m.role not in role.values:
            out.append(f"cells[{i}].match.role {m.role!r} is not one of dye.role.values")
        if not _is_wild(m.latency) and m.latency not in latency.values:
            out.append(f"cells[{i}].match.latency {m.latency!r} is not one of dye.latency.values")
    if defaults != 1:
        out.append(f"exactly one default cell (match: {{}}) is required, found {defaults}")
    if t.stable.url == t.candidate.url:
        out.append("stable and candidate must be different endpoints")
    return out


class RoutingTableError(ValueError):
    """A routing-table document that cannot be used; the message says why."""

    def __init__(self, source: str, reason: str) -> None:
        super().__init__(f"{source}: {reason}")
        self.source = source
        self.reason = reason


def parse_table(document: str | bytes, source: str = "table") -> RoutingTable:
    """Parse and validate a table document.

    Raises:
        RoutingTableError: not JSON, or not a valid table; ``reason`` is fit for an Event.
    """
    try:
        return RoutingTable.model_validate_json(document)
    except ValidationError as e:
        msgs = [f"{'.'.join(str(p) for p in err['loc']) or '<root>'}: {err['msg']}" for err in e.errors()]
        raise RoutingTableError(source, "; ".join(msgs)[:1000]) from None


def _endpoint(backend: Backend, namespace: str, cluster_domain: str) -> Endpoint:
    host = f"{backend.service}.{namespace}.svc.{cluster_domain}" if cluster_domain else backend.service
    return Endpoint(
        url=f"http://{host}:{backend.port}",
        scheduler_version=backend.scheduler_version,
        model_version=backend.model_version,
    )


def routing_table_from(
    release: GrayRelease,
    step: int,
    state: str,
    *,
    version: int,
    cluster_domain: str = "cluster.local",
    models: Sequence[str] = (),
) -> RoutingTable:
    """Build the table for ``release`` at ``step`` in ``state`` (a GrayRelease phase).

    Weights: ``RolledBack`` and ``Failed`` send nothing to the candidate, ``Promoted`` sends
    everything, any other state uses each cell's weight at ``step`` (clamped to the last step).

    Args:
        release: the GrayRelease, with ``metadata.name`` and ``metadata.namespace`` set.
        step: the current step, an index into each cell's ``weights``.
        state: the release phase the table is written for.
        version: the table version; must grow with every write for the same release.
        cluster_domain: DNS suffix of Services; empty to use the bare Service name.
        models: the ``model`` of the release's ModelVersions, the table's model names when
            the GrayRelease lists none.
    """
    spec = release.spec
    namespace = release.metadata.namespace or "default"
    cells: list[RoutingCell] = []
    for cell in spec.cells:
        if state in ("RolledBack", "Failed"):
            weight = 0.0
        elif state == "Promoted":
            weight = 100.0
        else:
            weight = cell.weights[min(step, len(cell.weights) - 1)]
        cells.append(RoutingCell(match=cell.match, weight=weight))
    return RoutingTable.model_validate(
        {
            "release": release.metadata.name,
            "namespace": release.metadata.namespace,
            "version": version,
            "state": state,
            "step": step,
            "stable": _endpoint(spec.stable, namespace, cluster_domain),
            "candidate": _endpoint(spec.candidate, namespace, cluster_domain),
            "models": list(spec.models) or sorted(set(models)),
            "dye": spec.dye,
            "cells": cells,
            "fallback": spec.fallback,
        }
    )


def configmap_name(release_name: str) -> str:
    """Name of the ConfigMap holding the table of ``release_name``."""
    return f"tinct-routing-{release_name}"[:253]


def routing_configmap(
    table: RoutingTable,
    *,
    namespace: str | None = None,
    owner: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The ConfigMap manifest carrying ``table``, ready for server-side apply.

    Args:
        table: the table to publish.
        namespace: defaults to the table's namespace.
        owner: an ownerReference (apiVersion, kind, name, uid) to the GrayRelease, so the
            ConfigMap goes away with it.
    """
    metadata: dict[str, Any] = {
        "name": configmap_name(table.release),
        "labels": {
            TABLE_LABEL: "true",
            RELEASE_LABEL: table.release,
            "app.kubernetes.io/managed-by": "tinct",
        },
        "annotations": {VERSION_ANNOTATION: str(table.version)},
    }
    ns = namespace or table.namespace
    if ns:
        metadata["namespace"] = ns
    if owner:
        metadata["ownerReferences"] = [{**owner, "controller": True, "blockOwnerDeletion": True}]
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": metadata,
        "data": {DATA_KEY: table.to_json()},
    }


__all__ = [
    "DATA_KEY",
    "RELEASE_LABEL",
    "SCHEMA",
    "TABLE_LABEL",
    "VERSION_ANNOTATION",
    "Endpoint",
    "RoutingCell",
    "RoutingTable",
    "RoutingTableError",
    "Side",
    "configmap_name",
    "parse_table",
    "routing_configmap",
    "routing_table_from",
]
