"""KEDA ScaledObjects for the two sides of a release (``spec.autoscaling.keda``); pure builders.

One ScaledObject per named Deployment, owned by the GrayRelease, with one trigger of KEDA's
``prometheus`` scaler. KEDA keeps an HPA for it (``keda-hpa-<name>``) whose External metric
is the query's value, and kube-controller-manager's HPA controller sets the Deployment's
replicas to ``ceil(value / targetPerReplica)`` within ``minReplicaCount`` and
``maxReplicaCount``, which tinct sets from the release's recorded state exactly as it sets
an HPA's bounds (:mod:`tinct.operator.grayrelease.scaling`).

Each side scales on its own signal, never on both sides together: the default query is the
side's engine queue depth summed over the series its own labels select (default: the
release's namespace and the side's Service), so the candidate's queue never drives stable's
replicas or the reverse. The queue metric of each engine, as the engines export it:

============  ===========================================================================
engine        queue depth (requests waiting, not yet running)
============  ===========================================================================
``vllm``      ``vllm:num_requests_waiting``
``sglang``    ``sglang:num_queue_reqs`` (older releases: ``sglang_num_queue_reqs``)
``tgi``       ``tgi_queue_size``
============  ===========================================================================

The Prometheus URL comes from the operator's configuration (resolved by the caller the way
analyses resolve theirs), never from the spec. A query answering nothing is an error for
KEDA (``ignoreNullValues: false``): the HPA then holds the replicas it has instead of
scaling a side down because its series went missing.
"""

from __future__ import annotations

import hashlib
from typing import Any

from tinct.api.routing import RELEASE_LABEL
from tinct.api.v1alpha1.grayrelease import Backend, GrayRelease, Keda
from tinct.operator.grayrelease.engine import QUEUE_METRICS  # one table of the engines' names
from tinct.operator.grayrelease.prometheus import selector

__all__ = [
    "API_VERSION",
    "GROUP",
    "PLURAL",
    "QUEUE_METRICS",
    "keda_hpa_name",
    "scaled_object_manifest",
    "scaled_object_name",
    "side_query",
    "targets",
]

GROUP = "keda.sh"
API_VERSION = f"{GROUP}/v1alpha1"
PLURAL = "scaledobjects"
#: KEDA uses a ScaledObject's name as a label value: at most 63 characters.
_MAX_NAME = 63


def scaled_object_name(release: str, side: str) -> str:
    """``tinct-<release>-<side>``, shortened with a digest of the release's name past 63 characters."""
    name = f"tinct-{release}-{side}"
    if len(name) <= _MAX_NAME:
        return name
    digest = hashlib.sha256(release.encode()).hexdigest()[:8]
    keep = _MAX_NAME - len(f"tinct--{digest}-{side}")
    return f"tinct-{release[:keep].rstrip('-.')}-{digest}-{side}"


def keda_hpa_name(scaled_object: str) -> str:
    """The HPA KEDA keeps for a ScaledObject it scales (its default name)."""
    return f"keda-hpa-{scaled_object}"


def side_labels(release: GrayRelease, side: str) -> dict[str, str]:
    """The labels selecting ``side``'s own engine series."""
    keda = _keda(release)
    backend: Backend = getattr(release.spec, side)
    given = getattr(keda, side).labels
    if given:
        return dict(given)
    return {"namespace": release.metadata.namespace or "default", "service": backend.service}


def side_query(release: GrayRelease, side: str) -> str | None:
    """The PromQL ``side`` scales on: its own query, else its engine's queue depth; None without either."""
    keda = _keda(release)
    own = getattr(keda, side).query
    if own is not None:
        return str(own)
    engine = getattr(release.spec, side).engine
    if engine is None:
        return None
    sel = selector(**side_labels(release, side))
    return " or ".join(f"sum({metric}{{{sel}}})" for metric in QUEUE_METRICS[engine])


def _keda(release: GrayRelease) -> Keda:
    scaling = release.spec.autoscaling
    if scaling is None or scaling.keda is None:
        raise ValueError("the release has no spec.autoscaling.keda")
    return scaling.keda


def _number(value: float) -> str:
    """A threshold as KEDA parses it (a float): ``5``, ``0.5``, ``1e+09``."""
    return format(value, "g")


def scaler_metadata(release: GrayRelease, name: str, side: str, owner: dict[str, Any]) -> dict[str, Any]:
    """Metadata of a scaler (HPA or ScaledObject) the release owns for one side."""
    return {
        "name": name,
        "namespace": release.metadata.namespace or "default",
        "labels": {
            RELEASE_LABEL: release.metadata.name[:63].rstrip("-_."),
            "tinct.io/side": side,
            "app.kubernetes.io/managed-by": "tinct",
        },
        "ownerReferences": [{**owner, "controller": True, "blockOwnerDeletion": True}],
    }


def deployment_ref(name: str) -> dict[str, str]:
    """A scaler's ``scaleTargetRef`` to the Deployment ``name``."""
    return {"apiVersion": "apps/v1", "kind": "Deployment", "name": name}


def scaled_object_manifest(
    release: GrayRelease,
    side: str,
    lo: int,
    hi: int,
    owner: dict[str, Any],
    *,
    server_address: str,
    query: str,
) -> dict[str, Any]:
    """The ScaledObject of one side, for server-side apply.

    ``server_address`` is a Prometheus URL from the operator's configuration; ``query`` is
    :func:`side_query`'s.
    """
    keda = _keda(release)
    backend: Backend = getattr(release.spec, side)
    if backend.deployment is None:
        raise ValueError(f"{side} names no deployment")
    return {
        "apiVersion": API_VERSION,
        "kind": "ScaledObject",
        "metadata": scaler_metadata(release, scaled_object_name(release.metadata.name, side), side, owner),
        "spec": {
            "scaleTargetRef": deployment_ref(backend.deployment),
            "minReplicaCount": lo,
            "maxReplicaCount": hi,
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
                    "name": "queue" if getattr(keda, side).query is None else "query",
                    "metricType": "AverageValue",
                    "metadata": {
                        "serverAddress": server_address,
                        "query": query,
                        "threshold": _number(keda.target_per_replica),
                        "ignoreNullValues": "false",
                    },
                }
            ],
        },
    }


def targets(obj: dict[str, Any], deployment: str) -> bool:
    """Whether a ScaledObject or HPA (as the watch has it) scales Deployment ``deployment``."""
    ref = (obj.get("spec") or {}).get("scaleTargetRef") or {}
    kind = ref.get("kind") or "Deployment"  # a ScaledObject's default
    group = (ref.get("apiVersion") or "apps/v1").split("/")[0]
    return bool(kind == "Deployment" and group == "apps" and ref.get("name") == deployment)
