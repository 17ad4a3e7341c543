"""What scales the two sides of a release: the plan, HPAs or KEDA ScaledObjects; pure.

:func:`plan_autoscaling` decides everything for the recorded status, side by side: one
scaler per named Deployment, owned by the GrayRelease (deleting the release removes them and
leaves the Deployments as they are); which kind — an ``autoscaling/v2`` HPA on the metric of
``spec.autoscaling``, or with ``spec.autoscaling.keda`` a KEDA ScaledObject on a Prometheus
query of that side alone; its name, its bounds, the signal it scales on, and whether it may
be written at all. The writers (:mod:`~tinct.operator.grayrelease.hpa`,
:mod:`~tinct.operator.grayrelease.scaledobject`) render what it decided for each side
(:class:`~tinct.operator.grayrelease.scalers.SideScaler`) and call nothing back.
Switching from one way to the other deletes the release's own scaler of the old way.

The bounds — an HPA's ``minReplicas``/``maxReplicas``, a ScaledObject's
``minReplicaCount``/``maxReplicaCount`` alike — follow the *recorded* status, and capacity
comes before weight:

- **candidate**: sized for the share it is about to take, not only the one in force: while
  a decided step waits for replicas (``status.nextStep``) its minimum is already the
  replicas that step needs (:func:`~tinct.operator.grayrelease.shares.needed`), so the HPA
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

With KEDA each side scales on its own signal, never on both sides together: its own query,
else its engine's queue depth (:data:`~tinct.operator.grayrelease.engine.QUEUE_METRICS`:
``vllm:num_requests_waiting``, ``sglang:num_queue_reqs`` or ``sglang_num_queue_reqs``,
``tgi_queue_size``) summed over the series its own labels select (default: the release's
namespace and the side's Service), so the candidate's queue never drives stable's replicas
or the reverse. The Prometheus URL comes from the operator's configuration (resolved by the
caller the way analyses resolve theirs, :class:`KedaEnv`), never from the spec.

An HPA or ScaledObject on the same Deployment that this release did not create is left
alone: the side is reported ``managed: false`` with an ``AutoscalingReady=False`` condition
(``ForeignHPA`` or ``ForeignScaledObject``); the HPA KEDA keeps for the release's own
ScaledObject is not foreign. A cluster without KEDA (``KEDANotInstalled``), a Prometheus the
operator does not allow (``PrometheusNotAllowed``) or two sides on the same query
(``SameSignal``) are conditions too, and nothing is written for them. A scaler that is
written but cannot read its metric — its HPA (KEDA's, for a ScaledObject) says
``ScalingActive=False`` with a ``FailedGet...`` reason, e.g. a Pods metric with no custom
metrics API — is ``AutoscalingReady=False MetricUnavailable``, never ``Applied``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from tinct.api.names import LABEL_VALUE, shortened
from tinct.api.v1alpha1.common import Condition, set_condition
from tinct.api.v1alpha1.grayrelease import (
    Backend,
    GrayRelease,
    GrayReleaseSpec,
    GrayReleaseStatus,
    Keda,
    ScalerStatus,
    parse_duration,
)
from tinct.operator.grayrelease.engine import QUEUE_METRICS
from tinct.operator.grayrelease.hpa import hpa_manifest
from tinct.operator.grayrelease.prometheus import selector
from tinct.operator.grayrelease.scaledobject import scaled_object_manifest
from tinct.operator.grayrelease.scalers import SideScaler, owner_reference
from tinct.operator.grayrelease.shares import needed, share_at

__all__ = [
    "SCALE_DOWN_DELAY",
    "STEP_DOWN_INTERVALS",
    "KedaEnv",
    "Plan",
    "SideScaler",
    "candidate_bounds",
    "hpa_name",
    "keda_hpa_name",
    "plan_autoscaling",
    "scaled_object_name",
    "side_query",
    "stable_bounds",
    "targets",
]

#: Analysis intervals over which stable's bounds come down after promotion.
STEP_DOWN_INTERVALS = 4
#: Seconds the candidate keeps its bounds after a rollback (at least one analysis interval).
SCALE_DOWN_DELAY = 30.0
#: KEDA uses a ScaledObject's name as a label value: at most 63 characters.
_MAX_SO_NAME = LABEL_VALUE
#: An HPA's name is a DNS subdomain.
_MAX_HPA_NAME = 253
#: Characters of a side's query that ``status.autoscaling[].query`` shows.
QUERY_SHOWN = 8192


def hpa_name(release: str, side: str) -> str:
    """``tinct-<release>-<side>``, shortened with a digest of the release's name past 253
    characters: each side keeps an HPA of its own."""
    return shortened("tinct-", release, f"-{side}", _MAX_HPA_NAME)


def scaled_object_name(release: str, side: str) -> str:
    """``tinct-<release>-<side>``, shortened with a digest of the release's name past 63 characters."""
    return shortened("tinct-", release, f"-{side}", _MAX_SO_NAME)


def keda_hpa_name(scaled_object: str) -> str:
    """The HPA KEDA keeps for a ScaledObject it scales (its default name)."""
    return f"keda-hpa-{scaled_object}"


def _shown(query: str | None) -> str | None:
    """``query`` as status shows it: cut to what the field holds (labels at their longest make
    a longer one; the ScaledObject gets it whole)."""
    if query is None or len(query) <= QUERY_SHOWN:
        return query
    return query[: QUERY_SHOWN - 3] + "..."


# --- the bounds -----------------------------------------------------------------------------


def _interval(spec: GrayReleaseSpec) -> float:
    return parse_duration(spec.analysis.interval) if spec.analysis else 60.0


def candidate_bounds(spec: GrayReleaseSpec, status: GrayReleaseStatus, now: datetime) -> tuple[int, int]:
    """(minReplicas, maxReplicas) of the candidate's scaler for the recorded ``status``."""
    scaling = spec.autoscaling
    assert scaling is not None
    lo, hi = scaling.min_replicas, scaling.max_replicas
    share = max(status.weights.values(), default=0.0)
    if status.next_step is not None:
        share = max(share, share_at(spec, status.next_step))
    if status.phase in ("RolledBack", "Failed"):
        since = (now - status.step_started_at).total_seconds() if status.step_started_at else math.inf
        share = share_at(spec, status.step) if since < max(SCALE_DOWN_DELAY, _interval(spec)) else 0.0
    if share <= 0:
        return lo, lo
    f = min(share, 100.0) / 100.0
    cmin = max(needed(spec, status, share), min(hi, math.ceil(lo * f - 1e-9)), 1)
    cmax = max(cmin, math.ceil(hi * f - 1e-9))
    return cmin, cmax


def stable_bounds(spec: GrayReleaseSpec, status: GrayReleaseStatus, now: datetime) -> tuple[int, int]:
    """(minReplicas, maxReplicas) of stable's scaler for the recorded ``status``."""
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


# --- the signal a side scales on (KEDA) ------------------------------------------------------


def _keda(release: GrayRelease) -> Keda:
    scaling = release.spec.autoscaling
    if scaling is None or scaling.keda is None:
        raise ValueError("the release has no spec.autoscaling.keda")
    return scaling.keda


def side_labels(release: GrayRelease, side: str) -> dict[str, str]:
    """The labels selecting ``side``'s own engine series."""
    given = getattr(_keda(release), side).labels
    if given:
        return dict(given)
    backend: Backend = getattr(release.spec, side)
    return {"namespace": release.metadata.namespace or "default", "service": backend.service}


def side_query(release: GrayRelease, side: str) -> str | None:
    """The PromQL ``side`` scales on: its own query, else its engine's queue depth; None without either."""
    own = getattr(_keda(release), side).query
    if own is not None:
        return str(own)
    engine = getattr(release.spec, side).engine
    if engine is None:
        return None
    sel = selector(**side_labels(release, side))
    return " or ".join(f"sum({metric}{{{sel}}})" for metric in QUEUE_METRICS[engine])


# --- whose scalers are there -----------------------------------------------------------------


def targets(obj: dict[str, Any], deployment: str) -> bool:
    """Whether a ScaledObject or HPA (as the watch has it) scales Deployment ``deployment``."""
    ref = (obj.get("spec") or {}).get("scaleTargetRef") or {}
    kind = ref.get("kind") or "Deployment"  # a ScaledObject's default
    group = (ref.get("apiVersion") or "apps/v1").split("/")[0]
    return bool(kind == "Deployment" and group == "apps" and ref.get("name") == deployment)


def _name(obj: dict[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("name", ""))


def _owned_by(obj: dict[str, Any], kind: str, *, uid: str | None = None, name: str | None = None) -> bool:
    refs = (obj.get("metadata") or {}).get("ownerReferences") or []
    return any(
        r.get("kind") == kind
        and (uid is None or r.get("uid") == uid)
        and (name is None or r.get("name") == name)
        for r in refs
    )


def _ours(obj: dict[str, Any], name: str, uid: str | None) -> bool:
    """The child ``name`` this release created (its owner reference carries the release's uid)."""
    return _name(obj) == name and _owned_by(obj, "GrayRelease", uid=uid)


def _foreign(
    release: GrayRelease,
    side: str,
    deployment: str,
    hpas: list[dict[str, Any]],
    scaled_objects: list[dict[str, Any]],
) -> tuple[list[str], list[str]]:
    """(HPAs, ScaledObjects) scaling ``deployment`` that this release did not create.

    KEDA's HPA for this release's own ScaledObject of the side is not foreign, whichever way
    the release scales now (it goes with that ScaledObject).
    """
    uid = release.metadata.uid
    hpa, so = hpa_name(release.metadata.name, side), scaled_object_name(release.metadata.name, side)
    mine = any(_ours(o, so, uid) for o in scaled_objects) or not any(_name(o) == so for o in scaled_objects)
    foreign_hpas = [
        _name(h)
        for h in hpas
        if targets(h, deployment)
        and not _ours(h, hpa, uid)
        and not (mine and _owned_by(h, "ScaledObject", name=so))
    ]
    foreign_sos = [_name(o) for o in scaled_objects if targets(o, deployment) and not _ours(o, so, uid)]
    return foreign_hpas, foreign_sos


# --- the plan --------------------------------------------------------------------------------


@dataclass(frozen=True)
class KedaEnv:
    """What a plan with ``spec.autoscaling.keda`` needs from outside: gathered, then planned on."""

    #: The cluster serves KEDA's ScaledObjects (``scaledobjects.keda.sh``).
    served: bool
    #: The Prometheus URL from the operator's configuration that the release names.
    url: str | None = None
    #: Why the release's Prometheus is refused (:class:`~tinct.operator.grayrelease.prometheus.PrometheusNotAllowed`).
    refused: str | None = None


@dataclass
class Plan:
    """What to apply and delete for the recorded status, and what to report."""

    #: HPAs to apply (server-side); the HPA way.
    manifests: list[dict[str, Any]] = field(default_factory=list)
    #: ScaledObjects to apply (server-side); the KEDA way.
    scaled_objects: list[dict[str, Any]] = field(default_factory=list)
    #: Names of this release's own HPAs / ScaledObjects the other way replaces.
    delete_hpas: list[str] = field(default_factory=list)
    delete_scaled_objects: list[str] = field(default_factory=list)
    status: list[ScalerStatus] = field(default_factory=list)
    foreign: list[str] = field(default_factory=list)
    foreign_reason: str = "ForeignHPA"
    #: (reason, message) when nothing can be applied for a reason other than a foreign scaler.
    problem: tuple[str, str] | None = None
    #: What the HPA controller says of the release's own HPAs (or KEDA's for its
    #: ScaledObjects) that cannot read their metric: applied, but scaling on nothing.
    unreadable: list[str] = field(default_factory=list)

    def conditions(self, conds: list[Condition], generation: int | None, now: datetime) -> list[Condition]:
        if self.problem is not None or self.foreign:
            reason, message = self.problem or (self.foreign_reason, "")
            new = Condition(
                type="AutoscalingReady",
                status="False",
                reason=reason,
                message="; ".join(m for m in (message, *self.foreign) if m),
                observed_generation=generation,
            )
        elif self.unreadable:
            new = Condition(
                type="AutoscalingReady",
                status="False",
                reason="MetricUnavailable",
                message="; ".join(self.unreadable),
                observed_generation=generation,
            )
        else:
            how = " (KEDA ScaledObjects)" if self.scaled_objects else ""
            new = Condition(
                type="AutoscalingReady",
                status="True",
                reason="Applied",
                message=(", ".join(f"{s.side} {s.min_replicas}-{s.max_replicas}" for s in self.status) + how)
                or "no Deployment named",
                observed_generation=generation,
            )
        return set_condition(conds, new, now)


def plan_autoscaling(
    release: GrayRelease,
    status: GrayReleaseStatus,
    hpas: list[dict[str, Any]],
    now: datetime,
    scaled_objects: list[dict[str, Any]] | None = None,
    keda: KedaEnv | None = None,
) -> Plan:
    """The HPAs or ScaledObjects to apply for the recorded ``status``, given those in the namespace.

    ``keda`` is required when the release has ``spec.autoscaling.keda``.
    """
    plan = Plan()
    spec = release.spec
    if spec.autoscaling is None:
        return plan
    sos = scaled_objects or []
    uid, rel = release.metadata.uid, release.metadata.name
    use_keda = spec.autoscaling.keda is not None
    queries: dict[str, str | None] = {}
    if use_keda:
        if keda is None:
            raise ValueError("planning spec.autoscaling.keda needs a KedaEnv")
        queries = {side: side_query(release, side) for side in ("stable", "candidate")}
        plan.problem = _keda_problem(release, keda, queries)
    writes: list[SideScaler] = []
    for side, backend in (("stable", spec.stable), ("candidate", spec.candidate)):
        if backend.deployment is None:
            continue
        name, so = hpa_name(rel, side), scaled_object_name(rel, side)
        lo, hi = (stable_bounds if side == "stable" else candidate_bounds)(spec, status, now)
        entry = ScalerStatus(
            side=side,
            hpa=keda_hpa_name(so) if use_keda else name,
            scaled_object=so if use_keda else None,
            query=_shown(queries.get(side)),
            min_replicas=lo,
            max_replicas=hi,
        )
        foreign_hpas, foreign_sos = _foreign(release, side, backend.deployment, hpas, sos)
        if foreign_hpas or foreign_sos:
            others = [f"HPA {n}" for n in foreign_hpas] + [f"ScaledObject {n}" for n in foreign_sos]
            plan.foreign.append(
                f"Deployment {backend.deployment} is already scaled by {', '.join(others)}, which this "
                f"release did not create; remove it to let the release manage {side} replicas"
            )
            if foreign_sos:
                plan.foreign_reason = "ForeignScaledObject"
            plan.status.append(entry.model_copy(update={"managed": False}))
            continue
        if not use_keda:
            writes.append(SideScaler(side, backend.deployment, name, lo, hi))
            plan.delete_scaled_objects += [so for o in sos if _ours(o, so, uid)]
        else:
            query, url = queries[side], keda.url if keda is not None else None
            if plan.problem is not None or query is None or url is None:
                plan.status.append(entry.model_copy(update={"managed": False}))
                continue
            writes.append(SideScaler(side, backend.deployment, so, lo, hi, query=query, server_address=url))
            plan.delete_hpas += [name for h in hpas if _ours(h, name, uid)]
        plan.status.append(entry)
    plan.unreadable = _unreadable(hpas, [s.hpa for s in plan.status if s.managed and s.hpa])
    owner = owner_reference(release)
    if use_keda:
        plan.scaled_objects = [scaled_object_manifest(release, s, owner) for s in writes]
    else:
        plan.manifests = [hpa_manifest(release, s, owner) for s in writes]
    return plan


def _unreadable(hpas: list[dict[str, Any]], names: list[str]) -> list[str]:
    """For each HPA of ``names`` whose controller cannot get its metric (``ScalingActive=False``,
    reason ``FailedGet...``), what it says; an HPA not yet looked at says nothing."""
    said: dict[tuple[str, str], list[str]] = {}  # (reason, message) -> the HPAs saying it
    for h in hpas:
        if _name(h) not in names:
            continue
        for c in (h.get("status") or {}).get("conditions") or []:
            reason = str(c.get("reason") or "")
            failing = c.get("type") == "ScalingActive" and c.get("status") == "False"
            if failing and reason.startswith("FailedGet"):
                said.setdefault((reason, str(c.get("message") or "")[:300]), []).append(_name(h))
    return [
        f"HPA {who[0]} cannot read its metric ({reason}): {message}"
        if len(who) == 1
        else f"HPAs {', '.join(who)} cannot read their metric ({reason}): {message}"
        for (reason, message), who in ((k, sorted(w, key=names.index)) for k, w in said.items())
    ]


def _keda_problem(
    release: GrayRelease, keda: KedaEnv, queries: dict[str, str | None]
) -> tuple[str, str] | None:
    """Why no ScaledObject can be written for the release, if so."""
    if not keda.served:
        return (
            "KEDANotInstalled",
            "spec.autoscaling.keda needs KEDA, but this cluster does not serve its ScaledObjects "
            "(CRD scaledobjects.keda.sh); install KEDA, or remove autoscaling.keda to scale with HPAs",
        )
    if keda.refused is not None or keda.url is None:
        return ("PrometheusNotAllowed", keda.refused or "no Prometheus for autoscaling.keda")
    spec = release.spec
    if spec.stable.deployment and spec.candidate.deployment and queries["stable"] == queries["candidate"]:
        return (
            "SameSignal",
            f"stable and candidate would both scale on {queries['stable']}; give "
            "autoscaling.keda.stable.labels or .candidate.labels that select each side's own series",
        )
    return None
