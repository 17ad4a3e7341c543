"""HorizontalPodAutoscalers for the two sides of a release; pure builders.

One ``autoscaling/v2`` HPA per named Deployment, owned by the GrayRelease (deleting the
release removes the HPAs and leaves the Deployments as they are), with the metric of
``spec.autoscaling`` (a pods metric at an average value; ``cpu`` / ``memory`` name a
resource metric instead). Bounds per side:

- **candidate**: follows its share of traffic, taken as the largest weight of any cell (the
  busiest cell decides, so no cell is starved): ``ceil(bound * share)``, never below 1 while
  it serves anything. At share 0 (not started, rolled back) it shrinks to ``minReplicas``.
- **stable**: keeps ``[minReplicas, maxReplicas]`` until the release is Promoted; then its
  maximum is stepped down to ``minReplicas`` over :data:`STEP_DOWN_INTERVALS` analysis
  intervals instead of at once, so the stable pods drain gradually.

An HPA on the same Deployment that this release did not create is left alone: the side is
reported ``managed: false`` with an ``AutoscalingReady=False`` condition.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from tinct.api.routing import RELEASE_LABEL
from tinct.api.v1alpha1.common import Condition, set_condition
from tinct.api.v1alpha1.grayrelease import (
    Autoscaling,
    Backend,
    GrayRelease,
    GrayReleaseStatus,
    ScalerStatus,
)
from tinct.operator.release.decide import parse_duration

__all__ = ["STEP_DOWN_INTERVALS", "Plan", "bounds", "hpa_manifest", "hpa_name", "plan_autoscaling"]

#: Analysis intervals over which stable's maximum comes down after promotion.
STEP_DOWN_INTERVALS = 4
_RESOURCES = ("cpu", "memory")


def hpa_name(release: str, side: str) -> str:
    return f"tinct-{release}-{side}"[:253]


def bounds(
    scaling: Autoscaling,
    side: str,
    phase: str,
    share: float,
    since_promotion: float | None = None,
    interval: float = 60.0,
) -> tuple[int, int]:
    """(minReplicas, maxReplicas) for ``side``.

    Args:
        share: the candidate's share of traffic in percent (largest cell weight in force).
        since_promotion: seconds since the release was Promoted (stable's step-down).
        interval: seconds per step-down stage.
    """
    lo, hi = scaling.min_replicas, scaling.max_replicas
    if side == "candidate":
        if share <= 0:
            return lo, lo
        f = min(share, 100.0) / 100.0
        cmax = max(1, math.ceil(hi * f))
        cmin = min(cmax, max(1, math.ceil(lo * f)))
        return cmin, cmax
    if phase != "Promoted" or since_promotion is None:
        return lo, hi
    stage = min(STEP_DOWN_INTERVALS, int(since_promotion // max(interval, 1e-3)) + 1)
    smax = max(lo, math.ceil(hi - (hi - lo) * stage / STEP_DOWN_INTERVALS))
    return lo, smax


def _metric(scaling: Autoscaling) -> dict[str, Any]:
    m = scaling.metric
    target = {"type": "AverageValue", "averageValue": m.average_value}
    if m.pods in _RESOURCES:
        return {"type": "Resource", "resource": {"name": m.pods, "target": target}}
    return {"type": "Pods", "pods": {"metric": {"name": m.pods}, "target": target}}


def hpa_manifest(
    release: GrayRelease, side: str, backend: Backend, lo: int, hi: int, owner: dict[str, Any]
) -> dict[str, Any]:
    """The HPA of one side, for server-side apply."""
    if backend.deployment is None or release.spec.autoscaling is None:
        raise ValueError(f"{side} has no deployment or the release no autoscaling")
    return {
        "apiVersion": "autoscaling/v2",
        "kind": "HorizontalPodAutoscaler",
        "metadata": {
            "name": hpa_name(release.metadata.name, side),
            "namespace": release.metadata.namespace or "default",
            "labels": {
                RELEASE_LABEL: release.metadata.name,
                "tinct.io/side": side,
                "app.kubernetes.io/managed-by": "tinct",
            },
            "ownerReferences": [{**owner, "controller": True, "blockOwnerDeletion": True}],
        },
        "spec": {
            "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": backend.deployment},
            "minReplicas": lo,
            "maxReplicas": hi,
            "metrics": [_metric(release.spec.autoscaling)],
        },
    }


@dataclass
class Plan:
    manifests: list[dict[str, Any]] = field(default_factory=list)
    status: list[ScalerStatus] = field(default_factory=list)
    foreign: list[str] = field(default_factory=list)

    def conditions(self, conds: list[Condition], generation: int | None, now: datetime) -> list[Condition]:
        if self.foreign:
            new = Condition(
                type="AutoscalingReady",
                status="False",
                reason="ForeignHPA",
                message="; ".join(self.foreign),
                observed_generation=generation,
            )
        else:
            new = Condition(
                type="AutoscalingReady",
                status="True",
                reason="Applied",
                message=", ".join(f"{s.side} {s.min_replicas}-{s.max_replicas}" for s in self.status)
                or "no Deployment named",
                observed_generation=generation,
            )
        return set_condition(conds, new, now)


def _targets(hpa: dict[str, Any], deployment: str) -> bool:
    ref = (hpa.get("spec") or {}).get("scaleTargetRef") or {}
    return bool(ref.get("kind") == "Deployment" and ref.get("name") == deployment)


def _ours(hpa: dict[str, Any], uid: str | None) -> bool:
    refs = (hpa.get("metadata") or {}).get("ownerReferences") or []
    return any(r.get("kind") == "GrayRelease" and r.get("uid") == uid for r in refs)


def plan_autoscaling(
    release: GrayRelease, status: GrayReleaseStatus, hpas: list[dict[str, Any]], now: datetime
) -> Plan:
    """The HPAs to apply for ``status`` given the HPAs in the namespace."""
    from tinct.operator.release.tables import owner_reference

    plan = Plan()
    scaling = release.spec.autoscaling
    if scaling is None:
        return plan
    share = max(status.weights.values(), default=0.0)
    interval = parse_duration(release.spec.analysis.interval) if release.spec.analysis else 60.0
    since = None
    if status.phase == "Promoted" and status.step_started_at is not None:
        since = (now - status.step_started_at).total_seconds()
    for side, backend in (("stable", release.spec.stable), ("candidate", release.spec.candidate)):
        if backend.deployment is None:
            continue
        name = hpa_name(release.metadata.name, side)
        lo, hi = bounds(scaling, side, status.phase, share, since, interval)
        others = [
            h
            for h in hpas
            if _targets(h, backend.deployment)
            and not (h["metadata"]["name"] == name and _ours(h, release.metadata.uid))
        ]
        if others:
            names = ", ".join(h["metadata"]["name"] for h in others)
            plan.foreign.append(
                f"Deployment {backend.deployment} is already scaled by HPA {names}, which this release did "
                f"not create; remove it to let the release manage {side} replicas"
            )
            plan.status.append(
                ScalerStatus(side=side, hpa=name, min_replicas=lo, max_replicas=hi, managed=False)
            )
            continue
        plan.manifests.append(hpa_manifest(release, side, backend, lo, hi, owner_reference(release)))
        plan.status.append(ScalerStatus(side=side, hpa=name, min_replicas=lo, max_replicas=hi))
    return plan
