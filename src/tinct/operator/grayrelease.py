"""kopf handlers for GrayRelease: one daemon per release drives it step by step.

Each round of the daemon (every ``TINCT_RELEASE_TICK`` seconds, when an analysis falls due,
or at once when the release's spec, its ``tinct.io/action`` annotation or one of its
ModelVersions changes):

1. check the preconditions (ModelVersions, Services, Deployments) through the API;
2. when the current step is due, analyse the candidate in Prometheus (off the event loop);
3. :func:`~tinct.operator.release_state.decide` the next status;
4. server-side-apply the routing-table ConfigMap that status calls for, then the HPAs;
5. append the transition to ``release_events`` (keyed by the transition count in status);
6. write the status, post the Event, update the operator metrics.

The status written last is the record: an operator killed anywhere in a round repeats the
round from the same status, and every write above converges instead of adding.

Runs with :mod:`tinct.operator.modelversion` (its startup handler opens the lineage writer):
``kopf run -m tinct.operator.modelversion -m tinct.operator.grayrelease`` or ``tinct operator``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, TypeVar

import kopf

from tinct.api.routing import configmap_name
from tinct.api.v1alpha1.common import GROUP, VERSION
from tinct.api.v1alpha1.grayrelease import AnalysisResult, GrayRelease, GrayReleaseStatus, RoutingRef
from tinct.lineage.records import release_event_rows
from tinct.operator import context
from tinct.operator.analysis import analyse
from tinct.operator.autoscaling import plan_autoscaling
from tinct.operator.release_kube import ReleaseKube
from tinct.operator.release_metrics import ReleaseMetrics, serve
from tinct.operator.release_state import (
    ACTION_ANNOTATION,
    Decision,
    Problem,
    analysis_due,
    decide,
    next_wakeup,
    preconditions,
)
from tinct.operator.routing import cells_by_tag, desired_table, next_table
from tinct.operator.settings import OperatorConfig

__all__ = ["PLURAL", "Runtime", "reconcile"]

PLURAL = "grayreleases"
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

    async def run(self, fn: Callable[..., _T], *args: Any, **kwargs: Any) -> _T:
        return await asyncio.get_running_loop().run_in_executor(self.pool, lambda: fn(*args, **kwargs))


_runtime: Runtime | None = None


def runtime() -> Runtime:
    """The process's runtime, created on first use from ``TINCT_*`` variables."""
    global _runtime
    if _runtime is None:
        config = OperatorConfig.from_env()
        _runtime = Runtime(tick=config.release_tick, cluster_domain=config.cluster_domain)
        if config.metrics_port:
            serve(_runtime.metrics, config.metrics_port)
    return _runtime


def parse(body: kopf.Body | dict[str, Any]) -> GrayRelease:
    return GrayRelease.model_validate(
        {"metadata": dict(body["metadata"]), "spec": dict(body["spec"]), "status": body.get("status") or None}
    )


def _check(rt: Runtime, gr: GrayRelease) -> list[Problem]:
    """Blocking: read what the preconditions are about and judge them."""
    ns, spec = gr.metadata.namespace or "default", gr.spec
    names = {spec.stable.model_version, spec.candidate.model_version}
    mvs = {n: rt.kube.modelversion(ns, n) for n in names}
    services = {b.service: rt.kube.service_exists(ns, b.service) for b in (spec.stable, spec.candidate)}
    deployments = {
        b.deployment: rt.kube.deployment_exists(ns, b.deployment)
        for b in (spec.stable, spec.candidate)
        if b.deployment
    }
    return preconditions(spec, mvs, services, deployments)


@dataclass
class Outcome:
    decision: Decision
    status: GrayReleaseStatus
    changed: bool


async def reconcile(gr: GrayRelease, rt: Runtime, now: datetime | None = None) -> Outcome:
    """One round for ``gr`` (its status being the one last recorded); see the module doc."""
    now = now or datetime.now(UTC)
    ns, name = gr.metadata.namespace or "default", gr.metadata.name
    old = gr.status or GrayReleaseStatus()
    problems = await rt.run(_check, rt, gr)
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

    cm = await rt.run(rt.kube.configmap, ns, configmap_name(name))
    manifest, version = next_table(gr, st, cm, rt.cluster_domain)
    if manifest is not None:
        await rt.run(rt.kube.apply_configmap, manifest)
    st.routing = RoutingRef(config_map=configmap_name(name), version=version)

    if spec.autoscaling is not None:
        hpas = await rt.run(rt.kube.hpas, ns)
        plan = plan_autoscaling(gr, st, hpas, now)
        for m in plan.manifests:
            await rt.run(rt.kube.apply_hpa, m)
        st.autoscaling = plan.status
        st.conditions = plan.conditions(st.conditions, gr.metadata.generation, now)

    t = decision.transition
    if t is not None and t.record:
        ctx = context.current()
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
            operator_version=ctx.store.operator_version,
        )
        await ctx.writer.record(rows, "release_events")
        st.transitions = seq + 1

    changed = st.wire() != old.wire()
    if changed:
        await rt.run(rt.kube.patch_status, ns, name, st.model_dump(by_alias=True, mode="json"))
    return Outcome(decision, st, changed)


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
async def drive_release(body: kopf.Body, stopped: kopf.DaemonStopped, logger: _Logger, **_: Any) -> None:
    rt = runtime()
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
            if cached is not None and gr.status is not None and cached.transitions >= gr.status.transitions:
                gr = gr.model_copy(update={"status": cached})
            wake.clear()
            delay = rt.tick
            try:
                out = await reconcile(gr, rt)
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
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(wake.wait(), timeout=delay)
    finally:
        rt.wakers.pop(key, None)


@kopf.on.event(GROUP, VERSION, PLURAL)
def _release_changed(body: kopf.Body, type: str | None, **_: Any) -> None:
    """Spec or annotation changes reach the daemon now, not at its next tick."""
    rt = runtime()
    key = (body["metadata"].get("namespace") or "default", body["metadata"]["name"])
    if type == "DELETED":
        rt.written.pop(key, None)
        rt.metrics.forget(*key)
        return
    status = body.get("status") or {}
    annotation = (body["metadata"].get("annotations") or {}).get(ACTION_ANNOTATION)
    stale = status.get("observedGeneration") != body["metadata"].get("generation")
    if stale or (annotation and annotation != status.get("acknowledgedAction")):
        _wake(rt, key)


@kopf.on.event(GROUP, VERSION, "modelversions")
def _modelversion_changed(body: kopf.Body, **_: Any) -> None:
    """A release waiting for (or running on) a ModelVersion looks again when it changes."""
    rt = runtime()
    ns, name = body["metadata"].get("namespace") or "default", body["metadata"]["name"]
    for (rns, _release), (event, refs) in list(rt.wakers.items()):
        if rns == ns and name in refs:
            event.set()
