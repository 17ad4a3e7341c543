"""kopf handlers for ModelVersion: verify, record lineage, report status; retire on delete.

Run alone with ``kopf run -m tinct.operator.modelversion`` or through ``tinct operator``.

Life of a version: create/update of ``spec`` (or operator restart with unfinished work)
→ ``Hashing`` (reported with bytes done/total when hashing takes longer than the progress
interval) → ``Ready`` with digests, per-file artifacts, the interface and the lineage table
version, or ``Failed`` with a message saying what to fix. A verified version whose
interface changed more than its declared step allows, compared with the highest Ready
version below it (:mod:`tinct.operator.interface`), is ``Misversioned`` with
``InterfaceCompatible=False`` and the differences; one that has a version below it still
being verified waits for it (``Pending``, ``WaitingForEarlierVersion``), and a version that
settles has the later ones compared with it again (:func:`settled_modelversion`,
:func:`compare_waiting`). ``Ready`` is True exactly when the phase is. A LoRA adapter (``spec.adapter``) waits
for its base to be Ready and is then held to it (:mod:`tinct.operator.adapter`): one that does
not fit is ``Failed`` with ``BaseCompatible=False``. A resync of an unchanged generation is a
no-op. A delete or a new generation stops the hashing of the old one within a progress
interval; versions share the hashing threads fairly (:mod:`tinct.artifacts.fair`). A
transient storage or lineage fault keeps the phase and retries with backoff. Deleting the
object records a ``retired`` row before kopf releases the finalizer.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

import kopf

from tinct.api.v1alpha1.common import GROUP, VERSION, Condition, set_condition
from tinct.api.v1alpha1.modelversion import (
    READY,
    ArtifactStatus,
    Digests,
    InterfaceStatus,
    LineageRef,
    ModelVersion,
    ModelVersionStatus,
)
from tinct.api.v1alpha1.modelversion import Progress as ProgressStatus
from tinct.artifacts.hashing import Progress
from tinct.artifacts.interface import digest, summary
from tinct.artifacts.storage import StorageError
from tinct.artifacts.verify import Failure, Verification, verify
from tinct.lineage.records import BaseRef, Rows, model_version_rows
from tinct.operator import adapter as adapters
from tinct.operator import context
from tinct.operator.interface import WAITING, Comparison, compare, compare_again, judged, to_compare_again
from tinct.text import clip

__all__ = ["PLURAL", "build_status", "event_for", "reconcile", "retire"]

PLURAL = "modelversions"
#: Characters of an Event's note (kopf cuts longer ones in the middle, without a word).
EVENT_NOTE_MAX = 1024
#: Seconds between looks of a version waiting for an earlier one (which also wakes it when it settles).
COMPARE_AGAIN_INTERVAL = 5.0
_Logger = logging.Logger | logging.LoggerAdapter[Any]


def backoff(retry: int) -> float:
    """Seconds before retry number ``retry`` (0-based) of a transient fault."""
    return float(min(300, 5 * 2 ** min(retry, 6)))


def event_for(mv: ModelVersion, verification: Verification) -> str:
    """The lineage event a verification of ``mv`` records.

    Deterministic for a given object state, so a reconcile repeated after a crash writes
    the same key and is deduplicated.
    """
    if not verification.ok:
        return "failed"
    return "registered" if mv.status is None or mv.status.lineage is None else "updated"


def build_status(
    mv: ModelVersion,
    verification: Verification,
    table: str,
    version: int,
    now: datetime,
    comparison: Comparison | None = None,
    base: adapters.Base | None = None,
) -> ModelVersionStatus:
    """Status after a finished verification recorded at Delta ``version`` of ``table``.

    ``comparison`` (with the predecessor) sets ``InterfaceCompatible``; a verified version
    whose declared step is smaller than its measured one is ``Misversioned``. ``base``: an
    adapter's base, which it was checked against (``BaseCompatible``).
    """
    old = mv.status or ModelVersionStatus()
    gen = mv.metadata.generation
    conds = list(old.conditions)
    failure = verification.failure

    def cond(type_: str, status: str, reason: str, message: str) -> None:
        nonlocal conds
        conds = set_condition(
            conds,
            Condition(type=type_, status=status, reason=reason, message=message, observed_generation=gen),
            now,
        )

    if failure is not None and failure.condition == "Compatible":
        cond("Compatible", "False", failure.reason, failure.message)
        cond("Verified", "Unknown", "NotChecked", "artifacts are not hashed for an incompatible version")
    else:
        cond("Compatible", "True", "Compatible", "quantization and runtime are compatible")
        if failure is not None and failure.condition != "BaseCompatible":
            cond("Verified", "False", failure.reason, failure.message)
        else:
            cond("Verified", "True", "DigestsVerified", f"{len(verification.files)} file(s) hashed and valid")
    if base is not None and failure is not None and failure.condition == "BaseCompatible":
        cond("BaseCompatible", "False", failure.reason, failure.message)
    elif base is not None and failure is None:
        lora = (verification.interface or {}).get("lora") or {}
        rank = f" within maxLoraRank {base.max_rank}" if base.max_rank is not None else ""
        cond(
            "BaseCompatible",
            "True",
            "AdapterFitsBase",
            f"fits base ModelVersion {base.name}: {len(lora.get('modules') or {})} module(s) of its "
            f"weights, rank {lora.get('max_rank')}{rank}",
        )
    cond("Recorded", "True", "LineageRecorded", f"{table} version {version}")
    lineage = LineageRef(table=table, version=version)
    if failure is not None:
        return ModelVersionStatus(
            phase="Failed",
            message=failure.message,
            observed_generation=gen,
            lineage=lineage,
            conditions=conds,
        ).with_ready(gen, now)
    verified = ModelVersionStatus(
        observed_generation=gen,
        digests=Digests.model_validate(verification.digests),
        artifacts=[
            ArtifactStatus(uri=d.uri, format=fmt, sha256=d.sha256, size=d.size)
            for fmt, d in verification.files
        ],
        interface=(
            InterfaceStatus(digest=digest(verification.interface), summary=summary(verification.interface))
            if verification.interface is not None
            else None
        ),
        adapter=adapters.adapter_status(mv, verification, base) if base is not None else None,
        progress=None,
        lineage=lineage,
        conditions=conds,
    )
    return judged(verified, comparison, mv.spec.version, gen, now)


def _unchanged(mv: ModelVersion) -> bool:
    """Whether this generation has its verdict (a version waiting for an earlier one to
    compare with is verified and recorded: :func:`compare_waiting` finishes it)."""
    st = mv.status
    return (
        st is not None
        and st.observed_generation == mv.metadata.generation
        and (
            st.phase in ("Ready", "Misversioned", "Failed")
            or (st.phase == "Pending" and st.lineage is not None)
        )
    )


async def _handled_meanwhile(mv: ModelVersion, ctx: context.Context) -> bool:
    """Whether the object as the API server has it now holds the verdict on ``mv``'s
    generation (verifying again would only say it twice); False when it cannot be read."""
    ns, name = mv.metadata.namespace or "", mv.metadata.name
    try:
        live = await asyncio.get_running_loop().run_in_executor(
            ctx.io, ctx.status.get_object, PLURAL, ns, name
        )
    except Exception:
        return False
    if live is None:
        return False
    current = ModelVersion.model_validate(live)
    return current.metadata.generation == mv.metadata.generation and _unchanged(current)


def _claims_ready(mv: ModelVersion) -> bool:
    """Whether ``mv``'s status still says Ready=True, for another generation than its own."""
    st = mv.status
    return st is not None and any(
        c.type == READY and c.status == "True" and c.observed_generation != mv.metadata.generation
        for c in st.conditions
    )


def _patch(status: ModelVersionStatus, *fields: str) -> dict[str, Any]:
    """The merge patch that sets ``fields`` of ``status`` and leaves the others alone."""
    return status.merge_patch(*fields)


async def _patch_status(
    ctx: context.Context, mv: ModelVersion, patch: dict[str, Any]
) -> dict[str, Any] | None:
    """Merge-patch the status now; the object as the API server has it after, or None."""
    ns, name = mv.metadata.namespace or "", mv.metadata.name
    return await asyncio.get_running_loop().run_in_executor(
        ctx.io, ctx.status.patch_status, PLURAL, ns, name, patch
    )


def _superseded(mv: ModelVersion, current: dict[str, Any] | None) -> str | None:
    """Why the object as it is now makes verifying ``mv`` pointless, if it does."""
    meta = (current or {}).get("metadata") or {}
    if meta.get("deletionTimestamp"):
        return "the object is being deleted"
    generation = meta.get("generation")
    if generation is not None and generation != mv.metadata.generation:
        return f"generation {generation} replaced it"
    return None


async def _verify_with_progress(mv: ModelVersion, ctx: context.Context, log: Any) -> Verification | None:
    """Verify ``mv``, reporting progress; None when a delete or a new generation stopped it.

    Every ``progress_interval`` the status patch also returns the object as it is now: when
    it is being deleted or has a newer generation, the hashing is cancelled at once, so
    kopf can move on to the delete or the new spec instead of waiting for the last byte.
    Cancelling this coroutine (operator shutdown) cancels the hashing too.
    """
    cfg = ctx.config
    progress = Progress()
    group = ctx.hashing.group(f"{mv.metadata.namespace}/{mv.metadata.name}")
    task = asyncio.ensure_future(
        verify(
            mv.spec,
            group,
            artifact_roots=cfg.artifact_roots,
            config=cfg.storage,
            progress=progress,
            onnx_parse_limit=cfg.onnx_parse_limit,
        )
    )
    try:
        while True:
            done, _ = await asyncio.wait({task}, timeout=cfg.progress_interval)
            if done:
                return task.result()
            bytes_done, bytes_total = progress.snapshot()
            pct = 100 * bytes_done // bytes_total if bytes_total else 0
            message = f"hashing: {pct}% of {bytes_total} bytes"
            hashing = ModelVersionStatus(
                phase="Hashing",
                message=message,
                progress=ProgressStatus(bytes_done=bytes_done, bytes_total=bytes_total),
                conditions=(mv.status or ModelVersionStatus()).conditions,
            ).with_ready(mv.metadata.generation, datetime.now(UTC), ("Hashing", message))
            why = _superseded(
                mv,
                await _patch_status(ctx, mv, _patch(hashing, "phase", "message", "progress", "conditions")),
            )
            if why is not None:
                log.info("stopped verifying generation %s: %s", mv.metadata.generation, why)
                return None
    finally:
        group.cancel()
        task.cancel()


async def _report_transient(mv: ModelVersion, ctx: context.Context, reason: str, message: str) -> None:
    """Say in status why the version is not Ready yet; the phase is left as it is."""
    st = (mv.status or ModelVersionStatus()).held(
        "Verified", reason, message, mv.metadata.generation, datetime.now(UTC)
    )
    await _patch_status(ctx, mv, st.merge_patch("phase", "message", "conditions"))


async def _record(ctx: context.Context, rows: Rows, retry: int) -> int:
    """Write ``rows`` to the lineage tables; the Delta version that holds them.

    Raises:
        kopf.TemporaryError: the tables could not be written; kopf retries with backoff.
    """
    try:
        return await ctx.writer.record(rows)
    except Exception as exc:
        raise kopf.TemporaryError(
            f"lineage tables unavailable, will retry: {exc}", delay=backoff(retry)
        ) from exc


async def reconcile(
    mv: ModelVersion, ctx: context.Context, *, retry: int = 0, logger: Any = None
) -> ModelVersionStatus | None:
    """Verify and record ``mv``; the new status, or None when there is nothing (more) to do.

    Raises:
        kopf.TemporaryError: storage or the lineage tables failed transiently.
    """
    log = logger or logging.getLogger(__name__)
    if _unchanged(mv):
        log.debug("generation %s already handled", mv.metadata.generation)
        return None
    if await _handled_meanwhile(mv, ctx):
        # kopf waits a few seconds for its own patch to come back on the watch, then goes on
        # with the copy it has: on a slow API server that is the one before the verdict.
        log.info("generation %s already has its verdict; this copy of it was older", mv.metadata.generation)
        return None
    base = await adapters.wait_for_base(mv, ctx, retry) if mv.spec.adapter is not None else None
    if _claims_ready(mv):  # a new generation: Ready no longer speaks for it
        now, gen = datetime.now(UTC), mv.metadata.generation
        again = (mv.status or ModelVersionStatus()).with_ready(
            gen, now, ("Hashing", f"verifying generation {gen}")
        )
        await _patch_status(ctx, mv, _patch(again, "conditions"))
    try:
        verification = await _verify_with_progress(mv, ctx, log)
    except StorageError as exc:
        delay = backoff(retry)
        await _report_transient(mv, ctx, "StorageUnavailable", f"retrying in {delay:g}s: {exc}")
        raise kopf.TemporaryError(f"storage unavailable, will retry: {exc}", delay=delay) from exc
    if verification is None:
        return None
    if base is not None and verification.ok:
        mismatch = await adapters.check(mv, verification, base, ctx)
        if mismatch is not None:
            verification.failure = Failure("BaseCompatible", mismatch.reason, mismatch.message)
    event = event_for(mv, verification)
    rows = model_version_rows(
        mv, event, verification, operator_version=ctx.store.operator_version, base=_lineage_base(base)
    )
    version = await _record(ctx, rows, retry)
    comparison = None
    if verification.ok and verification.interface is not None:
        comparison = await compare(mv, verification.interface, ctx)
    return build_status(
        mv, verification, ctx.store.uri("model_versions"), version, datetime.now(UTC), comparison, base
    )


def _lineage_base(base: adapters.Base | None) -> BaseRef | None:
    if base is None:
        return None
    return BaseRef(name=base.name, uid=base.uid, model=base.model, version=base.version)


async def retire(mv: ModelVersion, ctx: context.Context, *, retry: int = 0) -> int:
    """Record the ``retired`` row; the Delta version holding it."""
    digests = mv.status.digests.wire() if mv.status and mv.status.digests else {}
    rows = model_version_rows(
        mv, "retired", Verification(digests=digests), operator_version=ctx.store.operator_version
    )
    return await _record(ctx, rows, retry)


@kopf.on.resume(GROUP, VERSION, PLURAL)
@kopf.on.create(GROUP, VERSION, PLURAL)
@kopf.on.update(GROUP, VERSION, PLURAL, field="spec")
async def verify_modelversion(
    body: kopf.Body, patch: kopf.Patch, retry: int, memo: kopf.Memo, logger: _Logger, **_: Any
) -> None:
    mv = ModelVersion.from_body(body)
    status = await reconcile(mv, context.of(memo), retry=retry, logger=logger)
    if status is None:
        return
    # Merge patch: the fields the new status sets, and a stale progress block dropped.
    patch.status.update(_patch(status, "progress") | status.wire())
    _announce(body, status)


def _announce(body: Any, status: ModelVersionStatus) -> None:
    """The Event of a verdict: Normal when Ready or waiting for an earlier version to compare
    with, else a Warning with the reason of what holds it."""
    note = clip(status.message or "", EVENT_NOTE_MAX)
    reason = next((c.reason for c in status.conditions if c.type == READY), "Failed")
    if status.phase == "Ready":
        kopf.info(body, reason="Verified", message=note)
    elif status.phase == "Pending":
        kopf.info(body, reason=reason, message=note)
    else:
        kopf.warn(body, reason=reason, message=note)


async def _compare_again(obj: Mapping[str, Any], ctx: context.Context, log: Any) -> None:
    """Compare the verified version ``obj`` again; its status written unless it changed meanwhile."""
    meta = obj["metadata"]
    try:
        patch = await compare_again(obj, ctx)
    except Exception as exc:
        log.warning("could not compare %s again: %s", meta.get("name"), exc)
        return
    if patch is None:
        return
    ns, name = meta.get("namespace") or "", meta["name"]
    written = await asyncio.get_running_loop().run_in_executor(
        ctx.io, ctx.status.patch_status, PLURAL, ns, name, patch, meta.get("resourceVersion")
    )
    if written is not None:
        log.info("%s compared again: %s", name, patch.get("message"))
        _announce(written, ModelVersion.model_validate(written).status or ModelVersionStatus())


@kopf.on.event(GROUP, VERSION, PLURAL)
async def settled_modelversion(
    body: kopf.Body, type: str | None, memo: kopf.Memo, logger: _Logger, **_: Any
) -> None:
    """A version that settled is compared with by the later ones it may concern (see
    :mod:`tinct.operator.interface`): those it is now the predecessor of, and those waiting."""
    status = body.get("status") or {}
    if type == "DELETED" or status.get("phase") not in ("Ready", "Misversioned", "Failed"):
        return
    ctx = context.of(memo)
    ns = body["metadata"].get("namespace") or "default"
    try:
        objects = await asyncio.get_running_loop().run_in_executor(
            ctx.io, ctx.status.list_objects, PLURAL, ns
        )
    except Exception as exc:
        logger.warning("could not list the ModelVersions of %s: %s", ns, exc)
        return
    model = (body.get("spec") or {}).get("model")
    for obj in to_compare_again(body, [o for o in objects if (o.get("spec") or {}).get("model") == model]):
        await _compare_again(obj, ctx, logger)


def _waiting(status: kopf.Status, **_: Any) -> bool:
    return status.get("phase") == "Pending" and any(
        c.get("type") == "InterfaceCompatible" and c.get("reason") == WAITING
        for c in status.get("conditions") or []
    )


@kopf.timer(GROUP, VERSION, PLURAL, interval=COMPARE_AGAIN_INTERVAL, when=_waiting)
async def compare_waiting(body: kopf.Body, memo: kopf.Memo, logger: _Logger, **_: Any) -> None:
    """A version waiting for an earlier one looks again on its own, whatever it missed."""
    await _compare_again(body, context.of(memo), logger)


@kopf.on.delete(GROUP, VERSION, PLURAL)
async def retire_modelversion(
    body: kopf.Body, retry: int, memo: kopf.Memo, logger: _Logger, **_: Any
) -> None:
    version = await retire(ModelVersion.from_body(body), context.of(memo), retry=retry)
    logger.info("retired at lineage version %s", version)
