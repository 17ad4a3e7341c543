"""What a release's status turns into: the routing-table ConfigMap and the HPAs."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from tinct.api.routing import DATA_KEY, VERSION_ANNOTATION, parse_table
from tinct.api.v1alpha1.grayrelease import GrayRelease, GrayReleaseStatus
from tinct.operator.grayrelease.scaling import (
    STEP_DOWN_INTERVALS,
    candidate_bounds,
    hpa_name,
    plan_autoscaling,
    stable_bounds,
)
from tinct.operator.grayrelease.tables import (
    cells_by_tag,
    content_digest,
    desired_table,
    plan,
    release_models,
    standing_table,
    table_manifest,
    target_digest,
)
from tinct_testing.release_helpers import DEFAULT, LONG, SHORT, T0, TABLES, mv, release, step


def started(**spec: Any) -> GrayRelease:
    return step(release(**spec), T0)


def _planned(
    gr: GrayRelease, found: int = 0, models: list[str] | None = None
) -> tuple[GrayReleaseStatus, Any]:
    assert gr.status is not None
    st = gr.status.model_copy(deep=True)
    table = plan(gr, st, table_namespace=TABLES, found_version=found, models=models or ["llama3-8b"])
    return st, table


def test_table_follows_status_lives_in_the_table_namespace_and_its_version_only_grows() -> None:
    gr = started()
    st = gr.status
    assert st is not None
    assert st.routing is not None
    assert (st.routing.config_map, st.routing.namespace, st.routing.version) == (
        "tinct-routing-llm.chat",
        TABLES,
        1,
    )
    table = desired_table(gr, st, st.routing.version, models=["llama3-8b"])
    assert st.routing.digest == content_digest(table)
    manifest = table_manifest(table, TABLES)
    meta = manifest["metadata"]
    assert (meta["name"], meta["namespace"]) == ("tinct-routing-llm.chat", TABLES)
    assert meta["annotations"][VERSION_ANNOTATION] == "1"
    assert meta["labels"]["tinct.io/release-namespace"] == "llm"
    assert "ownerReferences" not in meta  # a reference cannot cross namespaces; it outlives the release
    doc = parse_table(manifest["data"][DATA_KEY])
    assert (doc.state, doc.step, doc.uid, doc.namespace) == ("Progressing", 0, "uid-1", "llm")
    assert [c.weight for c in doc.cells] == [5, 0.1, 1]
    assert doc.candidate.url == "http://sched-v2.llm.svc.cluster.local:8000"

    # The same status planned again: the same version.
    again, _ = _planned(gr)
    assert again.routing is not None
    assert again.routing.version == 1
    # Other content: one version on; the cluster ahead of status (written, then the operator died): above it.
    aborted = step(gr, T0 + timedelta(minutes=1), actions=["abort@a1-x"])
    assert aborted.status is not None
    assert aborted.status.routing is not None
    assert aborted.status.routing.version == 2
    ahead, table = _planned(aborted, found=12)
    assert ahead.routing is not None
    assert ahead.routing.version == 13
    assert [c.weight for c in table.cells] == [0, 0, 0]


def test_table_names_the_model_of_the_releases_modelversions() -> None:
    gr = started()
    both = {"llama3-8b-1-4-0": mv(version="1.4.0"), "llama3-8b-2-0-0": mv(version="1.5.0")}
    assert release_models(gr, both) == ["llama3-8b"]
    candidate_only = {"llama3-8b-1-4-0": None, "llama3-8b-2-0-0": mv(version="1.5.0")}
    assert release_models(gr, candidate_only) == ["llama3-8b"]
    # Neither known (deleted mid-release): the models last recorded, never "any model".
    assert release_models(gr, {"llama3-8b-1-4-0": None, "llama3-8b-2-0-0": None}, ["llama3-8b"]) == [
        "llama3-8b"
    ]
    assert release_models(gr, {"llama3-8b-1-4-0": {"spec": {}}}) == []
    assert release_models(gr, {**both, "llama3-8b-2-0-0": mv(model="coder-7b")}) == ["llama3-8b"]
    # A table naming other models is other content: a new version.
    st, table = _planned(gr, models=["coder-7b"])
    assert st.routing is not None
    assert st.routing.version == 2
    assert table.models == ["coder-7b"]
    named = started(models=["chat-prod", "chat"])
    _, listed = _planned(named)
    assert listed.models == ["chat-prod", "chat"]


def test_target_digest_covers_what_is_released_and_waits_for_digests() -> None:
    gr = release()
    mvs = {"llama3-8b-1-4-0": mv(digest="a"), "llama3-8b-2-0-0": mv(version="1.5.0", digest="b")}
    base = target_digest(gr, mvs)
    assert base is not None
    assert target_digest(gr, {**mvs, "llama3-8b-2-0-0": mv(version="1.5.0", digest="c")}) != base
    assert target_digest(gr, {**mvs, "llama3-8b-2-0-0": mv(version="1.5.0", phase=None)}) is None
    for change in (
        {"port": 8001},
        {"service": "sched-v3"},
        {"deployment": "other"},
        {"scheduler_version": "v3"},
    ):
        other = release()
        other.spec.candidate = other.spec.candidate.model_copy(update=change)
        assert target_digest(other, mvs) != base, change


def test_a_deleted_release_leaves_its_outcome_as_the_standing_route() -> None:
    gr = started()
    assert gr.status is not None
    stable = standing_table(gr, gr.status, found_version=3)
    assert (stable.standing, stable.version, {c.weight for c in stable.cells}) == (True, 4, {0})
    assert stable.models == ["llama3-8b"]
    promoted = step(gr, T0 + timedelta(seconds=1), actions=["promote@a1-p"])
    assert promoted.status is not None
    assert promoted.status.phase == "Promoted"
    cand = standing_table(promoted, promoted.status)
    assert {c.weight for c in cand.cells} == {100}
    assert cand.version == promoted.status.routing.version + 1  # type: ignore[union-attr]


def test_backend_url_overrides_the_service_address() -> None:
    gr = started()
    gr.spec.candidate.url = "http://127.0.0.1:18080"
    assert gr.status is not None
    table = desired_table(gr, gr.status, 1, cluster_domain="")
    assert (table.stable.url, table.candidate.url) == (
        "http://sched-v1.llm.svc:8000",
        "http://127.0.0.1:18080",
    )


def test_cells_by_tag_uses_the_routers_most_specific_match() -> None:
    gr = started()
    assert gr.status is not None
    cells = cells_by_tag(desired_table(gr, gr.status, 1))
    assert cells[LONG] == [LONG]
    assert cells[SHORT] == [SHORT]
    assert len(cells[DEFAULT]) == 3 * 3 * 2 - 2


def _status(**kw: Any) -> GrayReleaseStatus:
    return GrayReleaseStatus(step_started_at=T0, **kw)


def test_candidate_bounds_follow_the_share_it_is_about_to_take() -> None:
    spec = release(autoscaling={"minReplicas": 2, "maxReplicas": 12}).spec
    assert candidate_bounds(spec, _status(phase="Pending"), T0) == (2, 2)
    assert candidate_bounds(spec, _status(phase="Progressing", weights={"a": 0.1}), T0) == (1, 1)
    assert candidate_bounds(spec, _status(phase="Progressing", weights={"a": 20}), T0) == (1, 3)
    # Stable served with 4: a step of 50 % waiting for its replicas already asks for 2.
    waiting = _status(phase="Progressing", step=1, next_step=2, weights={"a": 20}, stable_floor=4)
    assert candidate_bounds(spec, waiting, T0) == (2, 6)
    promoting = _status(phase="Progressing", step=2, next_step=4, weights={"a": 50}, stable_floor=4)
    assert candidate_bounds(spec, promoting, T0) == (4, 12)
    assert candidate_bounds(spec, _status(phase="Promoted", weights={"a": 100}, stable_floor=4), T0) == (
        4,
        12,
    )
    # After a rollback the candidate keeps its bounds a while, then shrinks.
    rolled = _status(phase="RolledBack", step=2, weights={"a": 0})
    assert candidate_bounds(spec, rolled, T0 + timedelta(seconds=10)) == (1, 6)
    assert candidate_bounds(spec, rolled, T0 + timedelta(minutes=2)) == (2, 2)


def test_stable_keeps_its_floor_until_promotion_then_steps_down() -> None:
    spec = release(autoscaling={"minReplicas": 2, "maxReplicas": 12}, analysis={}).spec
    assert stable_bounds(spec, _status(phase="Progressing", stable_floor=6), T0) == (6, 12)
    assert stable_bounds(spec, _status(phase="RolledBack", stable_floor=6), T0) == (6, 12)
    assert stable_bounds(spec, _status(phase="Progressing"), T0) == (2, 12)
    promoted = _status(phase="Promoted", stable_floor=6)
    seen = [stable_bounds(spec, promoted, T0 + timedelta(minutes=i)) for i in range(6)]
    assert seen == [(5, 10), (4, 7), (3, 5), (2, 2), (2, 2), (2, 2)]
    assert STEP_DOWN_INTERVALS == 4


def _hpa(name: str, deployment: str, uid: str | None = None) -> dict[str, Any]:
    refs = [{"kind": "GrayRelease", "uid": uid}] if uid else []
    return {
        "metadata": {"name": name, "ownerReferences": refs},
        "spec": {"scaleTargetRef": {"kind": "Deployment", "name": deployment}},
    }


def test_plan_writes_both_hpas_with_the_spec_metric() -> None:
    gr = started()
    assert gr.status is not None
    plan = plan_autoscaling(gr, gr.status, [_hpa(hpa_name("chat", "stable"), "sched-v1", "uid-1")], T0)
    assert plan.foreign == []
    assert [(s.side, s.min_replicas, s.max_replicas, s.managed) for s in plan.status] == [
        ("stable", 1, 12, True),
        ("candidate", 1, 1, True),
    ]
    cand = plan.manifests[1]
    assert cand["metadata"]["name"] == "tinct-chat-candidate"
    assert cand["metadata"]["ownerReferences"][0]["uid"] == "uid-1"
    assert cand["spec"]["scaleTargetRef"] == {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "name": "sched-v2",
    }
    assert cand["spec"]["metrics"] == [
        {
            "type": "Pods",
            "pods": {
                "metric": {"name": "http_requests_total"},
                "target": {"type": "AverageValue", "averageValue": "250"},
            },
        }
    ]
    cpu = started(
        autoscaling={"minReplicas": 1, "maxReplicas": 4, "metric": {"pods": "cpu", "averageValue": "500m"}}
    )
    assert cpu.status is not None
    metric = plan_autoscaling(cpu, cpu.status, [], T0).manifests[0]["spec"]["metrics"][0]
    assert metric == {
        "type": "Resource",
        "resource": {"name": "cpu", "target": {"type": "AverageValue", "averageValue": "500m"}},
    }


def test_foreign_hpa_is_not_fought_over() -> None:
    gr = started()
    assert gr.status is not None
    plan = plan_autoscaling(gr, gr.status, [_hpa("team-hpa", "sched-v2")], T0)
    assert [m["metadata"]["name"] for m in plan.manifests] == ["tinct-chat-stable"]
    assert [(s.side, s.managed) for s in plan.status] == [("stable", True), ("candidate", False)]
    conds = plan.conditions([], 1, T0)
    assert (conds[0].type, conds[0].status, conds[0].reason) == ("AutoscalingReady", "False", "ForeignHPA")
    assert "HPA team-hpa, which this release did not create" in conds[0].message


def _scaling_active(hpa: dict[str, Any], status: str, reason: str, message: str) -> dict[str, Any]:
    cond = {"type": "ScalingActive", "status": status, "reason": reason, "message": message}
    return {**hpa, "status": {"conditions": [cond]}}


def test_an_hpa_that_cannot_read_its_metric_is_never_applied() -> None:
    gr = started()
    assert gr.status is not None
    stable, candidate = hpa_name("chat", "stable"), hpa_name("chat", "candidate")
    fresh = [_hpa(stable, "sched-v1", "uid-1"), _hpa(candidate, "sched-v2", "uid-1")]
    # Not looked at yet by the HPA controller: applied, as far as anyone knows.
    conds = plan_autoscaling(gr, gr.status, fresh, T0).conditions([], 1, T0)
    assert (conds[0].status, conds[0].reason) == ("True", "Applied")
    said = (
        "unable to get metric http_requests_total: no custom metrics API (custom.metrics.k8s.io) registered"
    )
    blind = [
        _scaling_active(fresh[0], "False", "FailedGetPodsMetric", said),
        _scaling_active(
            fresh[1], "True", "ValidMetricFound", "the HPA was able to compute the replica count"
        ),
        # Another's HPA failing says nothing of this release's.
        _scaling_active(_hpa("team-hpa", "other"), "False", "FailedGetPodsMetric", said),
    ]
    plan = plan_autoscaling(gr, gr.status, blind, T0)
    assert [m["metadata"]["name"] for m in plan.manifests] == [stable, candidate], "still written"
    conds = plan.conditions([], 1, T0)
    assert (conds[0].status, conds[0].reason) == ("False", "MetricUnavailable")
    assert conds[0].message == f"HPA {stable} cannot read its metric (FailedGetPodsMetric): {said}"
    # Both saying the same: one sentence naming both.
    both = [_scaling_active(h, "False", "FailedGetPodsMetric", said) for h in fresh]
    conds = plan_autoscaling(gr, gr.status, both, T0).conditions([], 1, T0)
    assert (
        conds[0].message
        == f"HPAs {stable}, {candidate} cannot read their metric (FailedGetPodsMetric): {said}"
    )
    # Scaling disabled (a Deployment at 0 replicas) is no metric problem.
    idle = [_scaling_active(fresh[0], "False", "ScalingDisabled", "scaling is disabled"), fresh[1]]
    conds = plan_autoscaling(gr, gr.status, idle, T0).conditions([], 1, T0)
    assert (conds[0].status, conds[0].reason) == ("True", "Applied")
