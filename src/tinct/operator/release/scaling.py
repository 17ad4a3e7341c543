"""HorizontalPodAutoscalers for the two sides of a release; pure builders.

One ``autoscaling/v2`` HPA per named Deployment, owned by the GrayRelease (deleting the
release removes the HPAs and leaves the Deployments as they are), with the metric of
``spec.autoscaling`` (a pods metric at an average value; ``cpu`` / ``memory`` name a
resource metric instead). The bounds follow the *recorded* status, and capacity comes
before weight:

- **candidate**: sized for the share it is about to take, not only the one in force: while
  a decided step waits for replicas (``status.nextStep``) its minimum is already the
  replicas that step needs (:func:`~tinct.operator.release.decide.needed`), so the HPA
  controller brings them up before any weight moves; on promotion its bounds are raised to
  the full range before it takes 100 %. The maximum is ``ceil(maxReplicas * share)``, never
  below the minimum. After a rollback or abort its bounds stay as they were for
  :data:`SCALE_DOWN_DELAY` (or one analysis interval, if longer), so answers in flight finish
  and every router has the rollback table before the pods go; then ``minReplicas``.
- **stable**: keeps the floor it had when the release started (``status.stableFloor``, its
  Deployment's replicas then) as its minimum until the release is Promoted — a rollback
  therefore always finds stable sized for 100 %; after promotion, which happens only once
  the candidate has the replicas for the whole traffic, its minimum and maximum step down
  to ``minReplicas`` over :data:`STEP_DOWN_INTERVALS` analysis intervals.

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
    GrayReleaseSpec,
    GrayReleaseStatus,
    ScalerStatus,
    parse_duration,
)
from tinct.operator.release.decide import needed, steps_of

__all__ = [
    "SCALE_DOWN_DELAY",
    "STEP_DOWN_INTERVALS",
    "Plan",
    "candidate_bounds",
    "hpa_manifest",
    "hpa_name",
    "plan_autoscaling",
    "stable_bounds",
]

#: Analysis intervals over which stable's bounds come down after promotion.
STEP_DOWN_INTERVALS = 4
#: Seconds the candidate keeps its bounds after a rollback (at least one analysis interval).
SCALE_DOWN_DELAY = 30.0
_RESOURCES = ("cpu", "memory")


def hpa_name(release: str, side: str) -> str:
    return f"tinct-{release}-{side}"[:253]


def _share_at(spec: GrayReleaseSpec, step: int) -> float:
    if step >= steps_of(spec):
        return 100.0
    return max(c.weights[min(step, len(c.weights) - 1)] for c in spec.cells)


def _interval(spec: GrayReleaseSpec) -> float:
    return parse_duration(spec.analysis.interval) if spec.analysis else 60.0


def candidate_bounds(spec: GrayReleaseSpec, status: GrayReleaseStatus, now: datetime) -> tuple[int, int]:
    """(minReplicas, maxReplicas) of the candidate's HPA for the recorded ``status``."""
    scaling = spec.autoscaling
    assert scaling is not None
    lo, hi = scaling.min_replicas, scaling.max_replicas
    share = max(status.weights.values(), default=0.0)
    if status.next_step is not None:
        share = max(share, _share_at(spec, status.next_step))
    if status.phase in ("RolledBack", "Failed"):
        since = (now - status.step_started_at).total_seconds() if status.step_started_at else math.inf
        share = _share_at(spec, status.step) if since < max(SCALE_DOWN_DELAY, _interval(spec)) else 0.0
    if share <= 0:
        return lo, lo
    f = min(share, 100.0) / 100.0
    cmin = max(needed(spec, status, share), min(hi, math.ceil(lo * f - 1e-9)), 1)
    cmax = max(cmin, math.ceil(hi * f - 1e-9))
    return cmin, cmax


def stable_bounds(spec: GrayReleaseSpec, status: GrayReleaseStatus, now: datetime) -> tuple[int, int]:
    """(minReplicas, maxReplicas) of stable's HPA for the recorded ``status``."""
    scaling = spec.autoscaling
    assert scaling is not None
    lo, hi = scaling.min_replicas, scaling.max_replicas
    floor = min(hi, max(lo, status.stable_floor or lo))
    if status.phase != "Promoted" or status.step_started_at is None:
        return floor, hi
    since = (now - status.step_started_at).total_seconds()
    stage = min(STEP_DOWN_INTERVALS, int(since // max(_interval(spec), 1e-3)) + 1)
    smax = max(lo, math.ceil(hi - (hi - lo) * stage / STEP_DOWN_INTERVALS))
    smin = max(lo, math.ceil(floor - (floor - lo) * stage / STEP_DOWN_INTERVALS))
    return min(smin, smax), smax


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
                RELEASE_LABEL: release.metadata.name[:63].rstrip("-_."),
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
    """The HPAs to apply for the recorded ``status``, given the HPAs in the namespace."""
    from tinct.operator.release.tables import owner_reference

    plan = Plan()
    spec = release.spec
    if spec.autoscaling is None:
        return plan
    for side, backend in (("stable", spec.stable), ("candidate", spec.candidate)):
        if backend.deployment is None:
            continue
        name = hpa_name(release.metadata.name, side)
        lo, hi = (stable_bounds if side == "stable" else candidate_bounds)(spec, status, now)
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
