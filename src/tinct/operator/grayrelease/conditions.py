"""What a decided status says to people in its conditions; pure.

Two kinds: the conditions of what the round observed (:func:`observed`) — the preconditions
(``ModelVersionsReady``, ``BackendsAvailable``, ``AnalysisReady``), ``NotificationsReady``,
``RouteAvailable``, ``Bookkeeping`` and, after a tamper, ``StatusVerified`` — and the summary of where the release stands (:func:`summary`) —
``Ready``, ``Progressing`` and ``Degraded``, as ``kubectl wait`` and dashboards read them.
The conditions the rules themselves set (``CapacityReady``, ``AnalysisPassing``) are set where
the rule is, in :mod:`~tinct.operator.grayrelease.decide`.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from tinct.api.v1alpha1.common import Condition, set_condition
from tinct.api.v1alpha1.grayrelease import GrayReleaseSpec
from tinct.operator.grayrelease.decision import Transition
from tinct.operator.grayrelease.preconditions import Problem
from tinct.operator.grayrelease.round import Round
from tinct.operator.grayrelease.timing import has_metrics

__all__ = ["observed", "summary"]


def observed(r: Round) -> None:
    """Set the conditions of what the round observed; a Warning Event when an older release
    takes the model."""
    st, inputs, spec = r.st, r.inputs, r.spec
    gen = r.release.metadata.generation
    st.conditions = _preconditions(st.conditions, inputs.problems, gen, inputs.now, spec)
    if spec.notify:
        unknown = list(inputs.unknown_notifiers)
        st.conditions = set_condition(
            st.conditions,
            Condition(
                type="NotificationsReady",
                status="False" if unknown else "True",
                reason="NotifierUnknown" if unknown else "Configured",
                message=(
                    f"the operator has no notifier {', '.join(unknown)}: give it one with --notifier "
                    "(the chart's operator.notifiers), or fix spec.notify"
                    if unknown
                    else "every notifier of spec.notify is configured"
                ),
                observed_generation=gen,
            ),
            inputs.now,
        )
    _route(r, inputs.conflict, gen)
    _bookkeeping(r, inputs.bookkeeping, gen)
    if inputs.tampered is not None:
        r.condition("StatusVerified", "False", "StatusTampered", inputs.tampered, gen)
        r.emit(Transition("StatusTampered", inputs.tampered, warning=True, record=False))


def _preconditions(
    conds: list[Condition],
    problems: Sequence[Problem],
    gen: int | None,
    now: datetime,
    spec: GrayReleaseSpec | None = None,
) -> list[Condition]:
    analysis: tuple[str, str] = ("Configured", "the analysis can run as configured")
    if spec is not None and not has_metrics(spec):
        interval = spec.analysis.interval if spec.analysis else "1m"
        analysis = (
            "NoMetrics",
            f"analysis names no metrics: each step moves on after {interval} without judging the candidate",
        )
    for ctype, ok_reason, ok_msg in (
        ("ModelVersionsReady", "Ready", "both ModelVersions are Ready and of the same model"),
        ("BackendsAvailable", "Found", "the Services (with the ports named) and Deployments exist"),
        ("AnalysisReady", *analysis),
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


def _route(r: Round, conflict: str | None, gen: int | None) -> None:
    """``RouteAvailable``, and a Warning Event when an older release takes the model."""
    old = next((c for c in r.old.conditions if c.type == "RouteAvailable"), None)
    if conflict is None:
        r.condition(
            "RouteAvailable", "True", "ModelFree", "no older release serves this release's models", gen
        )
        return
    r.condition("RouteAvailable", "False", "ModelConflict", conflict, gen)
    if old is None or old.status != "False" or old.message != conflict:
        r.emit(Transition("ModelConflict", conflict, warning=True, record=False))


def _bookkeeping(r: Round, refused: str | None, gen: int | None) -> None:
    """``Bookkeeping=False`` while kopf's bookkeeping cannot be written; True once it can again
    (absent while it never failed)."""
    if refused is not None:
        r.condition("Bookkeeping", "False", "AnnotationsTooLarge", refused, gen)
    elif any(c.type == "Bookkeeping" for c in r.old.conditions):
        r.condition("Bookkeeping", "True", "Written", "kopf's bookkeeping is written again", gen)


def summary(r: Round, gen: int | None) -> None:
    """``Ready``, ``Progressing`` and ``Degraded``, as ``kubectl wait`` and dashboards read them."""
    st = r.st
    phase = st.phase
    msg = st.message or phase
    if phase == "Promoted":
        ready = ("True", "Promoted", "promoted: the candidate serves every cell")
    else:
        ready = ("False", phase, msg)
    if phase == "Progressing" and st.blocked_since is None and st.next_step is None:
        progressing = ("True", "StepInForce", f"step {r.label()}")
    elif phase == "Progressing":
        progressing = ("True", "Held", msg)
    else:
        progressing = ("False", phase, msg)
    last = r.out[-1].reason if r.out else None
    old = next((c for c in r.old.conditions if c.type == "Degraded"), None)
    if phase == "RolledBack":
        if last in ("Aborted", "ProgressDeadlineExceeded", "RolledBack"):
            degraded = ("True", last, msg)
        elif old is not None and old.status == "True":
            degraded = ("True", old.reason, old.message)
        else:
            degraded = ("True", "RolledBack", msg)
    elif phase == "Failed":
        degraded = ("True", "Failed", msg)
    elif r.withdrawn:
        degraded = ("True", "CandidateUnavailable", msg)
    else:
        degraded = ("False", "AsExpected", "no rollback, failure or unavailable candidate")
    for type_, (status, why, message) in (
        ("Ready", ready),
        ("Progressing", progressing),
        ("Degraded", degraded),
    ):
        r.condition(type_, status, why, message, gen)
    verified = next((c for c in r.old.conditions if c.type == "StatusVerified"), None)
    moved = r.inputs.tampered is None and any(t.record for t in r.out)
    if moved and verified is not None and verified.status == "False":
        # The release moved on by the operator's own decisions: its status is its record again.
        r.condition(
            "StatusVerified", "True", "Sealed", "every status since the tamper is the operator's", gen
        )
