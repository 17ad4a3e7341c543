"""Holding a ModelVersion's declared version to its interface.

A verified version is compared with its **predecessor**: the highest ``Ready`` version of
the same model in the same namespace below it in semver order (:func:`predecessor`, pure).
The predecessor's interface is read back from the lineage ``interfaces`` table (what the
operator measured when it verified it), and :func:`tinct.artifacts.contract.verdict` says
whether the declared step allows the differences. :func:`compare` does the reads;
:func:`condition_of` turns the outcome into the ``InterfaceCompatible`` condition and
:func:`judged` into the version's phase.

**Order does not matter.** Versions applied together are verified in any order, so a
version below this one and above its predecessor may still be on its way
(:func:`unsettled`): then this one waits (phase ``Pending``,
``InterfaceCompatible=Unknown``, ``WaitingForEarlierVersion``) instead of being compared
with less than it will have. When a version settles, the later versions it is now the
predecessor of, and those waiting, are compared again (:func:`to_compare_again`,
:func:`compare_again`), from their interface as recorded.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from tinct.api.v1alpha1.common import Condition, set_condition
from tinct.api.v1alpha1.modelversion import ModelVersion, ModelVersionPhase, ModelVersionStatus
from tinct.artifacts.contract import Verdict, verdict
from tinct.artifacts.interface import Interface
from tinct.operator import context

__all__ = [
    "WAITING",
    "Comparison",
    "compare",
    "compare_again",
    "condition_of",
    "judged",
    "predecessor",
    "semver_key",
    "to_compare_again",
    "unsettled",
]

#: The ``InterfaceCompatible`` reason of a version waiting for an earlier one to settle.
WAITING = "WaitingForEarlierVersion"
#: Phases a version does not leave without a new spec: what it is compared with is known.
_SETTLED = ("Ready", "Misversioned", "Failed")

_SEMVER = re.compile(r"^(\d+)\.(\d+)\.(\d+)(?:-([0-9A-Za-z.-]+))?(?:\+.*)?$")
#: How much of the list of differences goes into a condition message.
_MESSAGE_MAX = 4000


def semver_key(version: str) -> tuple[Any, ...] | None:
    """Sort key of a semver (a pre-release sorts before its release); None if not semver."""
    m = _SEMVER.match(version)
    if m is None:
        return None
    pre = m.group(4)
    ids: tuple[Any, ...] = ()
    if pre:
        ids = tuple((0, int(p), "") if p.isdigit() else (1, 0, p) for p in pre.split("."))
    return (int(m.group(1)), int(m.group(2)), int(m.group(3)), 0 if pre else 1, ids)


def _below(
    model: str, version: str, uid: str | None, objects: Iterable[Mapping[str, Any]]
) -> list[tuple[tuple[Any, ...], Mapping[str, Any]]]:
    """The other versions of ``model`` below ``version`` (not being deleted), highest first."""
    mine = semver_key(version)
    if mine is None:
        return []
    out = []
    for obj in objects:
        spec, meta = obj.get("spec") or {}, obj.get("metadata") or {}
        if meta.get("uid") == uid or spec.get("model") != model or meta.get("deletionTimestamp"):
            continue
        key = semver_key(str(spec.get("version", "")))
        if key is not None and key < mine:
            out.append((key, obj))
    return sorted(out, key=lambda kv: kv[0], reverse=True)


def _usable(obj: Mapping[str, Any]) -> bool:
    status = obj.get("status") or {}
    return status.get("phase") == "Ready" and bool((status.get("interface") or {}).get("digest"))


def predecessor(mv: ModelVersion, objects: Iterable[Mapping[str, Any]]) -> Mapping[str, Any] | None:
    """The highest Ready version of ``mv``'s model below ``mv.spec.version``, with an interface."""
    below = _below(mv.spec.model, mv.spec.version, mv.metadata.uid, objects)
    return next((obj for _, obj in below if _usable(obj)), None)


def unsettled(mv: ModelVersion, objects: Iterable[Mapping[str, Any]]) -> Mapping[str, Any] | None:
    """The highest version below ``mv`` and above its predecessor that has not settled yet
    (not verified, or waiting itself): it may become the predecessor. None: nothing to wait for."""
    for _, obj in _below(mv.spec.model, mv.spec.version, mv.metadata.uid, objects):
        if _usable(obj):
            return None
        if not _settled(obj):
            return obj
    return None


def _settled(obj: Mapping[str, Any]) -> bool:
    status, meta = obj.get("status") or {}, obj.get("metadata") or {}
    return status.get("phase") in _SETTLED and status.get("observedGeneration") in (
        None,
        meta.get("generation"),
    )


def label(obj: Mapping[str, Any]) -> str:
    """``name@version`` of a ModelVersion object."""
    return f"{(obj.get('metadata') or {}).get('name')}@{(obj.get('spec') or {}).get('version')}"


@dataclass(frozen=True)
class Comparison:
    """The outcome of comparing a version with its predecessor (``base``: name@version)."""

    base: str | None = None
    verdict: Verdict | None = None
    #: Why no comparison could be made (a read failed); None when it was made or not needed.
    error: str | None = None
    #: An earlier version (name@version) not settled yet that may become the predecessor.
    waiting: str | None = None


def _differences(v: Verdict) -> str:
    text = "; ".join(str(d) for d in v.differences)
    return text if len(text) <= _MESSAGE_MAX else text[: _MESSAGE_MAX - 3] + "..."


def condition_of(c: Comparison, version: str) -> tuple[str, str, str]:
    """(status, reason, message) of ``InterfaceCompatible`` for a comparison of ``version``."""
    if c.waiting is not None:
        return (
            "Unknown",
            "WaitingForEarlierVersion",  # WAITING, spelled out for docs/troubleshooting.md's check
            f"{c.waiting} is not verified yet; the interface is compared once it is (it may be the "
            "version to compare with)",
        )
    if c.error is not None:
        return "Unknown", "ComparisonUnavailable", c.error
    if c.verdict is None or c.base is None:
        return "True", "NoEarlierVersion", "no Ready version of this model below it to compare with"
    old = c.base.rpartition("@")[2]
    v = c.verdict
    if v.ok:
        detail = f": {_differences(v)}" if v.differences else ": identical interfaces"
        return "True", "InterfaceMatchesVersion", f"compared with {c.base}: {v.explain(old, version)}{detail}"
    return (
        "False",
        "VersionContradictsInterface",
        f"compared with {c.base}: {v.explain(old, version)}: {_differences(v)}",
    )


async def compare(mv: ModelVersion, interface: Interface, ctx: context.Context) -> Comparison:
    """Compare ``mv`` (whose measured interface is ``interface``) with its predecessor."""
    from tinct.lineage.interfaces import recorded_interface

    loop = asyncio.get_running_loop()
    ns = mv.metadata.namespace or "default"
    try:
        objects = await loop.run_in_executor(ctx.io, ctx.status.list_objects, "modelversions", ns)
    except Exception as exc:
        return Comparison(error=f"could not list the ModelVersions of {ns} to compare with: {exc}")
    earlier = unsettled(mv, objects)
    if earlier is not None:
        return Comparison(waiting=label(earlier))
    base = predecessor(mv, objects)
    if base is None:
        return Comparison()
    meta, spec = base["metadata"], base["spec"]
    name = label(base)
    try:
        recorded = await loop.run_in_executor(
            ctx.io,
            lambda: recorded_interface(
                meta.get("name", ""), ctx.store.root, uid=meta.get("uid"), config=ctx.config.storage
            ),
        )
    except Exception as exc:
        return Comparison(
            base=name, error=f"could not read the interface of {name} from the lineage tables: {exc}"
        )
    return Comparison(
        base=name, verdict=verdict(str(spec.get("version")), mv.spec.version, recorded.interface, interface)
    )


def judged(
    st: ModelVersionStatus, comparison: Comparison | None, version: str, generation: int | None, now: datetime
) -> ModelVersionStatus:
    """The status of a verified, recorded version ``st`` held to ``comparison``: its phase
    (Ready, Misversioned, or Pending while it waits for an earlier version), message,
    ``InterfaceCompatible``, ``interface.comparedWith`` and ``Ready``."""
    files = st.artifacts or []
    phase: ModelVersionPhase = "Ready"
    message = f"{len(files)} file(s), {sum(a.size for a in files)} bytes verified"
    conds = st.conditions
    interface = st.interface
    if comparison is not None:
        status, reason, text = condition_of(comparison, version)
        why = Condition(
            type="InterfaceCompatible",
            status=status,
            reason=reason,
            message=text,
            observed_generation=generation,
        )
        conds = set_condition(conds, why, now)
        if status == "False":
            phase = "Misversioned"
            message = f"cannot be released as {version}: {text}"[:1024]
        elif comparison.waiting is not None:
            phase = "Pending"
            message = f"{message}; waiting for {comparison.waiting} to compare interfaces with"[:1024]
        if interface is not None:
            interface = interface.model_copy(update={"compared_with": comparison.base})
    update = {"phase": phase, "message": message, "conditions": conds, "interface": interface}
    return st.model_copy(update=update).with_ready(generation, now)


def _verified_here(obj: Mapping[str, Any]) -> bool:
    """Whether ``obj``'s status is a verdict on its current generation with an interface."""
    status, meta = obj.get("status") or {}, obj.get("metadata") or {}
    return (
        status.get("phase") in ("Ready", "Misversioned", "Pending")
        and status.get("observedGeneration") == meta.get("generation")
        and bool((status.get("interface") or {}).get("digest"))
        and not meta.get("deletionTimestamp")
    )


def _reason(obj: Mapping[str, Any]) -> str | None:
    conds = (obj.get("status") or {}).get("conditions") or []
    return next((c.get("reason") for c in conds if c.get("type") == "InterfaceCompatible"), None)


def to_compare_again(settled: Mapping[str, Any], objects: list[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The versions to compare again now that ``settled`` has settled: the later ones of its
    model it is now the predecessor of (compared with another or with nothing), and those
    waiting for an earlier version. Pure."""
    if not _settled(settled):
        return []
    uid = (settled.get("metadata") or {}).get("uid")
    out = []
    for obj in objects:
        if not _verified_here(obj) or (obj.get("metadata") or {}).get("uid") == uid:
            continue
        if _reason(obj) == WAITING:
            out.append(obj)
            continue
        spec = obj.get("spec") or {}
        below = _below(str(spec.get("model")), str(spec.get("version")), obj["metadata"].get("uid"), objects)
        base = next((o for _, o in below if _usable(o)), None)
        compared = ((obj.get("status") or {}).get("interface") or {}).get("comparedWith")
        if base is not None and base["metadata"].get("uid") == uid and compared != label(settled):
            out.append(obj)
    return out


async def compare_again(obj: Mapping[str, Any], ctx: context.Context) -> dict[str, Any] | None:
    """The status ``obj`` (a verified version) has when compared again from its recorded
    interface, as a merge patch guarded by its resourceVersion; None when nothing changes.

    Raises:
        Exception: its interface could not be read back from the lineage tables.
    """
    from tinct.lineage.interfaces import recorded_interface

    mv = ModelVersion.model_validate(obj)
    meta = obj["metadata"]
    recorded = await asyncio.get_running_loop().run_in_executor(
        ctx.io,
        lambda: recorded_interface(
            meta["name"], ctx.store.root, uid=meta.get("uid"), config=ctx.config.storage
        ),
    )
    old = mv.status or ModelVersionStatus()
    now = datetime.now(UTC)
    new = judged(
        old, await compare(mv, recorded.interface, ctx), mv.spec.version, mv.metadata.generation, now
    )
    fields = ("phase", "message", "conditions", "interface")
    if new.merge_patch(*fields) == old.merge_patch(*fields):
        return None
    return new.merge_patch(*fields)
