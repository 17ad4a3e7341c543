"""The KEDA ScaledObject of one side, as the scaling planner decided it; a pure writer.

One trigger of KEDA's ``prometheus`` scaler on the side's own query, at the Prometheus URL
of the operator's configuration, both from the plan
(:mod:`~tinct.operator.grayrelease.scaling`), as are its name and its bounds. KEDA keeps an
HPA for it (``keda-hpa-<name>``) whose External metric is the query's value, and
kube-controller-manager's HPA controller sets the Deployment's replicas to
``ceil(value / targetPerReplica)`` within ``minReplicaCount`` and ``maxReplicaCount``.

A query answering nothing is an error for KEDA (``ignoreNullValues: false``): the HPA then
holds the replicas it has instead of scaling a side down because its series went missing.
"""

from __future__ import annotations

from typing import Any

from tinct.api.v1alpha1.grayrelease import GrayRelease
from tinct.operator.grayrelease.scalers import SideScaler, deployment_ref, scaler_metadata

__all__ = ["API_VERSION", "GROUP", "PLURAL", "scaled_object_manifest"]

GROUP = "keda.sh"
API_VERSION = f"{GROUP}/v1alpha1"
PLURAL = "scaledobjects"


def _number(value: float) -> str:
    """A threshold as KEDA parses it (a float): ``5``, ``0.5``, ``1e+09``."""
    return format(value, "g")


def scaled_object_manifest(release: GrayRelease, scaler: SideScaler, owner: dict[str, Any]) -> dict[str, Any]:
    """The ScaledObject of ``scaler``, for server-side apply."""
    scaling = release.spec.autoscaling
    keda = scaling.keda if scaling is not None else None
    if keda is None or scaler.query is None or scaler.server_address is None:
        raise ValueError(f"{scaler.side} has no KEDA query or Prometheus to scale on")
    return {
        "apiVersion": API_VERSION,
        "kind": "ScaledObject",
        "metadata": scaler_metadata(release, scaler, owner),
        "spec": {
            "scaleTargetRef": deployment_ref(scaler.deployment),
            "minReplicaCount": scaler.min_replicas,
            "maxReplicaCount": scaler.max_replicas,
            "advanced": {
                "horizontalPodAutoscalerConfig": {
                    "behavior": {
                        "scaleUp": {"stabilizationWindowSeconds": keda.scale_up_stabilization_seconds},
                        "scaleDown": {"stabilizationWindowSeconds": keda.scale_down_stabilization_seconds},
                    }
                }
            },
            "triggers": [
                {
                    "type": "prometheus",
                    "name": "queue" if getattr(keda, scaler.side).query is None else "query",
                    "metricType": "AverageValue",
                    "metadata": {
                        "serverAddress": scaler.server_address,
                        "query": scaler.query,
                        "threshold": _number(keda.target_per_replica),
                        "ignoreNullValues": "false",
                    },
                }
            ],
        },
    }
