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
    parse_table,
    routing_configmap,
    routing_table_from,
)
from tinct.api.v1alpha1 import GrayRelease
from tinct.router.table import CompiledTable

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


def test_configmap_round_trips_the_table() -> None:
    t = routing_table_from(_release(), 2, "Progressing", version=4)
    owner = {"apiVersion": "tinct.io/v1alpha1", "kind": "GrayRelease", "name": "chat", "uid": "u-1"}
    cm = routing_configmap(t, owner=owner)
    assert cm["metadata"]["name"] == "tinct-routing-chat"
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
            "must name a bucket of dye.promptLength",
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
