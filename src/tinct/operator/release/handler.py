"""kopf handlers for GrayRelease: one daemon per release drives it step by step.

Each round of the daemon (every ``TINCT_RELEASE_TICK`` seconds, when an analysis falls due,
or at once when the release's spec, its ``tinct.io/action`` annotation or one of its
ModelVersions changes):

1. check the preconditions (ModelVersions, Services, Deployments) through the API;
2. when the current step is due, analyse the candidate in Prometheus (off the event loop);
3. :func:`~tinct.operator.release.decide.decide` the next status;
4. server-side-apply the routing-table ConfigMap that status calls for, then the HPAs;
5. append the transition to ``release_events`` (keyed by the transition count in status);
6. write the status, post the Event, update the operator metrics.

The status written last is the record: an operator killed anywhere in a round repeats the
round from the same status, and every write above converges instead of adding.

Runs with :mod:`tinct.operator.modelversion` (its startup handler opens the lineage writer):
``kopf run -m tinct.operator.modelversion -m tinct.operator.release.handler`` or ``tinct operator``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, TypeVar

import kopf

from tinct.api.routing import TABLE_LABEL, configmap_name
from tinct.api.v1alpha1.common import GROUP, VERSION
from tinct.api.v1alpha1.grayrelease import AnalysisResult, GrayRelease, GrayReleaseStatus, RoutingRef
from tinct.lineage.records import release_event_rows
from tinct.operator import context
from tinct.operator.release.analysis import analyse
from tinct.operator.release.decide import (
    ACTION_ANNOTATION,
    Decision,
    Problem,
    analysis_due,
    decide,
    next_wakeup,
    preconditions,
)
from tinct.operator.release.kube import ReleaseKube
from tinct.operator.release.metrics import ReleaseMetrics, serve
from tinct.operator.release.scaling import hpa_name, plan_autoscaling
from tinct.operator.release.tables import (
    cells_by_tag,
    desired_table,
    next_table,
    release_models,
    table_version,
)

__all__ = ["PLURAL", "Runtime", "reconcile"]

PLURAL = "grayreleases"
#: Seconds a child we applied is taken as present before the watch cache shows it.
APPLY_GRACE = 10.0
_T = TypeVar("_T")
_Logger = logging.Logger | logging.LoggerAdapter[Any]
log = logging.getLogger(__name__)


@dataclass
class Runtime:
    """What every release daemon of the process shares."""

    kube: ReleaseKube = field(default_factory=ReleaseKube)
    pool: ThreadPoolExecutor = field(
        default_factory=lambda: ThreadPoolExecutor(16, thread_name_prefix="tinct-release")
    )
    metrics: ReleaseMetrics = field(default_factory=ReleaseMetrics)
    tick: float = 5.0
    cluster_domain: str = "cluster.local"
    #: (namespace, release) -> (wake-up event, names of its ModelVersions)
    wakers: dict[tuple[str, str], tuple[asyncio.Event, frozenset[str]]] = field(default_factory=dict)
    #: (namespace, release) -> the status last written, newer than the watch may have delivered
    written: dict[tuple[str, str], GrayReleaseStatus] = field(default_factory=dict)
    #: (namespace, child name) -> (when, the manifest last applied): covers the index's lag
    applied: dict[tuple[str, str], tuple[float, dict[str, Any]]] = field(default_factory=dict)

    def recent(self, key: tuple[str, str]) -> dict[str, Any] | None:
        """The manifest applied for ``key`` within the last :data:`APPLY_GRACE` seconds.

        Past that the index has seen our write, and it alone tells whether the child is
        still there (someone may have deleted it: then it is applied again).
        """
        got = self.applied.get(key)
        return got[1] if got is not None and time.monotonic() - got[0] < APPLY_GRACE else None

    def remember(self, key: tuple[str, str], manifest: dict[str, Any]) -> None:
        self.applied[key] = (time.monotonic(), manifest)

    async def run(self, fn: Callable[..., _T], *args: Any, **kwargs: Any) -> _T:
        return await asyncio.get_running_loop().run_in_executor(self.pool, lambda: fn(*args, **kwargs))


_RUNTIME = "tinct_release_runtime"


@kopf.on.startup()
async def _start_runtime(memo: Any, **_: Any) -> None:
    """Put the release daemons' shared :class:`Runtime` into the root memo; serve metrics."""
    config = context.config_of(memo)
    rt = Runtime(tick=config.release_tick, cluster_domain=config.cluster_domain)
    memo[_RUNTIME] = rt
    if config.metrics_port:
        serve(rt.metrics, config.metrics_port)


@kopf.on.cleanup()
async def _stop_runtime(memo: Any, **_: Any) -> None:
    rt = memo.pop(_RUNTIME, None)
    if isinstance(rt, Runtime):
        rt.pool.shutdown(wait=False, cancel_futures=True)


def runtime(memo: Any) -> Runtime:
    """The process's release runtime, from the ``memo`` any handler receives."""
    rt = memo.get(_RUNTIME)
    if not isinstance(rt, Runtime):
        raise RuntimeError("the release runtime is not started (the startup activity has not run)")
    return rt


def parse(body: kopf.Body | dict[str, Any]) -> GrayRelease:
    return GrayRelease.model_validate(
        {"metadata": dict(body["metadata"]), "spec": dict(body["spec"]), "status": body.get("status") or None}
    )


@dataclass
class View:
    """What the controller knows of the objects around one release, from kopf's indices
    (watch caches), so a round costs no reads of the API server."""

    modelversions: dict[str, dict[str, Any] | None]
    services: dict[str, bool]
    deployments: dict[str, bool]
    hpas: list[dict[str, Any]]
    configmap: dict[str, Any] | None

    def problems(self, gr: GrayRelease) -> list[Problem]:
        return preconditions(gr.spec, self.modelversions, self.services, self.deployments)


def _one(index: Any, key: Any) -> Any:
    store = index.get(key) if index is not None else None
    return next(iter(store), None) if store else None


def view_of(gr: GrayRelease, indices: dict[str, Any]) -> View:
    """The :class:`View` of ``gr`` from the indices kopf passes to handlers."""
    ns, spec = gr.metadata.namespace or "default", gr.spec
    sides = (spec.stable, spec.candidate)
    mvs = indices.get("tinct_modelversions")
    services = set(indices["tinct_services"].get(ns, ())) if "tinct_services" in indices else set()
    deployments = set(indices["tinct_deployments"].get(ns, ())) if "tinct_deployments" in indices else set()
    hpas = list(indices["tinct_hpas"].get(ns, ())) if "tinct_hpas" in indices else []
    return View(
        modelversions={b.model_version: _one(mvs, (ns, b.model_version)) for b in sides},
        services={b.service: b.service in services for b in sides},
        deployments={b.deployment: b.deployment in deployments for b in sides if b.deployment},
        hpas=hpas,
        configmap=_one(indices.get("tinct_tables"), (ns, configmap_name(ns, gr.metadata.name))),
    )


@dataclass
class Outcome:
    decision: Decision
    status: GrayReleaseStatus
    changed: bool


async def reconcile(
    gr: GrayRelease, rt: Runtime, view: View, lineage: context.Context, now: datetime | None = None
) -> Outcome:
    """One round for ``gr`` (its status being the one last recorded); see the module doc."""
    now = now or datetime.now(UTC)
    ns, name = gr.metadata.namespace or "default", gr.metadata.name
    old = gr.status or GrayReleaseStatus()
    problems = view.problems(gr)
    action = gr.metadata.annotations.get(ACTION_ANNOTATION)
    analysis: AnalysisResult | None = None
    spec = gr.spec
    pending_action = bool(action) and action != old.acknowledged_action
    if (
        spec.analysis is not None
        and spec.analysis.metrics
        and not problems
        and not spec.paused
        and not old.pause_reason
        and not pending_action
        and analysis_due(gr, now)
    ):
        cells = cells_by_tag(desired_table(gr, old, 0, rt.cluster_domain)) if spec.analysis.per_cell else None
        analysis = await rt.run(
            analyse, spec.analysis, name, now, cells=cells, cutoff_ms=float(spec.fallback.latency_ms)
        )
        rt.metrics.analyses.labels(ns, name, analysis.verdict).inc()
    decision = decide(gr, problems=problems, analysis=analysis, action=action, now=now)
    st = decision.status

    # The index lags our own writes by a watch event; the table last applied covers the gap.
    cm = _newest(view.configmap, rt.recent((ns, configmap_name(ns, name))))
    models = release_models(gr, view.modelversions)
    manifest, version = next_table(gr, st, cm, rt.cluster_domain, models)
    if manifest is not None:
        await rt.run(rt.kube.apply_configmap, manifest)
        rt.remember((ns, configmap_name(ns, name)), manifest)
    st.routing = RoutingRef(config_map=configmap_name(ns, name), version=version)

    if spec.autoscaling is not None:
        plan = plan_autoscaling(gr, st, view.hpas, now)
        for m in plan.manifests:
            key = (ns, m["metadata"]["name"])
            if not _hpa_current(m, view.hpas, rt.recent(key)):
                await rt.run(rt.kube.apply_hpa, m)
                rt.remember(key, m)
        st.autoscaling = plan.status
        st.conditions = plan.conditions(st.conditions, gr.metadata.generation, now)

    t = decision.transition
    if t is not None and t.record:
        seq = st.transitions
        metrics = {}
        if st.last_analysis is not None:
            metrics = {m.name: m.value for m in st.last_analysis.metrics if m.value is not None}
        rows = release_event_rows(
            release=name,
            namespace=ns,
            uid=gr.metadata.uid or "",
            generation=int(gr.metadata.generation or 0),
            step=st.step,
            state=st.phase,
            from_model_version=spec.stable.model_version,
            to_model_version=spec.candidate.model_version,
            weights=st.weights,
            metrics=metrics,
            reason=f"{t.reason}: {t.message}"[:2000],
            event_id=f"{gr.metadata.uid}/{seq}/{st.phase}/{st.step}",
            operator_version=lineage.store.operator_version,
        )
        await lineage.writer.record(rows, "release_events")
        st.transitions = seq + 1

    changed = st.wire() != old.wire()
    if changed:
        await rt.run(rt.kube.patch_status, ns, name, st.model_dump(by_alias=True, mode="json"))
    return Outcome(decision, st, changed)


def _newest(*configmaps: dict[str, Any] | None) -> dict[str, Any] | None:
    found = [c for c in configmaps if c]
    return max(found, key=lambda c: table_version(c)[0], default=None)


def _hpa_current(
    manifest: dict[str, Any], hpas: list[dict[str, Any]], applied: dict[str, Any] | None
) -> bool:
    """Whether the cluster (or our last apply) already has ``manifest``'s spec."""
    name, want = manifest["metadata"]["name"], manifest["spec"]
    if applied is not None and applied["spec"] == want:
        return True
    return any(h["metadata"]["name"] == name and h.get("spec") == want for h in hpas)


def _post(body: kopf.Body, decision: Decision) -> None:
    t = decision.transition
    if t is None:
        return
    if t.warning:
        kopf.warn(body, reason=t.reason, message=t.message[:1024])
    else:
        kopf.info(body, reason=t.reason, message=t.message[:1024])


def _wake(rt: Runtime, key: tuple[str, str]) -> None:
    entry = rt.wakers.get(key)
    if entry is not None:
        entry[0].set()


@kopf.daemon(GROUP, VERSION, PLURAL, cancellation_timeout=10.0)
async def drive_release(
    body: kopf.Body, stopped: kopf.DaemonStopped, logger: _Logger, memo: Any, **kwargs: Any
) -> None:
    rt = runtime(memo)
    lineage = context.of(memo)
    key = (body["metadata"].get("namespace") or "default", body["metadata"]["name"])
    wake = asyncio.Event()
    failures = 0
    try:
        while not stopped:
            gr = parse(body)
            rt.wakers[key] = (
                wake,
                frozenset({gr.spec.stable.model_version, gr.spec.candidate.model_version}),
            )
            cached = rt.written.get(key)
            if cached is not None and (gr.status is None or cached.transitions >= gr.status.transitions):
                gr = gr.model_copy(update={"status": cached})
            wake.clear()
            delay = rt.tick
            try:
                out = await reconcile(gr, rt, view_of(gr, kwargs), lineage)
                failures = 0
                rt.written[key] = out.status
                _post(body, out.decision)
                if out.decision.transition is not None:
                    rt.metrics.transitions.labels(*key, out.decision.transition.reason).inc()
                    logger.info("%s: %s", out.decision.transition.reason, out.decision.transition.message)
                rt.metrics.observe(*key, out.status)
                delay = next_wakeup(gr.model_copy(update={"status": out.status}), datetime.now(UTC), rt.tick)
            except Exception as exc:
                failures += 1
                delay = min(60.0, rt.tick * 2 ** min(failures, 4))
                logger.warning("round failed, retrying in %.0fs: %s", delay, exc)
            await _sleep(wake, stopped, delay)
    finally:
        rt.wakers.pop(key, None)


async def _sleep(wake: asyncio.Event, stopped: kopf.DaemonStopped, delay: float) -> None:
    """Until ``delay`` passes, the release needs a look, or the daemon is told to stop."""
    waiters = {asyncio.ensure_future(wake.wait()), asyncio.ensure_future(stopped.wait())}
    try:
        await asyncio.wait(waiters, timeout=delay, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for w in waiters:
            w.cancel()


@kopf.on.event(GROUP, VERSION, PLURAL)
def _release_changed(body: kopf.Body, type: str | None, memo: Any, **_: Any) -> None:
    """Spec or annotation changes reach the daemon now, not at its next tick."""
    rt = runtime(memo)
    key = (body["metadata"].get("namespace") or "default", body["metadata"]["name"])
    if type == "DELETED":
        rt.written.pop(key, None)
        rt.metrics.forget(*key)
        ns, name = key
        for child in (configmap_name(ns, name), hpa_name(name, "stable"), hpa_name(name, "candidate")):
            rt.applied.pop((ns, child), None)
        return
    status = body.get("status") or {}
    annotation = (body["metadata"].get("annotations") or {}).get(ACTION_ANNOTATION)
    stale = status.get("observedGeneration") != body["metadata"].get("generation")
    if stale or (annotation and annotation != status.get("acknowledgedAction")):
        _wake(rt, key)


@kopf.on.event(GROUP, VERSION, "modelversions")
def _modelversion_changed(body: kopf.Body, memo: Any, **_: Any) -> None:
    """A release waiting for (or running on) a ModelVersion looks again when it changes."""
    rt = runtime(memo)
    ns, name = body["metadata"].get("namespace") or "default", body["metadata"]["name"]
    for (rns, _release), (event, refs) in list(rt.wakers.items()):
        if rns == ns and name in refs:
            event.set()


# Watch caches of what a release depends on: rounds read these instead of the API server.


@kopf.index(GROUP, VERSION, "modelversions")
def tinct_modelversions(
    namespace: str | None, name: str, spec: kopf.Spec, status: kopf.Status, **_: Any
) -> Any:
    return {
        (namespace, name): {
            "spec": {"model": spec.get("model"), "version": spec.get("version")},
            "status": {"phase": status.get("phase")},
        }
    }


@kopf.index("v1", "services")
def tinct_services(namespace: str | None, name: str, **_: Any) -> Any:
    return {namespace: name}


@kopf.index("apps", "v1", "deployments")
def tinct_deployments(namespace: str | None, name: str, **_: Any) -> Any:
    return {namespace: name}


@kopf.index("autoscaling", "v2", "horizontalpodautoscalers")
def tinct_hpas(namespace: str | None, name: str, meta: kopf.Meta, spec: kopf.Spec, **_: Any) -> Any:
    owners = [dict(r) for r in meta.get("ownerReferences", [])]
    return {namespace: {"metadata": {"name": name, "ownerReferences": owners}, "spec": dict(spec)}}


@kopf.index("v1", "configmaps", labels={TABLE_LABEL: "true"})
def tinct_tables(namespace: str | None, name: str, meta: kopf.Meta, body: kopf.Body, **_: Any) -> Any:
    return {
        (namespace, name): {
            "metadata": {"annotations": dict(meta.get("annotations", {}))},
            "data": dict(body.get("data") or {}),
        }
    }
