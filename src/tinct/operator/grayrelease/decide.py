"""The GrayRelease decision: the recorded status in, the next status out. Pure.

:func:`decide` takes the GrayRelease (its status is the state last *recorded*) and what one
round observed (:class:`~tinct.operator.grayrelease.decision.Inputs`), and returns the next
status with the transitions that led there. The controller persists that status before it
acts on it: the routing table, the scalers and the history all follow from the recorded
status, so an operator restarted at any point, or a round whose write failed, repeats the
decision instead of making another.

The promise of a progressive-delivery tool is that traffic moves toward the candidate only
on evidence and away from it at once and for good when the evidence says so. Here is where
each part of it is kept:

- **Toward the candidate only on evidence** (:func:`_progress`, :func:`_apply_next`): a
  step's weights apply only after the previous step's analysis passed — judged over a window
  that starts once every router serves the step's table (``status.routing.confirmedAt``,
  :mod:`~tinct.operator.grayrelease.timing`) — or, for a release without analysis metrics,
  after its interval; and only when the candidate Deployment has the available replicas the
  new share needs (:meth:`~tinct.operator.grayrelease.round.Round.short_of`,
  :func:`~tinct.operator.grayrelease.shares.needed`). Until then the decided step waits in
  ``status.nextStep`` and the weights stay.
- **Away at once** (:func:`_machine`, :meth:`~tinct.operator.grayrelease.round.Round.rollback`):
  the failure limit, an abort or a progress deadline with ``progressDeadlineAbort`` roll back
  (every cell 0); a candidate whose ModelVersion is not Ready or gone, whose Service or
  Deployment is gone, or which has no available replica (:func:`_candidate_down`) is withdrawn
  and loses its traffic in the same decision, and the release does not advance while that
  lasts.
- **For good** (:func:`_machine`): ``Promoted`` and ``RolledBack`` change only by a person's
  act (``retry``) or a change of what is released (:func:`_target`: the ModelVersions, or any
  target: Service, port, Deployment, URL, scheduler version, ModelVersion digests, which start
  a new attempt at step 1). Precondition problems are reported on them, never acted on.
- **Never silently held** (:meth:`~tinct.operator.grayrelease.round.Round.block`): a release
  that cannot progress (preconditions, capacity, routers, inconclusive analyses) for
  ``spec.progressDeadlineSeconds`` is paused, or rolled back with ``progressDeadlineAbort``.
- **Manual actions cannot replay** (:mod:`~tinct.operator.grayrelease.manual`): a
  ``tinct.io/action`` value present when the release is created, one seen before, or one
  addressed to another attempt (``<verb>@a<attempt>-<nonce>``, as ``tinct release`` writes) is
  refused with a message (:func:`~tinct.api.v1alpha1.action.replay_refusal`, the annotation's
  contract); the rest are carried out in the order they were given, each once, and their
  outcome is recorded in ``status.lastAction``.

The weights a status puts in force come from the routing table's rule
(:func:`~tinct.operator.grayrelease.shares.weights_for`); the conditions people read from
:mod:`~tinct.operator.grayrelease.conditions`.
"""

from __future__ import annotations

import math

from tinct.api.v1alpha1.common import set_condition
from tinct.api.v1alpha1.grayrelease import AnalysisResult, GrayRelease, HistoryEntry
from tinct.api.v1alpha1.releasestatus import HISTORY_LIMIT
from tinct.operator.grayrelease import conditions, manual
from tinct.operator.grayrelease.decision import Decision, Inputs, Transition
from tinct.operator.grayrelease.round import FINAL, Round
from tinct.operator.grayrelease.shares import shadows_for, weights_for
from tinct.operator.grayrelease.timing import analysis_due, has_metrics, needs_confirmation

__all__ = ["decide"]


def decide(release: GrayRelease, inputs: Inputs) -> Decision:
    """The next status of ``release`` (its status being the one recorded) given ``inputs``."""
    r = Round(release, inputs)
    conditions.observed(r)
    at_creation = r.old.released is None
    _target(r)
    _adapter(r)
    for value in dict.fromkeys(inputs.actions):
        manual.handle(r, value, at_creation)
    t = _machine(r)
    if t is not None:
        r.emit(t)
    return _finish(r)


# --- what is released ------------------------------------------------------------------------


def _target(r: Round) -> None:
    st, spec, inputs = r.st, r.spec, r.inputs
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
        r.restart()
        r.emit(Transition("Restarted", f"{changed}: starting over from step 1/{r.n}"))


def _adapter(r: Round) -> None:
    """Record where a LoRA adapter candidate is; a change in how many pods hold it is a
    transition of its own (a history row): loaded on n/m pods, or unloaded."""
    new, old = r.inputs.adapter, r.old.adapter
    if r.spec.candidate.adapter is None or new is None:
        r.st.adapter = None
        return
    r.st.adapter = new
    if new.served_name is None or (old is not None and (old.loaded, old.total) == (new.loaded, new.total)):
        return
    before = old.loaded if old is not None and old.served_name == new.served_name else 0
    where = f"{new.served_name} loaded on {new.loaded}/{new.total} pods"
    if new.loaded > before:
        r.emit(Transition("AdapterLoaded", where, informs=False))
    elif new.loaded < before:
        r.emit(Transition("AdapterUnloaded", where, warning=new.withdrawn_at is None, informs=False))


# --- the state machine -----------------------------------------------------------------------


def _machine(r: Round) -> Transition | None:
    st, spec, inputs = r.st, r.spec, r.inputs
    if st.phase in FINAL:
        return None
    fatal = [p for p in inputs.problems if p.fatal]
    if fatal:
        if st.phase == "Failed":
            return None
        st.phase = "Failed"
        st.next_step = None
        r.unblock()
        return Transition("Failed", "; ".join(p.message for p in fatal), warning=True)
    if st.phase == "Failed":
        r.restart()
        return Transition("Recovered", f"the failed precondition holds now; starting over from step 1/{r.n}")

    if st.stable_floor is None and inputs.capacity.stable_replicas is not None:
        # What stable served everything with before this attempt: kept until promotion.
        st.stable_floor = max(1, inputs.capacity.stable_replicas)
    started = st.step_started_at is not None
    serving = r.old.candidate_weight > 0
    down = _candidate_down(r) if started or st.next_step is not None else []
    r.withdrawn = bool(down)
    promoting = st.next_step is not None and st.next_step >= r.n
    if (spec.paused or st.pause_reason) and not promoting:
        r.unblock()
        if down and serving:
            r.emit(_lost(r, down))
        if st.phase == "Paused":
            return None
        st.phase = "Paused"
        why = "spec.paused is true" if spec.paused else st.pause_reason or ""
        return Transition("Paused", f"paused at step {r.label()}: {why}")
    if down:
        msg = "; ".join(down + [p.message for p in inputs.problems if p.side != "candidate"])
        t = _lost(r, down) if serving else r.wait("CandidateUnavailable", msg, warning=True)
        if t is not None:
            st.phase = "Pending"
        return r.block(msg) or t
    if inputs.problems:
        msg = "; ".join(p.message for p in inputs.problems)
        held = f"holding step {r.label()}: " if started else ""
        reasons = {p.reason for p in inputs.problems}
        t = r.wait(reasons.pop() if len(reasons) == 1 else "Waiting", held + msg, warning=True)
        return r.block(msg) or t
    if st.next_step is not None:
        return _apply_next(r, "promotion requested" if promoting else "the candidate has its replicas")
    if not started:
        return _start(r)
    if st.phase != "Progressing":
        return _resume(r)
    return _progress(r)


def _candidate_down(r: Round) -> list[str]:
    """Why the candidate cannot serve now (empty: it can)."""
    why = [p.message for p in r.inputs.problems if p.side == "candidate" and not p.fatal]
    available = r.inputs.capacity.candidate_available
    if available is not None and available <= 0 and r.spec.candidate.deployment:
        why.append(f"candidate Deployment {r.spec.candidate.deployment} has no available replica")
    return why


def _lost(r: Round, down: list[str]) -> Transition:
    """The candidate, which had traffic, loses it at once."""
    return Transition(
        "CandidateUnavailable",
        f"the candidate lost its traffic at step {r.label()}: {'; '.join(down)}",
        warning=True,
    )


def _start(r: Round) -> Transition | None:
    short = r.record_capacity(0)
    if short:
        t = r.wait("WaitingForCapacity", short)
        return r.block(short) or t
    r.enter("Progressing", 0)
    return Transition("Started", f"step 1/{r.n}")


def _resume(r: Round) -> Transition | None:
    st = r.st
    was = st.phase
    short = r.record_capacity(st.step)
    if short:
        t = r.wait("WaitingForCapacity", f"holding step {r.label()}: {short}")
        return r.block(short) or t
    r.enter("Progressing", st.step)
    return Transition("Resumed", f"{was} -> Progressing at step {r.label()}")


def _progress(r: Round) -> Transition | None:
    st, spec, inputs = r.st, r.spec, r.inputs
    # Reported only: a share already in force stays while the candidate keeps a replica.
    r.record_capacity(st.step)
    current = r.release.model_copy(update={"status": st})
    if not has_metrics(spec):
        if analysis_due(current, r.now):
            interval = r.spec.analysis.interval if r.spec.analysis else "1m"
            return _decide_next(
                r, f"{interval} passed; no analysis metrics judge the candidate (analysis: {{}})"
            )
        return None
    if needs_confirmation(current):
        version = st.routing.version if st.routing else 0
        if st.routing is not None and inputs.routers is not None and inputs.routers >= version:
            st.routing.confirmed_at = r.now
            r.unblock()
            return None
        seen = "no router exports it" if inputs.routers is None else f"the lowest seen is {inputs.routers}"
        return r.block(f"the routers have not been seen serving table version {version} ({seen})")
    if inputs.analysis is None:
        return None
    return _judge(r, inputs.analysis)


def _decide_next(r: Round, why: str) -> Transition | None:
    st, spec = r.st, r.spec
    nxt = st.step + 1
    if nxt >= r.n - 1 and all(c.weights[-1] >= 100 for c in spec.cells):
        nxt = r.n  # the last step sends everything: that is the promotion
    st.next_step = min(nxt, r.n)
    return _apply_next(r, why)


def _apply_next(r: Round, why: str) -> Transition | None:
    st = r.st
    nxt = st.next_step
    assert nxt is not None
    short = r.record_capacity(nxt)
    if short:
        st.phase = "Progressing"
        blocked = r.block(short)
        if blocked is not None:
            return blocked
        if r.old.next_step == nxt and r.old.message == short:
            return None
        return Transition("WaitingForCapacity", short, record=False)
    was = st.step
    if nxt >= r.n:
        r.enter("Promoted", r.n - 1)
        st.pause_reason = None
        return Transition("Promoted", f"promoted after step {r.label(was)}: {why}")
    r.enter("Progressing", nxt)
    return Transition("StepAdvanced", f"step {r.label(nxt)}: {why}")


def _judge(r: Round, result: AnalysisResult) -> Transition | None:
    st, spec = r.st, r.spec
    assert spec.analysis is not None
    st.last_analysis = result.model_copy(update={"step": st.step})
    gen = r.release.metadata.generation
    summary = result.message or ", ".join(
        f"{m.name}={'n/a' if m.value is None else f'{m.value:.4g}'} ({m.verdict})" for m in result.metrics
    )
    if result.verdict == "Pass":
        st.inconclusive_analyses = 0
        r.unblock()
        r.condition("AnalysisPassing", "True", "Passed", summary, gen)
        return _decide_next(r, f"analysis passed: {summary}")
    if result.verdict == "Fail":
        st.inconclusive_analyses = 0
        r.unblock()
        st.failed_analyses += 1
        limit = max(1, spec.analysis.failure_limit)
        r.condition(
            "AnalysisPassing", "False", "Failed", f"{st.failed_analyses}/{limit} failed: {summary}", gen
        )
        if st.failed_analyses >= limit:
            return r.rollback(
                "RolledBack",
                f"rolled back at step {r.label()} after {st.failed_analyses} failed analyses: {summary}",
            )
        return Transition(
            "AnalysisFailed", f"analysis {st.failed_analyses}/{limit} failed: {summary}", True, False
        )
    st.inconclusive_analyses += 1
    limit = spec.analysis.inconclusive_limit
    r.condition(
        "AnalysisPassing",
        "Unknown",
        "Inconclusive",
        f"holding step {r.label()} ({st.inconclusive_analyses}/{limit} inconclusive): {summary}",
        gen,
    )
    if st.inconclusive_analyses >= limit:
        st.pause_reason = f"{st.inconclusive_analyses} inconclusive analyses in a row: {summary}"[:1024]
        st.phase = "Paused"
        r.unblock()
        return Transition(
            "Paused",
            f"paused at step {r.label()}: {st.pause_reason}; `tinct release resume` continues",
            True,
        )
    return r.block(f"analyses inconclusive: {summary}")


# --- what follows from the decision ----------------------------------------------------------


def _finish(r: Round) -> Decision:
    st, spec = r.st, r.spec
    gen = r.release.metadata.generation
    st.observed_generation = gen
    st.weights = weights_for(spec, st, r.withdrawn)
    st.shadows = shadows_for(spec, st, r.withdrawn)
    st.candidate_weight = max(st.weights.values(), default=0.0)
    st.progress = f"{r.n}/{r.n}" if st.phase == "Promoted" else r.label()
    said = [t for t in r.out if t.informs]
    if said:
        st.message = said[-1].message[:1024]
    elif r.held and st.phase == "Progressing":
        also = f"; {r.inputs.conflict}" if r.inputs.conflict else ""
        st.message = f"holding step {r.label()}: {r.held}{also}"[:1024]
    elif r.held and st.phase == "Pending":
        st.message = st.message or r.held[:1024]
    if r.capacity is not None:
        st.conditions = set_condition(st.conditions, r.capacity, r.now)
    conditions.summary(r, gen)
    for t in r.out:
        if t.record:
            _history(r, t)
    return Decision(st, r.out)


def _history(r: Round, t: Transition) -> None:
    st = r.st
    metrics: dict[str, float] = {}
    if st.last_analysis is not None:
        metrics = {
            m.name: m.value
            for m in st.last_analysis.metrics
            if m.value is not None and math.isfinite(m.value)
        }
    phase, step, started = r.at.get(id(t), (st.phase, st.step, st.step_started_at))
    then = st.model_copy(update={"phase": phase, "step": step, "step_started_at": started})
    last = t is r.out[-1]
    st.history = [
        *st.history,
        HistoryEntry(
            seq=st.transitions,
            reason=t.reason,
            message=t.message[:2000],
            phase=phase,
            step=step,
            weights=weights_for(r.spec, then, r.withdrawn and last),
            metrics=metrics,
            time=r.now,
        ),
    ][-HISTORY_LIMIT:]
    st.transitions += 1
