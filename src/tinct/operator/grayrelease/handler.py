"""kopf handlers for GrayRelease: one daemon per release drives it, round by round.

A round (every ``TINCT_RELEASE_TICK`` seconds, when an analysis window closes, or at once
when the release, an action on it, one of its ModelVersions or Deployments changes):

1. **gather**: preconditions and capacity from kopf's watch caches; whether the routers
   serve the step's table, or the analysis of a closed window, from Prometheus (async,
   bounded: a slow Prometheus delays only its own release); the actions given meanwhile,
   read *after* the analysis, so an abort given during it wins over its step-up;
2. **decide** (:func:`~tinct.operator.grayrelease.decide.decide`, pure) the next status, and plan
   what it calls for — the routing-table version and digest, the scalers' bounds — into it;
3. **record** the status, conditioned on the resourceVersion it was decided from: a status
   that changed meanwhile is never overwritten (the round starts again from it), and a
   write that fails otherwise is retried with the *same* decision;
4. **act** on the recorded status only: apply the routing table to the table namespace,
   then the HPAs or KEDA ScaledObjects, then retire standing routes this release's table
   now covers;
5. **history**: the transitions recorded in ``status.history`` are appended to
   ``release_events`` (with a timeout; a lineage outage delays the history, never the
   traffic) and then dropped from status; Events are posted.

An operator killed anywhere repeats the round from the recorded status, and every write
converges instead of adding. Deleting a release leaves its model's **standing route**
(:func:`~tinct.operator.grayrelease.tables.standing_table`) unless ``spec.routeOnDelete: Remove``.

Runs with :mod:`tinct.operator.modelversion` (its startup handler opens the lineage writer):
``kopf run -m tinct.operator.modelversion -m tinct.operator.grayrelease.handler`` or ``tinct operator``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, TypeVar

import kopf

from tinct.api.routing import RoutingTable, configmap_name
from tinct.api.v1alpha1.action import ACTION_ANNOTATION
from tinct.api.v1alpha1.common import GROUP, VERSION
from tinct.api.v1alpha1.grayrelease import AnalysisResult, GrayRelease, GrayReleaseStatus, HistoryEntry
from tinct.lineage.records import release_event_rows
from tinct.operator import context
from tinct.operator.grayrelease import analysis as analysis_
from tinct.operator.grayrelease import prometheus
from tinct.operator.grayrelease.decide import decide
from tinct.operator.grayrelease.decision import Capacity, Decision, Inputs
from tinct.operator.grayrelease.kube import ConflictError, ReleaseKube, TableWatch
from tinct.operator.grayrelease.metrics import ReleaseMetrics, serve
from tinct.operator.grayrelease.notify import Dispatcher
from tinct.operator.grayrelease.preconditions import Claim, Problem, model_conflict, preconditions
from tinct.operator.grayrelease.scaling import KedaEnv, Plan, hpa_name, plan_autoscaling, scaled_object_name
from tinct.operator.grayrelease.tables import (
    cells_by_tag,
    content_digest,
    desired_table,
    plan,
    release_models,
    standing_table,
    table_manifest,
    target_digest,
)
from tinct.operator.grayrelease.timing import analysis_due, needs_confirmation, next_wakeup

__all__ = ["PLURAL", "Runtime", "View", "reconcile"]

PLURAL = "grayreleases"
#: Seconds a child we applied is taken as present before the watch cache shows it.
APPLY_GRACE = 10.0
#: Seconds a round waits for the lineage writer before leaving the history for later.
HISTORY_TIMEOUT = 10.0
#: Seconds an answer to "does the cluster serve KEDA's ScaledObjects?" is reused.
KEDA_CHECK_SECONDS = 30.0
_T = TypeVar("_T")
_Logger = logging.Logger | logging.LoggerAdapter[Any]
log = logging.getLogger(__name__)

Key = tuple[str, str]


@dataclass
class Written:
    """A status this process wrote, and the resourceVersions before and after."""

    uid: str | None
    base: str | None
    after: str | None
    status: GrayReleaseStatus


@dataclass
class Pending:
    """A decision whose status write failed: the next round writes it again, unchanged."""

    uid: str | None
    base: str | None
    decision: Decision
    table: RoutingTable


@dataclass
class Runtime:
    """What every release daemon of the process shares."""

    kube: ReleaseKube = field(default_factory=ReleaseKube)
    #: Kubernetes calls only; Prometheus is asked asynchronously, outside any pool.
    pool: ThreadPoolExecutor = field(
        default_factory=lambda: ThreadPoolExecutor(8, thread_name_prefix="tinct-release")
    )
    metrics: ReleaseMetrics = field(default_factory=ReleaseMetrics)
    tick: float = 5.0
    cluster_domain: str = "cluster.local"
    table_namespace: str = "default"
    config: Any = None
    tables: TableWatch | None = None
    #: (namespace, release) -> (wake-up event, names of its ModelVersions and Deployments)
    wakers: dict[Key, tuple[asyncio.Event, frozenset[str]]] = field(default_factory=dict)
    #: (namespace, release) -> the status last written, newer than the watch may have delivered
    written: dict[Key, Written] = field(default_factory=dict)
    pending: dict[Key, Pending] = field(default_factory=dict)
    #: (namespace, release) -> tinct.io/action values seen by the watch, oldest first
    actions: dict[Key, list[str]] = field(default_factory=dict)
    #: Releases being deleted: their daemon no longer acts.
    deleting: set[Key] = field(default_factory=set)
    #: (namespace, child name) -> (when, the manifest last applied): covers the index's lag
    applied: dict[Key, tuple[float, dict[str, Any]]] = field(default_factory=dict)
    session: Any = None
    #: Posts recorded transitions to the webhooks releases name (spec.notify).
    notify: Dispatcher | None = None
    #: (uid, interface digest) -> the interface recorded in the lineage tables (never changes)
    interfaces: dict[tuple[str, str], Any] = field(default_factory=dict)
    #: (when asked, answer) of whether the cluster serves KEDA's ScaledObjects
    keda_served: tuple[float, bool] | None = None

    def recent(self, key: Key) -> dict[str, Any] | None:
        """The manifest applied for ``key`` within the last :data:`APPLY_GRACE` seconds."""
        got = self.applied.get(key)
        return got[1] if got is not None and time.monotonic() - got[0] < APPLY_GRACE else None

    def remember(self, key: Key, manifest: dict[str, Any]) -> None:
        self.applied[key] = (time.monotonic(), manifest)

    async def run(self, fn: Callable[..., _T], *args: Any, **kwargs: Any) -> _T:
        return await asyncio.get_running_loop().run_in_executor(self.pool, lambda: fn(*args, **kwargs))

    async def serves_keda(self) -> bool:
        """Whether the cluster serves KEDA's ScaledObjects (discovery, asked at most every
        :data:`KEDA_CHECK_SECONDS`)."""
        got = self.keda_served
        if got is None or time.monotonic() - got[0] > KEDA_CHECK_SECONDS:
            got = (time.monotonic(), await self.run(self.kube.served, "keda.sh/v1alpha1", "scaledobjects"))
            self.keda_served = got
        return got[1]

    def found(self, name: str) -> tuple[int, str | None]:
        """(version, content digest) of the table ConfigMap ``name`` as the watch has it."""
        got = self.tables.get(name) if self.tables is not None else None
        return (got.version, got.digest) if got is not None else (0, None)


_RUNTIME = "tinct_release_runtime"


@kopf.on.startup()
async def _start_runtime(memo: Any, **_: Any) -> None:
    """Put the release daemons' shared :class:`Runtime` into the root memo; serve metrics."""
    config = context.config_of(memo)
    rt = Runtime(
        tick=config.release_tick,
        cluster_domain=config.cluster_domain,
        table_namespace=config.table_namespace,
        config=config,
    )
    rt.tables = TableWatch(config.table_namespace, rt.kube._api)
    rt.tables.start()
    rt.session = prometheus.client_session()
    rt.notify = Dispatcher(
        config.notifiers,
        rt.metrics,
        timeout=config.notify_timeout,
        attempts=config.notify_attempts,
        backoff=config.notify_backoff,
    )
    memo[_RUNTIME] = rt
    if config.metrics_port:
        serve(rt.metrics, config.metrics_port)


@kopf.on.cleanup()
async def _stop_runtime(memo: Any, **_: Any) -> None:
    rt = memo.pop(_RUNTIME, None)
    if isinstance(rt, Runtime):
        if rt.tables is not None:
            rt.tables.stop()
        if rt.session is not None:
            await rt.session.close()
        if rt.notify is not None:
            await rt.notify.drain(2.0)  # what is queued gets a moment; the rest is said in the log
            await rt.notify.close()
        rt.pool.shutdown(wait=False, cancel_futures=True)


def runtime(memo: Any) -> Runtime:
    """The process's release runtime, from the ``memo`` any handler receives."""
    rt = memo.get(_RUNTIME)
    if not isinstance(rt, Runtime):
        raise RuntimeError("the release runtime is not started (the startup activity has not run)")
    return rt


def parse(body: kopf.Body | Mapping[str, Any]) -> GrayRelease:
    return GrayRelease.model_validate(
        {"metadata": dict(body["metadata"]), "spec": dict(body["spec"]), "status": body.get("status") or None}
    )


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

    def scaling(self, gr: GrayRelease, status: GrayReleaseStatus, now: datetime) -> Plan:
        """The scalers ``status`` calls for (see :func:`~tinct.operator.grayrelease.scaling.plan_autoscaling`)."""
        return plan_autoscaling(gr, status, self.hpas, now, self.scaled_objects, self.keda)

    def problems(self, gr: GrayRelease, config: Any = None) -> list[Problem]:
        out = preconditions(
            gr.spec,
            self.modelversions,
            self.services,
            {k: v is not None for k, v in self.deployments.items()},
            self.interfaces,
            self.service_ports,
        )
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
    services: dict[str, tuple[int, ...]] = (
        dict(indices["tinct_services"].get(ns, ())) if "tinct_services" in indices else {}
    )
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
    )


@dataclass
class Outcome:
    decision: Decision
    status: GrayReleaseStatus
    #: The release's resourceVersion after the round's writes (None: nothing was written).
    resource_version: str | None
    #: The transitions this round recorded in status (to notify of).
    recorded: list[HistoryEntry] = field(default_factory=list)


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
    )


async def _keda_env(gr: GrayRelease, rt: Runtime) -> KedaEnv | None:
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
    gr: GrayRelease, rt: Runtime, view: View, actions: Callable[[], Sequence[str]], now: datetime
) -> Inputs:
    """What the round needs to decide: step 1 of the module doc."""
    spec = gr.spec
    old = gr.status or GrayReleaseStatus()
    await _interfaces(gr, rt, view)
    problems = view.problems(gr, rt.config)
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
    )


def _conflict(gr: GrayRelease, rt: Runtime, view: View) -> Problem | None:
    """ModelConflict when an older live table of another release claims this release's models."""
    if rt.tables is None:
        return None
    name = configmap_name(gr.metadata.namespace or "default", gr.metadata.name)
    old = gr.status or GrayReleaseStatus()
    recorded = old.routing.models if old.routing is not None else []
    models = list(gr.spec.models) or release_models(gr, view.modelversions, recorded)
    claims = [
        Claim(f.name, f.created, f.table.namespace or "", f.table.release, f.table.uid, tuple(f.table.models))
        for f in list(rt.tables.tables.values())
        if f.table is not None and not f.table.standing and f.name != name
    ]
    mine = rt.tables.get(name)
    return model_conflict(gr.metadata.uid, name, mine.created if mine is not None else None, models, claims)


def _planned(gr: GrayRelease, rt: Runtime, view: View, decision: Decision, now: datetime) -> RoutingTable:
    """Plan the table and the scalers the decided status calls for into it (pure, recorded with it)."""
    st = decision.status
    old = gr.status or GrayReleaseStatus()
    name = configmap_name(gr.metadata.namespace or "default", gr.metadata.name)
    found_version, _ = rt.found(name)
    recorded_models = old.routing.models if old.routing is not None else []
    table = plan(
        gr,
        st,
        table_namespace=rt.table_namespace,
        found_version=found_version,
        cluster_domain=rt.cluster_domain,
        models=release_models(gr, view.modelversions, recorded_models),
    )
    if gr.spec.autoscaling is not None:
        scaling = view.scaling(gr, st, now)
        st.autoscaling = scaling.status
        st.conditions = scaling.conditions(st.conditions, gr.metadata.generation, now)
    return table


async def reconcile(
    gr: GrayRelease,
    rt: Runtime,
    view: View,
    lineage: context.Context,
    *,
    base: str | None,
    actions: Callable[[], Sequence[str]] = tuple,
    pending: Pending | None = None,
    now: datetime | None = None,
) -> Outcome:
    """One round for ``gr`` (its status being the one last recorded, at resourceVersion
    ``base``); see the module doc. ``pending``: a decision whose write failed, written again."""
    now = now or datetime.now(UTC)
    ns, name = gr.metadata.namespace or "default", gr.metadata.name
    old = gr.status or GrayReleaseStatus()
    view.keda = await _keda_env(gr, rt)
    if pending is not None:
        decision, table = pending.decision, pending.table
    else:
        inputs = await gather(gr, rt, view, actions, now)
        decision = decide(gr, inputs)
        table = _planned(gr, rt, view, decision, now)
    st = decision.status

    # Record.
    rv = base
    if st.wire() != old.wire():
        try:
            rv = await rt.run(rt.kube.patch_status, ns, name, st.model_dump(by_alias=True, mode="json"), base)
        except ConflictError:
            raise
        except Exception:
            rt.pending[(ns, name)] = Pending(gr.metadata.uid, base, decision, table)
            raise
    recorded = [h for h in st.history if h.seq >= old.transitions]
    if (ns, name) in rt.deleting:
        return Outcome(decision, st, rv, recorded)

    # Act on what was recorded.
    await _apply_table(rt, table)
    if gr.spec.autoscaling is not None:
        await _apply_scaling(rt, ns, view, view.scaling(gr, st, now))
    await _retire_standing(rt, gr, table)

    # History, then Events.
    if st.history:
        remaining = await _record_history(gr, st, lineage)
        if len(remaining) != len(st.history):
            st.history = remaining
            try:
                patch = {"history": [h.model_dump(by_alias=True, mode="json") for h in remaining]}
                rv = await rt.run(rt.kube.patch_status, ns, name, patch, rv)
            except Exception as exc:  # written again by the next round; rows are idempotent
                log.info("[%s/%s] could not drop written history from status: %s", ns, name, exc)
    return Outcome(decision, st, rv, recorded)


def _so_key(ns: str, name: str) -> Key:
    """The :attr:`Runtime.applied` key of a ScaledObject (an HPA of the same name keys ``(ns, name)``)."""
    return (ns, f"ScaledObject/{name}")


async def _apply_scaling(rt: Runtime, ns: str, view: View, scaling: Plan) -> None:
    """Apply the planned scalers: first remove the release's own of the way it no longer scales
    (two HPAs on one Deployment would fight), then apply what differs from the watch cache."""
    for name in scaling.delete_hpas:
        await rt.run(rt.kube.delete_hpa, ns, name)
        rt.applied.pop((ns, name), None)
    for name in scaling.delete_scaled_objects:
        await rt.run(rt.kube.delete_scaled_object, ns, name)
        rt.applied.pop(_so_key(ns, name), None)
    for m in scaling.manifests:
        key = (ns, m["metadata"]["name"])
        if not _hpa_current(m, view.hpas, rt.recent(key)):
            await rt.run(rt.kube.apply_hpa, m)
            rt.remember(key, m)
    for m in scaling.scaled_objects:
        key = _so_key(ns, m["metadata"]["name"])
        if not _so_current(m, view.scaled_objects, rt.recent(key)):
            try:
                await rt.run(rt.kube.apply_scaled_object, m)
            except Exception:
                rt.keda_served = None  # KEDA may have gone: ask discovery again next round
                raise
            rt.remember(key, m)


async def _apply_table(rt: Runtime, table: RoutingTable) -> None:
    name = configmap_name(table.namespace or "default", table.release)
    found_version, found_digest = rt.found(name)
    if found_version >= table.version and found_digest == content_digest(table):
        return
    if found_version > table.version:
        return  # the next round plans a version above it
    await rt.run(rt.kube.apply_configmap, table_manifest(table, rt.table_namespace))
    if rt.tables is not None:
        rt.tables.put(name, table)


async def _retire_standing(rt: Runtime, gr: GrayRelease, table: RoutingTable) -> None:
    """Delete standing routes of deleted releases whose models this live table now serves."""
    if rt.tables is None or not table.models:
        return
    mine = set(table.models)
    for name, found in list(rt.tables.tables.items()):
        t = found.table
        if t is None or not t.standing or t.uid == gr.metadata.uid or not t.models:
            continue
        if set(t.models) <= mine:
            log.info(
                "standing route %s (models %s) is taken over by %s", name, ",".join(t.models), table.release
            )
            await rt.run(rt.kube.delete_configmap, rt.table_namespace, name)
            rt.tables.forget(name)


async def _record_history(gr: GrayRelease, st: GrayReleaseStatus, lineage: context.Context) -> list[Any]:
    """Append the status's pending transitions to ``release_events``; the ones left unwritten."""
    ns, name = gr.metadata.namespace or "default", gr.metadata.name
    rows: list[Any] = []
    for h in st.history:
        rows.extend(
            release_event_rows(
                release=name,
                namespace=ns,
                uid=gr.metadata.uid or "",
                generation=int(gr.metadata.generation or 0),
                step=h.step,
                state=h.phase,
                from_model_version=gr.spec.stable.model_version,
                to_model_version=gr.spec.candidate.model_version,
                weights=h.weights,
                metrics=h.metrics,
                reason=f"{h.reason}: {h.message}"[:2000],
                event_id=f"{gr.metadata.uid}/{h.seq}/{h.phase}/{h.step}",
                now=h.time,
                operator_version=lineage.store.operator_version,
            )["release_events"]
        )
    try:
        await asyncio.wait_for(
            lineage.writer.record({"release_events": rows}, "release_events"), HISTORY_TIMEOUT
        )
    except Exception as exc:
        log.warning("[%s/%s] release history not written yet, kept in status: %s", ns, name, exc)
        return list(st.history)
    return []


def _hpa_current(
    manifest: dict[str, Any], hpas: list[dict[str, Any]], applied: dict[str, Any] | None
) -> bool:
    """Whether the cluster (or our last apply) already has ``manifest``'s spec."""
    name, want = manifest["metadata"]["name"], manifest["spec"]
    if applied is not None and applied["spec"] == want:
        return True
    return any(h["metadata"]["name"] == name and h.get("spec") == want for h in hpas)


def _contains(got: Any, want: Any) -> bool:
    """Whether ``got`` holds every field of ``want`` with its value (fields the API server or
    KEDA default are not ours to compare)."""
    if isinstance(want, dict):
        return isinstance(got, dict) and all(_contains(got.get(k), v) for k, v in want.items())
    return bool(got == want)


def _so_current(
    manifest: dict[str, Any], scaled_objects: list[dict[str, Any]], applied: dict[str, Any] | None
) -> bool:
    """Whether the cluster (or our last apply) already has every field of ``manifest``'s spec."""
    name, want = manifest["metadata"]["name"], manifest["spec"]
    if applied is not None and applied["spec"] == want:
        return True
    return any(o["metadata"]["name"] == name and _contains(o.get("spec"), want) for o in scaled_objects)


def _post(body: kopf.Body, decision: Decision) -> None:
    for t in decision.transitions:
        if t.warning:
            kopf.warn(body, reason=t.reason, message=t.message[:1024])
        else:
            kopf.info(body, reason=t.reason, message=t.message[:1024])


def _wake(rt: Runtime, key: Key) -> None:
    entry = rt.wakers.get(key)
    if entry is not None:
        entry[0].set()


def _actions(rt: Runtime, key: Key, body: kopf.Body, status: GrayReleaseStatus | None) -> list[str]:
    """The action values to consider now: those the watch delivered, then the current one."""
    current = (body["metadata"].get("annotations") or {}).get(ACTION_ANNOTATION)
    done = set(status.seen_actions) if status is not None else set()
    acked = status.acknowledged_action if status is not None else None
    values = [v for v in rt.actions.get(key, []) if v not in done and v != current]
    # The annotation as it stands is decided on even when seen before (GitOps restoring an old
    # value): the decision refuses it and says so, once.
    if current and current != acked:
        values.append(current)
    return list(dict.fromkeys(values))


def _forget_actions(rt: Runtime, key: Key, status: GrayReleaseStatus) -> None:
    queued = rt.actions.get(key)
    if queued:
        rt.actions[key] = [v for v in queued if v not in status.seen_actions]


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
            if body["metadata"].get("deletionTimestamp") or key in rt.deleting:
                break
            gr = parse(body)
            uid = gr.metadata.uid
            body_rv = body["metadata"].get("resourceVersion")
            spec = gr.spec
            refs = {spec.stable.model_version, spec.candidate.model_version}
            refs |= {d for d in (spec.stable.deployment, spec.candidate.deployment) if d}
            rt.wakers[key] = (wake, frozenset(refs))
            base = body_rv
            mine = rt.written.get(key)
            if mine is not None and mine.uid == uid and mine.base == body_rv:
                # The watch has not delivered our last write yet: that status is the newer one.
                gr = gr.model_copy(update={"status": mine.status})
                base = mine.after
            pending = rt.pending.pop(key, None)
            if pending is not None and (pending.uid != uid or pending.base != base):
                pending = None
            wake.clear()
            delay = rt.tick
            if rt.tables is not None and not rt.tables.synced.is_set():
                await _sleep(wake, stopped, 0.2)
                continue
            current = gr
            try:
                out = await reconcile(
                    current,
                    rt,
                    view_of(current, kwargs),
                    lineage,
                    base=base,
                    actions=lambda gr=current: _actions(rt, key, body, gr.status),  # type: ignore[misc]
                    pending=pending,
                )
                failures = 0
                if out.resource_version != base:
                    # Until the watch delivers a newer object, this status is the one to start from.
                    rt.written[key] = Written(uid, body_rv, out.resource_version, out.status)
                _forget_actions(rt, key, out.status)
                _post(body, out.decision)
                if rt.notify is not None and out.recorded:
                    rt.notify.post(current.model_copy(update={"status": out.status}), out.recorded)
                for t in out.decision.transitions:
                    rt.metrics.transitions.labels(*key, t.reason).inc()
                    logger.info("%s: %s", t.reason, t.message)
                rt.metrics.observe(*key, out.status)
                delay = next_wakeup(gr.model_copy(update={"status": out.status}), datetime.now(UTC), rt.tick)
            except ConflictError:
                delay = 0.1  # the release changed since it was read: decide again from it
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


@kopf.on.delete(GROUP, VERSION, PLURAL)
async def _release_deleted(body: kopf.Body, memo: Any, logger: _Logger, **_: Any) -> None:
    """Before the release goes, its model gets its standing route (or loses it, if asked)."""
    rt = runtime(memo)
    gr = parse(body)
    ns, name = gr.metadata.namespace or "default", gr.metadata.name
    rt.deleting.add((ns, name))
    cm = configmap_name(ns, name)
    if gr.spec.route_on_delete == "Remove":
        await rt.run(rt.kube.delete_configmap, rt.table_namespace, cm)
        if rt.tables is not None:
            rt.tables.forget(cm)
        logger.info("route of %s/%s removed (spec.routeOnDelete: Remove)", ns, name)
        return
    mine = rt.written.get((ns, name))
    st = mine.status if mine is not None and mine.uid == gr.metadata.uid else gr.status
    found_version, found_digest = rt.found(cm)
    if st is None or (st.routing is None and not found_version):
        return  # it never routed anything
    table = standing_table(gr, st, found_version=found_version, cluster_domain=rt.cluster_domain)
    got = rt.tables.get(cm) if rt.tables is not None else None
    if got is not None and got.standing and found_digest == content_digest(table):
        return
    await rt.run(rt.kube.apply_configmap, table_manifest(table, rt.table_namespace))
    if rt.tables is not None:
        rt.tables.put(cm, table)
    side = "the candidate" if st.phase == "Promoted" else "stable"
    logger.info("%s/%s deleted: its models %s stay served by %s", ns, name, ",".join(table.models), side)


@kopf.on.event(GROUP, VERSION, PLURAL)
def _release_changed(body: kopf.Body, type: str | None, memo: Any, **_: Any) -> None:
    """Spec or annotation changes reach the daemon now, not at its next tick; every action
    value the watch delivers is queued, so two given between rounds are both seen."""
    rt = runtime(memo)
    key = (body["metadata"].get("namespace") or "default", body["metadata"]["name"])
    if type == "DELETED":
        rt.written.pop(key, None)
        rt.pending.pop(key, None)
        rt.actions.pop(key, None)
        rt.deleting.discard(key)
        rt.metrics.forget(*key)
        ns, name = key
        for side in ("stable", "candidate"):
            rt.applied.pop((ns, hpa_name(name, side)), None)
            rt.applied.pop(_so_key(ns, scaled_object_name(name, side)), None)
        return
    status = body.get("status") or {}
    annotation = (body["metadata"].get("annotations") or {}).get(ACTION_ANNOTATION)
    if annotation and annotation not in (status.get("seenActions") or []):
        queued = rt.actions.setdefault(key, [])
        if annotation not in queued:
            queued.append(annotation)
            del queued[:-32]
    stale = status.get("observedGeneration") != body["metadata"].get("generation")
    if stale or (annotation and annotation != status.get("acknowledgedAction")):
        _wake(rt, key)


def _wake_referring(rt: Runtime, ns: str, name: str) -> None:
    for (rns, _release), (event, refs) in list(rt.wakers.items()):
        if rns == ns and name in refs:
            event.set()


@kopf.on.event(GROUP, VERSION, "modelversions")
def _modelversion_changed(body: kopf.Body, memo: Any, **_: Any) -> None:
    """A release waiting for (or running on) a ModelVersion looks again when it changes."""
    _wake_referring(runtime(memo), body["metadata"].get("namespace") or "default", body["metadata"]["name"])


@kopf.on.event("apps", "v1", "deployments")
def _deployment_changed(body: kopf.Body, memo: Any, **_: Any) -> None:
    """A release waiting for replicas (or losing them) looks again when its Deployment changes."""
    _wake_referring(runtime(memo), body["metadata"].get("namespace") or "default", body["metadata"]["name"])


# Watch caches of what a release depends on: rounds read these instead of the API server.


@kopf.index(GROUP, VERSION, "modelversions")
def tinct_modelversions(
    namespace: str | None, name: str, meta: kopf.Meta, spec: kopf.Spec, status: kopf.Status, **_: Any
) -> Any:
    return {
        (namespace, name): {
            "uid": meta.get("uid"),
            "spec": {"model": spec.get("model"), "version": spec.get("version")},
            "status": {
                "phase": status.get("phase"),
                "digests": dict(status.get("digests") or {}),
                "interface": {"digest": (status.get("interface") or {}).get("digest")},
            },
        }
    }


@kopf.index("v1", "services")
def tinct_services(namespace: str | None, name: str, spec: kopf.Spec, **_: Any) -> Any:
    ports = tuple(p["port"] for p in spec.get("ports") or [] if isinstance(p.get("port"), int))
    return {namespace: (name, ports)}


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
def tinct_hpas(namespace: str | None, name: str, meta: kopf.Meta, spec: kopf.Spec, **_: Any) -> Any:
    owners = [dict(r) for r in meta.get("ownerReferences", [])]
    return {namespace: {"metadata": {"name": name, "ownerReferences": owners}, "spec": dict(spec)}}


@kopf.index("keda.sh", "v1alpha1", "scaledobjects")
def tinct_scaledobjects(namespace: str | None, name: str, meta: kopf.Meta, spec: kopf.Spec, **_: Any) -> Any:
    """KEDA's ScaledObjects, when KEDA is installed (kopf watches them once their CRD is served)."""
    owners = [dict(r) for r in meta.get("ownerReferences", [])]
    return {namespace: {"metadata": {"name": name, "ownerReferences": owners}, "spec": dict(spec)}}
