"""The GrayRelease state machine, as pure functions of the resource and what was observed.

Phases: ``Pending`` (preconditions not met, or not started) → ``Progressing`` at step *i*
→ ``Promoted``; or → ``RolledBack`` (failure limit reached, or aborted); ``Paused`` (by
``spec.paused`` or after too many inconclusive analyses); ``Failed`` for what cannot
proceed until the spec changes (the two ModelVersions are of different models).

:func:`decide` takes the GrayRelease (its status is the recorded state), the precondition
problems, an analysis result when one was due, and the manual action requested through the
:data:`ACTION_ANNOTATION`; it returns the next status and at most one :class:`Transition`.
Everything the controller does (routing table, HPAs, history row, Event) follows from that
decision, so an operator restarted at any point recomputes the same thing from the status.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Literal

from tinct.api.v1alpha1.common import Condition, set_condition
from tinct.api.v1alpha1.grayrelease import (
    AnalysisResult,
    CellMatch,
    GrayRelease,
    GrayReleasePhase,
    GrayReleaseSpec,
    GrayReleaseStatus,
    parse_duration,
)

__all__ = [
    "ACTIONS",
    "ACTION_ANNOTATION",
    "Decision",
    "Problem",
    "Transition",
    "analysis_due",
    "cell_key",
    "decide",
    "next_wakeup",
    "parse_duration",
    "preconditions",
    "weights_for",
]

#: Annotation carrying a manual request, ``<verb>@<nonce>``; a new nonce is a new request.
ACTION_ANNOTATION = "tinct.io/action"
ACTIONS = ("promote", "abort", "retry", "resume")

_SEMVER_MAJOR = re.compile(r"^v?([0-9]+)\.")


def cell_key(match: CellMatch) -> str:
    """A cell's name in status and history: its dye tag with ``*`` for what it does not fix."""

    def v(x: str | None) -> str:
        return x if x else "*"

    return f"len:{v(match.prompt_length)}+role:{v(match.role)}+latency:{v(match.latency)}"


@dataclass(frozen=True)
class Problem:
    """A precondition that does not hold; ``condition`` is the status condition it sets False."""

    condition: Literal["ModelVersionsReady", "BackendsAvailable"]
    reason: str
    message: str
    #: Cannot resolve without a spec change: the release fails instead of waiting.
    fatal: bool = False


@dataclass(frozen=True)
class Transition:
    """A change of phase or step: an Event, and a ``release_events`` row when ``record``."""

    reason: str
    message: str
    warning: bool = False
    record: bool = True


@dataclass
class Decision:
    status: GrayReleaseStatus
    transition: Transition | None = None


def _mv_summary(obj: dict[str, Any] | None) -> tuple[str | None, str | None, str | None]:
    if obj is None:
        return None, None, None
    spec = obj.get("spec") or {}
    status = obj.get("status") or {}
    return spec.get("model"), spec.get("version"), status.get("phase")


def preconditions(
    spec: GrayReleaseSpec,
    modelversions: dict[str, dict[str, Any] | None],
    services: dict[str, bool],
    deployments: dict[str, bool],
) -> list[Problem]:
    """What keeps ``spec`` from progressing, given the objects found (None / False: absent)."""
    out: list[Problem] = []
    sides = (("stable", spec.stable), ("candidate", spec.candidate))
    found: dict[str, tuple[str | None, str | None, str | None]] = {}
    for side, backend in sides:
        obj = modelversions.get(backend.model_version)
        if obj is None:
            out.append(
                Problem(
                    "ModelVersionsReady",
                    "ModelVersionMissing",
                    f"{side} ModelVersion {backend.model_version} does not exist; apply it",
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
                )
            )
    if len(found) == 2:
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
    for side, backend in sides:
        if not services.get(backend.service, False):
            out.append(
                Problem(
                    "BackendsAvailable", "ServiceMissing", f"{side} Service {backend.service} does not exist"
                )
            )
        if backend.deployment and not deployments.get(backend.deployment, False):
            out.append(
                Problem(
                    "BackendsAvailable",
                    "DeploymentMissing",
                    f"{side} Deployment {backend.deployment} does not exist",
                )
            )
    return out


def _major(version: str | None) -> int | None:
    m = _SEMVER_MAJOR.match(version or "")
    return int(m.group(1)) if m else None


def weights_for(spec: GrayReleaseSpec, phase: str, step: int, started: bool) -> dict[str, float]:
    """The weight of every cell in force for a release in ``phase`` at ``step``."""
    out: dict[str, float] = {}
    for cell in spec.cells:
        if phase in ("RolledBack", "Failed") or not started:
            w = 0.0
        elif phase == "Promoted":
            w = 100.0
        else:
            w = cell.weights[min(step, len(cell.weights) - 1)]
        out[cell_key(cell.match)] = w
    return out


def _steps(spec: GrayReleaseSpec) -> int:
    return len(spec.cells[0].weights)


def analysis_due(release: GrayRelease, now: datetime) -> bool:
    """Whether a Progressing release's current step is due for an analysis (or, without
    analysis, for the next step)."""
    st = release.status
    if st is None or st.phase != "Progressing" or st.step_started_at is None:
        return False
    return now >= _due_at(release)


def _due_at(release: GrayRelease) -> datetime:
    st = release.status or GrayReleaseStatus()
    if st.step_started_at is None:
        raise ValueError("the release has not started")
    interval = timedelta(
        seconds=parse_duration(release.spec.analysis.interval if release.spec.analysis else "1m")
    )
    last = st.step_started_at
    if st.last_analysis is not None and st.last_analysis.time > last:
        last = st.last_analysis.time
    return last + interval


def next_wakeup(release: GrayRelease, now: datetime, tick: float) -> float:
    """Seconds until the controller should look at ``release`` again (at most ``tick``)."""
    st = release.status
    if st is None or st.phase != "Progressing" or st.step_started_at is None:
        return tick
    return max(0.05, min(tick, (_due_at(release) - now).total_seconds()))


def _parse_action(value: str | None) -> str | None:
    if not value:
        return None
    verb = value.split("@", 1)[0].strip().lower()
    return verb if verb in ACTIONS else ""


def decide(
    release: GrayRelease,
    *,
    problems: list[Problem],
    analysis: AnalysisResult | None,
    action: str | None,
    now: datetime,
) -> Decision:
    """The next status of ``release`` and the transition that leads there, if any."""
    spec = release.spec
    old = release.status or GrayReleaseStatus()
    st = old.model_copy(deep=True)
    st.observed_generation = release.metadata.generation
    st.conditions = _precondition_conditions(st.conditions, problems, release.metadata.generation, now)
    dec = _decide(release, st, problems, analysis, action, now)
    s = dec.status
    s.weights = weights_for(spec, s.phase, s.step, s.step_started_at is not None)
    if dec.transition is not None:
        s.message = dec.transition.message[:1024]
    return dec


def _precondition_conditions(
    conds: list[Condition], problems: list[Problem], gen: int | None, now: datetime
) -> list[Condition]:
    for ctype, ok_reason, ok_msg in (
        ("ModelVersionsReady", "Ready", "both ModelVersions are Ready and of the same model"),
        ("BackendsAvailable", "Found", "the Services and Deployments exist"),
    ):
        mine = [p for p in problems if p.condition == ctype]
        if mine:
            new = Condition(
                type=ctype,
                status="False",
                reason=mine[0].reason,
                message="; ".join(p.message for p in mine)[:32768],
                observed_generation=gen,
            )
        else:
            new = Condition(
                type=ctype, status="True", reason=ok_reason, message=ok_msg, observed_generation=gen
            )
        conds = set_condition(conds, new, now)
    return conds


def _enter(st: GrayReleaseStatus, phase: GrayReleasePhase, step: int, now: datetime) -> None:
    st.phase = phase
    st.step = step
    st.step_started_at = now


def _restart(st: GrayReleaseStatus) -> None:
    st.step = 0
    st.step_started_at = None
    st.failed_analyses = 0
    st.inconclusive_analyses = 0
    st.last_analysis = None
    st.pause_reason = None


def _decide(
    release: GrayRelease,
    st: GrayReleaseStatus,
    problems: list[Problem],
    analysis: AnalysisResult | None,
    action: str | None,
    now: datetime,
) -> Decision:
    spec = release.spec
    pair = f"{spec.stable.model_version} -> {spec.candidate.model_version}"
    if st.released != pair:
        was, st.released = st.released, pair
        if was is not None:
            _restart(st)
            st.phase = "Pending"
            return Decision(st, Transition("Restarted", f"{was} became {pair}: starting over from step 0"))
    started = st.step_started_at is not None
    if action and action != st.acknowledged_action:
        st.acknowledged_action = action
        done = _act(release, st, _parse_action(action), action, problems, now)
        if done is not None:
            return done

    fatal = [p for p in problems if p.fatal]
    if fatal:
        if st.phase == "Failed":
            return Decision(st)
        st.phase = "Failed"
        st.step_started_at = st.step_started_at or now
        return Decision(st, Transition("Failed", "; ".join(p.message for p in fatal), warning=True))
    if st.phase == "Failed":
        _restart(st)
        st.phase = "Pending"
        return Decision(st, Transition("Recovered", "the failed precondition holds now; starting over"))
    if st.phase in ("Promoted", "RolledBack"):
        return Decision(st)
    if problems:
        if st.phase == "Pending":
            return Decision(st)
        st.phase = "Pending"
        msg = "; ".join(p.message for p in problems)
        held = f"holding step {st.step}: " if started else ""
        return Decision(st, Transition("Waiting", held + msg, warning=True))
    if spec.paused or st.pause_reason:
        if st.phase == "Paused":
            return Decision(st)
        st.phase = "Paused"
        why = "spec.paused is true" if spec.paused else st.pause_reason or ""
        return Decision(st, Transition("Paused", f"paused at step {st.step}: {why}"))
    if st.phase != "Progressing":
        was = st.phase
        _enter(st, "Progressing", st.step, now)
        if not started:
            return Decision(st, Transition("Started", f"step 0 of {_steps(spec)}"))
        return Decision(st, Transition("Resumed", f"{was} -> Progressing at step {st.step}"))

    if spec.analysis is None or not spec.analysis.metrics:
        if analysis_due(release, now):
            return _advance(spec, st, now, "no analysis configured")
        return Decision(st)
    if analysis is None:
        return Decision(st)
    return _judge(spec, st, analysis, now)


def _act(
    release: GrayRelease,
    st: GrayReleaseStatus,
    verb: str | None,
    raw: str,
    problems: list[Problem],
    now: datetime,
) -> Decision | None:
    """Carry out a manual request; None when it leaves the rest of the decision to run."""
    if verb == "":
        return Decision(
            st,
            Transition(
                "ActionIgnored",
                f"{ACTION_ANNOTATION}={raw!r}: use one of {', '.join(ACTIONS)} as <verb>@<nonce>",
                warning=True,
                record=False,
            ),
        )
    if verb == "abort":
        if st.phase in ("RolledBack", "Promoted"):
            return Decision(st, Transition("ActionIgnored", f"abort: release is {st.phase}", record=False))
        return _rollback(
            st, now, "Aborted", f"aborted by request at step {st.step}; stable serves everything"
        )
    if verb == "promote":
        if st.phase in ("RolledBack", "Promoted", "Failed") or problems:
            why = st.phase if not problems else "; ".join(p.message for p in problems)
            return Decision(st, Transition("ActionIgnored", f"promote: {why}", warning=True, record=False))
        _enter(st, "Promoted", _steps(release.spec) - 1, now)
        st.pause_reason = None
        return Decision(st, Transition("Promoted", "promoted by request: every cell at 100"))
    if verb == "retry":
        if st.phase not in ("RolledBack", "Failed"):
            return Decision(st, Transition("ActionIgnored", f"retry: release is {st.phase}", record=False))
        _restart(st)
        st.phase = "Pending"
        return Decision(st, Transition("Retried", "retry requested: starting over from step 0"))
    if verb == "resume":
        st.pause_reason = None
    return None


def _rollback(st: GrayReleaseStatus, now: datetime, reason: str, message: str) -> Decision:
    _enter(st, "RolledBack", st.step, now)
    st.pause_reason = None
    return Decision(st, Transition(reason, message, warning=True))


def _advance(spec: GrayReleaseSpec, st: GrayReleaseStatus, now: datetime, why: str) -> Decision:
    last = _steps(spec) - 1
    was = st.step
    nxt = was + 1
    all_full = all(c.weights[-1] >= 100 for c in spec.cells)
    if nxt > last or (nxt == last and all_full):
        _enter(st, "Promoted", min(nxt, last), now)
        return Decision(st, Transition("Promoted", f"promoted after step {was}: {why}"))
    _enter(st, "Progressing", nxt, now)
    return Decision(st, Transition("StepAdvanced", f"step {nxt} of {last + 1}: {why}"))


def _judge(spec: GrayReleaseSpec, st: GrayReleaseStatus, result: AnalysisResult, now: datetime) -> Decision:
    assert spec.analysis is not None
    st.last_analysis = result.model_copy(update={"step": st.step})
    gen = st.observed_generation
    summary = result.message or ", ".join(
        f"{m.name}={'n/a' if m.value is None else f'{m.value:.4g}'} ({m.verdict})" for m in result.metrics
    )
    if result.verdict == "Pass":
        st.inconclusive_analyses = 0
        st.conditions = set_condition(
            st.conditions,
            Condition(
                type="AnalysisPassing",
                status="True",
                reason="Passed",
                message=summary,
                observed_generation=gen,
            ),
            now,
        )
        return _advance(spec, st, now, f"analysis passed: {summary}")
    if result.verdict == "Fail":
        st.inconclusive_analyses = 0
        st.failed_analyses += 1
        limit = max(1, spec.analysis.failure_limit)
        st.conditions = set_condition(
            st.conditions,
            Condition(
                type="AnalysisPassing",
                status="False",
                reason="Failed",
                message=f"{st.failed_analyses}/{limit} failed: {summary}",
                observed_generation=gen,
            ),
            now,
        )
        if st.failed_analyses >= limit:
            return _rollback(
                st,
                now,
                "RolledBack",
                f"rolled back at step {st.step} after {st.failed_analyses} failed analyses: {summary}",
            )
        return Decision(
            st,
            Transition(
                "AnalysisFailed", f"analysis {st.failed_analyses}/{limit} failed: {summary}", True, False
            ),
        )
    st.inconclusive_analyses += 1
    st.conditions = set_condition(
        st.conditions,
        Condition(
            type="AnalysisPassing",
            status="Unknown",
            reason="Inconclusive",
            message=f"holding step {st.step} ({st.inconclusive_analyses}/{spec.analysis.inconclusive_limit} "
            f"inconclusive): {summary}",
            observed_generation=gen,
        ),
        now,
    )
    if st.inconclusive_analyses >= spec.analysis.inconclusive_limit:
        st.pause_reason = f"{st.inconclusive_analyses} inconclusive analyses in a row: {summary}"[:1024]
        st.phase = "Paused"
        return Decision(
            st,
            Transition(
                "Paused",
                f"paused at step {st.step}: {st.pause_reason}; `tinct release resume` continues",
                True,
            ),
        )
    return Decision(st)
