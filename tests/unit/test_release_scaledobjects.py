"""spec.autoscaling.keda: the ScaledObjects a release's status turns into, and when none are written."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from tinct.api.v1alpha1.grayrelease import GrayRelease
from tinct.operator.grayrelease.engine import QUEUE_METRICS
from tinct.operator.grayrelease.scaling import (
    KedaEnv,
    candidate_bounds,
    hpa_name,
    keda_hpa_name,
    plan_autoscaling,
    scaled_object_name,
    side_query,
    stable_bounds,
    targets,
)
from tinct_testing.release_helpers import T0, release, step

PROM = "http://prometheus.monitoring:9090"
KEDA = KedaEnv(served=True, url=PROM)


def keda_release(
    keda: dict[str, Any] | None = None, engines: tuple[str, str] = ("sglang", "vllm"), **spec: Any
) -> GrayRelease:
    base = release().spec
    gr = release(
        stable={**base.stable.wire(), "engine": engines[0]},
        candidate={**base.candidate.wire(), "engine": engines[1]},
        autoscaling={"minReplicas": 2, "maxReplicas": 12, "keda": keda if keda is not None else {}},
        **spec,
    )
    return step(gr, T0)


def _owned(
    name: str, deployment: str, kind: str = "GrayRelease", uid: str = "uid-1", owner: str = "chat"
) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "ownerReferences": [{"kind": kind, "uid": uid, "name": owner}]},
        "spec": {"scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": deployment}},
    }


def _foreign(name: str, deployment: str) -> dict[str, Any]:
    return {"metadata": {"name": name}, "spec": {"scaleTargetRef": {"name": deployment}}}


def test_each_side_gets_a_scaledobject_on_its_own_engine_queue() -> None:
    gr = keda_release({"targetPerReplica": 4, "scaleDownStabilizationSeconds": 30})
    assert gr.status is not None
    plan = plan_autoscaling(gr, gr.status, [], T0, [], KEDA)
    assert plan.manifests == [], "no HPA of tinct's own beside KEDA's"
    assert plan.problem is None
    assert plan.foreign == []
    stable, cand = plan.scaled_objects
    assert [m["metadata"]["name"] for m in (stable, cand)] == ["tinct-chat-stable", "tinct-chat-candidate"]
    assert cand["apiVersion"] == "keda.sh/v1alpha1"
    assert cand["kind"] == "ScaledObject"
    meta = cand["metadata"]
    assert (meta["namespace"], meta["ownerReferences"][0]["uid"]) == ("llm", "uid-1")
    assert meta["ownerReferences"][0]["controller"] is True
    assert meta["labels"]["tinct.io/side"] == "candidate"
    spec = cand["spec"]
    assert spec["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": "sched-v2"}
    assert (spec["minReplicaCount"], spec["maxReplicaCount"]) == candidate_bounds(gr.spec, gr.status, T0)
    assert (stable["spec"]["minReplicaCount"], stable["spec"]["maxReplicaCount"]) == stable_bounds(
        gr.spec, gr.status, T0
    )
    assert spec["advanced"]["horizontalPodAutoscalerConfig"]["behavior"] == {
        "scaleUp": {"stabilizationWindowSeconds": 0},
        "scaleDown": {"stabilizationWindowSeconds": 30},
    }
    (trigger,) = spec["triggers"]
    assert trigger["type"] == "prometheus"
    assert trigger["metricType"] == "AverageValue"
    assert trigger["metadata"] == {
        "serverAddress": PROM,
        "query": 'sum(vllm:num_requests_waiting{namespace="llm",service="sched-v2"})',
        "threshold": "4",
        "ignoreNullValues": "false",
    }
    # stable runs SGLang: both names its releases have exported, the first found wins.
    assert stable["spec"]["triggers"][0]["metadata"]["query"] == (
        'sum(sglang:num_queue_reqs{namespace="llm",service="sched-v1"}) or '
        'sum(sglang_num_queue_reqs{namespace="llm",service="sched-v1"})'
    )
    assert [(s.side, s.hpa, s.scaled_object, s.managed) for s in plan.status] == [
        ("stable", "keda-hpa-tinct-chat-stable", "tinct-chat-stable", True),
        ("candidate", "keda-hpa-tinct-chat-candidate", "tinct-chat-candidate", True),
    ]
    assert plan.status[1].query == trigger["metadata"]["query"]
    (cond,) = plan.conditions([], 1, T0)
    assert (cond.status, cond.reason) == ("True", "Applied")
    assert "KEDA ScaledObjects" in cond.message


def test_bounds_follow_the_release_like_the_hpas() -> None:
    gr = keda_release()
    assert gr.status is not None
    later = gr.status.model_copy(update={"phase": "Promoted", "weights": {"a": 100}, "stable_floor": 6})
    for when in (T0, T0 + timedelta(minutes=1), T0 + timedelta(minutes=10)):
        plan = plan_autoscaling(gr, later, [], when, [], KEDA)
        got = {
            m["metadata"]["name"]: (m["spec"]["minReplicaCount"], m["spec"]["maxReplicaCount"])
            for m in plan.scaled_objects
        }
        assert got == {
            "tinct-chat-stable": stable_bounds(gr.spec, later, when),
            "tinct-chat-candidate": candidate_bounds(gr.spec, later, when),
        }
    assert stable_bounds(gr.spec, later, T0 + timedelta(minutes=10)) == (2, 2), "stable stepped down"


def test_labels_and_queries_each_side_names() -> None:
    gr = keda_release(
        {
            "stable": {"labels": {"job": "llm-v1", "pod": 'a"b'}},
            "candidate": {"query": 'sum(rate(tokens_total{app="v2"}[1m]))'},
        },
        engines=("tgi", "vllm"),
    )
    assert side_query(gr, "stable") == 'sum(tgi_queue_size{job="llm-v1",pod="a\\"b"})'
    assert side_query(gr, "candidate") == 'sum(rate(tokens_total{app="v2"}[1m]))'
    cand = plan_autoscaling(gr, gr.status, [], T0, [], KEDA).scaled_objects[1]  # type: ignore[arg-type]
    assert cand["spec"]["triggers"][0]["name"] == "query"


def test_two_sides_on_the_same_series_are_refused() -> None:
    # Same Service, two ports: the default labels would select the same series for both.
    gr = keda_release(engines=("vllm", "vllm"))
    gr.spec.candidate.service = gr.spec.stable.service
    gr.spec.candidate.port = 9000
    assert gr.status is not None
    plan = plan_autoscaling(gr, gr.status, [], T0, [], KEDA)
    assert plan.scaled_objects == []
    (cond,) = plan.conditions([], 1, T0)
    assert (cond.status, cond.reason) == ("False", "SameSignal")
    assert "labels" in cond.message
    assert [s.managed for s in plan.status] == [False, False]


@pytest.mark.parametrize(
    ("env", "reason"),
    [
        (KedaEnv(served=False, url=PROM), "KEDANotInstalled"),
        (
            KedaEnv(served=True, refused="spec.autoscaling.keda.prometheus.name x is not one"),
            "PrometheusNotAllowed",
        ),
    ],
)
def test_nothing_is_written_without_keda_or_an_allowed_prometheus(env: KedaEnv, reason: str) -> None:
    gr = keda_release()
    assert gr.status is not None
    ours = _owned(hpa_name("chat", "candidate"), "sched-v2")
    plan = plan_autoscaling(gr, gr.status, [ours], T0, [], env)
    assert plan.scaled_objects == []
    assert plan.manifests == []
    assert plan.delete_hpas == [], "the HPA it has keeps scaling until something replaces it"
    (cond,) = plan.conditions([], 1, T0)
    assert (cond.status, cond.reason) == ("False", reason)
    assert [s.managed for s in plan.status] == [False, False]
    if reason == "KEDANotInstalled":
        assert "scaledobjects.keda.sh" in cond.message


def test_switching_ways_removes_the_releases_own_scaler_of_the_other_way() -> None:
    gr = keda_release()
    assert gr.status is not None
    own_hpas = [
        _owned(hpa_name("chat", s), d) for s, d in (("stable", "sched-v1"), ("candidate", "sched-v2"))
    ]
    plan = plan_autoscaling(gr, gr.status, own_hpas, T0, [], KEDA)
    assert plan.delete_hpas == ["tinct-chat-stable", "tinct-chat-candidate"]
    assert plan.foreign == []
    # Back to HPAs: the ScaledObjects go, and KEDA's HPAs for them are not foreign meanwhile.
    hpa_way = step(release(autoscaling={"minReplicas": 2, "maxReplicas": 12}), T0)
    assert hpa_way.status is not None
    sos = [_owned(scaled_object_name("chat", "candidate"), "sched-v2")]
    keda_hpa = _owned(
        keda_hpa_name("tinct-chat-candidate"), "sched-v2", kind="ScaledObject", owner="tinct-chat-candidate"
    )
    plan = plan_autoscaling(hpa_way, hpa_way.status, [keda_hpa], T0, sos)
    assert plan.delete_scaled_objects == ["tinct-chat-candidate"]
    assert [m["metadata"]["name"] for m in plan.manifests] == ["tinct-chat-stable", "tinct-chat-candidate"]
    assert plan.foreign == []


def test_keda_hpa_of_the_releases_own_scaledobject_is_not_foreign() -> None:
    gr = keda_release()
    assert gr.status is not None
    sos = [_owned("tinct-chat-candidate", "sched-v2"), _owned("tinct-chat-stable", "sched-v1")]
    hpas = [
        _owned(
            "keda-hpa-tinct-chat-candidate", "sched-v2", kind="ScaledObject", owner="tinct-chat-candidate"
        ),
        _owned("keda-hpa-tinct-chat-stable", "sched-v1", kind="ScaledObject", owner="tinct-chat-stable"),
    ]
    plan = plan_autoscaling(gr, gr.status, hpas, T0, sos, KEDA)
    assert plan.foreign == []
    assert len(plan.scaled_objects) == 2


def test_foreign_scaledobject_or_hpa_is_not_fought_over() -> None:
    gr = keda_release()
    assert gr.status is not None
    team_so = _foreign("team-so", "sched-v2")
    team_hpa = _owned("keda-hpa-team-so", "sched-v2", kind="ScaledObject", uid="u-team", owner="team-so")
    plan = plan_autoscaling(gr, gr.status, [team_hpa], T0, [team_so], KEDA)
    assert [m["metadata"]["name"] for m in plan.scaled_objects] == ["tinct-chat-stable"]
    assert [(s.side, s.managed) for s in plan.status] == [("stable", True), ("candidate", False)]
    (cond,) = plan.conditions([], 1, T0)
    assert (cond.status, cond.reason) == ("False", "ForeignScaledObject")
    assert "HPA keda-hpa-team-so, ScaledObject team-so" in cond.message
    # A ScaledObject another release (another uid) made under the same name is foreign too.
    other = _owned("tinct-chat-candidate", "sched-v2", uid="uid-other")
    plan = plan_autoscaling(gr, gr.status, [], T0, [other], KEDA)
    assert [s.managed for s in plan.status] == [True, False]
    # And in the HPA way, a ScaledObject on the Deployment is foreign as well.
    hpa_way = step(release(autoscaling={"minReplicas": 2, "maxReplicas": 12}), T0)
    assert hpa_way.status is not None
    plan = plan_autoscaling(hpa_way, hpa_way.status, [], T0, [team_so])
    assert [m["metadata"]["name"] for m in plan.manifests] == ["tinct-chat-stable"]
    assert plan.foreign_reason == "ForeignScaledObject"


def test_names_fit_keda_limits_and_stay_apart() -> None:
    long = "r" * 200
    stable, cand = scaled_object_name(long, "stable"), scaled_object_name(long, "candidate")
    assert len(stable) <= 63
    assert len(cand) <= 63
    assert stable != cand
    assert stable.endswith("-stable")
    assert scaled_object_name("r" * 201, "stable") != stable
    assert scaled_object_name("chat", "stable") == "tinct-chat-stable"


def test_targets_reads_a_scaledobjects_defaults() -> None:
    assert targets(_foreign("so", "sched-v2"), "sched-v2")
    assert not targets(_foreign("so", "sched-v2"), "sched-v1")
    sts = {"spec": {"scaleTargetRef": {"apiVersion": "apps/v1", "kind": "StatefulSet", "name": "sched-v2"}}}
    assert not targets(sts, "sched-v2")


def test_every_engine_has_a_queue_metric() -> None:
    from typing import get_args

    from tinct.api.v1alpha1.grayrelease import Engine

    assert set(QUEUE_METRICS) == set(get_args(Engine))


def test_kubectl_explain_describes_every_autoscaling_field() -> None:
    import yaml

    from tinct_testing.paths import CRDS

    crd = yaml.safe_load((CRDS / "tinct.io_grayreleases.yaml").read_text())
    spec = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
    missing: list[str] = []

    def walk(path: str, node: dict[str, Any]) -> None:
        if "description" not in node:
            missing.append(path)
        for name, child in (node.get("properties") or {}).items():
            walk(f"{path}.{name}", child)

    walk("spec.autoscaling", spec["autoscaling"])
    walk("spec.candidate.engine", spec["candidate"]["properties"]["engine"])
    assert missing == []
    keda = spec["autoscaling"]["properties"]["keda"]["properties"]
    assert "replicas" in keda["targetPerReplica"]["description"]
    assert "Seconds" in keda["scaleDownStabilizationSeconds"]["description"]


def test_a_scaledobject_with_fields_keda_defaulted_counts_as_applied() -> None:
    from tinct.operator.grayrelease.act import so_current

    gr = keda_release()
    assert gr.status is not None
    want = plan_autoscaling(gr, gr.status, [], T0, [], KEDA).scaled_objects[1]
    stored = {"metadata": {"name": want["metadata"]["name"]}, "spec": {**want["spec"], "pollingInterval": 30}}
    assert so_current(want, [stored], None)
    older = {**stored, "spec": {**stored["spec"], "maxReplicaCount": want["spec"]["maxReplicaCount"] + 1}}
    assert not so_current(want, [older], None)
    assert so_current(want, [older], want), "just applied: the watch has not caught up yet"
    assert not so_current(want, [], None)


def test_labels_at_their_longest_make_a_query_status_shows_cut_and_keda_gets_whole() -> None:
    labels = {f"k{s}{i:03d}".ljust(128, "x"): "v" * 256 for s in "s" for i in range(16)}
    other = {f"k{s}{i:03d}".ljust(128, "x"): "w" * 256 for s in "c" for i in range(16)}
    gr = keda_release({"stable": {"labels": labels}, "candidate": {"labels": other}})
    assert gr.status is not None
    plan = plan_autoscaling(gr, gr.status, [], T0, [], KEDA)
    shown = [s.query for s in plan.status]
    whole = [so["spec"]["triggers"][0]["metadata"]["query"] for so in plan.scaled_objects]
    assert all(len(q or "") <= 8192 for q in shown)
    assert max(len(q) for q in whole) > 8192, "the case this guards"
    assert all(q is not None and w.startswith(q[:-3]) for q, w in zip(shown, whole, strict=True))


def test_an_action_value_of_any_size_is_one_request_recorded_cut() -> None:
    from tinct.api.v1alpha1.action import bounded
    from tinct.api.v1alpha1.grayrelease import GrayReleaseStatus

    huge = "abort@a1-" + "x" * 200_000
    gr = step(step(release(), T0), T0 + timedelta(seconds=1), actions=[bounded(huge)])
    assert gr.status is not None
    assert gr.status.last_action is not None
    assert (gr.status.last_action.result, gr.status.phase) == ("Done", "RolledBack")
    assert len(gr.status.last_action.value) <= 256
    assert gr.status.last_action.value == bounded(huge) != bounded(huge + "y")
    assert gr.status.seen_actions[-1] == bounded(huge)
    GrayReleaseStatus.model_validate(gr.status.wire())  # it can be written
