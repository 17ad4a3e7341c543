"""Holding a ModelVersion's declared version to its interface.

A verified version is compared with its **predecessor**: the highest ``Ready`` version of
the same model in the same namespace below it in semver order (:func:`predecessor`, pure).
The predecessor's interface is read back from the lineage ``interfaces`` table (what the
operator measured when it verified it), and :func:`tinct.artifacts.contract.verdict` says
whether the declared step allows the differences. :func:`compare` does the reads;
:func:`condition_of` turns the outcome into the ``InterfaceCompatible`` condition.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from tinct.api.v1alpha1.modelversion import ModelVersion
from tinct.artifacts.contract import Verdict, verdict
from tinct.artifacts.interface import Interface
from tinct.operator import context

__all__ = ["Comparison", "compare", "condition_of", "predecessor", "semver_key"]

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


def predecessor(mv: ModelVersion, objects: Iterable[Mapping[str, Any]]) -> Mapping[str, Any] | None:
    """The highest Ready version of ``mv``'s model below ``mv.spec.version``, with an interface."""
    mine = semver_key(mv.spec.version)
    if mine is None:
        return None
    best: tuple[tuple[Any, ...], Mapping[str, Any]] | None = None
    for obj in objects:
        spec, status, meta = obj.get("spec") or {}, obj.get("status") or {}, obj.get("metadata") or {}
        if meta.get("uid") == mv.metadata.uid or spec.get("model") != mv.spec.model:
            continue
        if status.get("phase") != "Ready" or not (status.get("interface") or {}).get("digest"):
            continue
        key = semver_key(str(spec.get("version", "")))
        if key is None or key >= mine:
            continue
        if best is None or key > best[0]:
            best = (key, obj)
    return best[1] if best else None


@dataclass(frozen=True)
class Comparison:
    """The outcome of comparing a version with its predecessor (``base``: name@version)."""

    base: str | None = None
    verdict: Verdict | None = None
    #: Why no comparison could be made (a read failed); None when it was made or not needed.
    error: str | None = None


def _differences(v: Verdict) -> str:
    text = "; ".join(str(d) for d in v.differences)
    return text if len(text) <= _MESSAGE_MAX else text[: _MESSAGE_MAX - 3] + "..."


def condition_of(c: Comparison, version: str) -> tuple[str, str, str]:
    """(status, reason, message) of ``InterfaceCompatible`` for a comparison of ``version``."""
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
    base = predecessor(mv, objects)
    if base is None:
        return Comparison()
    meta, spec = base["metadata"], base["spec"]
    label = f"{meta.get('name')}@{spec.get('version')}"
    try:
        recorded = await loop.run_in_executor(
            ctx.io,
            lambda: recorded_interface(
                meta.get("name", ""), ctx.store.root, uid=meta.get("uid"), config=ctx.config.storage
            ),
        )
    except Exception as exc:
        return Comparison(
            base=label, error=f"could not read the interface of {label} from the lineage tables: {exc}"
        )
    return Comparison(
        base=label, verdict=verdict(str(spec.get("version")), mv.spec.version, recorded.interface, interface)
    )
