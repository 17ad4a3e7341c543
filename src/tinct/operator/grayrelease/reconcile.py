"""One round of a release: gather, decide, record, act, history.

1. **gather** (:func:`~tinct.operator.grayrelease.world.gather`) what the round needs;
2. **decide** (:func:`~tinct.operator.grayrelease.decide.decide`, pure) the next status, and
   plan what it calls for — the routing-table version and digest, the scalers' bounds — into
   it (:func:`_planned`);
3. **record** the status, sealed (:mod:`~tinct.operator.grayrelease.seal`), conditioned on
   the resourceVersion it was decided from: a status that changed meanwhile is never
   overwritten (the round starts again from it, if the operator wrote it; a status someone
   else wrote is not acted on and the round writes over it), and a write that fails
   otherwise is retried with the *same* decision (:class:`~.runtime.Pending`);
4. **act** on the recorded status only (:mod:`~tinct.operator.grayrelease.act`): apply the
   routing table to the table namespace, with the operator's record of the status beside
   it, then the HPAs or KEDA ScaledObjects, then retire standing routes of this namespace
   that this release's table now covers;
5. **history**: the transitions recorded in ``status.history`` are appended to
   ``release_events`` (with a timeout; a lineage outage delays the history, never the
   traffic) and then dropped from status.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime

from tinct.api.routing import RoutingTable, configmap_name
from tinct.api.v1alpha1.grayrelease import GrayRelease, GrayReleaseStatus, HistoryEntry
from tinct.operator import context
from tinct.operator.grayrelease import act
from tinct.operator.grayrelease.decide import decide
from tinct.operator.grayrelease.decision import Decision
from tinct.operator.grayrelease.kube import ConflictError
from tinct.operator.grayrelease.runtime import Pending, Runtime
from tinct.operator.grayrelease.seal import Record, sealed
from tinct.operator.grayrelease.tables import claims_of, plan, release_models
from tinct.operator.grayrelease.world import View, gather, keda_env

__all__ = ["Outcome", "reconcile"]

log = logging.getLogger(__name__)


@dataclass
class Outcome:
    """What one round decided and wrote."""

    decision: Decision
    status: GrayReleaseStatus
    #: The release's resourceVersion after the round's writes (None: nothing was written).
    resource_version: str | None
    #: The transitions this round recorded in status (to notify of).
    recorded: list[HistoryEntry] = field(default_factory=list)
    #: The resourceVersions of the release each of the round's writes produced.
    rvs: list[str] = field(default_factory=list)


def _planned(gr: GrayRelease, rt: Runtime, view: View, decision: Decision, now: datetime) -> RoutingTable:
    """Plan the table and the scalers the decided status calls for into it (pure, recorded with it)."""
    st = decision.status
    old = gr.status or GrayReleaseStatus()
    ns = gr.metadata.namespace or "default"
    name = configmap_name(ns, gr.metadata.name)
    found_version, _ = rt.found(name)
    recorded_models = old.routing.models if old.routing is not None else []
    models = release_models(gr, view.modelversions, recorded_models)
    found = list(rt.tables.tables.values()) if rt.tables is not None else []
    # The release's own claim on its models: the moment it first routed, kept in its status.
    since = old.routing.since if old.routing is not None and old.routing.since else now.timestamp()
    table = plan(
        gr,
        st,
        table_namespace=rt.table_namespace,
        found_version=found_version,
        cluster_domain=rt.cluster_domain,
        models=models,
        claimed=claims_of(ns, name, list(gr.spec.models) or models, found, since),
        since=since,
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
    tampered: str | None = None,
) -> Outcome:
    """One round for ``gr`` (its status being the one last recorded, at resourceVersion
    ``base``); see the module doc. ``pending``: a decision whose write failed, written again.
    ``tampered``: why the status on the server is not the one ``gr`` carries (someone else
    wrote it); the round writes its own over it and says so."""
    now = now or datetime.now(UTC)
    ns = gr.metadata.namespace or "default"
    old = gr.status or GrayReleaseStatus()
    view.keda = await keda_env(gr, rt)
    if pending is not None:
        decision, table = pending.decision, pending.table
    else:
        inputs = await gather(gr, rt, view, actions, now, tampered)
        decision = decide(gr, inputs)
        table = _planned(gr, rt, view, decision, now)
    st = decision.status
    rv = await _record(gr, rt, base, decision, table, force=tampered is not None)
    recorded = [h for h in st.history if h.seq >= old.transitions]
    rvs = [rv] if rv and rv != base else []
    if (ns, gr.metadata.name) in rt.deleting:
        return Outcome(decision, st, rv, recorded, rvs)

    # Act on what was recorded; a table naming a backend outside the release's reach is not
    # applied (the precondition BackendNotAllowed says why): the table in force stays. The
    # table's ConfigMap carries the operator's record of the status just written.
    uid = gr.metadata.uid or ""
    reachable = rt.config is None or not view.backend_problems(gr, rt.config.backends)
    if reachable:
        await act.apply_table(rt, table, Record.of(uid, st))
    if gr.spec.autoscaling is not None:
        await act.apply_scaling(rt, ns, view.scaling(gr, st, now), view.hpas, view.scaled_objects)
    if reachable:
        await act.retire_standing(rt, gr, table)

    if st.history:
        rv, st = await _history(gr, rt, st, lineage, rv)
        rvs += [rv] if rv and rv not in rvs and rv != base else []
        if reachable:
            await act.apply_table(rt, table, Record.of(uid, st))
    return Outcome(decision, st, rv, recorded, rvs)


async def _record(
    gr: GrayRelease,
    rt: Runtime,
    base: str | None,
    decision: Decision,
    table: RoutingTable,
    *,
    force: bool = False,
) -> str | None:
    """Write the decided status, sealed and numbered one past the status it was decided from,
    conditioned on ``base``; the resourceVersion after it. ``force``: write it even if it is
    the status the round started from (the server holds another).

    A write refused for a conflict propagates (the round starts again from the newer
    status); one that fails otherwise leaves the decision pending, to be written as it is.
    """
    ns, name = gr.metadata.namespace or "default", gr.metadata.name
    st, old = decision.status, gr.status or GrayReleaseStatus()
    if not force and st.wire() == old.wire():
        return base
    sealed(rt.key, gr.metadata.uid or "", st, old.sequence + 1)
    try:
        return await rt.run(rt.kube.replace_status, ns, name, st.wire(), base)
    except ConflictError:
        raise
    except Exception:
        rt.pending[(ns, name)] = Pending(gr.metadata.uid, base, decision, table)
        raise


async def _history(
    gr: GrayRelease, rt: Runtime, st: GrayReleaseStatus, lineage: context.Context, rv: str | None
) -> tuple[str | None, GrayReleaseStatus]:
    """Append the status's history to ``release_events`` and drop what was written from status;
    the resourceVersion and the status after it."""
    ns, name = gr.metadata.namespace or "default", gr.metadata.name
    remaining = await act.record_history(gr, st, lineage)
    if len(remaining) == len(st.history):
        return rv, st
    dropped = st.model_copy(update={"history": remaining})
    sealed(rt.key, gr.metadata.uid or "", dropped, st.sequence + 1)
    try:
        return await rt.run(rt.kube.replace_status, ns, name, dropped.wire(), rv), dropped
    except Exception as exc:  # written again by the next round; rows are idempotent
        log.info("[%s/%s] could not drop written history from status: %s", ns, name, exc)
        return rv, st
