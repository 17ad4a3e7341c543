"""The routing table a GrayRelease's status calls for, and when to write it again.

The table version only grows, also across operator restarts: the next version is one more
than the largest of the version recorded in status and the one on the ConfigMap in the
cluster. A table whose content (everything but the version) is already in the ConfigMap is
not written again, so a reconcile repeated after a crash converges without a new version.

Each table names the OpenAI ``model`` values it serves, so one router can front many
releases: ``spec.models`` when the GrayRelease lists them, else the ``model`` of its
ModelVersions (:func:`release_models`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from tinct.api.routing import (
    DATA_KEY,
    VERSION_ANNOTATION,
    RoutingCell,
    RoutingTable,
    RoutingTableError,
    parse_table,
    routing_configmap,
    routing_table_from,
)
from tinct.api.v1alpha1.common import API_VERSION
from tinct.api.v1alpha1.grayrelease import GrayRelease, GrayReleaseStatus
from tinct.operator.release.decide import cell_key
from tinct.router.table import CompiledTable

__all__ = [
    "cells_by_tag",
    "desired_table",
    "next_table",
    "owner_reference",
    "release_models",
    "table_version",
]


def owner_reference(release: GrayRelease) -> dict[str, Any]:
    """An ownerReference to ``release`` (needs ``metadata.uid``)."""
    return {
        "apiVersion": API_VERSION,
        "kind": "GrayRelease",
        "name": release.metadata.name,
        "uid": release.metadata.uid or "",
    }


def release_models(release: GrayRelease, modelversions: Mapping[str, Mapping[str, Any] | None]) -> list[str]:
    """The ``model`` the release's ModelVersions serve, as found in ``modelversions`` (name ->
    object, None when missing); empty while neither is known.

    Both share one model (a precondition of the release); should they differ, the release
    cannot proceed and stable serves everything, so stable's model is the one named.
    """

    def model(name: str) -> str | None:
        spec = (modelversions.get(name) or {}).get("spec") or {}
        found = spec.get("model")
        return found if isinstance(found, str) and found else None

    spec = release.spec
    chosen = model(spec.stable.model_version) or model(spec.candidate.model_version)
    return [chosen] if chosen else []


def desired_table(
    release: GrayRelease,
    status: GrayReleaseStatus,
    version: int,
    cluster_domain: str = "cluster.local",
    models: Sequence[str] = (),
) -> RoutingTable:
    """The table for ``status``: its phase, its step, and ``status.weights`` per cell.

    ``models``: the model of the release's ModelVersions (:func:`release_models`), the
    table's model names when ``spec.models`` is empty.
    """
    table = routing_table_from(
        release, status.step, status.phase, version=version, cluster_domain=cluster_domain, models=models
    )
    cells = [
        RoutingCell(match=c.match, weight=status.weights.get(cell_key(c.match), 0.0))
        for c in release.spec.cells
    ]
    spec = release.spec
    update: dict[str, Any] = {"cells": cells}
    for side, backend in (("stable", spec.stable), ("candidate", spec.candidate)):
        if backend.url:
            update[side] = getattr(table, side).model_copy(update={"url": backend.url})
    return table.model_copy(update=update)


def table_version(configmap: dict[str, Any] | None) -> tuple[int, RoutingTable | None]:
    """The version and table of a routing-table ConfigMap as found (0, None if unusable)."""
    if not configmap:
        return 0, None
    annotations = (configmap.get("metadata") or {}).get("annotations") or {}
    try:
        version = int(annotations.get(VERSION_ANNOTATION, "0"))
    except ValueError:
        version = 0
    doc = (configmap.get("data") or {}).get(DATA_KEY)
    if not doc:
        return version, None
    try:
        table = parse_table(doc, "configmap")
    except RoutingTableError:
        return version, None
    return max(version, table.version), table


def _content(table: RoutingTable) -> dict[str, Any]:
    doc = table.wire()
    doc.pop("version", None)
    return doc


def next_table(
    release: GrayRelease,
    status: GrayReleaseStatus,
    configmap: dict[str, Any] | None,
    cluster_domain: str = "cluster.local",
    models: Sequence[str] = (),
) -> tuple[dict[str, Any] | None, int]:
    """The ConfigMap manifest to apply (None if the cluster has this table already) and the
    table version in force afterwards; ``models`` as for :func:`desired_table`."""
    found_version, found = table_version(configmap)
    recorded = status.routing.version if status.routing else 0
    want = desired_table(release, status, 0, cluster_domain, models)
    if found is not None and _content(found) == _content(want):
        return None, found_version
    version = max(found_version, recorded) + 1
    table = want.model_copy(update={"version": version})
    manifest = routing_configmap(
        table, namespace=release.metadata.namespace or "default", owner=owner_reference(release)
    )
    return manifest, version


def cells_by_tag(table: RoutingTable) -> dict[str, list[str]]:
    """Cell name -> the dye tags the router sends to that cell (most specific cell wins)."""
    compiled = CompiledTable(table)
    out: dict[str, list[str]] = {cell_key(c.match): [] for c in table.cells}
    for route in compiled.routes.values():
        out[cell_key(table.cells[route.cell].match)].append(route.tag)
    return out
