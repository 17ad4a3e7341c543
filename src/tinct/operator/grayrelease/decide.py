"""The GrayRelease decision: the recorded status in, the next status out. Pure.

:func:`decide` takes the GrayRelease (its status is the state last *recorded*) and what one
round observed (:class:`Inputs`), and returns the next status with the transitions that led
there. The controller persists that status before it acts on it: the routing table, the
HPAs and the history all follow from the recorded status, so an operator restarted at any
point, or a round whose write failed, repeats the decision instead of making another.

The promise of a progressive-delivery tool is that traffic moves toward the candidate only
on evidence and away from it at once and for good when the evidence says so. Here is where
each part of it is kept:

- **Toward the candidate only on evidence** (:meth:`_Round.progress`, :meth:`_Round.apply_next`):
  a step's weights apply only after the previous step's analysis passed — judged over a
  window that starts once every router serves the step's table (``status.routing.confirmedAt``)
  — or, for a release without analysis metrics, after its interval; and only when the
  candidate Deployment has the available replicas the new share needs (:func:`needed`).
  Until then the decided step waits in ``status.nextStep`` and the weights stay.
- **Away at once** (:meth:`_Round.rollback`, :meth:`_Round.withdraw`): the failure limit, an
  abort or a progress deadline with ``progressDeadlineAbort`` roll back (every cell 0); a
  candidate whose ModelVersion is not Ready or gone, whose Service or Deployment is gone, or
  which has no available replica loses its traffic in the same decision, and the release
  does not advance while that lasts.
- **For good** (:meth:`_Round.machine`): ``Promoted`` and ``RolledBack`` change only by a
  person's act (``retry``) or a change of what is released (the ModelVersions, or any
  target: Service, port, Deployment, URL, scheduler version, ModelVersion digests, which
  start a new attempt at step 1). Precondition problems are reported on them, never acted on.
- **Never silently held** (:meth:`_Round.block`): a release that cannot progress
  (preconditions, capacity, routers, inconclusive analyses) for
  ``spec.progressDeadlineSeconds`` is paused, or rolled back with ``progressDeadlineAbort``.
- **Manual actions cannot replay** (:meth:`_Round.action`): a ``tinct.io/action`` value present
  when the release is created, one seen before, or one addressed to another attempt
  (``<verb>@a<attempt>-<nonce>``, as ``tinct release`` writes) is refused with a message
  (:func:`~tinct.api.v1alpha1.action.replay_refusal`, the annotation's contract); the rest
  are carried out in the order they were given, each once, and their outcome is recorded in
  ``status.lastAction``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from tinct.api.v1alpha1.action import ACTION_ANNOTATION, SEEN_ACTIONS, parse_action, replay_refusal
from tinct.api.v1alpha1.common import Condition, set_condition
from tinct.api.v1alpha1.grayrelease import (
    ActionRecord,
    ActionResult,
    AnalysisResult,
    GrayRelease,
    GrayReleasePhase,
    GrayReleaseSpec,
    GrayReleaseStatus,
    HistoryEntry,
    cell_key,
    parse_duration,
)
from tinct.api.v1alpha1.releasestatus import HISTORY_LIMIT
from tinct.operator.grayrelease.preconditions import Problem, preconditions
from tinct.operator.grayrelease.shares import needed, share_at, steps_of, weights_for

__all__ = [
    "Capacity",
    "Decision",
    "Inputs",
    "Problem",
    "Transition",
    "analysis_due",
    "cell_key",
    "decide",
    "needs_confirmation",
    "next_wakeup",
    "parse_duration",
    "preconditions",
]

_FINAL = ("Promoted", "RolledBack")


@dataclass(frozen=True)
class Capacity:
    """The replicas of the release's Deployments as last seen; None where a side names none."""

    candidate_available: int | None = None
    #: ``spec.replicas`` of stable's Deployment: its floor while the release runs.
    stable_replicas: int | None = None
    stable_available: int | None = None


@dataclass(frozen=True)
class Inputs:
    """What one round observed."""

    now: datetime
    problems: Sequence[Problem] = ()
    #: The analysis of the current step's window, when one was due and ran.
    analysis: AnalysisResult | None = None
    #: ``tinct.io/action`` values given since the last round, oldest first.
    actions: Sequence[str] = ()
    capacity: Capacity = field(default_factory=Capacity)
    #: Digest of what is released (:func:`~tinct.operator.grayrelease.tables.target_digest`);
    #: None while it cannot be known (a ModelVersion without digests yet).
    target: str | None = None
    #: The lowest routing-table version the routers serve (from their metrics); None: unknown.
    routers: int | None = None
    #: Webhooks ``spec.notify`` names that the operator is not configured with.
    unknown_notifiers: Sequence[str] = ()
    #: Why an older release's routing table keeps this release's model (routers that serve
    #: both follow that one); None: no conflict. Reported, not acted on: routers selecting
    #: one release's table each serve both.
    conflict: str | None = None


@dataclass(frozen=True)
class Transition:
    """A change worth an Event; a ``release_events`` row too when ``record``."""

    reason: str
    message: str
    warning: bool = False
    record: bool = True


@dataclass
class Decision:
    status: GrayReleaseStatus
    transitions: list[Transition] = field(default_factory=list)

    @property
    def transition(self) -> Transition | None:
        """The last transition of the round (the one that explains the status), if any."""
        return self.transitions[-1] if self.transitions else None


def _interval(release: GrayRelease) -> timedelta:
    analysis = release.spec.analysis
    return timedelta(seconds=parse_duration(analysis.interval if analysis else "1m"))


def _has_metrics(spec: GrayReleaseSpec) -> bool:
    return spec.analysis is not None and bool(spec.analysis.metrics)


def _running(st: GrayReleaseStatus) -> bool:
    return st.phase == "Progressing" and st.step_started_at is not None and st.next_step is None


def needs_confirmation(release: GrayRelease) -> bool:
    """Whether the routers must still be seen serving the step's table before its window starts."""
    st = release.status
    return (
        st is not None
        and _running(st)
        and _has_metrics(release.spec)
        and (st.routing is None or st.routing.confirmed_at is None)
    )


def _due_at(release: GrayRelease) -> datetime | None:
    st = release.status
    if st is None or not _running(st):
        return None
    assert st.step_started_at is not None
    start = st.step_started_at
    if _has_metrics(release.spec):
        if st.routing is None or st.routing.confirmed_at is None:
            return None
        start = max(start, st.routing.confirmed_at)
        if (
            st.last_analysis is not None
            and st.last_analysis.step == st.step
            and st.last_analysis.time > start
        ):
            start = st.last_analysis.time
    return start + _interval(release)


def analysis_due(release: GrayRelease, now: datetime) -> bool:
    """Whether the current step's window is complete: time to analyse (or, without analysis
    metrics, to move on)."""
    due = _due_at(release)
    return due is not None and now >= due


def next_wakeup(release: GrayRelease, now: datetime, tick: float) -> float:
    """Seconds until the controller should look at ``release`` again (at most ``tick``)."""
    due = _due_at(release)
    if due is None:
        return tick
    return max(0.05, min(tick, (due - now).total_seconds()))


def _fmt(v: float) -> str:
    return f"{v:g}"


class _Round:
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
        self.at: dict[int, tuple[GrayReleasePhase, int, datetime | None]] = {}
        #: The candidate is unavailable this round: it serves nothing.
        self.withdrawn = False
        #: Why the release is held this round (for the progress deadline's message).
        self.held: str | None = None
        #: The capacity condition of this round, if it says anything.
        self.capacity: Condition | None = None

    # --- helpers -----------------------------------------------------------------------

    def emit(self, t: Transition) -> None:
        st = self.st
        self.out.append(t)
        #: Where the release stood right after ``t``: its history row says that, not the end of the round.
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

    def label(self, step: int | None = None) -> str:
        s = self.st.step if step is None else step
        return f"{min(s, self.n - 1) + 1}/{self.n}"

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

    # --- its route -------------------------------------------------------------------------

    def route(self, conflict: str | None, gen: int | None) -> None:
        """``RouteAvailable``, and a Warning Event when an older release takes the model."""
        old = next((c for c in self.old.conditions if c.type == "RouteAvailable"), None)
        if conflict is None:
            self.condition(
                "RouteAvailable", "True", "ModelFree", "no older release serves this release's models", gen
            )
            return
        self.condition("RouteAvailable", "False", "ModelConflict", conflict, gen)
        if old is None or old.status != "False" or old.message != conflict:
            self.emit(Transition("ModelConflict", conflict, warning=True, record=False))

    # --- what is released ----------------------------------------------------------------

    def target(self) -> None:
        st, spec, inputs = self.st, self.spec, self.inputs
        pair = f"{spec.stable.model_version} -> {spec.candidate.model_version}"
        if st.released is None:
            st.released, st.target = pair, inputs.target
            st.attempt = max(st.attempt, 1)
            return
        changed: str | None = None
        if st.released != pair:
            changed = f"{st.released} became {pair}"
        elif inputs.target is not None and st.target is not None and inputs.target != st.target:
            changed = (
                "what is released changed (a Service, port, Deployment, URL, scheduler version "
                "or ModelVersion digest)"
            )
        if inputs.target is not None:
            st.target = inputs.target
        st.released = pair
        if changed is not None:
            self.restart()
            self.emit(Transition("Restarted", f"{changed}: starting over from step 1/{self.n}"))

    # --- manual actions ------------------------------------------------------------------

    def action(self, value: str, at_creation: bool) -> None:
        st = self.st
        if value == st.acknowledged_action:
            return
        request = parse_action(value)
        why = replay_refusal(request, at_creation=at_creation, seen=st.seen_actions, attempt=st.attempt)
        if why is not None:
            self.settle(value, "Refused", why)
        else:
            assert request.verb is not None
            self.carry_out(value, request.verb)

    def settle(self, value: str, result: ActionResult, message: str) -> None:
        st = self.st
        st.acknowledged_action = value
        st.last_action = ActionRecord(value=value, result=result, message=message[:1024], time=self.now)
        st.seen_actions = [*[v for v in st.seen_actions if v != value], value][-SEEN_ACTIONS:]
        if result == "Refused":
            self.emit(
                Transition(
                    "ActionRefused",
                    f"{ACTION_ANNOTATION}={value}: {message}"[:1024],
                    warning=True,
                    record=False,
                )
            )

    def carry_out(self, value: str, verb: str) -> None:
        st = self.st
        phase = st.phase
        if verb == "abort":
            if phase == "RolledBack":
                self.settle(value, "Refused", "the release is already rolled back")
                return
            if phase == "Promoted":
                self.settle(
                    value, "Refused", "the release is promoted; release stable again as a new candidate"
                )
                return
            self.settle(value, "Done", f"aborted at step {self.label()}")
            self.emit(
                self.rollback(
                    "Aborted", f"aborted by request at step {self.label()}; stable serves everything"
                )
            )
        elif verb == "promote":
            problems = [p.message for p in self.inputs.problems]
            if phase in (*_FINAL, "Failed"):
                self.settle(value, "Refused", f"the release is {phase}")
                return
            if problems:
                self.settle(value, "Refused", "; ".join(problems))
                return
            st.next_step = self.n
            st.pause_reason = None
            self.settle(
                value, "Done", "promotion requested: every cell goes to 100 once the candidate can take it"
            )
        elif verb == "retry":
            if phase not in ("RolledBack", "Failed"):
                self.settle(
                    value, "Refused", f"only a rolled-back or failed release is retried; it is {phase}"
                )
                return
            self.restart()
            self.settle(value, "Done", f"starting over from step 1/{self.n} as attempt {st.attempt}")
            self.emit(Transition("Retried", f"retry requested: starting over from step 1/{self.n}"))
        else:  # resume
            st.pause_reason = None
            st.inconclusive_analyses = 0
            st.blocked_since = None
            self.settle(value, "Done", "resumed")

    # --- the state machine ------------------------------------------------------------------

    def candidate_down(self) -> list[str]:
        """Why the candidate cannot serve now (empty: it can)."""
        why = [p.message for p in self.inputs.problems if p.side == "candidate" and not p.fatal]
        available = self.inputs.capacity.candidate_available
        if available is not None and available <= 0 and self.spec.candidate.deployment:
            why.append(f"candidate Deployment {self.spec.candidate.deployment} has no available replica")
        return why

    def machine(self) -> Transition | None:
        st, spec, inputs = self.st, self.spec, self.inputs
        if st.phase in _FINAL:
            return None
        fatal = [p for p in inputs.problems if p.fatal]
        if fatal:
            if st.phase == "Failed":
                return None
            st.phase = "Failed"
            st.next_step = None
            self.unblock()
            return Transition("Failed", "; ".join(p.message for p in fatal), warning=True)
        if st.phase == "Failed":
            self.restart()
            return Transition(
                "Recovered", f"the failed precondition holds now; starting over from step 1/{self.n}"
            )

        if st.stable_floor is None and inputs.capacity.stable_replicas is not None:
            # What stable served everything with before this attempt: kept until promotion.
            st.stable_floor = max(1, inputs.capacity.stable_replicas)
        started = st.step_started_at is not None
        serving = self.old.candidate_weight > 0
        down = self.candidate_down() if started or st.next_step is not None else []
        self.withdrawn = bool(down)
        promoting = st.next_step is not None and st.next_step >= self.n
        if (spec.paused or st.pause_reason) and not promoting:
            self.unblock()
            if down and serving:
                self.emit(self.lost(down))
            if st.phase == "Paused":
                return None
            st.phase = "Paused"
            why = "spec.paused is true" if spec.paused else st.pause_reason or ""
            return Transition("Paused", f"paused at step {self.label()}: {why}")
        if down:
            msg = "; ".join(down + [p.message for p in inputs.problems if p.side != "candidate"])
            t = self.lost(down) if serving else self.wait("CandidateUnavailable", msg, warning=True)
            if t is not None:
                st.phase = "Pending"
            return self.block(msg) or t
        if inputs.problems:
            msg = "; ".join(p.message for p in inputs.problems)
            held = f"holding step {self.label()}: " if started else ""
            reasons = {p.reason for p in inputs.problems}
            t = self.wait(reasons.pop() if len(reasons) == 1 else "Waiting", held + msg, warning=True)
            return self.block(msg) or t
        if st.next_step is not None:
            return self.apply_next("promotion requested" if promoting else "the candidate has its replicas")
        if not started:
            return self.start()
        if st.phase != "Progressing":
            return self.resume()
        return self.progress()

    def lost(self, down: list[str]) -> Transition:
        """The candidate, which had traffic, loses it at once."""
        return Transition(
            "CandidateUnavailable",
            f"the candidate lost its traffic at step {self.label()}: {'; '.join(down)}",
            warning=True,
        )

    def start(self) -> Transition | None:
        short = self.short_of(0)
        if short:
            t = self.wait("WaitingForCapacity", short)
            return self.block(short) or t
        self.enter("Progressing", 0)
        return Transition("Started", f"step 1/{self.n}")

    def resume(self) -> Transition | None:
        st = self.st
        was = st.phase
        short = self.short_of(st.step)
        if short:
            t = self.wait("WaitingForCapacity", f"holding step {self.label()}: {short}")
            return self.block(short) or t
        self.enter("Progressing", st.step)
        return Transition("Resumed", f"{was} -> Progressing at step {self.label()}")

    def short_of(self, step: int) -> str | None:
        """What the candidate lacks to take the share of ``step`` (None: nothing)."""
        available = self.inputs.capacity.candidate_available
        dep = self.spec.candidate.deployment
        share = share_at(self.spec, step)
        need = needed(self.spec, self.st, share)
        ok = available is None or not dep or available >= need
        what = "promotion" if step >= self.n else f"step {self.label(step)}"
        self.capacity = Condition(
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
            return None
        return (
            f"waiting for {need} available replicas of candidate Deployment {dep} "
            f"({available} now) before {what} sends it {_fmt(share)}%"
        )

    def progress(self) -> Transition | None:
        st, spec, inputs = self.st, self.spec, self.inputs
        # Reported only: a share already in force stays while the candidate keeps a replica.
        self.short_of(st.step)
        current = self.release.model_copy(update={"status": st})
        if not _has_metrics(spec):
            if analysis_due(current, self.now):
                interval = self.spec.analysis.interval if self.spec.analysis else "1m"
                return self.decide_next(
                    f"{interval} passed; no analysis metrics judge the candidate (analysis: {{}})"
                )
            return None
        if needs_confirmation(current):
            version = st.routing.version if st.routing else 0
            if st.routing is not None and inputs.routers is not None and inputs.routers >= version:
                st.routing.confirmed_at = self.now
                self.unblock()
                return None
            seen = (
                "no router exports it" if inputs.routers is None else f"the lowest seen is {inputs.routers}"
            )
            return self.block(f"the routers have not been seen serving table version {version} ({seen})")
        if inputs.analysis is None:
            return None
        return self.judge(inputs.analysis)

    def decide_next(self, why: str) -> Transition | None:
        st, spec = self.st, self.spec
        nxt = st.step + 1
        if nxt >= self.n - 1 and all(c.weights[-1] >= 100 for c in spec.cells):
            nxt = self.n  # the last step sends everything: that is the promotion
        st.next_step = min(nxt, self.n)
        return self.apply_next(why)

    def apply_next(self, why: str) -> Transition | None:
        st = self.st
        nxt = st.next_step
        assert nxt is not None
        short = self.short_of(nxt)
        if short:
            st.phase = "Progressing"
            blocked = self.block(short)
            if blocked is not None:
                return blocked
            if self.old.next_step == nxt and self.old.message == short:
                return None
            return Transition("WaitingForCapacity", short, record=False)
        was = st.step
        if nxt >= self.n:
            self.enter("Promoted", self.n - 1)
            st.pause_reason = None
            return Transition("Promoted", f"promoted after step {self.label(was)}: {why}")
        self.enter("Progressing", nxt)
        return Transition("StepAdvanced", f"step {self.label(nxt)}: {why}")

    def judge(self, result: AnalysisResult) -> Transition | None:
        st, spec = self.st, self.spec
        assert spec.analysis is not None
        st.last_analysis = result.model_copy(update={"step": st.step})
        gen = self.release.metadata.generation
        summary = result.message or ", ".join(
            f"{m.name}={'n/a' if m.value is None else f'{m.value:.4g}'} ({m.verdict})" for m in result.metrics
        )
        if result.verdict == "Pass":
            st.inconclusive_analyses = 0
            self.unblock()
            self.condition("AnalysisPassing", "True", "Passed", summary, gen)
            return self.decide_next(f"analysis passed: {summary}")
        if result.verdict == "Fail":
            st.inconclusive_analyses = 0
            self.unblock()
            st.failed_analyses += 1
            limit = max(1, spec.analysis.failure_limit)
            self.condition(
                "AnalysisPassing", "False", "Failed", f"{st.failed_analyses}/{limit} failed: {summary}", gen
            )
            if st.failed_analyses >= limit:
                return self.rollback(
                    "RolledBack",
                    f"rolled back at step {self.label()} after {st.failed_analyses} failed analyses: {summary}",
                )
            return Transition(
                "AnalysisFailed", f"analysis {st.failed_analyses}/{limit} failed: {summary}", True, False
            )
        st.inconclusive_analyses += 1
        limit = spec.analysis.inconclusive_limit
        self.condition(
            "AnalysisPassing",
            "Unknown",
            "Inconclusive",
            f"holding step {self.label()} ({st.inconclusive_analyses}/{limit} inconclusive): {summary}",
            gen,
        )
        if st.inconclusive_analyses >= limit:
            st.pause_reason = f"{st.inconclusive_analyses} inconclusive analyses in a row: {summary}"[:1024]
            st.phase = "Paused"
            self.unblock()
            return Transition(
                "Paused",
                f"paused at step {self.label()}: {st.pause_reason}; `tinct release resume` continues",
                True,
            )
        return self.block(f"analyses inconclusive: {summary}")

    def condition(self, type_: str, status: str, reason: str, message: str, gen: int | None) -> None:
        self.st.conditions = set_condition(
            self.st.conditions,
            Condition(
                type=type_, status=status, reason=reason, message=message[:32768], observed_generation=gen
            ),
            self.now,
        )

    # --- what follows from the decision ----------------------------------------------------

    def finish(self) -> Decision:
        st, spec = self.st, self.spec
        gen = self.release.metadata.generation
        st.observed_generation = gen
        st.weights = weights_for(spec, st, self.withdrawn)
        st.candidate_weight = max(st.weights.values(), default=0.0)
        st.progress = f"{self.n}/{self.n}" if st.phase == "Promoted" else self.label()
        if self.out:
            st.message = self.out[-1].message[:1024]
        elif self.held and st.phase == "Progressing":
            also = f"; {self.inputs.conflict}" if self.inputs.conflict else ""
            st.message = f"holding step {self.label()}: {self.held}{also}"[:1024]
        elif self.held and st.phase == "Pending":
            st.message = st.message or self.held[:1024]
        if self.capacity is not None:
            st.conditions = set_condition(st.conditions, self.capacity, self.now)
        self.summary_conditions(gen)
        for t in self.out:
            if t.record:
                self.history(t)
        return Decision(st, self.out)

    def history(self, t: Transition) -> None:
        st = self.st
        metrics: dict[str, float] = {}
        if st.last_analysis is not None:
            metrics = {
                m.name: m.value
                for m in st.last_analysis.metrics
                if m.value is not None and math.isfinite(m.value)
            }
        phase, step, started = self.at.get(id(t), (st.phase, st.step, st.step_started_at))
        then = st.model_copy(update={"phase": phase, "step": step, "step_started_at": started})
        last = t is self.out[-1]
        st.history = [
            *st.history,
            HistoryEntry(
                seq=st.transitions,
                reason=t.reason,
                message=t.message[:2000],
                phase=phase,
                step=step,
                weights=weights_for(self.spec, then, self.withdrawn and last),
                metrics=metrics,
                time=self.now,
            ),
        ][-HISTORY_LIMIT:]
        st.transitions += 1

    def summary_conditions(self, gen: int | None) -> None:
        """``Ready``, ``Progressing`` and ``Degraded``, as ``kubectl wait`` and dashboards read them."""
        st = self.st
        phase = st.phase
        msg = st.message or phase
        if phase == "Promoted":
            ready = ("True", "Promoted", "promoted: the candidate serves every cell")
        else:
            ready = ("False", phase, msg)
        if phase == "Progressing" and st.blocked_since is None and st.next_step is None:
            progressing = ("True", "StepInForce", f"step {self.label()}")
        elif phase == "Progressing":
            progressing = ("True", "Held", msg)
        else:
            progressing = ("False", phase, msg)
        last = self.out[-1].reason if self.out else None
        old = next((c for c in self.old.conditions if c.type == "Degraded"), None)
        if phase == "RolledBack":
            if last in ("Aborted", "ProgressDeadlineExceeded", "RolledBack"):
                degraded = ("True", last, msg)
            elif old is not None and old.status == "True":
                degraded = ("True", old.reason, old.message)
            else:
                degraded = ("True", "RolledBack", msg)
        elif phase == "Failed":
            degraded = ("True", "Failed", msg)
        elif self.withdrawn:
            degraded = ("True", "CandidateUnavailable", msg)
        else:
            degraded = ("False", "AsExpected", "no rollback, failure or unavailable candidate")
        for type_, (status, why, message) in (
            ("Ready", ready),
            ("Progressing", progressing),
            ("Degraded", degraded),
        ):
            self.condition(type_, status, why, message, gen)


def decide(release: GrayRelease, inputs: Inputs) -> Decision:
    """The next status of ``release`` (its status being the one recorded) given ``inputs``."""
    r = _Round(release, inputs)
    st = r.st
    gen = release.metadata.generation
    st.conditions = _precondition_conditions(st.conditions, inputs.problems, gen, inputs.now, release.spec)
    if release.spec.notify:
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
    r.route(inputs.conflict, gen)
    at_creation = r.old.released is None
    r.target()
    for value in dict.fromkeys(inputs.actions):
        r.action(value, at_creation)
    t = r.machine()
    if t is not None:
        r.emit(t)
    return r.finish()


def _precondition_conditions(
    conds: list[Condition],
    problems: Sequence[Problem],
    gen: int | None,
    now: datetime,
    spec: GrayReleaseSpec | None = None,
) -> list[Condition]:
    analysis: tuple[str, str] = ("Configured", "the analysis can run as configured")
    if spec is not None and not _has_metrics(spec):
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
