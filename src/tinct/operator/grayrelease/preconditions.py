"""What keeps a GrayRelease from progressing, and whose problem it is; pure.

:func:`preconditions` reads the objects a release depends on (as the controller's watch
caches hold them) and names each that is missing or not ready, with the condition it sets
False and the side it belongs to: a problem on the candidate's side takes the candidate's
traffic away (:mod:`~tinct.operator.grayrelease.decide`), one on stable's holds the step.

Stable and candidate are also compared by interface (:mod:`tinct.artifacts.contract`): a
breaking difference needs ``spec.allowMajorUpgrade`` *and* a MAJOR step, and a candidate
whose version number contradicts its interface is refused, with the differences listed.
"""

from __future__ import annotations

import math
import re
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from tinct.api import ownership
from tinct.api.ownership import holders
from tinct.api.v1alpha1.grayrelease import GrayReleaseSpec
from tinct.artifacts.contract import verdict
from tinct.artifacts.interface import Interface

__all__ = ["Claim", "Party", "Problem", "Side", "model_conflict", "preconditions"]

_SEMVER_MAJOR = re.compile(r"^v?([0-9]+)\.")

Side = Literal["stable", "candidate"]
#: Whose problem a precondition is: a side's, or the release's own (e.g. its analysis).
Party = Literal["stable", "candidate", "release"]


@dataclass(frozen=True)
class Problem:
    """A precondition that does not hold; ``condition`` is the status condition it sets False."""

    condition: Literal["ModelVersionsReady", "BackendsAvailable", "AnalysisReady", "RouteAvailable"]
    reason: str
    message: str
    #: Cannot resolve without a spec change: the release fails instead of waiting.
    fatal: bool = False
    #: Whose problem it is; a candidate problem takes the candidate's traffic away.
    side: Party = "candidate"


def _mv_summary(obj: Mapping[str, Any] | None) -> tuple[str | None, str | None, str | None]:
    if obj is None:
        return None, None, None
    spec = obj.get("spec") or {}
    status = obj.get("status") or {}
    return spec.get("model"), spec.get("version"), status.get("phase")


def preconditions(
    spec: GrayReleaseSpec,
    modelversions: Mapping[str, Mapping[str, Any] | None],
    services: Mapping[str, bool],
    deployments: Mapping[str, bool],
    interfaces: Mapping[str, Interface | None] | None = None,
    service_ports: Mapping[str, Collection[int]] | None = None,
) -> list[Problem]:
    """What keeps ``spec`` from progressing, given the objects found (None / False: absent).

    ``interfaces`` holds the recorded interface of a ModelVersion (by name) whenever the
    two sides' ``status.interface.digest`` differ; None for one that could not be read.
    ``service_ports`` holds the ports of each Service found (a side routed through its
    Service must name one of them; a side with a ``url`` is not).
    """
    out: list[Problem] = []
    sides: tuple[tuple[Side, Any], ...] = (("stable", spec.stable), ("candidate", spec.candidate))
    found: dict[str, tuple[str | None, str | None, str | None]] = {}
    for side, backend in sides:
        obj = modelversions.get(backend.model_version)
        if obj is None:
            out.append(
                Problem(
                    "ModelVersionsReady",
                    "ModelVersionMissing",
                    f"{side} ModelVersion {backend.model_version} does not exist; apply it",
                    side=side,
                )
            )
            continue
        found[side] = _mv_summary(obj)
        phase = found[side][2]
        if phase != "Ready":
            out.append(
                Problem(
                    "ModelVersionsReady",
                    "ModelVersionNotReady",
                    f"{side} ModelVersion {backend.model_version} is {phase or 'Pending'}, not Ready",
                    side=side,
                )
            )
    if len(found) == 2 and spec.candidate.adapter is not None:
        problem = _adapter_base_problem(spec, modelversions)
        if problem is not None:
            out.append(problem)
    elif len(found) == 2:
        (sm, sv, _), (cm, cv, _) = found["stable"], found["candidate"]
        if sm != cm:
            out.append(
                Problem(
                    "ModelVersionsReady",
                    "DifferentModels",
                    f"stable is model {sm!r} but candidate is {cm!r}; a release moves traffic between "
                    "versions of one model: fix spec.stable/candidate.modelVersion",
                    fatal=True,
                )
            )
        else:
            smaj, cmaj = _major(sv), _major(cv)
            if smaj is not None and cmaj is not None and smaj != cmaj and not spec.allow_major_upgrade:
                out.append(
                    Problem(
                        "ModelVersionsReady",
                        "MajorUpgradeNotAllowed",
                        f"{sv} -> {cv} changes the MAJOR version (an API break); "
                        "set spec.allowMajorUpgrade: true to release it",
                    )
                )
            problem = _interface_problem(spec, modelversions, interfaces or {}, sv, cv)
            if problem is not None:
                out.append(problem)
    for side, backend in sides:
        ports = (service_ports or {}).get(backend.service)
        if not services.get(backend.service, False):
            out.append(
                Problem(
                    "BackendsAvailable",
                    "ServiceMissing",
                    f"{side} Service {backend.service} does not exist; create it, or fix spec.{side}.service",
                    side=side,
                )
            )
        elif ports is not None and backend.url is None and backend.port not in ports:
            has = ", ".join(str(p) for p in sorted(ports)) or "none"
            out.append(
                Problem(
                    "BackendsAvailable",
                    "ServicePortMissing",
                    f"{side} Service {backend.service} has no port {backend.port} (its ports: {has}); "
                    f"fix spec.{side}.port or the Service",
                    side=side,
                )
            )
        if backend.deployment and not deployments.get(backend.deployment, False):
            out.append(
                Problem(
                    "BackendsAvailable",
                    "DeploymentMissing",
                    f"{side} Deployment {backend.deployment} does not exist",
                    side=side,
                )
            )
    return out


def _adapter_base_problem(
    spec: GrayReleaseSpec, modelversions: Mapping[str, Mapping[str, Any] | None]
) -> Problem | None:
    """An adapter candidate runs on stable's pods: it must be an adapter of stable's ModelVersion."""
    name = spec.candidate.model_version
    adapter = ((modelversions.get(name) or {}).get("spec") or {}).get("adapter")
    base = adapter.get("baseModelVersion") if isinstance(adapter, Mapping) else None
    if base == spec.stable.model_version:
        return None
    what = f"an adapter of ModelVersion {base}" if base else "not a LoRA adapter (no spec.adapter)"
    return Problem(
        "ModelVersionsReady",
        "NotAnAdapterOfStable",
        f"candidate.adapter names ModelVersion {name}, {what}; it is loaded on stable's pods, so it "
        f"must be an adapter of stable's ModelVersion {spec.stable.model_version}",
        fatal=True,
    )


@dataclass(frozen=True)
class Claim:
    """A routing table (live or standing) found in the table namespace, and what it claims."""

    config_map: str
    created: float
    namespace: str
    release: str
    uid: str | None
    models: tuple[str, ...]
    standing: bool = False
    #: Model -> an earlier claim the table carries over (:mod:`tinct.api.ownership`).
    claimed: Mapping[str, float] = field(default_factory=dict)

    @property
    def key(self) -> str:
        return self.config_map

    def since(self, model: str) -> float:
        return ownership.since(self.claimed, self.created, model)


def model_conflict(
    uid: str | None,
    namespace: str,
    config_map: str,
    created: float | None,
    models: Sequence[str],
    claims: Sequence[Claim],
    owners: Mapping[str, str] | None = None,
    claimed: Mapping[str, float] | None = None,
) -> Problem | None:
    """The model this release's table cannot have, by the routers' rule
    (:mod:`tinct.api.ownership`): it belongs to another namespace (one ``owners`` gives it, or
    the one that first routed it, live or standing), or an older live release of this
    namespace serves it. ``created`` is None while this release has no table yet; ``claimed``
    the earlier claims its table carries over.
    """
    at = created if created is not None else math.inf
    mine = Claim(config_map, at, namespace, "", uid, tuple(models), claimed=dict(claimed or {}))
    others = [c for c in claims if c.uid != uid and c.config_map != config_map]
    owners = owners or {}
    served = holders([*others, mine], owners)
    for model in sorted(set(models)):
        holder = served.get(model)
        if holder is mine:
            continue
        return Problem(
            "RouteAvailable", "ModelConflict", _taken(model, namespace, holder, owners), side="release"
        )
    return None


def _taken(model: str, namespace: str, holder: Claim | None, owners: Mapping[str, str]) -> str:
    """Why the routers give ``model`` to ``holder`` (None: to no table) and not to this release."""
    if holder is not None and holder.namespace == namespace:
        return (
            f"model {model} is served by GrayRelease {holder.namespace}/{holder.release}, an older "
            "release: routers serving both tables follow that one until it is deleted; give this one "
            "other models (spec.models), or routers of its own"
        )
    if holder is None:
        why = f"model {model} belongs to namespace {owners.get(model)} (the operator's --model-owner)"
    else:
        how = "given it by the operator's --model-owner" if model in owners else "which routed it first"
        what = "the standing route of its deleted GrayRelease" if holder.standing else "GrayRelease"
        who = f"{what} {holder.namespace}/{holder.release}"
        why = f"model {model} belongs to namespace {holder.namespace}, {how} ({who})"
    return (
        f"{why}: routers never give it to a release of another namespace; give this one other "
        "models (spec.models), or ask a cluster administrator to give the model to this namespace "
        "(--model-owner)"
    )


def _digest(obj: Mapping[str, Any] | None) -> str | None:
    iface = ((obj or {}).get("status") or {}).get("interface") or {}
    digest = iface.get("digest")
    return str(digest) if digest else None


def _interface_problem(
    spec: GrayReleaseSpec,
    modelversions: Mapping[str, Mapping[str, Any] | None],
    interfaces: Mapping[str, Interface | None],
    sv: str | None,
    cv: str | None,
) -> Problem | None:
    """The refusal of a candidate whose version number does not allow its interface change."""
    stable, candidate = spec.stable.model_version, spec.candidate.model_version
    sd, cd = _digest(modelversions.get(stable)), _digest(modelversions.get(candidate))
    if sd is None or cd is None or sd == cd:
        return None  # equal interfaces, or versions recorded before interfaces were
    si, ci = interfaces.get(stable), interfaces.get(candidate)
    if si is None or ci is None:
        missing = stable if si is None else candidate
        return Problem(
            "ModelVersionsReady",
            "InterfaceNotRecorded",
            f"the interface of ModelVersion {missing} cannot be read from the lineage tables yet; "
            "the release waits to compare stable and candidate",
        )
    v = verdict(sv or "", cv or "", si, ci)
    listed = "; ".join(str(d) for d in v.differences)
    if len(listed) > 4000:
        listed = listed[:3997] + "..."
    if v.breaking and not (spec.allow_major_upgrade and v.declared == "major"):
        need = (
            "set spec.allowMajorUpgrade: true to release it"
            if v.declared == "major"
            else "publish the candidate as a new MAJOR version and set spec.allowMajorUpgrade: true"
        )
        return Problem(
            "ModelVersionsReady",
            "BreakingInterfaceChange",
            f"{sv} -> {cv} breaks the interface ({need}): {listed}",
        )
    if not v.ok:
        return Problem(
            "ModelVersionsReady",
            "VersionContradictsInterface",
            f"{v.explain(sv or '', cv or '')}: {listed}",
        )
    return None


def _major(version: str | None) -> int | None:
    m = _SEMVER_MAJOR.match(version or "")
    return int(m.group(1)) if m else None
