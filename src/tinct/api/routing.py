"""The routing table: what the GrayRelease operator tells the routers, as JSON in a ConfigMap.

One table per GrayRelease. The operator builds it with :func:`routing_table_from` at every
step, promotion and rollback, and for the standing route of a deleted release, its weights
and shadow shares by one rule (:func:`cell_weights`), and writes it with :func:`routing_configmap`; routers
watch the ConfigMaps labelled :data:`TABLE_LABEL` and swap to a new table as soon as it
validates.

The dye, cell-match and fallback models are those of ``GrayRelease``; what the table adds is
the state of one moment: resolved endpoints, one weight and one shadow share per cell, the step, a version, and the
shadow settings (:class:`~tinct.api.v1alpha1.shadow.ShadowTable`) when a cell mirrors.

A table arrives through a ConfigMap that anyone with write access can edit, never through
the GrayRelease CRD's CEL rules, so :class:`RoutingTable` checks the same rules in Python:
its ``dye`` is the GrayRelease's and brings its rules along, and it lists the GrayRelease's
cell rules (:data:`~tinct.api.v1alpha1.grayrelease.CELL_RULES`) as its own (see
:mod:`tinct.api.v1alpha1.rules`).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from typing import Annotated, Any, Literal

from pydantic import Field, ValidationError

from tinct.api.names import label_value
from tinct.api.v1alpha1.common import Model
from tinct.api.v1alpha1.grayrelease import (
    CELL_RULES,
    AdapterRelease,
    Backend,
    CellMatch,
    Dye,
    Fallback,
    GrayRelease,
    GrayReleasePhase,
    GrayReleaseSpec,
    ModelName,
    Shadow,
    ShadowTable,
    Weight,
    cell_key,
)
from tinct.api.v1alpha1.rules import Rule, cel

#: Label every routing-table ConfigMap carries; routers select on it.
TABLE_LABEL = "tinct.io/routing-table"
#: Label naming the GrayRelease a table belongs to.
RELEASE_LABEL = "tinct.io/release"
#: Label naming the namespace of the GrayRelease a table belongs to.
RELEASE_NAMESPACE_LABEL = "tinct.io/release-namespace"
#: Key of the JSON document in the ConfigMap's ``data``.
DATA_KEY = "table.json"
#: Annotation mirroring the table version, for ``kubectl get cm -o yaml`` readers.
VERSION_ANNOTATION = "tinct.io/table-version"

Side = Literal["stable", "candidate"]


_ADDRESS_URL = r"^https?://[A-Za-z0-9.\-\[\]:]+(:[0-9]{1,5})?$"


class Endpoint(Model):
    """A backend as the router reaches it."""

    url: str = Field(pattern=r"^https?://[A-Za-z0-9.\-\[\]:]+(:[0-9]{1,5})?$", max_length=512)
    """Base URL without a path; the request path is appended as is."""
    scheduler_version: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$", max_length=63)
    model_version: str | None = Field(default=None, max_length=253)
    adapter: str | None = Field(default=None, min_length=1, max_length=253, pattern=r"^[^\s]+$")
    """A LoRA adapter candidate: the served name the router writes into the request's 'model' (the url is then
    stable's Service)."""
    addresses: list[Annotated[str, Field(pattern=_ADDRESS_URL, max_length=512)]] = Field(
        default_factory=list, max_length=1024
    )
    """A LoRA adapter candidate: the base URLs of the pods that have it loaded; the candidate's share goes
    only to them (none: the candidate gets no traffic)."""


class RoutingCell(Model):
    """A cell of the table: which requests, the percent of them that go to the candidate, and
    the percent of those stable answers that are mirrored to the candidate."""

    match: CellMatch = Field(default_factory=CellMatch)
    weight: Weight
    shadow: Weight = 0.0


class RoutingTable(Model):
    """The routing state of one GrayRelease at one moment."""

    model_config = cel(
        *CELL_RULES,
        Rule(
            cel="has(self.candidate.adapter) || self.stable.url != self.candidate.url",
            holds=lambda t: t.candidate.adapter is not None or t.stable.url != t.candidate.url,
            message="stable and candidate must be different endpoints",
        ),
    )

    #: Schema version of the table document; bumped on an incompatible change.
    schema_: Literal["tinct.io/routing/v1"] = Field(default="tinct.io/routing/v1", alias="schema")
    release: str = Field(min_length=1, max_length=253)
    """GrayRelease name; salts the sticky hash."""
    namespace: str | None = Field(default=None, max_length=63)
    uid: str | None = Field(default=None, max_length=128)
    """The GrayRelease's uid: a table whose version goes backward for the same uid is refused."""
    version: int = Field(ge=0)
    """Increases with every table the operator writes."""
    standing: bool = False
    """The standing route of a deleted release: it serves the release's models until a live release claims
    them."""
    state: GrayReleasePhase = "Progressing"
    step: int = Field(default=0, ge=0)
    stable: Endpoint
    candidate: Endpoint
    models: list[ModelName] = Field(default_factory=list, max_length=32)
    """OpenAI model names whose requests this table routes; empty: any model."""
    claimed: dict[ModelName, float] = Field(default_factory=dict, max_length=32)
    """Model -> when the release's namespace began routing it (epoch seconds): carried over from the table of
    that namespace it took the model over from, else the moment the operator first wrote this table (finer
    than the ConfigMap's creation time, which counts whole seconds, and never more than a second after it);
    the creation time for a model not listed. A model belongs to the namespace with the earliest claim
    (tinct.api.ownership)."""
    dye: Dye
    cells: list[RoutingCell] = Field(min_length=1, max_length=64)
    fallback: Fallback = Field(default_factory=Fallback)
    shadow: ShadowTable | None = None
    """The release's shadow settings and ModelVersions; null when no cell mirrors."""

    def to_json(self) -> str:
        """The document as stored under :data:`DATA_KEY`."""
        return json.dumps(self.wire(), sort_keys=True, separators=(",", ":"))


class RoutingTableError(ValueError):
    """A routing-table document that cannot be used; the message says why."""

    def __init__(self, source: str, reason: str) -> None:
        super().__init__(f"{source}: {reason}")
        self.source = source
        self.reason = reason


def _reason(error: Any) -> str:
    """A validation error's message, without pydantic's "Value error, " for a broken rule."""
    if error["type"] == "value_error":
        return str(error["ctx"]["error"])
    return str(error["msg"])


def parse_table(document: str | bytes, source: str = "table") -> RoutingTable:
    """Parse and validate a table document.

    Raises:
        RoutingTableError: not JSON, or not a valid table; ``reason`` is fit for an Event.
    """
    try:
        return RoutingTable.model_validate_json(document)
    except ValidationError as e:
        msgs = [f"{'.'.join(str(p) for p in err['loc']) or '<root>'}: {_reason(err)}" for err in e.errors()]
        raise RoutingTableError(source, "; ".join(msgs)[:1000]) from None


def _endpoint(backend: Backend, namespace: str, cluster_domain: str) -> Endpoint:
    host = f"{backend.service}.{namespace}.svc" + (f".{cluster_domain}" if cluster_domain else "")
    return Endpoint(
        url=f"http://{host}:{backend.port}",
        scheduler_version=backend.scheduler_version,
        model_version=backend.model_version,
    )


def _pod_url(address: str, port: int) -> str:
    host = f"[{address}]" if ":" in address else address
    return f"http://{host}:{port}"


def cell_weights(
    spec: GrayReleaseSpec, state: str, step: int, *, serving: bool = True, shadow: bool = False
) -> dict[str, float]:
    """The weight rule: the percent of each cell's traffic (by :func:`cell_key`) the candidate
    gets in ``state`` (a GrayRelease phase) at ``step`` -- or, with ``shadow``, the percent of
    the requests stable answers that are mirrored to it (``cells[].shadow``).

    ``Promoted`` sends everything, and mirrors nothing. ``RolledBack`` and ``Failed`` send and
    mirror nothing, and so does a candidate that does not serve (``serving`` False: its step
    has not started, or it is unavailable). Any other state uses each cell's value at
    ``step``, clamped to the last step (a cell without ``shadow`` mirrors nothing).
    """
    out: dict[str, float] = {}
    for cell in spec.cells:
        values = cell.shadow if shadow else cell.weights
        if state == "Promoted":
            share = 0.0 if shadow else 100.0
        elif state in ("RolledBack", "Failed") or not serving or not values:
            share = 0.0
        else:
            share = values[min(step, len(values) - 1)]
        out[cell_key(cell.match)] = share
    return out


def _shadow_settings(release: GrayRelease, shadows: Mapping[str, float]) -> ShadowTable | None:
    """The table's shadow settings: the spec's (or the defaults) when a cell mirrors."""
    if not any(v > 0 for v in shadows.values()):
        return None
    spec = release.spec
    settings = spec.shadow or Shadow()
    return ShadowTable.model_validate(
        {
            **settings.model_dump(),
            "stable_model_version": spec.stable.model_version,
            "candidate_model_version": spec.candidate.model_version,
        }
    )


def routing_table_from(
    release: GrayRelease,
    step: int,
    state: str,
    *,
    version: int,
    weights: Mapping[str, float] | None = None,
    shadows: Mapping[str, float] | None = None,
    standing: bool = False,
    cluster_domain: str = "cluster.local",
    models: Sequence[str] = (),
    claimed: Mapping[str, float] | None = None,
    adapter: AdapterRelease | None = None,
) -> RoutingTable:
    """The table the routers get for ``release`` at ``step`` in ``state`` (a GrayRelease phase).

    Every table the operator writes comes from here: a step's, a rollback's, a promotion's,
    and a deleted release's standing route.

    Args:
        release: the GrayRelease, with ``metadata.name`` and ``metadata.namespace`` set (and
            ``metadata.uid``, which the table names).
        step: the current step, an index into each cell's ``weights``.
        state: the release phase the table is written for.
        version: the table version; must grow with every write for the same release.
        weights: each cell's weight (by :func:`cell_key`) as a recorded status put it in force
            (``status.weights``, which the decision takes from :func:`cell_weights`); default:
            :func:`cell_weights` of ``state`` and ``step``. A cell missing from it gets 0.
        shadows: each cell's shadow share the same way (``status.shadows``); default:
            :func:`cell_weights` with ``shadow``. A cell missing from it mirrors nothing.
        standing: the table is the standing route of a deleted release.
        cluster_domain: DNS suffix of Services; empty: ``<service>.<namespace>.svc``, for the
            resolver's search path to complete (never the bare Service name, which would
            resolve in the router's namespace).
        models: the ``model`` of the release's ModelVersions, the table's model names when
            the GrayRelease lists none.
        claimed: earlier claims on its models the table carries over (:mod:`tinct.api.ownership`).
        adapter: a LoRA adapter candidate's ``status.adapter``: the served name the routers
            write into 'model' and the pods that have it. Without a served name or a pod
            holding it the candidate gets nothing, whatever ``weights`` say.
    """
    spec = release.spec
    namespace = release.metadata.namespace or "default"
    if weights is None:
        weights = cell_weights(spec, state, step)
    if shadows is None:
        shadows = cell_weights(spec, state, step, shadow=True)
    candidate = _endpoint(spec.candidate, namespace, cluster_domain)
    if spec.candidate.adapter is not None:
        served = adapter.served_name if adapter is not None else None
        port = (adapter.port if adapter else None) or spec.stable.port
        addresses = [_pod_url(a, port) for a in adapter.addresses] if adapter and served else []
        candidate = candidate.model_copy(
            update={"adapter": served or spec.candidate.adapter.model_version, "addresses": addresses}
        )
        if not addresses:
            weights, shadows = {}, {}
    table = RoutingTable.model_validate(
        {
            "release": release.metadata.name,
            "namespace": release.metadata.namespace,
            "uid": release.metadata.uid,
            "version": version,
            "standing": standing,
            "state": state,
            "step": step,
            "stable": _endpoint(spec.stable, namespace, cluster_domain),
            "candidate": candidate,
            "models": list(spec.models) or sorted(set(models)),
            "claimed": dict(claimed or {}),
            "dye": spec.dye,
            "cells": [
                RoutingCell(
                    match=c.match,
                    weight=weights.get(cell_key(c.match), 0.0),
                    shadow=shadows.get(cell_key(c.match), 0.0),
                )
                for c in spec.cells
            ],
            "fallback": spec.fallback,
            "shadow": _shadow_settings(release, shadows),
        }
    )
    # A backend's own URL is set after validation: one equal to the other side's makes a table
    # the routers refuse (and say why), not a round that cannot record its decision.
    urls = {side: b.url for side, b in (("stable", spec.stable), ("candidate", spec.candidate)) if b.url}
    if not urls:
        return table
    return table.model_copy(
        update={side: getattr(table, side).model_copy(update={"url": url}) for side, url in urls.items()}
    )


def configmap_name(namespace: str, release_name: str) -> str:
    """Name of the ConfigMap holding the table of ``namespace/release_name``.

    Tables of every namespace live side by side in the operator's table namespace, so the
    name carries both (a namespace has no dots, so ``<namespace>.<release>`` is unique); a
    name that would pass 253 characters ends in a digest of the whole instead.
    """
    name = f"tinct-routing-{namespace}.{release_name}"
    if len(name) <= 253:
        return name
    digest = hashlib.sha256(name.encode()).hexdigest()[:16]
    return f"{name[:236]}-{digest}"


def routing_configmap(
    table: RoutingTable,
    *,
    namespace: str | None = None,
    owner: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The ConfigMap manifest carrying ``table``, ready for server-side apply.

    Args:
        table: the table to publish.
        namespace: where the ConfigMap lives: the operator's table namespace, which only
            the operator may write and the routers read (default: the table's namespace).
        owner: an ownerReference to the GrayRelease, for a table kept in the release's own
            namespace; tables in the table namespace have none (a reference cannot cross
            namespaces) and outlive their release as its standing route.
    """
    ns = namespace or table.namespace or "default"
    metadata: dict[str, Any] = {
        "name": configmap_name(table.namespace or "default", table.release),
        "labels": {
            TABLE_LABEL: "true",
            RELEASE_LABEL: label_value(table.release),
            RELEASE_NAMESPACE_LABEL: label_value(table.namespace or "default"),
            "app.kubernetes.io/managed-by": "tinct",
        },
        "annotations": {VERSION_ANNOTATION: str(table.version)},
    }
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
    "RELEASE_NAMESPACE_LABEL",
    "TABLE_LABEL",
    "VERSION_ANNOTATION",
    "Endpoint",
    "RoutingCell",
    "RoutingTable",
    "RoutingTableError",
    "Side",
    "cell_weights",
    "configmap_name",
    "parse_table",
    "routing_configmap",
    "routing_table_from",
]
