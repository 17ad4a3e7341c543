"""kopf handlers for GrayRelease: one daemon per release drives it, round by round.

A round (every ``TINCT_RELEASE_TICK`` seconds, when an analysis window closes, or at once
when the release, an action on it, one of its ModelVersions or Deployments changes) gathers
what it needs, decides, records the decision and then acts on what was recorded
(:mod:`~tinct.operator.grayrelease.reconcile`); this module posts its transitions as Events,
to the webhooks the release names and to the controller's metrics, and sleeps until the next.

An operator killed anywhere repeats the round from the recorded status, and every write
converges instead of adding. Deleting a release leaves its model's **standing route**
(:func:`~tinct.operator.grayrelease.act.leave_route`) unless ``spec.routeOnDelete: Remove``.
The watch caches the rounds read are kopf indices, registered with the view that reads them
(:mod:`~tinct.operator.grayrelease.world`).

Runs with :mod:`tinct.operator.modelversion` (its startup handler opens the lineage writer):
``kopf run -m tinct.operator.modelversion -m tinct.operator.grayrelease.handler`` or ``tinct operator``.
"""

from __future__ import annotations

import asyncio
import logging
import os
from datetime import UTC, datetime
from typing import Any

import kopf

from tinct.api.v1alpha1.common import GROUP, VERSION
from tinct.operator import context
from tinct.operator.grayrelease import act, prometheus
from tinct.operator.grayrelease.kube import ConflictError, TableWatch
from tinct.operator.grayrelease.metrics import serve
from tinct.operator.grayrelease.notify import Dispatcher
from tinct.operator.grayrelease.reconcile import Outcome, reconcile
from tinct.operator.grayrelease.runtime import RUNTIME, Key, Runtime, Start, key_of, runtime
from tinct.operator.grayrelease.timing import next_wakeup
from tinct.operator.grayrelease.world import view_of

__all__ = ["PLURAL"]

PLURAL = "grayreleases"
_Logger = logging.Logger | logging.LoggerAdapter[Any]


@kopf.on.startup()
async def _start_runtime(memo: Any, **_: Any) -> None:
    """Put the release daemons' shared :class:`Runtime` into the root memo; serve metrics."""
    config = context.config_of(memo)
    rt = Runtime(
        tick=config.release_tick,
        cluster_domain=config.cluster_domain,
        table_namespace=config.table_namespace,
        config=config,
        key=_status_key(config),
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
        break_after=config.notify_break_after,
        retry_after=config.notify_retry_after,
    )
    memo[RUNTIME] = rt
    if config.metrics_port:
        serve(rt.metrics, config.metrics_port)


def _status_key(config: Any) -> bytes:
    """The key statuses are sealed with: the configured one, else one of this process alone."""
    key: bytes | None = config.seal_key()
    if key:
        return key
    logging.getLogger(__name__).warning(
        "no status key configured (TINCT_STATUS_KEY_FILE, the chart's Secret): statuses are sealed "
        "with a key of this process alone; after a restart only a status equal to the operator's "
        "record of it is trusted, and one written just before the restart is restored from that record"
    )
    return os.urandom(32)


@kopf.on.cleanup()
async def _stop_runtime(memo: Any, **_: Any) -> None:
    rt = memo.pop(RUNTIME, None)
    if isinstance(rt, Runtime):
        await rt.close()


@kopf.daemon(GROUP, VERSION, PLURAL, cancellation_timeout=10.0)
async def drive_release(
    body: kopf.Body, stopped: kopf.DaemonStopped, logger: _Logger, memo: Any, **kwargs: Any
) -> None:
    rt = runtime(memo)
    lineage = context.of(memo)
    key = key_of(body)
    wake = asyncio.Event()
    failures = 0
    try:
        while not stopped:
            if body["metadata"].get("deletionTimestamp") or key in rt.deleting:
                break
            start = rt.begin(key, body, wake)
            if rt.tables is not None and not rt.tables.synced.is_set():
                await _sleep(wake, stopped, 0.2)
                continue
            current = start.release
            try:
                out = await reconcile(
                    current,
                    rt,
                    view_of(current, kwargs),
                    lineage,
                    base=start.base,
                    actions=lambda gr=current: rt.actions_for(key, body, gr.status),  # type: ignore[misc]
                    pending=start.pending,
                    tampered=start.tampered,
                )
                failures = 0
                delay = _done(rt, key, body, start, out, logger)
            except ConflictError:
                delay = 0.1  # the release changed since it was read: decide again from it
            except Exception as exc:
                failures += 1
                delay = min(60.0, rt.tick * 2 ** min(failures, 4))
                logger.warning("round failed, retrying in %.0fs: %s", delay, exc)
            await _sleep(wake, stopped, delay)
    finally:
        rt.wakers.pop(key, None)


def _done(rt: Runtime, key: Key, body: kopf.Body, start: Start, out: Outcome, logger: _Logger) -> float:
    """Tell of a round that went through: Events, webhooks, metrics, log; the seconds until the next."""
    current = start.release.model_copy(update={"status": out.status})
    if out.resource_version != start.base:
        # Until the watch delivers a newer object, this status is the one to start from.
        rt.remember_written(key, start, out.resource_version, out.status, out.rvs)
    rt.forget_actions(key, out.status)
    act.post_events(body, out.decision)
    if rt.notify is not None and out.recorded:
        rt.notify.post(current, out.recorded)
    for t in out.decision.transitions:
        rt.metrics.transitions.labels(*key, t.reason).inc()
        logger.info("%s: %s", t.reason, t.message)
    rt.metrics.observe(*key, out.status)
    return next_wakeup(current, datetime.now(UTC), rt.tick)


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
    rt.deleting.add(key_of(body))
    await act.leave_route(rt, body, logger)
    await act.leave_adapter(rt, body, logger)


@kopf.on.event(GROUP, VERSION, PLURAL)
def _release_changed(body: kopf.Body, type: str | None, memo: Any, **_: Any) -> None:
    """Spec or annotation changes, and a status the operator did not write last, reach the
    daemon now, not at its next tick; every action value the watch delivers is queued, so two
    given between rounds are both seen."""
    rt = runtime(memo)
    key = key_of(body)
    if type == "DELETED":
        rt.forget(key)
        return
    status = body.get("status") or {}
    annotation = rt.queue_action(key, body)
    stale = status.get("observedGeneration") != body["metadata"].get("generation")
    other = rt.foreign(key, body)  # someone else's status: restored now, not at the next tick
    if stale or other or (annotation and annotation != status.get("acknowledgedAction")):
        rt.wake(key)


@kopf.on.event(GROUP, VERSION, "modelversions")
def _modelversion_changed(body: kopf.Body, memo: Any, **_: Any) -> None:
    """A release waiting for (or running on) a ModelVersion looks again when it changes."""
    runtime(memo).wake_referring(*key_of(body))


@kopf.on.event("apps", "v1", "deployments")
def _deployment_changed(body: kopf.Body, memo: Any, **_: Any) -> None:
    """A release waiting for replicas (or losing them) looks again when its Deployment changes."""
    runtime(memo).wake_referring(*key_of(body))
