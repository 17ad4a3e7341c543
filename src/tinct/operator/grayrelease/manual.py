"""Manual actions: the ``tinct.io/action`` requests a round carries out or refuses.

A request that must not be replayed is refused with the reason the annotation's contract
gives (:func:`~tinct.api.v1alpha1.action.replay_refusal`); the rest are carried out in the
order they were given, each once: ``abort`` rolls back, ``promote`` decides the promotion
(which waits for the candidate's replicas like any step), ``retry`` starts a rolled-back or
failed release over as a new attempt, ``resume`` lifts a pause the operator made. Each
outcome is recorded in ``status.lastAction``, and a refusal is a Warning Event; a refusal
leaves ``status.message`` alone, which goes on saying where the release is. On a final release
every action but the ``retry`` of a rolled-back one is refused
(:func:`~tinct.api.v1alpha1.action.final_refusal`).
"""

from __future__ import annotations

from tinct.api.v1alpha1.action import (
    ACTION_ANNOTATION,
    SEEN_ACTIONS,
    final_refusal,
    parse_action,
    replay_refusal,
)
from tinct.api.v1alpha1.grayrelease import ActionRecord, ActionResult
from tinct.operator.grayrelease.decision import Transition
from tinct.operator.grayrelease.round import Round

__all__ = ["handle"]


def handle(r: Round, value: str, at_creation: bool) -> None:
    """Carry out the request ``value``, or refuse it; either way record what became of it."""
    st = r.st
    if value == st.acknowledged_action:
        return
    request = parse_action(value)
    why = replay_refusal(request, at_creation=at_creation, seen=st.seen_actions, attempt=st.attempt)
    if why is not None:
        _settle(r, value, "Refused", why)
    else:
        assert request.verb is not None
        _carry_out(r, value, request.verb)


def _settle(r: Round, value: str, result: ActionResult, message: str) -> None:
    st = r.st
    st.acknowledged_action = value
    st.last_action = ActionRecord(value=value, result=result, message=message[:1024], time=r.now)
    st.seen_actions = [*[v for v in st.seen_actions if v != value], value][-SEEN_ACTIONS:]
    if result == "Refused":
        r.emit(
            Transition(
                "ActionRefused",
                f"{ACTION_ANNOTATION}={value}: {message}"[:1024],
                warning=True,
                record=False,
                informs=False,
            )
        )


def _carry_out(r: Round, value: str, verb: str) -> None:
    st = r.st
    phase = st.phase
    final = final_refusal(verb, phase)
    if final is not None:
        _settle(r, value, "Refused", final)
        return
    if verb == "abort":
        _settle(r, value, "Done", f"aborted at step {r.label()}")
        r.emit(r.rollback("Aborted", f"aborted by request at step {r.label()}; stable serves everything"))
    elif verb == "promote":
        problems = [p.message for p in r.inputs.problems]
        if phase == "Failed":
            _settle(r, value, "Refused", f"the release is {phase}")
            return
        if problems:
            _settle(r, value, "Refused", "; ".join(problems))
            return
        st.next_step = r.n
        st.pause_reason = None
        _settle(
            r, value, "Done", "promotion requested: every cell goes to 100 once the candidate can take it"
        )
    elif verb == "retry":
        if phase not in ("RolledBack", "Failed"):
            _settle(r, value, "Refused", f"only a rolled-back or failed release is retried; it is {phase}")
            return
        r.restart()
        _settle(r, value, "Done", f"starting over from step 1/{r.n} as attempt {st.attempt}")
        r.emit(Transition("Retried", f"retry requested: starting over from step 1/{r.n}"))
    else:  # resume
        st.pause_reason = None
        st.inconclusive_analyses = 0
        st.blocked_since = None
        _settle(r, value, "Done", "resumed")
