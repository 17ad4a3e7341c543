"""What a round reads of the world: the watch caches, Prometheus, the lineage tables.

Rounds read no object from the API server: kopf keeps a watch cache (an index) of every
ModelVersion, Service, Deployment, HPA and KEDA ScaledObject, and :func:`view_of` takes what
one release depends on from them (:class:`View`). :func:`gather` adds what the caches cannot
say — the verdict of a closed analysis window or whether the routers serve the step's table
(from Prometheus, asynchronously and bounded: a slow Prometheus delays only its own release),
the recorded interfaces of the two ModelVersions when they differ (from the lineage tables),
an older release claiming the same model (from the routing-table watch) — and the actions
given meanwhile, read *after* the analysis, so an abort given during it wins over its step-up.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import kopf

from tinct.api.backends import BackendPolicy
from tinct.api.routing import configmap_name
from tinct.api.v1alpha1.common import GROUP, VERSION
from tinct.api.v1alpha1.grayrelease import AnalysisResult, Backend, GrayRelease, GrayReleaseStatus
from tinct.operator.bookkeeping import REFUSED
from tinct.operator.grayrelease import adapters, loading, prometheus
from tinct.operator.grayrelease import analysis as analysis_
from tinct.operator.grayrelease.decision import Capacity, Inputs
from tinct.operator.grayrelease.preconditions import Claim, Problem, Side, model_conflict, preconditions
from tinct.operator.grayrelease.runtime import Runtime
from tinct.operator.grayrelease.scaling import KedaEnv, Plan, plan_autoscaling
from tinct.operator.grayrelease.tables import (
    cells_by_tag,
    claims_of,
    desired_table,
    release_models,
    target_digest,
)
from tinct.operator.grayrelease.timing import analysis_due, needs_confirmation

__all__ = ["View", "gather", "keda_env", "view_of"]

log = logging.getLogger(__name__)


@dataclass
class View:
    """What the controller knows of the objects around one release, from kopf's indices
    (watch caches), so a round costs no reads of the API server."""

    modelversions: dict[str, dict[str, Any] | None]
    services: dict[str, bool]
    #: Service name -> its ports, for the Services found
    service_ports: dict[str, tuple[int, ...]]
    #: name -> {"replicas": spec.replicas, "available": status.availableReplicas}, None: absent
    deployments: dict[str, dict[str, int] | None]
    hpas: list[dict[str, Any]]
    #: ModelVersion name -> its recorded interface, when the two sides' interfaces differ
    interfaces: dict[str, Any] = field(default_factory=dict)
    #: KEDA ScaledObjects of the namespace (none when KEDA is not installed)
    scaled_objects: list[dict[str, Any]] = field(default_factory=list)
    #: What ``spec.autoscaling.keda`` needs to be planned (gathered by the round)
    keda: KedaEnv | None = None
    #: Service name -> the host an ExternalName Service of the release's sides points to
    external: dict[str, str] = field(default_factory=dict)

    def scaling(self, gr: GrayRelease, status: GrayReleaseStatus, now: datetime) -> Plan:
        """The scalers ``status`` calls for (see :func:`~tinct.operator.grayrelease.scaling.plan_autoscaling`)."""
        return plan_autoscaling(gr, status, self.hpas, now, self.scaled_objects, self.keda)

    def backend_problems(self, gr: GrayRelease, policy: BackendPolicy) -> list[Problem]:
        """The sides whose backend lies outside the release's namespace and the allow-list:
        a ``url`` elsewhere, or a Service of type ExternalName pointing elsewhere. No table
        naming them is written."""
        ns = gr.metadata.namespace or "default"
        out = []
        sides: tuple[tuple[Side, Backend], ...] = (
            ("stable", gr.spec.stable),
            ("candidate", gr.spec.candidate),
        )
        for side, backend in sides:
            target, what = backend.url, f"spec.{side}.url"
            external = self.external.get(backend.service)
            if target is None and external is not None:
                target, what = (
                    f"http://{external}:{backend.port}",
                    f"Service {backend.service} (ExternalName)",
                )
            why = policy.refusal(target, ns) if target is not None else None
            if why is not None:
                out.append(
                    Problem(
                        "BackendsAvailable",
                        "BackendNotAllowed",
                        f"{side} backend {what}: {why}",
                        fatal=backend.url is not None,
                        side=side,
                    )
                )
        return out

    def problems(self, gr: GrayRelease, config: Any = None) -> list[Problem]:
        out = preconditions(
            gr.spec,
            self.modelversions,
            self.services,
            {k: v is not None for k, v in self.deployments.items()},
            self.interfaces,
            self.service_ports,
        )
        if config is not None:
            out.extend(self.backend_problems(gr, config.backends))
        if gr.spec.analysis is not None and gr.spec.analysis.metrics and config is not None:
            try:
                prometheus.resolve(gr.spec.analysis.prometheus, config)
            except prometheus.PrometheusNotAllowed as exc:
                out.append(Problem("AnalysisReady", "PrometheusNotAllowed", str(exc), side="release"))
        return out

    def capacity(self, gr: GrayRelease) -> Capacity:
        def dep(name: str | None) -> dict[str, int] | None:
            return self.deployments.get(name) if name else None

        cand, stable = dep(gr.spec.candidate.deployment), dep(gr.spec.stable.deployment)
        return Capacity(
            candidate_available=cand["available"] if cand is not None else None,
            stable_replicas=stable["replicas"] if stable is not None else None,
        )


def _one(index: Any, key: Any) -> Any:
    store = index.get(key) if index is not None else None
    return next(iter(store), None) if store else None


def view_of(gr: GrayRelease, indices: Mapping[str, Any]) -> View:
    """The :class:`View` of ``gr`` from the indices kopf passes to handlers."""
    ns, spec = gr.metadata.namespace or "default", gr.spec
    sides = (spec.stable, spec.candidate)
    mvs = indices.get("tinct_modelversions")
    found = indices["tinct_services"].get(ns, ()) if "tinct_services" in indices else ()
    services: dict[str, tuple[int, ...]] = {name: ports for name, ports, _ in found}
    external = {name: host for name, _, host in found if host}
    deps = indices.get("tinct_deployments")
    hpas = list(indices["tinct_hpas"].get(ns, ())) if "tinct_hpas" in indices else []
    sos = indices.get("tinct_scaledobjects")
    return View(
        modelversions={b.model_version: _one(mvs, (ns, b.model_version)) for b in sides},
        services={b.service: b.service in services for b in sides},
        service_ports={b.service: services[b.service] for b in sides if b.service in services},
        deployments={b.deployment: _one(deps, (ns, b.deployment)) for b in sides if b.deployment},
        hpas=hpas,
        scaled_objects=list(sos.get(ns, ())) if sos is not None else [],
        external={b.service: external[b.service] for b in sides if b.service in external},
    )


async def _analyse(gr: GrayRelease, rt: Runtime, now: datetime) -> AnalysisResult:
    spec = gr.spec
    assert spec.analysis is not None
    target = prometheus.resolve(spec.analysis.prometheus, rt.config)
    st = gr.status or GrayReleaseStatus()
    cells = cells_by_tag(desired_table(gr, st, 0, rt.cluster_domain))
    return await analysis_.analyse(
        spec.analysis,
        gr.metadata.namespace or "default",
        gr.metadata.name,
        now,
        prometheus=target,
        cells=cells,
        cutoff_ms=float(spec.fallback.latency_ms),
        sides={"candidate": spec.candidate, "stable": spec.stable},
        session=rt.session,
        live=any(w > 0 for w in st.weights.values()),
        shadowed=[cell for cell, share in st.shadows.items() if share > 0],
    )


async def keda_env(gr: GrayRelease, rt: Runtime) -> KedaEnv | None:
    """What planning ``spec.autoscaling.keda`` needs: whether KEDA is there, and the Prometheus
    URL from the operator's configuration that the release names (never a URL of its own)."""
    scaling = gr.spec.autoscaling
    if scaling is None or scaling.keda is None:
        return None
    served = await rt.serves_keda()
    try:
        target = prometheus.resolve(
            scaling.keda.prometheus, rt.config, field="spec.autoscaling.keda.prometheus"
        )
    except prometheus.PrometheusNotAllowed as exc:
        return KedaEnv(served=served, refused=str(exc))
    return KedaEnv(served=served, url=target.url)


async def _routers(gr: GrayRelease, rt: Runtime) -> int | None:
    assert gr.spec.analysis is not None
    target = prometheus.resolve(gr.spec.analysis.prometheus, rt.config)
    return await prometheus.routers_serving(
        target, gr.metadata.namespace or "default", gr.metadata.name, session=rt.session
    )


def _recorded(config: Any, uid: str, name: str) -> Any:
    from tinct.lineage.interfaces import recorded_interface

    return recorded_interface(name, config.lineage_root, uid=uid, config=config.storage).interface


async def _interfaces(gr: GrayRelease, rt: Runtime, view: View) -> None:
    """Fill ``view.interfaces`` when stable's and candidate's interface digests differ.

    Each (uid, digest) is read from the lineage tables once; a failed read leaves it out
    (the precondition then waits) and is tried again next round.
    """
    sides = [gr.spec.stable.model_version, gr.spec.candidate.model_version]
    found = {n: view.modelversions.get(n) or {} for n in sides}
    digests = {n: ((o.get("status") or {}).get("interface") or {}).get("digest") for n, o in found.items()}
    if None in digests.values() or len(set(digests.values())) == 1 or rt.config is None:
        return
    for name in sides:
        uid = found[name].get("uid")
        if not uid:
            continue
        key = (str(uid), str(digests[name]))
        if key not in rt.interfaces:
            try:
                rt.interfaces[key] = await rt.run(_recorded, rt.config, str(uid), name)
            except Exception as exc:
                log.info("interface of ModelVersion %s not readable yet: %s", name, exc)
                continue
        view.interfaces[name] = rt.interfaces[key]


async def gather(
    gr: GrayRelease,
    rt: Runtime,
    view: View,
    actions: Callable[[], Sequence[str]],
    now: datetime,
    tampered: str | None = None,
) -> Inputs:
    """What the round needs to decide (see the module doc)."""
    spec = gr.spec
    old = gr.status or GrayReleaseStatus()
    await _interfaces(gr, rt, view)
    problems = view.problems(gr, rt.config)
    adapter = None
    if spec.candidate.adapter is not None:
        session = rt.engine_session()
        adapter = await adapters.sync(gr, rt.kube, rt.run, session, view.modelversions, now)
        held = loading.problem(spec, adapter)
        if held is not None and old.phase not in ("Promoted", "RolledBack", "Failed"):
            problems.append(held)
    conflict = _conflict(gr, rt, view)
    routers: int | None = None
    result: AnalysisResult | None = None
    quiet = problems or spec.paused or old.pause_reason
    if not quiet and needs_confirmation(gr):
        routers = await _routers(gr, rt)
    elif not quiet and spec.analysis is not None and spec.analysis.metrics and analysis_due(gr, now):
        result = await _analyse(gr, rt, now)
        rt.metrics.analyses.labels(gr.metadata.namespace or "default", gr.metadata.name, result.verdict).inc()
    return Inputs(
        now=now,
        problems=problems,
        analysis=result,
        actions=actions(),
        capacity=view.capacity(gr),
        target=target_digest(gr, view.modelversions),
        routers=routers,
        unknown_notifiers=rt.notify.unknown(gr) if rt.notify is not None else [n.name for n in spec.notify],
        conflict=conflict.message if conflict is not None else None,
        bookkeeping=REFUSED.get(gr.metadata.uid or ""),
        tampered=tampered,
        adapter=adapter,
    )


def _conflict(gr: GrayRelease, rt: Runtime, view: View) -> Problem | None:
    """ModelConflict when the routers give a model of this release to another table: one of
    another namespace (that routed it first, or that a cluster administrator gave it) or an
    older live one of this namespace (:mod:`tinct.api.ownership`)."""
    if rt.tables is None:
        return None
    ns = gr.metadata.namespace or "default"
    name = configmap_name(ns, gr.metadata.name)
    old = gr.status or GrayReleaseStatus()
    recorded = old.routing.models if old.routing is not None else []
    models = list(gr.spec.models) or release_models(gr, view.modelversions, recorded)
    found = list(rt.tables.tables.values())
    claims = [
        Claim(
            f.name,
            f.created,
            f.table.namespace or "",
            f.table.release,
            f.table.uid,
            tuple(f.table.models),
            f.table.standing,
            f.table.claimed,
        )
        for f in found
        if f.table is not None and f.name != name
    ]
    mine = rt.tables.get(name)
    created = mine.created if mine is not None else None
    owners = dict(rt.config.model_owners) if rt.config is not None else {}
    since = old.routing.since if old.routing is not None and old.routing.since else time.time()
    claimed = claims_of(ns, name, models, found, since)
    return model_conflict(gr.metadata.uid, ns, name, created, models, claims, owners, claimed)


# Watch caches of what a release depends on: rounds read these instead of the API server.


@kopf.index(GROUP, VERSION, "modelversions")
def tinct_modelversions(
    namespace: str | None, name: str, meta: kopf.Meta, spec: kopf.Spec, status: kopf.Status, **_: Any
) -> Any:
    return {
        (namespace, name): {
            "uid": meta.get("uid"),
            "spec": {
                "model": spec.get("model"),
                "version": spec.get("version"),
                **({"adapter": dict(spec["adapter"])} if spec.get("adapter") else {}),
            },
            "status": {
                "phase": status.get("phase"),
                "digests": dict(status.get("digests") or {}),
                "interface": {"digest": (status.get("interface") or {}).get("digest")},
                # A LoRA adapter's served name and directory, which a release loads into pods.
                **({"adapter": dict(status["adapter"])} if status.get("adapter") else {}),
            },
        }
    }


@kopf.index("v1", "services")
def tinct_services(namespace: str | None, name: str, spec: kopf.Spec, **_: Any) -> Any:
    """(name, ports, the host an ExternalName Service points to or None) by namespace."""
    ports = tuple(p["port"] for p in spec.get("ports") or [] if isinstance(p.get("port"), int))
    external = spec.get("externalName") if spec.get("type") == "ExternalName" else None
    return {namespace: (name, ports, str(external) if external else None)}


@kopf.index("apps", "v1", "deployments")
def tinct_deployments(
    namespace: str | None, name: str, spec: kopf.Spec, status: kopf.Status, **_: Any
) -> Any:
    return {
        (namespace, name): {
            "replicas": int(spec.get("replicas", 1) or 0),
            "available": int(status.get("availableReplicas") or 0),
        }
    }


@kopf.index("autoscaling", "v2", "horizontalpodautoscalers")
def tinct_hpas(
    namespace: str | None, name: str, meta: kopf.Meta, spec: kopf.Spec, status: kopf.Status, **_: Any
) -> Any:
    owners = [dict(r) for r in meta.get("ownerReferences", [])]
    # Of the status, only whether the HPA controller can read the metric: ScalingActive.
    active = [
        {k: str(c.get(k) or "")[:512] for k in ("type", "status", "reason", "message")}
        for c in (status.get("conditions") or [])
        if isinstance(c, dict) and c.get("type") == "ScalingActive"
    ][:1]
    return {
        namespace: {
            "metadata": {"name": name, "ownerReferences": owners},
            "spec": dict(spec),
            "status": {"conditions": active},
        }
    }


@kopf.index("keda.sh", "v1alpha1", "scaledobjects")
def tinct_scaledobjects(namespace: str | None, name: str, meta: kopf.Meta, spec: kopf.Spec, **_: Any) -> Any:
    """KEDA's ScaledObjects, when KEDA is installed (kopf watches them once their CRD is served)."""
    owners = [dict(r) for r in meta.get("ownerReferences", [])]
    return {namespace: {"metadata": {"name": name, "ownerReferences": owners}, "spec": dict(spec)}}
