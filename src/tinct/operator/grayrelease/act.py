"""Acting on the cluster for a release, on what its recorded status calls for.

Every write here converges instead of adding: the routing table is applied only when the
cluster lacks its version or content (:func:`apply_table`), a scaler only when the watch
cache (or our apply a moment ago) lacks its spec (:func:`apply_scaling`), standing routes this
release's table now covers are deleted (:func:`retire_standing`), history rows are keyed so
a retried append adds none (:func:`record_history`). A deleted release leaves its model's
standing route (:func:`leave_route`).
"""

from __future__ import annotations

import asyncio
import logging
from datetime import UTC, datetime
from typing import Any

import kopf

from tinct.api.routing import RoutingTable, configmap_name
from tinct.api.v1alpha1.grayrelease import GrayRelease, GrayReleaseStatus
from tinct.lineage.records import release_event_rows
from tinct.operator import context
from tinct.operator.grayrelease import adapters, loading
from tinct.operator.grayrelease.decision import Decision
from tinct.operator.grayrelease.runtime import Runtime, key_of, so_key
from tinct.operator.grayrelease.scaling import Plan
from tinct.operator.grayrelease.seal import Record
from tinct.operator.grayrelease.tables import content_digest, standing_table, table_manifest

__all__ = [
    "HISTORY_TIMEOUT",
    "apply_scaling",
    "apply_table",
    "hpa_current",
    "leave_route",
    "post_events",
    "record_history",
    "refused_backends",
    "retire_standing",
    "so_current",
]

#: Seconds a round waits for the lineage writer before leaving the history for later.
HISTORY_TIMEOUT = 10.0
_Logger = logging.Logger | logging.LoggerAdapter[Any]
log = logging.getLogger(__name__)


async def apply_scaling(
    rt: Runtime, ns: str, scaling: Plan, hpas: list[dict[str, Any]], scaled_objects: list[dict[str, Any]]
) -> None:
    """Apply the planned scalers: first remove the release's own of the way it no longer scales
    (two HPAs on one Deployment would fight), then apply what differs from the watch cache."""
    for name in scaling.delete_hpas:
        await rt.run(rt.kube.delete_hpa, ns, name)
        rt.applied.pop((ns, name), None)
    for name in scaling.delete_scaled_objects:
        await rt.run(rt.kube.delete_scaled_object, ns, name)
        rt.applied.pop(so_key(ns, name), None)
    for m in scaling.manifests:
        key = (ns, m["metadata"]["name"])
        if not hpa_current(m, hpas, rt.recent(key)):
            await rt.run(rt.kube.apply_hpa, m)
            rt.remember(key, m)
    for m in scaling.scaled_objects:
        key = so_key(ns, m["metadata"]["name"])
        if not so_current(m, scaled_objects, rt.recent(key)):
            try:
                await rt.run(rt.kube.apply_scaled_object, m)
            except Exception:
                rt.keda_served = None  # KEDA may have gone: ask discovery again next round
                raise
            rt.remember(key, m)


def refused_backends(rt: Runtime, table: RoutingTable) -> list[str]:
    """The sides of ``table`` whose URL the operator's backend policy refuses."""
    if rt.config is None:
        return []
    sides = [("stable", table.stable.url), ("candidate", table.candidate.url)]
    refused: list[str] = rt.config.backends.refusals(sides, table.namespace or "default")
    return refused


async def apply_table(rt: Runtime, table: RoutingTable, record: Record | None = None) -> None:
    """Apply ``table``, and ``record`` (the operator's record of the release's last status)
    beside it, unless the cluster has both, or a newer version the next round plans past.
    A table naming a backend the policy refuses is never applied: the one in force stays."""
    name = configmap_name(table.namespace or "default", table.release)
    refused = refused_backends(rt, table)
    if refused:
        log.info("routing table %s not applied: %s", name, "; ".join(refused))
        return
    found = rt.tables.get(name) if rt.tables is not None else None
    found_version, found_digest = rt.found(name)
    kept = found is not None and found.record == record
    if found_version >= table.version and found_digest == content_digest(table) and kept:
        return
    if found_version > table.version:
        return  # the next round plans a version above it
    await rt.run(rt.kube.apply_configmap, table_manifest(table, rt.table_namespace, record))
    if rt.tables is not None:
        rt.tables.put(name, table, record)


async def retire_standing(rt: Runtime, gr: GrayRelease, table: RoutingTable) -> None:
    """Delete standing routes of deleted releases of this namespace whose models this live
    table now serves; a standing route of another namespace is retired only by its own."""
    if rt.tables is None or not table.models:
        return
    mine = set(table.models)
    for name, found in list(rt.tables.tables.items()):
        t = found.table
        if t is None or not t.standing or t.uid == gr.metadata.uid or not t.models:
            continue
        if (t.namespace or "default") != (table.namespace or "default"):
            continue
        if set(t.models) <= mine:
            log.info(
                "standing route %s (models %s) is taken over by %s", name, ",".join(t.models), table.release
            )
            await rt.run(rt.kube.delete_configmap, rt.table_namespace, name)
            rt.tables.forget(name)


async def record_history(gr: GrayRelease, st: GrayReleaseStatus, lineage: context.Context) -> list[Any]:
    """Append the status's pending transitions to ``release_events``; the ones left unwritten.

    A row's ``step`` counts from 1, as ``2/4`` reads everywhere else; its key keeps the
    transition's own index, so a row retried across versions of the operator is still one row."""
    ns, name = gr.metadata.namespace or "default", gr.metadata.name
    rows: list[Any] = []
    for h in st.history:
        rows.extend(
            release_event_rows(
                release=name,
                namespace=ns,
                uid=gr.metadata.uid or "",
                generation=int(gr.metadata.generation or 0),
                step=h.step + 1,  # as people read it: 1 is the first step, as in 1/4
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


def hpa_current(manifest: dict[str, Any], hpas: list[dict[str, Any]], applied: dict[str, Any] | None) -> bool:
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


def so_current(
    manifest: dict[str, Any], scaled_objects: list[dict[str, Any]], applied: dict[str, Any] | None
) -> bool:
    """Whether the cluster (or our last apply) already has every field of ``manifest``'s spec."""
    name, want = manifest["metadata"]["name"], manifest["spec"]
    if applied is not None and applied["spec"] == want:
        return True
    return any(o["metadata"]["name"] == name and _contains(o.get("spec"), want) for o in scaled_objects)


async def leave_route(rt: Runtime, body: kopf.Body, logger: _Logger) -> None:
    """Before the deleted release of ``body`` goes, give its model its standing route (or remove
    the route, with ``spec.routeOnDelete: Remove``): the outcome of the status the operator
    stands by, never of one someone else wrote."""
    gr, tampered = rt.trusted(key_of(body), body)
    ns, name = gr.metadata.namespace or "default", gr.metadata.name
    cm = configmap_name(ns, name)
    if tampered:
        logger.warning("%s/%s deleted; %s", ns, name, tampered)
    if gr.spec.route_on_delete == "Remove":
        await rt.run(rt.kube.delete_configmap, rt.table_namespace, cm)
        if rt.tables is not None:
            rt.tables.forget(cm)
        logger.info("route of %s/%s removed (spec.routeOnDelete: Remove)", ns, name)
        return
    mine, st = rt.written.get((ns, name)), gr.status
    if (
        mine is not None
        and mine.uid == gr.metadata.uid
        and (st is None or mine.status.sequence > st.sequence)
    ):
        st = mine.status  # written by this process, not yet delivered by the watch
    found_version, found_digest = rt.found(cm)
    if st is None or (st.routing is None and not found_version):
        return  # it never routed anything
    got = rt.tables.get(cm) if rt.tables is not None else None
    claimed = got.table.claimed if got is not None and got.table is not None else None
    table = standing_table(
        gr, st, found_version=found_version, cluster_domain=rt.cluster_domain, claimed=claimed
    )
    refused = refused_backends(rt, table)
    if refused:
        logger.warning("%s/%s deleted: no standing route, its backends are refused: %s", ns, name, refused)
        return
    if got is not None and got.standing and found_digest == content_digest(table):
        return
    await rt.run(rt.kube.apply_configmap, table_manifest(table, rt.table_namespace))
    if rt.tables is not None:
        rt.tables.put(cm, table)
    side = "the candidate" if st.phase == "Promoted" else "stable"
    logger.info("%s/%s deleted: its models %s stay served by %s", ns, name, ",".join(table.models), side)


def post_events(body: kopf.Body, decision: Decision) -> None:
    """An Event for each transition of ``decision``."""
    for t in decision.transitions:
        if t.warning:
            kopf.warn(body, reason=t.reason, message=t.message[:1024])
        else:
            kopf.info(body, reason=t.reason, message=t.message[:1024])


async def leave_adapter(rt: Runtime, body: kopf.Body, logger: _Logger) -> None:
    """Before the deleted release of ``body`` goes, take its LoRA adapter candidate off stable's
    pods once the requests in flight on it have drained; an adapter it promoted stays."""
    gr, _ = rt.trusted(key_of(body), body)
    ref, st = gr.spec.candidate.adapter, gr.status or GrayReleaseStatus()
    if ref is None or st.adapter is None or st.adapter.served_name is None:
        return
    if loading.keeps_adapter(st.phase, deleting=True):
        return
    now = datetime.now(UTC)
    since = st.adapter.withdrawn_at or now
    await asyncio.sleep(max(0.0, (loading.DRAIN - (now - since)).total_seconds()))
    recorded = {
        "status": {
            "adapter": {"servedName": st.adapter.served_name, "path": st.adapter.path},
            "digests": {"lora": st.adapter.digest} if st.adapter.digest else {},
        }
    }
    gone = gr.model_copy(
        update={
            "status": st.model_copy(update={"adapter": st.adapter.model_copy(update={"withdrawn_at": since})})
        }
    )
    left = await adapters.sync(
        gone, rt.kube, rt.run, rt.engine_session(), {ref.model_version: recorded}, datetime.now(UTC), True
    )
    if left is not None:
        ns, name = gr.metadata.namespace or "default", gr.metadata.name
        logger.info(
            "%s/%s deleted: %s on %d/%d of stable's pods", ns, name, left.served_name, left.loaded, left.total
        )
