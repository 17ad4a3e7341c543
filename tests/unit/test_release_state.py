"""The GrayRelease decision: preconditions, steps, analysis verdicts, capacity, the routers'
confirmation, manual actions, the progress deadline and the summary conditions."""

from __future__ import annotations

from datetime import timedelta

import pytest

from tinct.api.v1alpha1.action import ActionRequest, action_value, final_refusal, handled, parse_action
from tinct.api.v1alpha1.grayrelease import GrayRelease, GrayReleaseStatus, cell_key, parse_duration
from tinct.operator.grayrelease.decision import Capacity, Inputs
from tinct.operator.grayrelease.preconditions import Claim, Problem, model_conflict, preconditions
from tinct.operator.grayrelease.round import Round
from tinct.operator.grayrelease.shares import needed, shadows_for, share_at, weights_for
from tinct.operator.grayrelease.tables import claims_of
from tinct.operator.grayrelease.timing import analysis_due, needs_confirmation, next_wakeup
from tinct_testing.release_helpers import (
    DEFAULT,
    LONG,
    SHORT,
    T0,
    mv,
    ok_objects,
    release,
    result,
    round_,
    step,
)

MINUTE = timedelta(minutes=1)
CANDIDATE_FAILED = Problem(
    "ModelVersionsReady", "ModelVersionNotReady", "candidate ModelVersion x is Failed, not Ready"
)
STABLE_GONE = Problem(
    "BackendsAvailable", "ServiceMissing", "stable Service sched-v1 does not exist", side="stable"
)


def st(gr: GrayRelease) -> GrayReleaseStatus:
    assert gr.status is not None
    return gr.status


def cond(status: GrayReleaseStatus, type_: str) -> tuple[str, str]:
    c = next(c for c in status.conditions if c.type == type_)
    return c.status, c.reason


def advance(gr: GrayRelease, now: object, verdict: str = "Pass") -> GrayRelease:
    return step(gr, now, result(verdict, now))  # type: ignore[arg-type]


def test_durations_and_cell_keys() -> None:
    assert parse_duration("1m30s") == 90
    assert parse_duration("250ms") == 0.25
    with pytest.raises(ValueError, match="not a duration"):
        parse_duration("1 minute")
    gr = release()
    assert [cell_key(c.match) for c in gr.spec.cells] == [LONG, SHORT, DEFAULT]


def test_preconditions_name_what_is_missing_and_whose_it_is() -> None:
    gr = release()
    mvs, svcs, deps = ok_objects(gr)
    assert preconditions(gr.spec, mvs, svcs, deps) == []

    missing = preconditions(gr.spec, {**mvs, "llama3-8b-2-0-0": None}, {"sched-v1": True}, {})
    assert [(p.condition, p.reason, p.side) for p in missing] == [
        ("ModelVersionsReady", "ModelVersionMissing", "candidate"),
        ("BackendsAvailable", "DeploymentMissing", "stable"),
        ("BackendsAvailable", "ServiceMissing", "candidate"),
        ("BackendsAvailable", "DeploymentMissing", "candidate"),
    ]
    assert "candidate ModelVersion llama3-8b-2-0-0 does not exist" in missing[0].message
    other = preconditions(
        gr.spec, {**mvs, "llama3-8b-2-0-0": mv(model="mistral", version="1.5.0")}, svcs, deps
    )
    assert [(p.reason, p.fatal) for p in other] == [("DifferentModels", True)]
    major = preconditions(
        release(allowMajorUpgrade=False).spec, {**mvs, "llama3-8b-2-0-0": mv(version="2.0.0")}, svcs, deps
    )
    assert [p.reason for p in major] == ["MajorUpgradeNotAllowed"]


def test_a_port_the_service_does_not_have_is_a_failed_precondition_naming_it() -> None:
    gr = release()
    mvs, svcs, deps = ok_objects(gr)
    ports = {"sched-v1": (8000,), "sched-v2": (80, 9000)}
    problems = preconditions(gr.spec, mvs, svcs, deps, service_ports=ports)
    assert [(p.condition, p.reason, p.side, p.message) for p in problems] == [
        (
            "BackendsAvailable",
            "ServicePortMissing",
            "candidate",
            "candidate Service sched-v2 has no port 8000 (its ports: 80, 9000); fix spec.candidate.port or "
            "the Service",
        )
    ]
    # A side reached by its url does not go through the Service's port.
    by_url = release(candidate={**gr.spec.candidate.wire(), "url": "http://10.0.0.7:8000"})
    assert preconditions(by_url.spec, mvs, svcs, deps, service_ports=ports) == []
    # The candidate loses nothing it never had: the release waits, saying why.
    d = round_(gr, T0, problems=problems)
    assert d.status.phase == "Pending"
    assert d.status.message == problems[0].message
    assert cond(d.status, "BackendsAvailable") == ("False", "ServicePortMissing")
    assert [(t.reason, t.warning) for t in d.transitions] == [("ServicePortMissing", True)]


def test_a_release_with_analysis_but_no_metrics_says_so_in_its_conditions_and_messages() -> None:
    gr = release(analysis={"interval": "30s"})
    d = round_(gr, T0, capacity=Capacity(candidate_available=1, stable_replicas=1))
    c = next(c for c in d.status.conditions if c.type == "AnalysisReady")
    assert (c.status, c.reason, c.message) == (
        "True",
        "NoMetrics",
        "analysis names no metrics: each step moves on after 30s without judging the candidate",
    )


def test_start_sets_step_one_weights_and_conditions() -> None:
    d = round_(release(), T0)
    s = d.status
    assert (s.phase, s.step, s.step_started_at, s.progress, s.attempt) == ("Progressing", 0, T0, "1/4", 1)
    assert s.weights == {LONG: 5, SHORT: 0.1, DEFAULT: 1}
    assert s.candidate_weight == 5
    assert [t.reason for t in d.transitions] == ["Started"]
    assert cond(s, "Ready") == ("False", "Progressing")
    assert cond(s, "Degraded") == ("False", "AsExpected")
    assert [h.reason for h in s.history] == ["Started"]
    # Decided again from what was recorded (a restarted operator): nothing new happens.
    gr = release().model_copy(update={"status": s})
    again = round_(gr, T0 + timedelta(seconds=5))
    assert again.transitions == []
    assert again.status.step == 0


def test_waiting_before_start_sends_nothing_and_starts_when_ready() -> None:
    d = round_(release(), T0, problems=[CANDIDATE_FAILED])
    assert d.status.phase == "Pending"
    assert set(d.status.weights.values()) == {0.0}
    assert cond(d.status, "ModelVersionsReady") == ("False", "ModelVersionNotReady")
    assert d.status.blocked_since == T0
    gr = step(release(), T0, problems=[CANDIDATE_FAILED])
    assert st(step(gr, T0 + timedelta(seconds=1))).phase == "Progressing"


def test_a_step_window_starts_when_the_routers_serve_its_table() -> None:
    gr = step(release(), T0, confirm=False)
    assert needs_confirmation(gr)
    assert not analysis_due(gr, T0 + 5 * MINUTE)
    # The routers still serve the previous table: the window has not started.
    version = st(gr).routing.version  # type: ignore[union-attr]
    gr = step(gr, T0 + timedelta(seconds=3), routers=version - 1, confirm=False)
    assert needs_confirmation(gr)
    assert st(gr).blocked_since is not None
    gr = step(gr, T0 + timedelta(seconds=7), routers=version, confirm=False)
    assert st(gr).routing.confirmed_at == T0 + timedelta(seconds=7)  # type: ignore[union-attr]
    assert st(gr).blocked_since is None
    assert not analysis_due(gr, T0 + MINUTE)
    assert analysis_due(gr, T0 + MINUTE + timedelta(seconds=7))
    assert next_wakeup(gr, T0 + timedelta(seconds=57), tick=30) == pytest.approx(10)


def test_analysis_pass_advances_each_step_and_the_last_full_step_promotes() -> None:
    gr = step(release(), T0)
    now = T0
    seen = []
    for _ in range(3):
        now += MINUTE
        assert analysis_due(gr, now)
        d = round_(gr, now, result("Pass", now))
        seen.append(
            (
                d.transitions[-1].reason,
                d.status.phase,
                d.status.step,
                d.status.weights[LONG],
                d.status.progress,
            )
        )
        gr = step(gr, now, result("Pass", now))
    assert seen == [
        ("StepAdvanced", "Progressing", 1, 20, "2/4"),
        ("StepAdvanced", "Progressing", 2, 50, "3/4"),
        ("Promoted", "Promoted", 3, 100, "4/4"),
    ]
    assert set(st(gr).weights.values()) == {100.0}
    assert cond(st(gr), "Ready") == ("True", "Promoted")
    assert not analysis_due(gr, now + MINUTE)
    assert [h.reason for h in st(gr).history] == ["Started", "StepAdvanced", "StepAdvanced", "Promoted"]
    assert [h.seq for h in st(gr).history] == [0, 1, 2, 3]


def test_failures_roll_back_at_the_limit_every_cell_to_zero_for_good() -> None:
    gr = step(release(), T0)
    d = round_(gr, T0 + MINUTE, result("Fail", T0 + MINUTE))
    assert (d.transitions[-1].reason, d.transitions[-1].record, d.status.phase) == (
        "AnalysisFailed",
        False,
        "Progressing",
    )
    assert d.status.weights[LONG] == 5  # held
    gr = gr.model_copy(update={"status": d.status})
    t2 = T0 + 2 * MINUTE
    d = round_(gr, t2, result("Fail", t2))
    assert (d.transitions[-1].reason, d.transitions[-1].warning, d.status.phase) == (
        "RolledBack",
        True,
        "RolledBack",
    )
    assert set(d.status.weights.values()) == {0.0}
    assert cond(d.status, "Degraded") == ("True", "RolledBack")
    rolled = gr.model_copy(update={"status": d.status})
    # Final: a passing analysis, a precondition problem, a fatal one, all change nothing.
    for kw in ({"analysis": result("Pass", t2)}, {"problems": [CANDIDATE_FAILED]}):
        later = round_(rolled, t2 + MINUTE, **kw)  # type: ignore[arg-type]
        assert (later.status.phase, set(later.status.weights.values())) == ("RolledBack", {0.0})
        assert later.transitions == []
        assert cond(later.status, "Degraded") == ("True", "RolledBack")


def test_promoted_stays_promoted_through_transient_problems() -> None:
    gr = step(step(release(), T0), T0 + timedelta(seconds=1), actions=["promote@a1-p"])
    assert st(gr).phase == "Promoted"
    other_model = Problem(
        "ModelVersionsReady", "DifferentModels", "stable is model 'a' but candidate is 'b'", fatal=True
    )
    for problems in ([other_model], [CANDIDATE_FAILED], [STABLE_GONE]):
        d = round_(gr, T0 + MINUTE, problems=problems)
        assert (d.status.phase, set(d.status.weights.values()), d.status.step) == ("Promoted", {100.0}, 3)
        assert d.transitions == []


def test_inconclusive_holds_never_counts_as_failure_then_pauses_and_resume_clears_it() -> None:
    analysis = release().spec.analysis
    assert analysis is not None
    gr = step(release(analysis=analysis.model_copy(update={"inconclusive_limit": 3}).wire()), T0)
    now = T0
    for i in range(1, 3):
        now += MINUTE
        d = round_(gr, now, result("Inconclusive", now))
        assert (d.status.phase, d.status.step, d.status.failed_analyses) == ("Progressing", 0, 0)
        assert d.status.inconclusive_analyses == i
        assert cond(d.status, "AnalysisPassing") == ("Unknown", "Inconclusive")
        assert d.status.blocked_since == T0 + MINUTE
        gr = gr.model_copy(update={"status": d.status})
    now += MINUTE
    d = round_(gr, now, result("Inconclusive", now))
    assert (d.transitions[-1].reason, d.status.phase, d.status.weights[LONG]) == ("Paused", "Paused", 5)
    gr = gr.model_copy(update={"status": d.status})
    assert st(step(gr, now + 5 * MINUTE)).phase == "Paused"  # spec.paused is false, yet it holds
    resumed = round_(gr, now + 6 * MINUTE, actions=["resume@1"])
    assert (resumed.transitions[-1].reason, resumed.status.phase) == ("Resumed", "Progressing")
    assert resumed.status.inconclusive_analyses == 0
    assert resumed.status.last_action is not None
    assert (resumed.status.last_action.value, resumed.status.last_action.result) == ("resume@1", "Done")


def test_spec_paused_holds_the_weights() -> None:
    gr = step(release(), T0)
    gr = gr.model_copy(update={"spec": gr.spec.model_copy(update={"paused": True})})
    d = round_(gr, T0 + 3 * MINUTE)
    assert (d.transitions[-1].reason, d.status.phase, d.status.weights[LONG]) == ("Paused", "Paused", 5)
    assert not analysis_due(gr.model_copy(update={"status": d.status}), T0 + 9 * MINUTE)


def test_a_failing_candidate_loses_its_traffic_at_once_and_the_release_does_not_advance() -> None:
    gr = advance(step(release(), T0), T0 + MINUTE)
    assert st(gr).weights[LONG] == 20
    for problem in (
        CANDIDATE_FAILED,
        Problem("ModelVersionsReady", "ModelVersionMissing", "candidate ModelVersion x does not exist"),
        Problem("BackendsAvailable", "ServiceMissing", "candidate Service sched-v2 does not exist"),
        Problem("BackendsAvailable", "DeploymentMissing", "candidate Deployment sched-v2 does not exist"),
    ):
        d = round_(gr, T0 + 2 * MINUTE, result("Pass", T0 + 2 * MINUTE), problems=[problem])
        assert set(d.status.weights.values()) == {0.0}, problem
        assert d.status.step == 1
        assert [(t.reason, t.warning, t.record) for t in d.transitions] == [
            ("CandidateUnavailable", True, True)
        ]
        assert cond(d.status, "Degraded") == ("True", "CandidateUnavailable")
        # The next round, still down: no second Event.
        again = round_(gr.model_copy(update={"status": d.status}), T0 + 3 * MINUTE, problems=[problem])
        assert again.transitions == []
        assert set(again.status.weights.values()) == {0.0}
    # No available replica is the same as gone.
    d = round_(gr, T0 + 2 * MINUTE, capacity=Capacity(candidate_available=0, stable_replicas=1))
    assert set(d.status.weights.values()) == {0.0}
    assert "has no available replica" in d.transitions[-1].message
    # Back: the step's weights again with a fresh window, not a step further.
    down = gr.model_copy(update={"status": d.status})
    back = step(down, T0 + 4 * MINUTE, capacity=Capacity(candidate_available=1, stable_replicas=1))
    assert (st(back).phase, st(back).step, st(back).weights[LONG]) == ("Progressing", 1, 20)
    assert st(back).step_started_at == T0 + 4 * MINUTE


def test_a_stable_side_problem_holds_the_step() -> None:
    gr = advance(step(release(), T0), T0 + MINUTE)
    d = round_(gr, T0 + 2 * MINUTE, result("Pass", T0 + 2 * MINUTE), problems=[STABLE_GONE])
    # The Event's reason is the problem's: what kubectl get events shows first.
    assert (d.transitions[-1].reason, d.status.phase, d.status.step, d.status.weights[LONG]) == (
        "ServiceMissing",
        "Pending",
        1,
        20,
    )
    back = round_(gr.model_copy(update={"status": d.status}), T0 + 3 * MINUTE)
    assert (back.transitions[-1].reason, back.status.phase, back.status.step) == ("Resumed", "Progressing", 1)


def test_fatal_problem_fails_with_zero_weights_and_recovers_as_a_new_attempt() -> None:
    gr = step(release(), T0)
    fatal = Problem(
        "ModelVersionsReady", "DifferentModels", "stable is model 'a' but candidate is 'b'", fatal=True
    )
    d = round_(gr, T0, problems=[fatal])
    assert (d.status.phase, set(d.status.weights.values())) == ("Failed", {0.0})
    d = round_(gr.model_copy(update={"status": d.status}), T0)
    assert (d.transitions[0].reason, d.status.step, d.status.attempt) == ("Recovered", 0, 2)


def test_a_step_applies_only_with_the_replicas_its_share_needs() -> None:
    spec = {"autoscaling": {"minReplicas": 1, "maxReplicas": 12}}
    # stable served everything with 4 replicas: 50 % needs 2, 100 % needs 4.
    four = Capacity(candidate_available=1, stable_replicas=4)
    gr = step(release(**spec), T0, capacity=four)
    assert st(gr).stable_floor == 4
    assert needed(gr.spec, st(gr), 20) == 1
    gr = advance(gr, T0 + MINUTE)  # step 2 (20 %) needs 1
    gr = step(gr, T0 + MINUTE, capacity=four)
    assert st(gr).step == 1
    d = round_(gr, T0 + 2 * MINUTE, result("Pass", T0 + 2 * MINUTE), capacity=four)
    s = d.status
    assert (s.phase, s.step, s.next_step, s.weights[LONG]) == ("Progressing", 1, 2, 20)
    assert [t.reason for t in d.transitions] == ["WaitingForCapacity"]
    assert (
        "waiting for 2 available replicas of candidate Deployment sched-v2 (1 now)"
        in d.transitions[0].message
    )
    assert cond(s, "CapacityReady") == ("False", "WaitingForReplicas")
    gr = gr.model_copy(update={"status": s})
    # Still short: no second Event, no analysis taken.
    assert not analysis_due(gr, T0 + 10 * MINUTE)
    assert round_(gr, T0 + 3 * MINUTE, capacity=four).transitions == []
    two = Capacity(candidate_available=2, stable_replicas=4)
    d = round_(gr, T0 + 4 * MINUTE, capacity=two)
    assert (d.status.step, d.status.next_step, d.status.weights[LONG]) == (2, None, 50)
    assert d.transitions[-1].reason == "StepAdvanced"
    assert d.status.step_started_at == T0 + 4 * MINUTE
    # Promotion waits for the replicas of the whole traffic.
    gr = step(gr.model_copy(update={"status": d.status}), T0 + 4 * MINUTE, capacity=two)
    d = round_(gr, T0 + 6 * MINUTE, result("Pass", T0 + 6 * MINUTE), capacity=two)
    assert (d.status.phase, d.status.next_step, d.status.weights[LONG]) == ("Progressing", 4, 50)
    d = round_(
        gr.model_copy(update={"status": d.status}),
        T0 + 7 * MINUTE,
        capacity=Capacity(candidate_available=4, stable_replicas=4),
    )
    assert (d.status.phase, set(d.status.weights.values())) == ("Promoted", {100.0})


def test_asking_what_the_candidate_lacks_changes_nothing() -> None:
    four = Capacity(candidate_available=1, stable_replicas=4)
    gr = step(release(), T0, capacity=four)
    r = Round(gr, Inputs(now=T0, capacity=four))
    before = r.st.model_copy(deep=True)
    short = r.short_of(2)
    assert short.missing is not None
    assert "2 available replicas" in short.missing
    assert (short.condition.status, short.condition.reason) == ("False", "WaitingForReplicas")
    assert (r.capacity, r.st, r.out) == (None, before, [])
    assert r.record_capacity(2) == short.missing
    assert r.capacity == short.condition


def test_without_analysis_steps_do_not_advance_over_zero_available_replicas() -> None:
    gr = step(release(analysis={}), T0, capacity=Capacity(candidate_available=1, stable_replicas=1))
    assert st(step(gr, T0 + timedelta(seconds=30))).step == 0
    assert st(step(gr, T0 + MINUTE)).step == 1
    none = Capacity(candidate_available=0, stable_replicas=1)
    held = step(gr, T0 + MINUTE, capacity=none)
    assert (st(held).phase, st(held).step, set(st(held).weights.values())) == ("Pending", 0, {0.0})
    assert st(step(held, T0 + 5 * MINUTE, capacity=none)).step == 0


def test_the_progress_deadline_pauses_or_rolls_back() -> None:
    gr = step(release(progressDeadlineSeconds=120), T0, problems=[STABLE_GONE])
    assert st(step(gr, T0 + MINUTE, problems=[STABLE_GONE])).phase == "Pending"
    d = round_(gr, T0 + 2 * MINUTE, problems=[STABLE_GONE])
    assert (d.status.phase, d.transitions[-1].reason) == ("Paused", "ProgressDeadlineExceeded")
    assert "no progress for 120s" in (d.status.pause_reason or "")
    # Inconclusive analyses count as no progress too; with progressDeadlineAbort: rolled back.
    gr = step(release(progressDeadlineSeconds=150, progressDeadlineAbort=True), T0)
    for i in range(1, 4):
        gr = step(gr, T0 + i * MINUTE, result("Inconclusive", T0 + i * MINUTE))
        assert st(gr).phase == "Progressing"  # blocked since the first one, at 1 min
    gr = step(gr, T0 + 4 * MINUTE, result("Inconclusive", T0 + 4 * MINUTE))
    assert (st(gr).phase, set(st(gr).weights.values())) == ("RolledBack", {0.0})
    assert cond(st(gr), "Degraded") == ("True", "ProgressDeadlineExceeded")


def test_actions_are_carried_out_once_in_order_and_old_ones_are_refused() -> None:
    gr = step(release(), T0)
    d = round_(gr, T0, actions=["abort@a1-x"])
    assert (d.transitions[-1].reason, d.status.phase, d.status.acknowledged_action) == (
        "Aborted",
        "RolledBack",
        "abort@a1-x",
    )
    assert set(d.status.weights.values()) == {0.0}
    assert cond(d.status, "Degraded") == ("True", "Aborted")
    gr = gr.model_copy(update={"status": d.status})
    assert round_(gr, T0, actions=["abort@a1-x"]).transitions == []  # the annotation still shows it

    d = round_(gr, T0, actions=["retry@a1-r"])
    assert (d.transitions[-1].reason, d.status.step, d.status.attempt) == ("Started", 0, 2)
    gr = gr.model_copy(update={"status": d.status})
    # GitOps restores an old value, or one meant for the attempt before: refused.
    for value, why in (("abort@a1-x", "handled before"), ("promote@a1-late", "meant for attempt 1")):
        d = round_(gr, T0, actions=[value])
        assert d.status.phase == "Progressing", value
        assert d.status.last_action is not None
        assert (d.status.last_action.result, why in d.status.last_action.message) == ("Refused", True)
        assert [(t.reason, t.warning, t.record) for t in d.transitions] == [("ActionRefused", True, False)]
    bad = round_(gr, T0, actions=["explode@1"])
    assert "promote, abort, retry, resume" in bad.transitions[0].message
    # Two given between two rounds: both, in order.
    d = round_(gr, T0, actions=["promote@a2-p", "abort@a2-q"])
    assert [t.reason for t in d.transitions] == ["Aborted"]
    assert d.status.phase == "RolledBack"
    assert d.status.seen_actions[-2:] == ["promote@a2-p", "abort@a2-q"]
    # An abort given while an analysis ran wins over its step-up.
    d = round_(gr, T0 + MINUTE, result("Pass", T0 + MINUTE), actions=["abort@a2-z"])
    assert (d.status.phase, set(d.status.weights.values())) == ("RolledBack", {0.0})


def test_an_action_present_at_creation_is_refused() -> None:
    d = round_(release(), T0, actions=["promote@1"])
    assert (d.status.phase, d.status.step) == ("Progressing", 0)
    assert d.status.last_action is not None
    assert d.status.last_action.result == "Refused"
    assert "present when the release was created" in d.status.last_action.message


def test_the_value_tinct_release_writes_is_read_as_addressed_to_its_attempt() -> None:
    value = action_value("promote", 3, "9f8c3854")
    assert value == "promote@a3-9f8c3854"
    assert parse_action(value) == ActionRequest(value, "promote", 3)
    assert parse_action("Abort@1700000000") == ActionRequest("Abort@1700000000", "abort", None)
    assert parse_action("explode@a1-x").verb is None
    status = {"seenActions": ["abort@a1-x"], "acknowledgedAction": "retry@a1-r"}
    assert handled("abort@a1-x", status)
    assert handled("retry@a1-r", status)
    assert not handled("promote@a2-p", status)


def test_a_change_of_target_starts_a_new_attempt_at_step_one() -> None:
    gr = step(
        step(release(), T0, target="t1"), T0 + timedelta(seconds=1), actions=["promote@a1-p"], target="t1"
    )
    assert st(gr).phase == "Promoted"
    # The same target, and one not known (a ModelVersion re-hashing): nothing happens.
    for target in ("t1", None):
        assert round_(gr, T0 + MINUTE, target=target).status.phase == "Promoted"
    d = round_(gr, T0 + MINUTE, target="t2")
    assert [t.reason for t in d.transitions] == ["Restarted", "Started"]
    assert (d.status.phase, d.status.step, d.status.attempt, d.status.target) == ("Progressing", 0, 2, "t2")
    gr.spec.candidate.model_version = "llama3-8b-2-1-0"
    d = round_(gr, T0 + MINUTE, target="t1")
    assert "became llama3-8b-1-4-0 -> llama3-8b-2-1-0" in d.transitions[0].message


def test_weights_for_every_phase() -> None:
    spec = release().spec
    s = GrayReleaseStatus(phase="Progressing", step=1, step_started_at=T0)
    assert weights_for(spec, s) == {LONG: 20, SHORT: 1, DEFAULT: 10}
    assert weights_for(spec, s, withdrawn=True) == {LONG: 0, SHORT: 0, DEFAULT: 0}
    assert weights_for(spec, s.model_copy(update={"phase": "Paused", "step": 9})) == {
        LONG: 100,
        SHORT: 100,
        DEFAULT: 100,
    }
    assert set(weights_for(spec, GrayReleaseStatus(phase="Pending", step=1)).values()) == {0}
    assert set(weights_for(spec, s.model_copy(update={"phase": "RolledBack"})).values()) == {0}
    assert set(weights_for(spec, s.model_copy(update={"phase": "Promoted"})).values()) == {100}


def test_the_release_that_loses_a_model_to_an_older_one_says_model_conflict() -> None:
    older = Claim("tinct-routing-llm.chat", 100.0, "llm", "chat", "uid-old", ("llama3-8b",))
    other_model = Claim("tinct-routing-llm.code", 50.0, "llm", "code", "uid-code", ("coder-7b",))
    # No table of its own yet, or a newer one: it loses.
    for created in (None, 200.0):
        problem = model_conflict(
            "uid-1", "llm", "tinct-routing-llm.chat-2", created, ["llama3-8b"], [older, other_model]
        )
        assert problem is not None
        assert problem.message == (
            "model llama3-8b is served by GrayRelease llm/chat, an older release: routers serving both "
            "tables follow that one until it is deleted; give this one other models (spec.models), or "
            "routers of its own"
        )
    # Its own table is the older one, or the models differ: no conflict.
    assert model_conflict("uid-1", "llm", "tinct-routing-llm.chat-2", 50.0, ["llama3-8b"], [older]) is None
    assert model_conflict("uid-1", "llm", "tinct-routing-llm.chat-2", None, ["mistral"], [older]) is None
    # A standing route of its own namespace gives way to it.
    standing = Claim("tinct-routing-llm.chat", 100.0, "llm", "chat", "uid-old", ("llama3-8b",), standing=True)
    assert model_conflict("uid-1", "llm", "tinct-routing-llm.chat-2", None, ["llama3-8b"], [standing]) is None
    # Said on the release that loses (condition, message, one Warning Event); not acted on:
    # routers that select one release's table each serve both.
    gr = release()
    d = round_(gr, T0, conflict=problem.message)
    assert cond(d.status, "RouteAvailable") == ("False", "ModelConflict")
    assert [(t.reason, t.warning) for t in d.transitions] == [("ModelConflict", True), ("Started", False)]
    assert d.status.phase == "Progressing"
    gr = gr.model_copy(update={"status": d.status})
    again = round_(gr, T0 + MINUTE, conflict=problem.message)
    assert "ModelConflict" not in [t.reason for t in again.transitions], "said once"
    free = round_(gr, T0 + MINUTE)
    assert cond(free.status, "RouteAvailable") == ("True", "ModelFree")


def test_a_dark_step_records_its_shadow_shares_and_needs_replicas_for_them() -> None:
    cells = release().wire()["spec"]["cells"]
    cells[1].update(weights=[0, 1, 10, 100], shadow=[20, 10, 0, 0])
    cells[0]["shadow"] = [0, 50, 0, 0]
    gr = step(release(cells=cells), T0)
    s = st(gr)
    assert (s.step, s.weights[SHORT], s.shadows[SHORT]) == (0, 0, 20)
    assert (s.shadows[LONG], s.shadows[DEFAULT]) == (0, 0)
    assert share_at(gr.spec, 0) == 20  # the mirrors of the dark cell need the candidate's replicas
    assert share_at(gr.spec, 1) == 60  # 20 % live, half of the other 80 % mirrored
    assert set(shadows_for(gr.spec, s, withdrawn=True).values()) == {0}


def test_a_model_belongs_to_the_namespace_that_routed_it_first_live_or_standing() -> None:
    theirs = Claim("tinct-routing-b.chat", 100.0, "b", "chat", "uid-b", ("llama3-8b",))
    left = Claim("tinct-routing-b.chat", 100.0, "b", "chat", "uid-b", ("llama3-8b",), standing=True)
    for claim, what in (
        (theirs, "GrayRelease b/chat"),
        (left, "the standing route of its deleted GrayRelease b/chat"),
    ):
        # Newer, or with no table yet: a release of another namespace never gets it.
        for created in (None, 200.0):
            problem = model_conflict("uid-a", "a", "tinct-routing-a.chat", created, ["llama3-8b"], [claim])
            assert problem is not None
            assert (problem.condition, problem.reason, problem.side) == (
                "RouteAvailable",
                "ModelConflict",
                "release",
            )
            assert problem.message.startswith(
                f"model llama3-8b belongs to namespace b, which routed it first ({what}): routers never "
                "give it to a release of another namespace"
            )
        # Its own table is older: the model is its namespace's.
        assert model_conflict("uid-a", "a", "tinct-routing-a.chat", 50.0, ["llama3-8b"], [claim]) is None
    # A cluster administrator's mapping decides whoever routed first.
    owners = {"llama3-8b": "a"}
    assert model_conflict("uid-a", "a", "tinct-routing-a.chat", None, ["llama3-8b"], [left], owners) is None
    elsewhere = model_conflict("uid-b", "b", "tinct-routing-b.next", None, ["llama3-8b"], [], owners)
    assert elsewhere is not None
    assert elsewhere.message.startswith(
        "model llama3-8b belongs to namespace a (the operator's --model-owner)"
    )


def test_a_release_carries_its_namespaces_claim_over() -> None:
    from types import SimpleNamespace

    from tinct_testing.router_fakes import table

    def found(name: str, created: float, ns: str, models: list[str], **kw: object) -> object:
        t = table("http://a:1", "http://b:2", namespace=ns, models=models, release=name)
        return SimpleNamespace(name=f"cm-{name}", created=created, table=t.model_copy(update=kw))

    tables = [
        found("owner", 100.0, "b", ["m", "n"], standing=True),
        found("other", 50.0, "a", ["m"]),
        found("next", 300.0, "b", ["m"]),
    ]
    assert claims_of("b", "cm-next", ["m", "x"], tables) == {"m": 100.0}  # type: ignore[arg-type]
    assert claims_of("b", "cm-new", ["n"], tables) == {"n": 100.0}, "no table of its own yet"  # type: ignore[arg-type]
    assert claims_of("b", "cm-owner", ["m"], tables) == {}, "nothing earlier than its own"  # type: ignore[arg-type]
    # Once carried over it stays, after the table it came from is gone.
    kept = [found("next", 300.0, "b", ["m"], claimed={"m": 100.0})]
    assert claims_of("b", "cm-next", ["m"], kept) == {"m": 100.0}  # type: ignore[arg-type]
    # A table about to be written claims what it does not carry over at that very moment ...
    assert claims_of("b", "cm-new", ["n", "x"], tables, now=400.25) == {"n": 100.0, "x": 400.25}  # type: ignore[arg-type]
    # ... and keeps that claim once its ConfigMap exists, created within that second.
    mine = [found("new", 400.0, "b", ["x"], claimed={"x": 400.25})]
    assert claims_of("b", "cm-new", ["x"], mine, now=999.0) == {"x": 400.25}  # type: ignore[arg-type]
    # A claim past the second its ConfigMap was created in (a clock ahead) is dropped: the
    # creation time is the claim.
    ahead = [found("new", 400.0, "b", ["x"], claimed={"x": 403.0})]
    assert claims_of("b", "cm-new", ["x"], ahead, now=999.0) == {}  # type: ignore[arg-type]


def test_two_namespaces_routing_a_model_within_one_second_are_told_apart() -> None:
    from tinct.api.ownership import holders

    # Both ConfigMaps were created at 100 (the API server counts seconds); b wrote first.
    a = Claim("tinct-routing-a.taker", 100.0, "a", "taker", "u-a", ("m",), claimed={"m": 100.8})
    b = Claim("tinct-routing-b.owner", 100.0, "b", "owner", "u-b", ("m",), claimed={"m": 100.2})
    assert holders([a, b], {})["m"] is b, "the earlier write, not the name that sorts first"
    # b's next release carries b's claim over once the owner is gone, however new its own table.
    nxt = Claim("tinct-routing-b.next", 107.0, "b", "next", "u-n", ("m",), claimed={"m": 100.2})
    assert holders([a, nxt], {})["m"] is nxt
    # Tables recording no claim of their own tie on the second; the name decides, as before.
    old_a = Claim("tinct-routing-a.taker", 100.0, "a", "taker", "u-a", ("m",))
    old_b = Claim("tinct-routing-b.owner", 100.0, "b", "owner", "u-b", ("m",))
    assert holders([old_b, old_a], {})["m"] is old_a


def test_the_routers_follow_the_same_owner() -> None:
    from tinct.api.ownership import holders, parse_model_owners

    b = Claim("cm-b", 100.0, "b", "chat", "u-b", ("m", "n"), standing=True)
    a = Claim("cm-a", 200.0, "a", "chat", "u-a", ("m", "o"))
    b2 = Claim("cm-b2", 300.0, "b", "next", "u-b2", ("n",))
    got = holders([a, b, b2], {})
    assert (got["m"], got["n"], got["o"]) == (b, b2, a)
    # b's next release of "m" carries b's claim over: b keeps "m" once the standing route goes.
    b3 = Claim("cm-b3", 300.0, "b", "next", "u-b3", ("m",), claimed={"m": 100.0})
    assert holders([a, b, b3], {})["m"] == b3
    assert holders([a, b3], {})["m"] == b3, "the standing route retired, the claim stays"
    assert holders([a, Claim("cm-b4", 300.0, "b", "next", "u-b4", ("m",))], {})["m"] == a
    assert "m" not in holders([a, b], {"m": "c"}), "reserved for a namespace that names it nowhere"
    assert holders([a, b], {"m": "a"})["m"] == a
    assert parse_model_owners("llama3-8b=team-a, org/m=x=b") == (("llama3-8b", "team-a"), ("org/m=x", "b"))
    for bad, why in (
        ("m", "is not MODEL=NAMESPACE"),
        ("=a", "is not MODEL=NAMESPACE"),
        ("m=Team", "'Team' is not a namespace name"),
        ("m=a,m=b", "model 'm' is given two namespaces"),
    ):
        with pytest.raises(ValueError, match=why):
            parse_model_owners(bad)


def test_a_final_release_refuses_every_action_but_retry_and_keeps_its_message() -> None:
    promoted = step(release(), T0, actions=[])
    promoted = step(promoted, T0 + timedelta(seconds=1), actions=["promote@a1-p"])
    assert st(promoted).phase == "Promoted"
    said = st(promoted).message
    for verb in ("promote", "abort", "resume", "retry"):
        d = round_(promoted, T0 + MINUTE, actions=[f"{verb}@a1-{verb}"])
        assert d.status.phase == "Promoted", verb
        assert d.status.last_action is not None
        assert d.status.last_action.result == "Refused", verb
        assert d.status.message == said, "a refused request does not speak for the release"
        assert [(t.reason, t.warning, t.record) for t in d.transitions] == [("ActionRefused", True, False)]
    aborted = step(step(release(), T0), T0 + timedelta(seconds=1), actions=["abort@a1-x"])
    d = round_(aborted, T0 + MINUTE, actions=["resume@a1-r"])
    assert d.status.last_action is not None
    assert "RolledBack, which is final" in d.status.last_action.message
    assert d.status.message == st(aborted).message
    assert round_(aborted, T0 + MINUTE, actions=["retry@a1-t"]).status.phase == "Progressing"


def test_final_refusal_names_what_to_do_instead() -> None:
    assert final_refusal("pause", "Progressing") is None
    assert final_refusal("retry", "RolledBack") is None
    assert final_refusal("pause", "Promoted") == (
        "the release is Promoted, which is final: there is nothing to pause; "
        "release stable again as a new candidate to go back"
    )
    assert "`tinct release retry` starts it over" in (final_refusal("pause", "RolledBack") or "")
    assert (
        final_refusal("retry", "Promoted")
        == "only a rolled-back or failed release is retried; it is Promoted"
    )
