"""What a LoRA adapter candidate needs on stable's pods, and what the routing table makes of it."""

from __future__ import annotations

import copy
from datetime import UTC, datetime, timedelta
from typing import Any

import yaml

from tinct.api.routing import routing_table_from
from tinct.api.v1alpha1 import GrayRelease
from tinct.api.v1alpha1.grayrelease import AdapterCandidate
from tinct.operator.grayrelease import loading
from tinct.operator.grayrelease.loading import PodSeen
from tinct_testing.paths import EXAMPLES

SERVED = "llama3-8b-support-0123456789ab"


def _release(**candidate: Any) -> GrayRelease:
    doc: dict[str, Any] = copy.deepcopy(yaml.safe_load((EXAMPLES / "grayrelease.yaml").read_text()))
    doc["spec"]["candidate"] = {"adapter": {"modelVersion": "llama3-8b-support-1-0-0", **candidate}}
    doc["metadata"].update(namespace="llm", uid="u-1")
    return GrayRelease.model_validate(doc)


def _pods() -> list[PodSeen]:
    return [
        PodSeen("sched-v1-a", "10.0.0.1", True, frozenset({"m", SERVED})),
        PodSeen("sched-v1-b", "10.0.0.2", True, frozenset({"m"})),
        PodSeen(
            "sched-v1-c", "10.0.0.3", True, frozenset({"m"}), refused="HTTP 400: LoRA rank 64 is greater"
        ),
        PodSeen("sched-v1-d", "10.0.0.4", False, None),
        PodSeen("sched-v1-e", None, False, None),
    ]


def test_record_counts_ready_pods_and_lists_the_missing_first() -> None:
    got = loading.record("mv", SERVED, "sha256:ab", "/adapters/x", _pods())
    assert (got.loaded, got.total) == (1, 3)
    assert got.addresses == ["10.0.0.1"]
    assert [(p.name, p.state) for p in got.pods] == [
        ("sched-v1-b", "Loading"),
        ("sched-v1-c", "Failed"),
        ("sched-v1-a", "Loaded"),
    ]
    assert got.pods[1].reason == "HTTP 400: LoRA rank 64 is greater"


def test_loads_where_missing_and_unloads_where_listed() -> None:
    assert [p.name for p in loading.to_load(_pods(), SERVED)] == ["sched-v1-b", "sched-v1-c"]
    assert [p.name for p in loading.to_unload(_pods(), SERVED)] == ["sched-v1-a"]


def test_adapter_stays_while_running_and_after_promotion_only() -> None:
    assert loading.keeps_adapter("Progressing")
    assert loading.keeps_adapter("Promoted", deleting=True)
    assert not loading.keeps_adapter("RolledBack")
    assert not loading.keeps_adapter("Paused", deleting=True)
    now = datetime(2026, 1, 1, tzinfo=UTC)
    assert not loading.drained(now - timedelta(seconds=5), now)
    assert loading.drained(now - loading.DRAIN, now)


def test_engine_path_maps_the_uri_onto_the_mount() -> None:
    ref = AdapterCandidate(model_version="a", uri_prefix="s3://models/adapters/", mount_path="/adapters")
    assert loading.engine_path(ref, "s3://models/adapters/x/1.0.0") == "/adapters/x/1.0.0"
    assert loading.engine_path(ref, "s3://other/x") == "s3://other/x"
    assert loading.engine_path(AdapterCandidate(model_version="a"), "file:///d") == "file:///d"


def test_problems_hold_the_candidate_until_a_pod_has_it() -> None:
    spec = _release().spec
    refused = loading.problem(spec, loading.record("mv", SERVED, None, None, _pods()))
    assert refused is not None
    assert (refused.reason, refused.side, refused.fatal) == ("AdapterLoadFailed", "candidate", False)
    assert "sched-v1-c" in refused.message
    none = loading.problem(spec, loading.record("mv", SERVED, None, None, _pods()[1:2]))
    assert none is not None
    assert none.reason == "AdapterNotLoaded"
    assert "0/1" in none.message
    assert loading.problem(spec, loading.record("mv", SERVED, None, None, _pods()[:2])) is None
    tgi = _release().spec.model_copy(
        update={"stable": _release().spec.stable.model_copy(update={"engine": "tgi"})}
    )
    cannot = loading.problem(tgi, None)
    assert cannot is not None
    assert cannot.reason == "EngineCannotLoadAdapters"


def test_table_sends_the_candidate_share_only_to_pods_holding_it() -> None:
    gr = _release()
    adapter = loading.record("mv", SERVED, None, None, _pods())
    table = routing_table_from(gr, 1, "Progressing", version=3, adapter=adapter)
    assert table.candidate.adapter == SERVED
    assert table.candidate.addresses == ["http://10.0.0.1:8000"]
    assert table.candidate.url == table.stable.url
    assert max(c.weight for c in table.cells) > 0
    nowhere = loading.record("mv", SERVED, None, None, _pods()[1:2])
    held = routing_table_from(gr, 1, "Progressing", version=3, adapter=nowhere)
    assert [c.weight for c in held.cells] == [0.0] * len(held.cells)
    assert held.candidate.addresses == []
    unknown = routing_table_from(gr, 1, "Progressing", version=3)
    assert [c.weight for c in unknown.cells] == [0.0] * len(unknown.cells)
