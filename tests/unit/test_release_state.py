"""The GrayRelease state machine: preconditions, steps, analysis verdicts, manual actions."""

from __future__ import annotations

from datetime import timedelta

import pytest

from release_helpers import DEFAULT, LONG, SHORT, T0, mv, ok_objects, release, result, step
from tinct.operator.release.decide import (
    Problem,
    analysis_due,
    cell_key,
    decide,
    next_wakeup,
    parse_duration,
    preconditions,
    weights_for,
)


def test_durations_and_cell_keys() -> None:
    assert parse_duration("1m30s") == 90
    assert parse_duration("250ms") == 0.25
    with pytest.raises(ValueError, match="not a duration"):
        parse_duration("1 minute")
    gr = release()
    assert [cell_key(c.match) for c in gr.spec.cells] == [LONG, SHORT, DEFAULT]


def test_preconditions_name_what_is_missing() -> None:
    gr = release()
    mvs, svcs, deps = ok_objects(gr)
    assert preconditions(gr.spec, mvs, svcs, deps) == []

    missing = preconditions(gr.spec, {**mvs, "llama3-8b-2-0-0": None}, {"sched-v1": True}, {})
    assert [(p.condition, p.reason) for p in missing] == [
        ("ModelVersionsReady", "ModelVersionMissing"),
        ("BackendsAvailable", "DeploymentMissing"),
        ("BackendsAvailable", "ServiceMissing"),
        ("BackendsAvailable", "DeploymentMissing"),
    ]
    assert "candidate ModelVersion llama3-8b-2-0-0 does not exist" in missing[0].message

    failed = preconditions(
        gr.spec, {**mvs, "llama3-8b-2-0-0": mv(version="1.5.0", phase="Failed")}, svcs, deps
    )
    assert [(p.reason, p.fatal) for p in failed] == [("ModelVersionNotReady", False)]
    assert "is Failed, not Ready" in failed[0].message

    other = preconditions(
        gr.spec, {**mvs, "llama3-8b-2-0-0": mv(model="mistral", version="1.5.0")}, svcs, deps
    )
    assert [(p.reason, p.fatal) for p in other] == [("DifferentModels", True)]


def test_major_upgrade_waits_for_the_opt_in() -> None:
    gr = release(allowMajorUpgrade=False)
    mvs, svcs, deps = ok_objects(gr)
    mvs["llama3-8b-2-0-0"] = mv(version="2.0.0")
    got = preconditions(gr.spec, mvs, svcs, deps)
    assert [(p.reason, p.fatal) for p in got] == [("MajorUpgradeNotAllowed", False)]
    assert "allowMajorUpgrade" in got[0].message
    assert preconditions(release(allowMajorUpgrade=True).spec, mvs, svcs, deps) == []


def test_start_sets_step_zero_weights_and_conditions() -> None:
    gr = release()
    d = decide(gr, problems=[], analysis=None, action=None, now=T0)
    st = d.status
    assert (st.phase, st.step, st.step_started_at) == ("Progressing", 0, T0)
    assert st.weights == {LONG: 5, SHORT: 0.1, DEFAULT: 1}
    assert d.transition is not None
    assert d.transition.reason == "Started"
    assert {c.type: c.status for c in st.conditions} == {
        "ModelVersionsReady": "True",
        "BackendsAvailable": "True",
    }
    # The same state decided again (a restarted operator): nothing happens.
    again = decide(step(gr, T0), problems=[], analysis=None, action=None, now=T0 + timedelta(seconds=5))
    assert again.transition is None
    assert again.status.step == 0


def test_waiting_before_start_sends_nothing_and_starts_when_ready() -> None:
    gr = release()
    p = Problem("ModelVersionsReady", "ModelVersionNotReady", "candidate ModelVersion x is Failed, not Ready")
    d = decide(gr, problems=[p], analysis=None, action=None, now=T0)
    assert d.status.phase == "Pending"
    assert d.transition is None  # it was Pending already
    assert set(d.status.weights.values()) == {0.0}
    cond = next(c for c in d.status.conditions if c.type == "ModelVersionsReady")
    assert (cond.status, cond.reason, cond.message) == ("False", "ModelVersionNotReady", p.message)
    gr = step(gr, T0, problems=[p])
    assert step(gr, T0 + timedelta(seconds=1)).status.phase == "Progressing"


def test_analysis_pass_advances_each_step_and_the_last_full_step_promotes() -> None:
    gr = step(release(), T0)
    interval = timedelta(minutes=1)
    assert not analysis_due(gr, T0 + timedelta(seconds=59))
    assert next_wakeup(gr, T0 + timedelta(seconds=50), tick=30) == pytest.approx(10)
    now = T0
    seen = []
    for _ in range(3):
        now += interval
        assert analysis_due(gr, now)
        d = decide(gr, problems=[], analysis=result("Pass", now), action=None, now=now)
        assert d.transition is not None
        seen.append((d.transition.reason, d.status.phase, d.status.step, d.status.weights[LONG]))
        gr = gr.model_copy(update={"status": d.status})
    assert seen == [
        ("StepAdvanced", "Progressing", 1, 20),
        ("StepAdvanced", "Progressing", 2, 50),
        ("Promoted", "Promoted", 3, 100),
    ]
    assert set(gr.status.weights.values()) == {100.0}  # type: ignore[union-attr]
    assert not analysis_due(gr, now + interval)


def test_last_step_below_100_promotes_after_passing_it() -> None:
    cells = [{"match": {}, "weights": [10, 50]}]
    gr = step(release(cells=cells), T0)
    gr = step(gr, T0 + timedelta(minutes=1), result("Pass", T0 + timedelta(minutes=1)))
    assert (gr.status.phase, gr.status.step) == ("Progressing", 1)  # type: ignore[union-attr]
    gr = step(gr, T0 + timedelta(minutes=2), result("Pass", T0 + timedelta(minutes=2)))
    assert (gr.status.phase, gr.status.weights) == ("Promoted", {DEFAULT: 100.0})  # type: ignore[union-attr]


def test_failures_roll_back_at_the_limit_every_cell_to_zero() -> None:
    gr = step(release(), T0)
    t1 = T0 + timedelta(minutes=1)
    d = decide(gr, problems=[], analysis=result("Fail", t1), action=None, now=t1)
    assert d.transition is not None
    assert (d.transition.reason, d.transition.record, d.status.phase) == (
        "AnalysisFailed",
        False,
        "Progressing",
    )
    assert d.status.failed_analyses == 1
    assert d.status.weights[LONG] == 5  # held
    gr = gr.model_copy(update={"status": d.status})
    t2 = t1 + timedelta(minutes=1)
    d = decide(gr, problems=[], analysis=result("Fail", t2), action=None, now=t2)
    assert d.transition is not None
    assert (d.transition.reason, d.transition.warning) == ("RolledBack", True)
    assert d.status.phase == "RolledBack"
    assert set(d.status.weights.values()) == {0.0}
    assert "after 2 failed analyses" in (d.status.message or "")
    rolled = gr.model_copy(update={"status": d.status})
    assert decide(rolled, problems=[], analysis=None, action=None, now=t2).transition is None


def test_inconclusive_holds_never_counts_as_failure_then_pauses() -> None:
    spec_analysis = release().spec.analysis
    assert spec_analysis is not None
    analysis = spec_analysis.model_copy(update={"inconclusive_limit": 3})
    gr = step(release(analysis=analysis.wire()), T0)
    now = T0
    for i in range(1, 3):
        now += timedelta(minutes=1)
        d = decide(gr, problems=[], analysis=result("Inconclusive", now), action=None, now=now)
        assert d.transition is None
        assert (d.status.phase, d.status.step, d.status.failed_analyses) == ("Progressing", 0, 0)
        assert d.status.inconclusive_analyses == i
        cond = next(c for c in d.status.conditions if c.type == "AnalysisPassing")
        assert (cond.status, cond.reason) == ("Unknown", "Inconclusive")
        gr = gr.model_copy(update={"status": d.status})
    now += timedelta(minutes=1)
    d = decide(gr, problems=[], analysis=result("Inconclusive", now), action=None, now=now)
    assert d.transition is not None
    assert (d.transition.reason, d.status.phase, d.status.weights[LONG]) == ("Paused", "Paused", 5)
    assert d.status.pause_reason
    gr = gr.model_copy(update={"status": d.status})
    # spec.paused is false, yet it stays paused until resumed by request.
    assert step(gr, now + timedelta(minutes=5)).status.phase == "Paused"  # type: ignore[union-attr]
    resumed = decide(gr, problems=[], analysis=None, action="resume@1", now=now + timedelta(minutes=6))
    assert resumed.transition is not None
    assert (resumed.transition.reason, resumed.status.phase) == ("Resumed", "Progressing")
    assert resumed.status.step_started_at == now + timedelta(minutes=6)
    assert resumed.status.acknowledged_action == "resume@1"


def test_spec_paused_holds_the_weights() -> None:
    gr = step(release(), T0)
    gr = gr.model_copy(update={"spec": gr.spec.model_copy(update={"paused": True})})
    d = decide(gr, problems=[], analysis=None, action=None, now=T0 + timedelta(minutes=3))
    assert d.transition is not None
    assert (d.transition.reason, d.status.phase, d.status.weights[LONG]) == ("Paused", "Paused", 5)
    assert not analysis_due(gr.model_copy(update={"status": d.status}), T0 + timedelta(minutes=9))


def test_precondition_lost_mid_release_holds_the_step() -> None:
    gr = step(release(), T0)
    gr = step(gr, T0 + timedelta(minutes=1), result("Pass", T0 + timedelta(minutes=1)))
    p = Problem("ModelVersionsReady", "ModelVersionNotReady", "candidate ModelVersion x is Failed, not Ready")
    d = decide(gr, problems=[p], analysis=None, action=None, now=T0 + timedelta(minutes=2))
    assert d.transition is not None
    assert (d.transition.reason, d.status.phase, d.status.step, d.status.weights[LONG]) == (
        "Waiting",
        "Pending",
        1,
        20,
    )
    gr = gr.model_copy(update={"status": d.status})
    back = decide(gr, problems=[], analysis=None, action=None, now=T0 + timedelta(minutes=3))
    assert back.transition is not None
    assert (back.transition.reason, back.status.phase, back.status.step) == ("Resumed", "Progressing", 1)


def test_fatal_problem_fails_with_zero_weights_and_recovers_when_fixed() -> None:
    gr = step(release(), T0)
    p = Problem(
        "ModelVersionsReady", "DifferentModels", "stable is model 'a' but candidate is 'b'", fatal=True
    )
    d = decide(gr, problems=[p], analysis=None, action=None, now=T0)
    assert (d.status.phase, set(d.status.weights.values())) == ("Failed", {0.0})
    gr = gr.model_copy(update={"status": d.status})
    d = decide(gr, problems=[], analysis=None, action=None, now=T0)
    assert d.transition is not None
    assert (d.transition.reason, d.status.phase, d.status.step) == ("Recovered", "Pending", 0)


def test_actions_abort_promote_retry_are_consumed_once() -> None:
    gr = step(release(), T0)
    d = decide(gr, problems=[], analysis=None, action="abort@a1", now=T0)
    assert d.transition is not None
    assert (d.transition.reason, d.status.phase, d.status.acknowledged_action) == (
        "Aborted",
        "RolledBack",
        "abort@a1",
    )
    assert set(d.status.weights.values()) == {0.0}
    gr = gr.model_copy(update={"status": d.status})
    assert decide(gr, problems=[], analysis=None, action="abort@a1", now=T0).transition is None

    d = decide(gr, problems=[], analysis=None, action="retry@r1", now=T0)
    assert d.transition is not None
    assert (d.transition.reason, d.status.phase, d.status.step, d.status.failed_analyses) == (
        "Retried",
        "Pending",
        0,
        0,
    )
    gr = step(gr.model_copy(update={"status": d.status}), T0, action="retry@r1")
    assert gr.status is not None
    assert gr.status.phase == "Progressing"

    d = decide(gr, problems=[], analysis=None, action="promote@p1", now=T0)
    assert d.transition is not None
    assert (d.transition.reason, d.status.phase, set(d.status.weights.values())) == (
        "Promoted",
        "Promoted",
        {100.0},
    )

    bad = decide(gr, problems=[], analysis=None, action="explode@1", now=T0)
    assert bad.transition is not None
    assert (bad.transition.reason, bad.transition.record) == ("ActionIgnored", False)
    assert "promote, abort, retry, resume" in bad.transition.message
    ignored = decide(gr, problems=[], analysis=None, action="retry@r2", now=T0)
    assert ignored.transition is not None
    assert ignored.transition.reason == "ActionIgnored"
    assert ignored.status.phase == "Progressing"


def test_without_analysis_each_interval_advances() -> None:
    gr = step(release(analysis=None), T0)
    assert step(gr, T0 + timedelta(seconds=30)).status.step == 0  # type: ignore[union-attr]
    gr = step(gr, T0 + timedelta(minutes=1))
    assert gr.status is not None
    assert (gr.status.phase, gr.status.step) == ("Progressing", 1)


def test_weights_for_every_phase() -> None:
    spec = release().spec
    assert weights_for(spec, "Progressing", 1, True) == {LONG: 20, SHORT: 1, DEFAULT: 10}
    assert weights_for(spec, "Paused", 9, True) == {LONG: 100, SHORT: 100, DEFAULT: 100}
    assert weights_for(spec, "Pending", 1, False) == {LONG: 0, SHORT: 0, DEFAULT: 0}
    assert weights_for(spec, "RolledBack", 2, True) == {LONG: 0, SHORT: 0, DEFAULT: 0}
    assert weights_for(spec, "Promoted", 0, True) == {LONG: 100, SHORT: 100, DEFAULT: 100}


def test_a_new_candidate_starts_the_release_over() -> None:
    gr = step(release(), T0)
    gr = step(gr, T0, action="promote@1")
    assert gr.status is not None
    assert (gr.status.phase, gr.status.released) == ("Promoted", "llama3-8b-1-4-0 -> llama3-8b-2-0-0")
    gr.spec.candidate.model_version = "llama3-8b-2-1-0"
    d = decide(gr, problems=[], analysis=None, action="promote@1", now=T0 + timedelta(minutes=1))
    assert d.transition is not None
    assert (d.transition.reason, d.status.phase, d.status.step) == ("Restarted", "Pending", 0)
    assert "became llama3-8b-1-4-0 -> llama3-8b-2-1-0" in d.transition.message
    assert set(d.status.weights.values()) == {0.0}  # nothing to the new candidate until it starts
    gr = gr.model_copy(update={"status": d.status})
    assert step(gr, T0 + timedelta(minutes=1), action="promote@1").status.phase == "Progressing"  # type: ignore[union-attr]
