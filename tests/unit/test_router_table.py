"""Routing table model, builder, ConfigMap shape, validation, and compilation."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from router_fakes import table, table_doc
from tinct.api.routing import (
    DATA_KEY,
    TABLE_LABEL,
    RoutingTable,
    RoutingTableError,
    cell_weights,
    configmap_name,
    parse_table,
    routing_configmap,
    routing_table_from,
)
from tinct.api.v1alpha1 import GrayRelease
from tinct.api.v1alpha1.dye import cell_key
from tinct.router.table import CompiledTable, TableHolder, TableRefusedError

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "grayrelease.yaml"


def _release() -> GrayRelease:
    doc = yaml.safe_load(EXAMPLE.read_text())
    doc["metadata"]["namespace"] = "llm"
    return GrayRelease.model_validate(doc)


def test_builder_takes_each_cells_weight_at_the_step() -> None:
    t = routing_table_from(_release(), 1, "Progressing", version=7)
    assert [c.weight for c in t.cells] == [20, 1, 10]
    assert t.version == 7
    assert t.step == 1
    assert t.release == "chat"
    assert t.stable.url == "http://sched-v1.llm.svc.cluster.local:8000"
    assert t.candidate.scheduler_version == "v2"
    assert t.fallback.latency_ms == 800
    assert t.dye.role.header == "X-User-Role"


def test_builder_clamps_step_and_follows_terminal_states() -> None:
    r = _release()
    assert [c.weight for c in routing_table_from(r, 99, "Progressing", version=1).cells] == [100, 100, 100]
    assert [c.weight for c in routing_table_from(r, 2, "RolledBack", version=2).cells] == [0, 0, 0]
    assert [c.weight for c in routing_table_from(r, 0, "Promoted", version=3).cells] == [100, 100, 100]


def test_one_weight_rule_for_the_table_the_status_and_the_standing_route() -> None:
    r = _release()
    assert list(cell_weights(r.spec, "Progressing", 1).values()) == [20, 1, 10]
    assert set(cell_weights(r.spec, "Progressing", 1, serving=False).values()) == {0}
    assert set(cell_weights(r.spec, "Paused", 1, serving=False).values()) == {0}
    assert set(cell_weights(r.spec, "Promoted", 1, serving=False).values()) == {100}
    # A recorded status's weights are the ones in force; a cell it does not name gets none.
    recorded = {cell_key(r.spec.cells[0].match): 5.0}
    t = routing_table_from(r, 1, "Pending", version=2, weights=recorded, standing=True)
    assert ([c.weight for c in t.cells], t.state, t.standing) == ([5, 0, 0], "Pending", True)


def test_configmap_round_trips_the_table() -> None:
    t = routing_table_from(_release(), 2, "Progressing", version=4)
    owner = {"apiVersion": "tinct.io/v1alpha1", "kind": "GrayRelease", "name": "chat", "uid": "u-1"}
    cm = routing_configmap(t, owner=owner)
    assert cm["metadata"]["name"] == "tinct-routing-llm.chat" == configmap_name("llm", "chat")
    assert cm["metadata"]["namespace"] == "llm"
    assert cm["metadata"]["labels"][TABLE_LABEL] == "true"
    assert cm["metadata"]["ownerReferences"][0]["controller"] is True
    assert parse_table(cm["data"][DATA_KEY]) == t


@pytest.mark.parametrize(
    ("mutate", "needle"),
    [
        (lambda d: d["cells"].append({"match": {"role": "*"}, "weight": 1}), "exactly one default cell"),
        (
            lambda d: d["cells"].insert(0, {"match": {"promptLength": "huge"}, "weight": 1}),
            'cells[0].match.promptLength "huge" is not a bucket of dye.promptLength ["short", "medium", "long"]',
        ),
        (lambda d: d["cells"].insert(0, {"match": {"role": "root"}, "weight": 1}), "dye.role.values"),
        (lambda d: d["dye"]["promptLength"]["buckets"].reverse(), "catch-all"),
        (lambda d: d["dye"]["role"].update(default="nobody"), "dye.role: default must be one of values"),
        (
            lambda d: d["dye"]["promptLength"]["buckets"][1].update(maxTokens=512),
            "dye.promptLength: buckets: bucket maxTokens must strictly increase",
        ),
        (lambda d: d["cells"][-1].update(weight=101), "weight"),
        (lambda d: d.update(version=-1), "version"),
        (lambda d: d["candidate"].update(url=d["stable"]["url"]), "different endpoints"),
        (lambda d: d.pop("stable"), "stable"),
    ],
)
def test_invalid_tables_are_rejected_with_a_reason(mutate, needle) -> None:  # type: ignore[no-untyped-def]
    d = table_doc("http://127.0.0.1:1", "http://127.0.0.1:2")
    mutate(d)
    with pytest.raises(RoutingTableError) as e:
        parse_table(json.dumps(d), "cm llm/x")
    assert needle in str(e.value)
    assert str(e.value).startswith("cm llm/x: ")


def test_not_json_is_rejected() -> None:
    with pytest.raises(RoutingTableError):
        parse_table("{not json", "file")


def test_most_specific_cell_wins_and_ties_go_to_the_first_listed() -> None:
    t = table(
        "http://127.0.0.1:1",
        "http://127.0.0.1:2",
        cells=[
            {"match": {"role": "admin"}, "weight": 10},
            {"match": {"promptLength": "long"}, "weight": 20},
            {"match": {"promptLength": "long", "role": "admin", "latency": "*"}, "weight": 30},
            {"match": {"promptLength": "long", "role": "admin", "latency": "high"}, "weight": 40},
        ],
        default_weight=1,
    )
    c = CompiledTable(t)
    assert c.routes[("long", "admin", "high")].weight == 40
    assert c.routes[("long", "admin", "low")].weight == 30
    assert c.routes[("short", "admin", "low")].weight == 10
    assert c.routes[("long", "user", "low")].weight == 20
    assert c.routes[("medium", "audit", "high")].weight == 1
    assert c.routes[("long", "admin", "high")].tag == "len:long+role:admin+latency:high"
    assert len(c.tags) == 3 * 3 * 2


def test_wire_form_uses_camel_case() -> None:
    t = table("http://127.0.0.1:1", "http://127.0.0.1:2")
    wire = json.loads(t.to_json())
    assert wire["schema"] == "tinct.io/routing/v1"
    assert "schedulerVersion" in wire["stable"]
    assert RoutingTable.model_validate_json(t.to_json()) == t


def test_shipped_example_table_is_what_the_builder_makes_of_the_example_release() -> None:
    shipped = parse_table(
        (EXAMPLE.parent / "router" / "routing-table.json").read_text(), "examples/router/routing-table.json"
    )
    assert shipped == routing_table_from(_release(), 1, "Progressing", version=1)


def _holder() -> tuple[TableHolder, list[tuple[str, str]]]:
    holder = TableHolder()
    rejected: list[tuple[str, str]] = []
    holder.on_reject.append(lambda src, why: rejected.append((src, why)))
    return holder, rejected


def test_a_table_going_back_in_version_is_refused_also_after_its_source_went_away() -> None:
    holder, rejected = _holder()
    ab = ("http://127.0.0.1:1", "http://127.0.0.1:2")
    holder.put("configmap t/x", table(*ab, version=5, uid="u-1"))
    holder.put("configmap t/other", table(*ab, version=1, release="other", models=["o"]))
    with pytest.raises(TableRefusedError) as e:
        holder.put("configmap t/x", table(*ab, version=4, uid="u-1", default_weight=100))
    assert "version 4 of llm/chat (uid u-1) goes back: version 5 was in force already" in e.value.reason
    assert rejected == [("configmap t/x", e.value.reason)]
    entry = holder.tables["configmap t/x"]
    assert entry[1].version == 5, "the last good table stays"
    # The ConfigMap is deleted and recreated with the old table: still refused.
    holder.remove("configmap t/x")
    with pytest.raises(TableRefusedError):
        holder.put("configmap t/x", table(*ab, version=4, uid="u-1"))
    assert "configmap t/x" not in holder.tables
    # Forward again is fine; so is a new release of that name (another uid) starting over.
    holder.put("configmap t/x", table(*ab, version=6, uid="u-1"))
    holder.put("configmap t/y", table(*ab, version=1, uid="u-2"))
    assert len(rejected) == 2


def test_without_a_uid_versions_are_counted_per_namespace_and_release() -> None:
    holder, rejected = _holder()
    ab = ("http://127.0.0.1:1", "http://127.0.0.1:2")
    holder.put("file a", table(*ab, version=3))
    holder.put("file b", table(*ab, version=1, namespace="elsewhere", models=["e"]))  # another release
    with pytest.raises(TableRefusedError):
        holder.put("file c", table(*ab, version=2, models=["c"]))  # llm/chat again, from elsewhere
    assert len(rejected) == 1


def test_the_same_version_is_a_no_op_when_identical_and_refused_when_changed() -> None:
    holder, rejected = _holder()
    ab = ("http://127.0.0.1:1", "http://127.0.0.1:2")
    changes: list[int] = []
    holder.on_change.append(lambda t: changes.append(t.version))
    first = holder.swap(table(*ab, version=2, uid="u-1"), "configmap t/x")
    assert holder.swap(table(*ab, version=2, uid="u-1"), "configmap t/x") is first
    assert changes == [2], "nothing changed, nothing to announce"
    with pytest.raises(TableRefusedError) as e:
        holder.swap(table(*ab, version=2, uid="u-1", default_weight=100), "configmap t/x")
    assert "was in force already with other content" in e.value.reason
    assert rejected == [("configmap t/x", e.value.reason)]
    assert holder.current is first


def test_a_live_table_wins_a_model_over_a_standing_one_whatever_their_ages() -> None:
    holder, _ = _holder()
    ab = ("http://127.0.0.1:1", "http://127.0.0.1:2")
    standing = table(*ab, release="old", models=["m", "s"], standing=True)
    _, lost = holder.put("configmap t/old", standing, created=100.0)
    assert lost == []
    _, lost = holder.put("configmap t/new", table(*ab, release="new", models=["m"]), created=200.0)
    assert lost == [], "the newer live table takes the model from the older standing one"
    for_m = holder.for_model("m")
    for_s = holder.for_model("s")
    assert for_m is not None
    assert for_m.release == "new"
    assert for_s is not None
    assert for_s.release == "old", "the standing table keeps the models nobody live claims"
    # Among standing tables, as among live ones, the older keeps the model.
    _, lost = holder.put("configmap t/older", table(*ab, release="gone", models=["s"], standing=True), 50.0)
    assert lost == []
    for_s = holder.for_model("s")
    assert for_s is not None
    assert for_s.release == "gone"
    _, lost = holder.put("configmap t/young", table(*ab, release="newest", models=["m"]), created=300.0)
    assert lost == ["m"]


def _shadowed() -> GrayRelease:
    """The example with a dark first step in two cells: weight 0, a shadow share above 0."""
    doc = yaml.safe_load(EXAMPLE.read_text())
    doc["metadata"]["namespace"] = "llm"
    doc["spec"]["cells"][0].update(weights=[0, 20, 50, 100], shadow=[10, 30, 5, 0])
    doc["spec"]["cells"][1].update(weights=[0, 1, 10, 100], shadow=[25, 0, 0, 0])
    doc["spec"]["shadow"] = {"noiseShare": 20, "judge": {"name": "local", "model": "judge-1"}}
    return GrayRelease.model_validate(doc)


def test_shadow_shares_follow_the_weight_rule() -> None:
    r = _shadowed()
    assert list(cell_weights(r.spec, "Progressing", 0, shadow=True).values()) == [10, 25, 0]
    assert list(cell_weights(r.spec, "Paused", 1, shadow=True).values()) == [30, 0, 0]
    assert list(cell_weights(r.spec, "Progressing", 99, shadow=True).values()) == [0, 0, 0]
    # Promotion, rollback, failure and a candidate that does not serve mirror nothing.
    for state, serving in (
        ("Promoted", True),
        ("RolledBack", True),
        ("Failed", True),
        ("Progressing", False),
    ):
        assert set(cell_weights(r.spec, state, 0, serving=serving, shadow=True).values()) == {0}
    # A cell without shadow mirrors nothing at any step.
    assert cell_weights(r.spec, "Progressing", 1, shadow=True)[cell_key(r.spec.cells[2].match)] == 0


def test_a_dark_step_puts_shadow_shares_and_settings_in_the_table() -> None:
    t = routing_table_from(_shadowed(), 0, "Progressing", version=3)
    assert [(c.weight, c.shadow) for c in t.cells] == [(0, 10), (0, 25), (1, 0)]
    assert t.shadow is not None
    assert (t.shadow.noise_share, t.shadow.max_concurrent, t.shadow.max_bytes) == (20, 8, 262144)
    assert (t.shadow.stable_model_version, t.shadow.candidate_model_version) == (
        "llama3-8b-1-4-0",
        "llama3-8b-2-0-0",
    )
    assert t.shadow.judge is not None
    assert (t.shadow.judge.name, t.shadow.judge.sample_rate, t.shadow.judge.min_confidence) == (
        "local",
        0.1,
        0.85,
    )
    wire = json.loads(t.to_json())
    assert wire["shadow"]["maxTokensPerMinute"] == 100000
    assert wire["shadow"]["lengthRatio"] == {"min": 0.5, "max": 2.0}
    assert wire["cells"][1]["shadow"] == 25
    assert parse_table(t.to_json()) == t


def test_no_shadow_settings_without_a_mirroring_cell() -> None:
    r = _shadowed()
    assert routing_table_from(r, 3, "Progressing", version=1).shadow is None
    assert routing_table_from(r, 0, "RolledBack", version=2).shadow is None
    assert routing_table_from(_release(), 0, "Progressing", version=1).shadow is None
    # A recorded status's shares are the ones in force.
    recorded = {cell_key(r.spec.cells[2].match): 40.0}
    t = routing_table_from(r, 0, "Progressing", version=2, shadows=recorded)
    assert [c.shadow for c in t.cells] == [0, 0, 40]
    assert t.shadow is not None
    assert t.shadow.noise_share == 20
