"""The HorizontalPodAutoscaler of one side, as the scaling planner decided it; a pure writer.

An ``autoscaling/v2`` HPA on the metric of ``spec.autoscaling``: a pods metric at an average
value, or ``cpu`` / ``memory`` as a resource metric. Its name and bounds come from the plan
(:mod:`~tinct.operator.grayrelease.scaling`).
"""

from __future__ import annotations

from typing import Any

from tinct.api.v1alpha1.grayrelease import Autoscaling, GrayRelease
from tinct.operator.grayrelease.scalers import SideScaler, deployment_ref, scaler_metadata

__all__ = ["hpa_manifest"]

_RESOURCES = ("cpu", "memory")


def _metric(scaling: Autoscaling) -> dict[str, Any]:
    m = scaling.metric
    target = {"type": "AverageValue", "averageValue": m.average_value}
    if m.pods in _RESOURCES:
        return {"type": "Resource", "resource": {"name": m.pods, "target": target}}
    return {"type": "Pods", "pods": {"metric": {"name": m.pods}, "target": target}}


def hpa_manifest(release: GrayRelease, scaler: SideScaler, owner: dict[str, Any]) -> dict[str, Any]:
    """The HPA of ``scaler``, for server-side apply."""
    if release.spec.autoscaling is None:
        raise ValueError("the release has no spec.autoscaling")
    return {
        "apiVersion": "autoscaling/v2",
        "kind": "HorizontalPodAutoscaler",
        "metadata": scaler_metadata(release, scaler, owner),
        "spec": {
            "scaleTargetRef": deployment_ref(scaler.deployment),
            "minReplicas": scaler.min_replicas,
            "maxReplicas": scaler.max_replicas,
            "metrics": [_metric(release.spec.autoscaling)],
        },
    }
