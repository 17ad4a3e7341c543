"""A side's scaler as the scaling planner decided it, and what its two writers share.

The planner (:mod:`~tinct.operator.grayrelease.scaling`) fills one :class:`SideScaler` per
side it may scale; the writers (:mod:`~tinct.operator.grayrelease.hpa`,
:mod:`~tinct.operator.grayrelease.scaledobject`) render it and decide nothing. Both kinds
carry the same metadata (:func:`scaler_metadata`): the labels and the owner reference that
mark a scaler as the release's own.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tinct.api.names import label_value
from tinct.api.routing import RELEASE_LABEL
from tinct.api.v1alpha1.common import API_VERSION
from tinct.api.v1alpha1.grayrelease import GrayRelease

__all__ = ["SideScaler", "deployment_ref", "owner_reference", "scaler_metadata"]


@dataclass(frozen=True)
class SideScaler:
    """What one side's scaler is to be."""

    side: str
    #: The Deployment it scales.
    deployment: str
    #: The HPA's or the ScaledObject's name.
    name: str
    min_replicas: int
    max_replicas: int
    #: KEDA: the PromQL the side scales on (its own signal).
    query: str | None = None
    #: KEDA: the Prometheus URL, one of the operator's configuration.
    server_address: str | None = None


def owner_reference(release: GrayRelease) -> dict[str, Any]:
    """An ownerReference to ``release`` (needs ``metadata.uid``)."""
    return {
        "apiVersion": API_VERSION,
        "kind": "GrayRelease",
        "name": release.metadata.name,
        "uid": release.metadata.uid or "",
    }


def scaler_metadata(release: GrayRelease, scaler: SideScaler, owner: dict[str, Any]) -> dict[str, Any]:
    """Metadata of a scaler (HPA or ScaledObject) the release owns for one side."""
    return {
        "name": scaler.name,
        "namespace": release.metadata.namespace or "default",
        "labels": {
            RELEASE_LABEL: label_value(release.metadata.name),
            "tinct.io/side": scaler.side,
            "app.kubernetes.io/managed-by": "tinct",
        },
        "ownerReferences": [{**owner, "controller": True, "blockOwnerDeletion": True}],
    }


def deployment_ref(name: str) -> dict[str, str]:
    """A scaler's ``scaleTargetRef`` to the Deployment ``name``."""
    return {"apiVersion": "apps/v1", "kind": "Deployment", "name": name}
