"""What the release daemons of one operator process share, and what it remembers of each release.

Besides the clients (Kubernetes in a thread pool, Prometheus sessions, the webhook
dispatcher, the routing-table watch), the process remembers, per release, what the watch
may not show yet:

- the status it last wrote (:class:`Written`): until the watch delivers a newer object, a
  round starts from that status, not from the older one the watch still has
  (:meth:`Runtime.begin`); a newer one the watch delivers is acted on only if the operator
  wrote it (:func:`~tinct.operator.grayrelease.seal.verdict`), else the round starts from
  this one (or the operator's record of it) and the tamper is reported;
- a decision whose status write failed (:class:`Pending`): the next round writes it again,
  unchanged, if it starts from the same status;
- the ``tinct.io/action`` values the watch delivered, oldest first, so two given between
  two rounds are both decided on (:meth:`Runtime.actions_for`);
- the children it applied a moment ago (:meth:`Runtime.recent`), which the watch caches may
  not hold yet.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, TypeVar

import kopf
from pydantic import ValidationError

from tinct.api.routing import RoutingTable, configmap_name
from tinct.api.v1alpha1.action import ACTION_ANNOTATION, SEEN_ACTIONS, bounded
from tinct.api.v1alpha1.grayrelease import GrayRelease, GrayReleaseStatus
from tinct.operator.grayrelease.decision import Decision
from tinct.operator.grayrelease.kube import ReleaseKube, TableWatch
from tinct.operator.grayrelease.metrics import ReleaseMetrics
from tinct.operator.grayrelease.notify import Dispatcher
from tinct.operator.grayrelease.scaling import hpa_name, scaled_object_name
from tinct.operator.grayrelease.seal import verdict

__all__ = [
    "APPLY_GRACE",
    "KEDA_CHECK_SECONDS",
    "RUNTIME",
    "Key",
    "Pending",
    "Runtime",
    "Start",
    "Written",
    "key_of",
    "parse",
    "runtime",
    "so_key",
]

#: Seconds a child we applied is taken as present before the watch cache shows it.
APPLY_GRACE = 10.0
#: resourceVersions of its own writes the process remembers per release.
_RVS = 32
#: Seconds an answer to "does the cluster serve KEDA's ScaledObjects?" is reused.
KEDA_CHECK_SECONDS = 30.0
#: The root memo's key of the process's :class:`Runtime`.
RUNTIME = "tinct_release_runtime"
_T = TypeVar("_T")

#: (namespace, release name); for :attr:`Runtime.applied`, (namespace, child name).
Key = tuple[str, str]


def key_of(body: kopf.Body | Mapping[str, Any]) -> Key:
    """The (namespace, name) of the object ``body``."""
    return (body["metadata"].get("namespace") or "default", body["metadata"]["name"])


def parse(body: kopf.Body | Mapping[str, Any]) -> GrayRelease:
    return GrayRelease.model_validate(
        {"metadata": dict(body["metadata"]), "spec": dict(body["spec"]), "status": body.get("status") or None}
    )


def so_key(ns: str, name: str) -> Key:
    """The :attr:`Runtime.applied` key of a ScaledObject (an HPA of the same name keys ``(ns, name)``)."""
    return (ns, f"ScaledObject/{name}")


@dataclass
class Written:
    """A status this process wrote, and the resourceVersions before and after."""

    uid: str | None
    base: str | None
    after: str | None
    status: GrayReleaseStatus
    #: resourceVersions of the release this process wrote or started from, up to ``after``:
    #: an object the watch delivers at one of them is an older view of its own writes.
    rvs: tuple[str, ...] = ()


@dataclass
class Pending:
    """A decision whose status write failed: the next round writes it again, unchanged."""

    uid: str | None
    base: str | None
    decision: Decision
    table: RoutingTable


@dataclass
class Start:
    """Where a round starts: the release with the newest status this process knows of."""

    release: GrayRelease
    #: The resourceVersion that status was recorded at: the precondition of the round's write.
    base: str | None
    #: The resourceVersion of the object the watch delivered.
    body_rv: str | None
    #: The decision to write again, when the last write of one failed from the same status.
    pending: Pending | None
    #: Why the status the watch delivered was not the operator's own, and what the round
    #: starts from instead; None: it was.
    tampered: str | None = None


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
    #: The session of the engines' own APIs (loading LoRA adapters), opened when first needed.
    engines: Any = None
    #: Posts recorded transitions to the webhooks releases name (spec.notify).
    notify: Dispatcher | None = None
    #: (uid, interface digest) -> the interface recorded in the lineage tables (never changes)
    interfaces: dict[tuple[str, str], Any] = field(default_factory=dict)
    #: (when asked, answer) of whether the cluster serves KEDA's ScaledObjects
    keda_served: tuple[float, bool] | None = None
    #: The key statuses are sealed with (:mod:`~tinct.operator.grayrelease.seal`).
    key: bytes = field(default_factory=lambda: os.urandom(32), repr=False)

    async def close(self) -> None:
        """Stop the table watch, close the clients; what the webhooks have queued gets a moment."""
        if self.tables is not None:
            self.tables.stop()
        if self.session is not None:
            await self.session.close()
        if self.engines is not None:
            await self.engines.close()
        if self.notify is not None:
            await self.notify.drain(2.0)  # what is queued gets a moment; the rest is said in the log
            await self.notify.close()
        self.pool.shutdown(wait=False, cancel_futures=True)

    # --- the clients ---------------------------------------------------------------------------

    def engine_session(self) -> Any:
        """The session the adapter loader talks to the engines through (on the running loop)."""
        if self.engines is None:
            import aiohttp

            self.engines = aiohttp.ClientSession(trust_env=False)
        return self.engines

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

    def recent(self, key: Key) -> dict[str, Any] | None:
        """The manifest applied for ``key`` within the last :data:`APPLY_GRACE` seconds."""
        got = self.applied.get(key)
        return got[1] if got is not None and time.monotonic() - got[0] < APPLY_GRACE else None

    def remember(self, key: Key, manifest: dict[str, Any]) -> None:
        self.applied[key] = (time.monotonic(), manifest)

    # --- the releases --------------------------------------------------------------------------

    def begin(self, key: Key, body: kopf.Body, wake: asyncio.Event) -> Start:
        """Start a round of ``key``: register its wake-up event, and the status to start from."""
        gr, tampered = self.trusted(key, body)
        uid = gr.metadata.uid
        body_rv = body["metadata"].get("resourceVersion")
        spec = gr.spec
        refs = {spec.stable.model_version, spec.candidate.model_version}
        refs |= {d for d in (spec.stable.deployment, spec.candidate.deployment) if d}
        self.wakers[key] = (wake, frozenset(refs))
        base = body_rv
        mine = self.written.get(key)
        if mine is not None and mine.uid == uid and (mine.base == body_rv or body_rv in mine.rvs):
            # The watch has not delivered our last write yet: that status is the newer one.
            gr = gr.model_copy(update={"status": mine.status})
            base, tampered = mine.after, None
        pending = self.pending.pop(key, None)
        if pending is not None and (pending.uid != uid or pending.base != base or tampered):
            pending = None
        wake.clear()
        return Start(gr, base, body_rv, pending, tampered)

    def foreign(self, key: Key, body: kopf.Body | Mapping[str, Any]) -> bool:
        """Whether the status the watch delivered is plainly not one the operator wrote: its
        seal does not verify, or it is older than the one this process wrote last (the round
        checks it fully, :meth:`trusted`)."""
        raw = body.get("status")
        if not raw:
            return False
        try:
            status = GrayReleaseStatus.model_validate(raw)
        except ValidationError:
            return True
        uid = str(body["metadata"].get("uid") or "")
        mine = self.written.get(key)
        if mine is not None and mine.uid == uid:
            if body["metadata"].get("resourceVersion") in mine.rvs:
                return False  # an older view of its own writes
            if status.sequence < mine.status.sequence:
                return True
        return verdict(self.key, uid, status) is not None

    def trusted(self, key: Key, body: kopf.Body | Mapping[str, Any]) -> tuple[GrayRelease, str | None]:
        """The release with the status the operator stands by: the one delivered, if it wrote
        it; else the one it wrote last (its memory, else its record, else none) and why the
        delivered one was refused (:func:`~tinct.operator.grayrelease.seal.verdict`)."""
        gr = parse({**body, "status": None})
        raw = body.get("status") or None
        status: GrayReleaseStatus | None = None
        try:
            status = GrayReleaseStatus.model_validate(raw) if raw is not None else None
            valid = True
        except ValidationError:
            valid = False
        uid = gr.metadata.uid or ""
        found = self.tables.get(configmap_name(*key)) if self.tables is not None else None
        record = found.record if found is not None else None
        why = verdict(
            self.key,
            uid,
            status,
            valid=valid,
            record=record,
            table=found.table if found is not None else None,
        )
        if why is None:
            return gr.model_copy(update={"status": status}), None
        mine = self.written.get(key)
        if (
            mine is not None
            and mine.uid == uid
            and (record is None or mine.status.sequence >= record.sequence)
        ):
            restored, source = mine.status, "the status the operator wrote last"
        elif record is not None and record.uid == uid:
            restored, source = record.status(), "the operator's record of the last status it wrote"
        else:
            restored, source = None, "nothing: the operator has written no status for it"
        return gr.model_copy(
            update={"status": restored}
        ), f"the status was not the operator's: {why}; it went on from {source}"

    def remember_written(
        self, key: Key, start: Start, after: str | None, status: GrayReleaseStatus, rvs: Sequence[str] = ()
    ) -> None:
        """``status`` was written at resourceVersion ``after`` (through ``rvs``) by the round that
        ``start`` began."""
        uid = start.release.metadata.uid
        before = self.written.get(key)
        earlier = before.rvs if before is not None and before.uid == uid else ()
        seen = tuple(dict.fromkeys(rv for rv in (*earlier, start.body_rv, *rvs) if rv))
        self.written[key] = Written(uid, start.body_rv, after, status, seen[-_RVS:])

    def actions_for(self, key: Key, body: kopf.Body, status: GrayReleaseStatus | None) -> list[str]:
        """The action values to consider now: those the watch delivered, then the current one."""
        given = (body["metadata"].get("annotations") or {}).get(ACTION_ANNOTATION)
        current = bounded(str(given)) if given else None
        done = set(status.seen_actions) if status is not None else set()
        acked = status.acknowledged_action if status is not None else None
        values = [v for v in self.actions.get(key, []) if v not in done and v != current]
        # The annotation as it stands is decided on even when seen before (GitOps restoring an old
        # value): the decision refuses it and says so, once.
        if current and current != acked:
            values.append(current)
        return list(dict.fromkeys(values))

    def queue_action(self, key: Key, body: kopf.Body) -> str | None:
        """Queue the action value the watch delivered with ``body``, unless status has seen it;
        the value, if any."""
        status = body.get("status") or {}
        given = (body["metadata"].get("annotations") or {}).get(ACTION_ANNOTATION)
        annotation = bounded(str(given)) if given else None
        if annotation and annotation not in (status.get("seenActions") or []):
            queued = self.actions.setdefault(key, [])
            if annotation not in queued:
                queued.append(annotation)
                del queued[:-SEEN_ACTIONS]
        return str(annotation) if annotation else None

    def forget_actions(self, key: Key, status: GrayReleaseStatus) -> None:
        queued = self.actions.get(key)
        if queued:
            self.actions[key] = [v for v in queued if v not in status.seen_actions]

    def forget(self, key: Key) -> None:
        """Drop what the process remembers of the deleted release ``key``."""
        self.written.pop(key, None)
        self.pending.pop(key, None)
        self.actions.pop(key, None)
        self.deleting.discard(key)
        self.metrics.forget(*key)
        ns, name = key
        for side in ("stable", "candidate"):
            self.applied.pop((ns, hpa_name(name, side)), None)
            self.applied.pop(so_key(ns, scaled_object_name(name, side)), None)

    def wake(self, key: Key) -> None:
        """Have the daemon of ``key`` look at it now."""
        entry = self.wakers.get(key)
        if entry is not None:
            entry[0].set()

    def wake_referring(self, ns: str, name: str) -> None:
        """Have every release of ``ns`` that names the ModelVersion or Deployment ``name`` look now."""
        for (rns, _release), (event, refs) in list(self.wakers.items()):
            if rns == ns and name in refs:
                event.set()


def runtime(memo: Any) -> Runtime:
    """The process's release runtime, from the ``memo`` any handler receives."""
    rt = memo.get(RUNTIME)
    if not isinstance(rt, Runtime):
        raise RuntimeError("the release runtime is not started (the startup activity has not run)")
    return rt
