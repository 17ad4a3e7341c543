"""One decision in the making: the working copy of the status and the moves every rule uses.

A :class:`Round` holds the status as recorded (``old``), the copy the decision changes
(``st``), the transitions so far, and what the round has concluded (the candidate withdrawn,
why the release is held, the capacity it needs). Its moves — enter a phase, start over, be
held (with the progress deadline), roll back, wait — are the vocabulary of
:mod:`~tinct.operator.grayrelease.decide`; its questions (:meth:`Round.short_of`, :meth:`Round.label`)
change nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from tinct.api.v1alpha1.action import FINAL_PHASES
from tinct.api.v1alpha1.common import Condition, set_condition
from tinct.api.v1alpha1.grayrelease import GrayRelease, GrayReleasePhase, GrayReleaseStatus
from tinct.operator.grayrelease.decision import Inputs, Transition
from tinct.operator.grayrelease.shares import needed, share_at, steps_of

__all__ = ["FINAL", "Round", "Shortfall"]

#: Phases that change only by a person's act or a change of what is released.
FINAL = FINAL_PHASES


def _fmt(v: float) -> str:
    return f"{v:g}"


@dataclass(frozen=True)
class Shortfall:
    """The candidate's capacity for a step: the ``CapacityReady`` condition it makes, and what
    it lacks (None: nothing)."""

    condition: Condition
    missing: str | None


class Round:
    """One decision: the working copy of the status and what the round has concluded."""

    def __init__(self, release: GrayRelease, inputs: Inputs) -> None:
        self.release = release
        self.spec = release.spec
        self.inputs = inputs
        self.now = inputs.now
        self.old = release.status or GrayReleaseStatus()
        self.st = self.old.model_copy(deep=True)
        self.n = steps_of(self.spec)
        self.out: list[Transition] = []
        #: Where the release stood right after each transition (by ``id``): its history row says that.
        self.at: dict[int, tuple[GrayReleasePhase, int, datetime | None]] = {}
        #: The candidate is unavailable this round: it serves nothing.
        self.withdrawn = False
        #: Why the release is held this round (for the progress deadline's message).
        self.held: str | None = None
        #: The capacity condition of this round, if it says anything.
        self.capacity: Condition | None = None

    # --- questions ---------------------------------------------------------------------------

    def label(self, step: int | None = None) -> str:
        """``step`` (default: the current one) as people read it: ``2/4``."""
        s = self.st.step if step is None else step
        return f"{min(s, self.n - 1) + 1}/{self.n}"

    def short_of(self, step: int) -> Shortfall:
        """What the candidate lacks to take the share of ``step``."""
        available = self.inputs.capacity.candidate_available
        dep = self.spec.candidate.deployment
        share = share_at(self.spec, step)
        need = needed(self.spec, self.st, share)
        ok = available is None or not dep or available >= need
        what = "promotion" if step >= self.n else f"step {self.label(step)}"
        condition = Condition(
            type="CapacityReady",
            status="True" if ok else "False",
            reason="ReplicasAvailable" if ok else "WaitingForReplicas",
            message=(
                f"candidate Deployment {dep}: {available} available, {need} needed for {what} ({_fmt(share)}%)"
                if dep and available is not None
                else "no candidate Deployment named: capacity is not checked"
            ),
            observed_generation=self.release.metadata.generation,
        )
        if ok:
            return Shortfall(condition, None)
        return Shortfall(
            condition,
            f"waiting for {need} available replicas of candidate Deployment {dep} "
            f"({available} now) before {what} sends it {_fmt(share)}%",
        )

    # --- moves ---------------------------------------------------------------------------------

    def record_capacity(self, step: int) -> str | None:
        """Make ``CapacityReady`` say whether the candidate can take ``step``; what it lacks."""
        short = self.short_of(step)
        self.capacity = short.condition
        return short.missing

    def emit(self, t: Transition) -> None:
        st = self.st
        self.out.append(t)
        self.at[id(t)] = (st.phase, st.step, st.step_started_at)

    def enter(self, phase: GrayReleasePhase, step: int) -> None:
        st = self.st
        st.phase = phase
        st.step = step
        st.step_started_at = self.now
        st.next_step = None
        st.blocked_since = None
        if st.routing is not None:
            st.routing.confirmed_at = None

    def restart(self) -> None:
        st = self.st
        st.phase = "Pending"
        st.step = 0
        st.step_started_at = None
        st.next_step = None
        st.failed_analyses = 0
        st.inconclusive_analyses = 0
        st.last_analysis = None
        st.pause_reason = None
        st.blocked_since = None
        st.stable_floor = None
        st.attempt += 1
        if st.routing is not None:
            st.routing.confirmed_at = None

    def block(self, why: str) -> Transition | None:
        """The release is held by ``why``; past the progress deadline it pauses or rolls back."""
        st = self.st
        self.held = why
        if st.blocked_since is None:
            st.blocked_since = self.now
        deadline = timedelta(seconds=self.spec.progress_deadline_seconds)
        if self.now - st.blocked_since < deadline:
            return None
        what = f"no progress for {self.spec.progress_deadline_seconds}s (progressDeadlineSeconds): {why}"
        if self.spec.progress_deadline_abort:
            return self.rollback("ProgressDeadlineExceeded", f"rolled back at step {self.label()}: {what}")
        st.pause_reason = what[:1024]
        st.phase = "Paused"
        st.blocked_since = None
        return Transition(
            "ProgressDeadlineExceeded",
            f"paused at step {self.label()}: {what}; fix it, then `tinct release resume`",
            warning=True,
        )

    def unblock(self) -> None:
        self.st.blocked_since = None

    def rollback(self, reason: str, message: str) -> Transition:
        st = self.st
        step = st.step
        self.enter("RolledBack", step)
        st.pause_reason = None
        return Transition(reason, message, warning=True)

    def wait(self, reason: str, message: str, *, warning: bool = False) -> Transition | None:
        """Pending (or staying Pending) for ``message``; an Event when the reason is new."""
        st = self.st
        said = st.message or ""
        same = st.phase == "Pending" and (said == message or said.endswith(": " + message))
        was = st.phase
        st.phase = "Pending"
        if same:
            return None
        return Transition(reason, message, warning=warning, record=was != "Pending")

    def condition(self, type_: str, status: str, reason: str, message: str, gen: int | None) -> None:
        self.st.conditions = set_condition(
            self.st.conditions,
            Condition(
                type=type_, status=status, reason=reason, message=message[:32768], observed_generation=gen
            ),
            self.now,
        )
