"""What a release's status turns into: the routing-table ConfigMap and the HPAs."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

from release_helpers import DEFAULT, LONG, SHORT, T0, mv, release, step
from tinct.api.routing import DATA_KEY, VERSION_ANNOTATION, parse_table
from tinct.api.v1alpha1.grayrelease import Autoscaling, GrayRelease
from tinct.operator.release.scaling import STEP_DOWN_INTERVALS, bounds, hpa_name, plan_autoscaling
from tinct.operator.release.tables import cells_by_tag, next_table, release_models


def started(**spec: Any) -> GrayRelease:
    return step(release(**spec), T0)


def test_table_follows_status_and_its_version_only_grows() -> None:
    gr = started()
    assert gr.status is not None
    manifest, version = next_table(gr, gr.status, None)
    assert manifest is not None
    assert version == 1
    meta = manifest["metadata"]
    assert meta["name"] == "tinct-routing-chat"
    assert meta["namespace"] == "llm"
    assert meta["annotations"][VERSION_ANNOTATION] == "1"
    assert meta["ownerReferences"] == [
        {
            "apiVersion": "tinct.io/v1alpha1",
            "kind": "GrayRelease",
            "name": "chat",
            "uid": "uid-1",
            "controller": True,
            "blockOwnerDeletion": True,
        }
    ]
    table = parse_table(manifest["data"][DATA_KEY])
    assert (table.state, table.step, [c.weight for c in table.cells]) == ("Progressing", 0, [5, 0.1, 1])
    assert table.candidate.url == "http://sched-v2.llm.svc.cluster.local:8000"

    # The same status against the ConfigMap now in the cluster: nothing to write.
    assert next_table(gr, gr.status, manifest) == (None, 1)

    # Status recorded version 7 but the ConfigMap was lost: the next version is 8.
    from tinct.api.v1alpha1.grayrelease import RoutingRef

    later = step(gr, T0 + timedelta(minutes=1), action="abort@1")
    assert later.status is not None
    later.status.routing = RoutingRef(config_map="tinct-routing-chat", version=7)
    manifest2, version2 = next_table(later, later.status, None)
    assert version2 == 8
    assert manifest2 is not None
    assert [c["weight"] for c in json.loads(manifest2["data"][DATA_KEY])["cells"]] == [0, 0, 0]
    # A ConfigMap ahead of status (written, then the operator died): still grows.
    ahead = json.loads(json.dumps(manifest))
    ahead["metadata"]["annotations"][VERSION_ANNOTATION] = "12"
    assert next_table(later, later.status, ahead)[1] == 13


def test_table_names_the_model_of_the_releases_modelversions() -> None:
    gr = started()
    assert gr.status is not None
    both = {"llama3-8b-1-4-0": mv(version="1.4.0"), "llama3-8b-2-0-0": mv(version="1.5.0")}
    models = release_models(gr, both)
    assert models == ["llama3-8b"]
    manifest, version = next_table(gr, gr.status, None, models=models)
    assert manifest is not None
    assert parse_table(manifest["data"][DATA_KEY]).models == ["llama3-8b"]

    # The same table without the model is other content: written again, one version on.
    bare, _ = next_table(gr, gr.status, None)
    assert bare is not None
    assert parse_table(bare["data"][DATA_KEY]).models == []
    assert next_table(gr, gr.status, bare, models=models)[1] == version + 1
    assert next_table(gr, gr.status, manifest, models=models) == (None, version)

    # Only one ModelVersion known yet: its model; none known: none.
    candidate_only = {"llama3-8b-1-4-0": None, "llama3-8b-2-0-0": mv(version="1.5.0")}
    assert release_models(gr, candidate_only) == ["llama3-8b"]
    assert release_models(gr, {"llama3-8b-1-4-0": None, "llama3-8b-2-0-0": None}) == []
    assert release_models(gr, {"llama3-8b-1-4-0": {"spec": {}}}) == []
    # Models that differ (the release cannot proceed, stable serves all): stable's.
    assert release_models(gr, {**both, "llama3-8b-2-0-0": mv(model="coder-7b")}) == ["llama3-8b"]

    # spec.models, when set, is what the table names.
    named = started(models=["chat-prod", "chat"])
    assert named.status is not None
    listed, _ = next_table(named, named.status, None, models=models)
    assert listed is not None
    assert parse_table(listed["data"][DATA_KEY]).models == ["chat-prod", "chat"]


def test_backend_url_overrides_the_service_address() -> None:
    gr = started()
    gr.spec.candidate.url = "http://127.0.0.1:18080"
    assert gr.status is not None
    manifest, _ = next_table(gr, gr.status, None, cluster_domain="")
    assert manifest is not None
    table = parse_table(manifest["data"][DATA_KEY])
    assert (table.stable.url, table.candidate.url) == ("http://sched-v1:8000", "http://127.0.0.1:18080")


def test_cells_by_tag_uses_the_routers_most_specific_match() -> None:
    gr = started()
    assert gr.status is not None
    manifest, _ = next_table(gr, gr.status, None)
    assert manifest is not None
    cells = cells_by_tag(parse_table(manifest["data"][DATA_KEY]))
    assert cells[LONG] == [LONG]
    assert cells[SHORT] == [SHORT]
    assert len(cells[DEFAULT]) == 3 * 3 * 2 - 2


def test_candidate_bounds_follow_its_share() -> None:
    s = Autoscaling(min_replicas=2, max_replicas=12)
    assert bounds(s, "candidate", "Pending", 0) == (2, 2)
    assert bounds(s, "candidate", "Progressing", 0.1) == (1, 1)
    assert bounds(s, "candidate", "Progressing", 20) == (1, 3)
    assert bounds(s, "candidate", "Progressing", 50) == (1, 6)
    assert bounds(s, "candidate", "Promoted", 100) == (2, 12)
    assert bounds(s, "candidate", "RolledBack", 0) == (2, 2)


def test_stable_keeps_its_bounds_until_promotion_then_steps_down() -> None:
    s = Autoscaling(min_replicas=2, max_replicas=12)
    assert bounds(s, "stable", "Progressing", 50) == (2, 12)
    assert bounds(s, "stable", "RolledBack", 0) == (2, 12)
    seen = [bounds(s, "stable", "Promoted", 100, since_promotion=i * 60.0, interval=60.0) for i in range(6)]
    assert seen == [(2, 10), (2, 7), (2, 5), (2, 2), (2, 2), (2, 2)]
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
