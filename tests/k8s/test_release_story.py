"""kubectl tells the story: a release that waits says for what, in its message, its conditions
and an Event, and the release that loses a model to an older one says ModelConflict itself.

These releases judge nothing (``analysis: {}`` with a long interval), so each stays at a
known step while the test looks at it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tinct_testing.controlplane.harness import Cluster
from tinct_testing.lineage_artifacts import make_onnx
from tinct_testing.release_cluster import (
    HOLD,
    apply,
    backends,
    condition,
    deployment,
    events,
    example,
    modelversion,
    operator,
    service,
    wait_release,
)
from tinct_testing.wait import WAIT, eventually


def _warnings(cluster: Cluster, ns: str, name: str) -> dict[str, str]:
    """reason -> message of the Warning Events on GrayRelease ``name``."""
    return {
        e["reason"]: e["message"]
        for e in events(cluster, ns)
        if e["involvedObject"]["name"] == name and e["type"] == "Warning"
    }


def _wide(cluster: Cluster, ns: str, name: str) -> dict[str, str]:
    out = cluster.kubectl("get", "gr", name, "-n", ns, "-o", "wide").stdout.splitlines()
    header, row = out[0], out[1]
    starts = [header.index(h) for h in header.split()]
    cols = [
        (h, row[a:b].strip()) for h, a, b in zip(header.split(), starts, [*starts[1:], len(row)], strict=True)
    ]
    return dict(cols)


def test_a_release_waiting_for_a_modelversion_and_a_service_says_so_everywhere(
    cluster: Cluster, namespace: str, tmp_path: Path
) -> None:
    ns, root = namespace, tmp_path / "lineage"
    onnx = make_onnx(tmp_path / "model.onnx")
    apply(cluster, ns, service("sched-v1"), deployment("sched-v1"), deployment("sched-v2"))
    apply(cluster, ns, modelversion("llama3-8b-1-4-0", "1.4.0", onnx))
    with operator(ns, root):
        apply(cluster, ns, example(analysis=HOLD))
        missing_mv = "candidate ModelVersion llama3-8b-2-0-0 does not exist; apply it"
        missing_svc = "candidate Service sched-v2 does not exist; create it, or fix spec.candidate.service"
        st = wait_release(
            cluster,
            ns,
            lambda s: s.get("phase") == "Pending" and missing_mv in (s.get("message") or ""),
            "Pending, naming the missing candidate ModelVersion",
        )
        assert missing_svc in st["message"]
        mvs = condition(st, "ModelVersionsReady")
        assert mvs["status"] == "False"
        assert missing_mv in mvs["message"]
        assert (
            condition(st, "BackendsAvailable")["reason"],
            condition(st, "BackendsAvailable")["message"],
        ) == (
            "ServiceMissing",
            missing_svc,
        )
        # kubectl get -o wide shows the same message; an Event says it once.
        row = _wide(cluster, ns, "chat")
        assert (row["PHASE"], row["STEP"]) == ("Pending", "1/4")
        assert missing_mv in row["MESSAGE"]
        warned = eventually(
            lambda: _warnings(cluster, ns, "chat") or None,
            timeout=WAIT,
            what="a Warning Event naming the wait",
        )
        assert any(missing_mv in m for m in warned.values()), warned

        # The Service appears, without the port the release names: a failed precondition naming it.
        apply(
            cluster,
            ns,
            service("sched-v2") | {"spec": {"selector": {"app": "sched-v2"}, "ports": [{"port": 9000}]}},
        )
        apply(cluster, ns, modelversion("llama3-8b-2-0-0", "1.5.0", onnx))
        port = "candidate Service sched-v2 has no port 8000 (its ports: 9000); fix spec.candidate.port or the Service"
        st = wait_release(
            cluster,
            ns,
            lambda s: s.get("message") == port,
            "the release waiting for the Service port",
        )
        assert st["phase"] == "Pending"
        assert (
            condition(st, "BackendsAvailable")["status"],
            condition(st, "BackendsAvailable")["reason"],
        ) == (
            "False",
            "ServicePortMissing",
        )
        eventually(
            lambda: _warnings(cluster, ns, "chat").get("ServicePortMissing") == port or None,
            timeout=WAIT,
            what="the ServicePortMissing Event",
        )
        # Fixed: it starts, and says which step it is at.
        apply(cluster, ns, service("sched-v2"))
        st = wait_release(cluster, ns, lambda s: s.get("phase") == "Progressing", "Progressing")
        assert st["progress"] == "1/4"
        assert condition(st, "BackendsAvailable")["status"] == "True"


def test_the_release_that_loses_a_model_to_an_older_one_says_model_conflict(
    cluster: Cluster, namespace: str, tmp_path: Path
) -> None:
    ns, root = namespace, tmp_path / "lineage"
    backends(cluster, ns, tmp_path)
    with operator(ns, root):
        apply(cluster, ns, example(analysis=HOLD))
        wait_release(cluster, ns, lambda s: s.get("phase") == "Progressing", "chat Progressing")
        second: dict[str, Any] = example(analysis=HOLD)
        second["metadata"]["name"] = "chat-2"
        apply(cluster, ns, second)
        conflict = (
            f"model llama3-8b is served by GrayRelease {ns}/chat, an older release: routers serving both "
            "tables follow that one until it is deleted; give this one other models (spec.models), or "
            "routers of its own"
        )
        st = wait_release(
            cluster,
            ns,
            lambda s: any(
                c["type"] == "RouteAvailable" and c["status"] == "False" for c in s.get("conditions", [])
            ),
            "chat-2 naming the conflict",
            name="chat-2",
        )
        assert (condition(st, "RouteAvailable")["reason"], condition(st, "RouteAvailable")["message"]) == (
            "ModelConflict",
            conflict,
        )
        eventually(
            lambda: _warnings(cluster, ns, "chat-2").get("ModelConflict") == conflict or None,
            timeout=WAIT,
            what="the ModelConflict Event on chat-2",
        )
        # The older release is untouched by it.
        first = json.loads(cluster.kubectl("get", "gr", "chat", "-n", ns, "-o", "json").stdout)["status"]
        assert (first["phase"], condition(first, "RouteAvailable")["status"]) == ("Progressing", "True")
        # When the older one goes, the model is free.
        cluster.kubectl("delete", "gr", "chat", "-n", ns, "--wait=true")
        st = wait_release(
            cluster,
            ns,
            lambda s: condition(s, "RouteAvailable")["status"] == "True",
            "chat-2's model free",
            name="chat-2",
        )
