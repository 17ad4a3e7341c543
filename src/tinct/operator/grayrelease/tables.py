"""The routing table a recorded GrayRelease status calls for; pure builders.

Tables of every release live in the operator's **table namespace** (``tinct operator
--table-namespace``; the chart's namespace), where only the operator's ServiceAccount may
write and the routers read; a tenant who can write ConfigMaps in its own namespace cannot
make a router route. The ConfigMap of ``llm/chat`` is ``tinct-routing-llm.chat``
(:func:`~tinct.api.routing.configmap_name`); it names the release's uid, so a router
refuses a table going backward for the same release.

The table version only grows: :func:`plan` gives the status a new version whenever the
table's content (all but its version) changes, one above both the version recorded in
status and the one found in the cluster, and records the content's digest beside it. The
controller persists that status first and applies the table it describes afterwards, so a
table is never in force that status did not record.

Each table names the OpenAI ``model`` values it serves, so one router can front many
releases: ``spec.models`` when the GrayRelease lists them, else the ``model`` of its
ModelVersions (:func:`release_models`), else the models the status last recorded (a
ModelVersion deleted mid-release must not turn the table into a catch-all).

When the release is deleted, its table stays as the model's **standing route**
(:func:`standing_table`): the candidate at 100 % when it was Promoted, stable otherwise.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from tinct.api import ownership
from tinct.api.routing import (
    RoutingTable,
    cell_weights,
    configmap_name,
    routing_configmap,
    routing_table_from,
)
from tinct.api.v1alpha1.dye import cell_key
from tinct.api.v1alpha1.grayrelease import GrayRelease, GrayReleaseStatus, RoutingRef
from tinct.operator.grayrelease.seal import RECORD_ANNOTATION, Record
from tinct.router.table import CompiledTable

__all__ = [
    "cells_by_tag",
    "claims_of",
    "content_digest",
    "desired_table",
    "plan",
    "release_models",
    "standing_table",
    "table_manifest",
    "target_digest",
]


class Found(Protocol):
    """A routing-table ConfigMap as the operator's watch found it
    (:class:`~tinct.operator.grayrelease.kube.FoundTable`)."""

    @property
    def name(self) -> str: ...
    @property
    def created(self) -> float: ...
    @property
    def table(self) -> RoutingTable | None: ...


def claims_of(
    namespace: str, config_map: str, models: Sequence[str], found: Sequence[Found], now: float | None = None
) -> dict[str, float]:
    """The claims the table ``config_map`` of a release of ``namespace`` records
    (:mod:`tinct.api.ownership`): for each of ``models``, the earliest claim on it of a table of
    the same namespace (live or standing) that is earlier than this table's own, and this
    table's own claim: ``now`` for a table not written yet (the moment it is, finer than the
    second its ConfigMap's creation counts), else the one it records. Stable: once recorded, a
    claim stays in the table."""
    mine = next((f for f in found if f.name == config_map), None)
    out: dict[str, float] = {}
    if mine is None and now is not None:
        out = dict.fromkeys(models, now)
    own = mine.created + 1.0 if mine is not None else math.inf
    for f in found:
        t = f.table
        if t is None or (t.namespace or "default") != namespace:
            continue
        for m in set(models) & set(t.models):
            if f is mine and m not in t.claimed:
                continue  # a table recording no claim of its own keeps to its creation time
            since = ownership.since(t.claimed, f.created, m)
            if since < min(own, out.get(m, math.inf)):
                out[m] = since
    return out


def release_models(
    release: GrayRelease, modelversions: Mapping[str, Mapping[str, Any] | None], recorded: Sequence[str] = ()
) -> list[str]:
    """The ``model`` the release's ModelVersions serve, as found in ``modelversions`` (name ->
    object, None when missing); ``recorded`` (the models of the table last planned) while
    neither is known.

    Both share one model (a precondition of the release); should they differ, the release
    cannot proceed and stable serves everything, so stable's model is the one named.
    """

    def model(name: str) -> str | None:
        spec = (modelversions.get(name) or {}).get("spec") or {}
        found = spec.get("model")
        return found if isinstance(found, str) and found else None

    spec = release.spec
    chosen = model(spec.stable.model_version) or model(spec.candidate.model_version)
    return [chosen] if chosen else list(recorded)


def target_digest(release: GrayRelease, modelversions: Mapping[str, Mapping[str, Any] | None]) -> str | None:
    """A digest of what the release moves traffic between: both sides' Service, port,
    Deployment, URL and scheduler version, and their ModelVersions' artifact digests.

    None while a ModelVersion is missing or has no digests yet (hashing): a target that
    cannot be known is never taken for a changed one.
    """
    sides: dict[str, Any] = {}
    for side, backend in (("stable", release.spec.stable), ("candidate", release.spec.candidate)):
        mv = modelversions.get(backend.model_version)
        digests = ((mv or {}).get("status") or {}).get("digests")
        if not digests:
            return None
        sides[side] = {
            "service": backend.service,
            "port": backend.port,
            "deployment": backend.deployment,
            "url": backend.url,
            "schedulerVersion": backend.scheduler_version,
            "digests": dict(sorted(dict(digests).items())),
        }
    text = json.dumps(sides, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def desired_table(
    release: GrayRelease,
    status: GrayReleaseStatus,
    version: int,
    cluster_domain: str = "cluster.local",
    models: Sequence[str] = (),
    claimed: Mapping[str, float] | None = None,
) -> RoutingTable:
    """The table ``status`` calls for: its phase, its step, and the weights it put in force."""
    return routing_table_from(
        release,
        status.step,
        status.phase,
        version=version,
        weights=status.weights,
        shadows=status.shadows,
        cluster_domain=cluster_domain,
        models=models,
        claimed=claimed,
        adapter=status.adapter,
    )


def content_digest(table: RoutingTable) -> str:
    """Digest of everything in ``table`` but its version."""
    doc = table.wire()
    doc.pop("version", None)
    return hashlib.sha256(json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()).hexdigest()[:32]


def plan(
    release: GrayRelease,
    status: GrayReleaseStatus,
    *,
    table_namespace: str,
    found_version: int = 0,
    cluster_domain: str = "cluster.local",
    models: Sequence[str] = (),
    claimed: Mapping[str, float] | None = None,
    since: float | None = None,
) -> RoutingTable:
    """Record in ``status.routing`` the table ``status`` calls for, and return it; ``since``:
    the release's own claim moment (kept once recorded).

    A new version (one above both ``status.routing.version`` and ``found_version``, the
    version of the ConfigMap in the cluster) when the content changed or the cluster holds
    a newer version than status knows; the recorded version otherwise.
    """
    ns = release.metadata.namespace or "default"
    ref = status.routing
    recorded = ref.version if ref is not None else 0
    since = ref.since if ref is not None and ref.since is not None else since
    want = desired_table(release, status, 0, cluster_domain, models, claimed)
    digest = content_digest(want)
    if ref is None or ref.digest != digest or found_version > recorded or ref.namespace != table_namespace:
        version = max(recorded, found_version) + 1
        status.routing = RoutingRef(
            config_map=configmap_name(ns, release.metadata.name),
            namespace=table_namespace,
            version=version,
            digest=digest,
            models=list(want.models),
            since=since,
        )
    else:
        version = recorded
        ref.models = list(want.models)
        ref.since = since
    return want.model_copy(update={"version": version})


def table_manifest(table: RoutingTable, table_namespace: str, record: Record | None = None) -> dict[str, Any]:
    """The ConfigMap of ``table`` in the table namespace, for server-side apply; with the
    operator's ``record`` of the release's last status in an annotation."""
    manifest = routing_configmap(table, namespace=table_namespace)
    if record is not None:
        manifest["metadata"]["annotations"][RECORD_ANNOTATION] = record.to_json()
    return manifest


def standing_table(
    release: GrayRelease,
    status: GrayReleaseStatus,
    *,
    found_version: int = 0,
    cluster_domain: str = "cluster.local",
    claimed: Mapping[str, float] | None = None,
) -> RoutingTable:
    """The standing route of a deleted release: its outcome, kept until another release
    takes its models over (``claimed``: what the last live table carried over).

    The candidate serves every cell when the release was Promoted; stable serves
    everything otherwise (the weight rule for a candidate that no longer serves). The
    version grows past everything the release wrote.
    """
    routing = status.routing
    return routing_table_from(
        release,
        status.step,
        status.phase,
        version=max(routing.version if routing is not None else 0, found_version) + 1,
        weights=cell_weights(release.spec, status.phase, status.step, serving=False),
        shadows={},
        standing=True,
        cluster_domain=cluster_domain,
        models=routing.models if routing is not None else [],
        claimed=claimed,
        adapter=status.adapter,
    )


def cells_by_tag(table: RoutingTable) -> dict[str, list[str]]:
    """Cell name -> the dye tags the router sends to that cell (most specific cell wins)."""
    compiled = CompiledTable(table)
    out: dict[str, list[str]] = {cell_key(c.match): [] for c in table.cells}
    for route in compiled.routes.values():
        out[cell_key(table.cells[route.cell].match)].append(route.tag)
    return out
