"""The GrayRelease controller on the real API server: preconditions, steps, history, manual
control, HPAs, and an operator killed mid-release.

These releases have no analysis metrics, so a step advances every ``analysis.interval``;
the analysis against a real Prometheus is in ``test_grayrelease_analysis.py``.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from tinct.api.routing import configmap_name
from tinct_testing.commands import tinct, tinct_ok
from tinct_testing.controlplane.harness import Cluster, free_port
from tinct_testing.lineage_artifacts import make_onnx
from tinct_testing.release_cluster import (
    HOLD,
    NO_METRICS,
    PROMOTED_PATH,
    apply,
    backends,
    condition,
    cpu_hpa,
    events,
    example,
    get,
    history,
    modelversion,
    operator,
    path,
    release_status,
    started,
    table,
    wait_history_written,
    wait_release,
)
from tinct_testing.wait import WAIT, eventually


def _hpa_bounds(cluster: Cluster, ns: str, side: str) -> tuple[int, int] | None:
    hpa = get(cluster, ns, "hpa", f"tinct-chat-{side}")
    if hpa is None:
        return None
    return hpa["spec"]["minReplicas"], hpa["spec"]["maxReplicas"]


Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def _scrape(port: int) -> Samples:
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        text = r.read().decode()
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
    }


def _sample(samples: Samples, name: str, **labels: str) -> float:
    got = [v for (n, ls), v in samples.items() if n == name and set(labels.items()) <= ls]
    assert len(got) == 1, (name, labels, got)
    return got[0]


def test_waits_for_a_ready_candidate_then_steps_to_promoted(
    cluster: Cluster, namespace: str, tmp_path: Path
) -> None:
    ns, root = namespace, tmp_path / "lineage"
    backends(cluster, ns, tmp_path, wrong_digest=True)
    with operator(ns, root):
        apply(cluster, ns, example(analysis=NO_METRICS))
        st = wait_release(
            cluster,
            ns,
            lambda s: s.get("phase") == "Pending" and s.get("conditions"),
            "Pending with conditions",
        )
        # While the versions are hashed both are Pending; then only the candidate, Failed, holds it.
        failed = "candidate ModelVersion llama3-8b-2-0-0 is Failed, not Ready"
        cond = eventually(
            lambda: (
                c
                if failed == (c := condition(release_status(cluster, ns), "ModelVersionsReady"))["message"]
                else None
            ),
            timeout=WAIT,
            what="candidate Failed",
        )
        assert (cond["status"], cond["reason"]) == ("False", "ModelVersionNotReady")
        assert condition(st, "BackendsAvailable")["status"] == "True"
        pending = eventually(lambda: table(cluster, ns), timeout=WAIT, what="the Pending table")
        assert pending[1]["state"] == "Pending"
        assert {c["weight"] for c in pending[1]["cells"]} == {0}

        # Fixing the candidate is noticed through its watch; the release starts and steps on.
        apply(cluster, ns, modelversion("llama3-8b-2-0-0", "1.5.0", make_onnx(tmp_path / "model.onnx")))
        seen: list[tuple[int, str, int, list[float]]] = []

        def promoted() -> bool:
            # Status is recorded before the table is applied: the end is both showing Promoted
            # at the version status recorded, read in that order so neither can be missed.
            st = release_status(cluster, ns)
            got = table(cluster, ns)
            if got is not None:
                version, doc = got
                entry = (version, doc["state"], doc["step"], [c["weight"] for c in doc["cells"]])
                if not seen or seen[-1] != entry:
                    seen.append(entry)
            recorded = (st.get("routing") or {}).get("version")
            return st.get("phase") == "Promoted" and got is not None and got[0] == recorded

        eventually(promoted, timeout=WAIT, what="Promoted")
        wait_history_written(cluster, ns)
        st = release_status(cluster, ns)
        hpas = {side: _hpa_bounds(cluster, ns, side) for side in ("stable", "candidate")}
        cm = get(cluster, ns, "configmap", configmap_name(ns, "chat"))
    versions = [v for v, *_ in seen]
    assert versions == sorted(versions)
    assert len(set(versions)) == len(versions)
    steps = [(state, step, weights) for _, state, step, weights in seen if state != "Pending"]
    assert steps == [
        ("Progressing", 0, [5, 0.1, 1]),
        ("Progressing", 1, [20, 1, 10]),
        ("Progressing", 2, [50, 10, 50]),
        ("Promoted", 3, [100, 100, 100]),
    ]
    assert st["routing"]["version"] == versions[-1]
    assert st["weights"] == {
        "len:long+role:admin+latency:high": 100,
        "len:short+role:user+latency:low": 100,
        "len:*+role:*+latency:*": 100,
    }
    assert cm is not None
    assert cm["metadata"]["labels"]["tinct.io/release-namespace"] == ns
    assert "ownerReferences" not in cm["metadata"], "the table outlives its release as the standing route"
    assert hpas["candidate"] == (1, 12)
    assert hpas["stable"] is not None
    assert hpas["stable"][0] == 1
    rows = history(root)
    assert path(rows) == PROMOTED_PATH
    assert [r["reason"].split(":")[0] for r in rows] == [
        "Started",
        "StepAdvanced",
        "StepAdvanced",
        "Promoted",
    ]
    assert dict(rows[1]["weights"]) == {
        "len:long+role:admin+latency:high": 20,
        "len:short+role:user+latency:low": 1,
        "len:*+role:*+latency:*": 10,
    }
    reasons = [e["reason"] for e in events(cluster, ns)]
    assert (reasons.count("Started"), reasons.count("StepAdvanced"), reasons.count("Promoted")) == (1, 2, 1)


def test_major_upgrade_waits_for_the_opt_in(cluster: Cluster, namespace: str, tmp_path: Path) -> None:
    ns = namespace
    backends(cluster, ns, tmp_path, candidate_version="2.0.0")
    with operator(ns, tmp_path / "lineage"):
        apply(cluster, ns, example(analysis=HOLD, allowMajorUpgrade=False))
        st = wait_release(
            cluster,
            ns,
            lambda s: any(c["reason"] == "MajorUpgradeNotAllowed" for c in s.get("conditions", [])),
            "MAJOR jump held",
        )
        assert st["phase"] == "Pending"
        assert "set spec.allowMajorUpgrade: true" in condition(st, "ModelVersionsReady")["message"]
        cluster.kubectl(
            "patch",
            "grayrelease",
            "chat",
            "-n",
            ns,
            "--type",
            "merge",
            "-p",
            '{"spec":{"allowMajorUpgrade":true}}',
        )
        st = wait_release(cluster, ns, lambda s: s.get("phase") == "Progressing", "started after opt-in")
    assert condition(st, "ModelVersionsReady")["status"] == "True"
    assert st["step"] == 0


def test_cli_pause_resume_abort_retry_promote(cluster: Cluster, namespace: str, tmp_path: Path) -> None:
    ns, root = namespace, tmp_path / "lineage"
    with started(cluster, ns, tmp_path, example(analysis=HOLD), phase="Progressing"):
        tinct_ok("release", "pause", "chat", "-n", ns)
        wait_release(cluster, ns, lambda s: s.get("phase") == "Paused", "Paused")
        out = tinct_ok("release", "resume", "chat", "-n", ns, "--wait", "60")
        assert "Progressing at step 1/4" in out.stdout

        out = tinct_ok("release", "abort", "chat", "-n", ns, "--wait", "60")
        assert "RolledBack" in out.stdout
        rolled = table(cluster, ns)
        assert rolled is not None
        assert {c["weight"] for c in rolled[1]["cells"]} == {0}

        tinct_ok("release", "retry", "chat", "-n", ns, "--wait", "60")
        wait_release(cluster, ns, lambda s: s.get("phase") == "Progressing", "Progressing again")
        out = tinct_ok("release", "promote", "chat", "-n", ns, "--wait", "60")
        assert "Promoted" in out.stdout

        status = tinct("release", "status", "chat", "-n", ns, "-o", "json")
        text = tinct("release", "status", "chat", "-n", ns)
        # The same request seen twice is carried out once.
        ack = release_status(cluster, ns)["acknowledgedAction"]
        missing = tinct("release", "status", "nope", "-n", ns)
        wait_history_written(cluster, ns)
    data = json.loads(status.stdout)
    assert (data["phase"], data["step"], data["steps"]) == ("Promoted", "4/4", 4)
    assert [c["inForce"] for c in data["cells"]] == [100, 100, 100]
    assert text.stdout.startswith(f"GrayRelease {ns}/chat  phase Promoted")
    assert "\033[" not in text.stdout
    assert ack.startswith("promote@")
    assert missing.returncode == 1
    assert f"grayrelease {ns}/nope not found" in missing.stderr
    rows = history(root)
    assert [(r["reason"].split(":")[0], r["state"]) for r in rows] == [
        ("Started", "Progressing"),
        ("Paused", "Paused"),
        ("Resumed", "Progressing"),
        ("Aborted", "RolledBack"),
        ("Retried", "Pending"),
        ("Started", "Progressing"),
        ("Promoted", "Promoted"),
    ]


def test_operator_killed_mid_release_continues_from_the_recorded_step(
    cluster: Cluster, namespace: str, tmp_path: Path
) -> None:
    ns, root = namespace, tmp_path / "lineage"
    backends(cluster, ns, tmp_path)
    env = {
        **os.environ,
        "TINCT_LINEAGE_ROOT": str(root),
        "TINCT_RELEASE_TICK": "0.5",
        "TINCT_ARTIFACT_ROOTS": str(tmp_path),
        "TINCT_TABLE_NAMESPACE": ns,
    }
    metrics_port = free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tinct.cli",
            "operator",
            "--namespace",
            ns,
            "--metrics-port",
            str(metrics_port),
        ],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        apply(cluster, ns, example(analysis={**NO_METRICS, "interval": "4s"}))
        st1 = wait_release(cluster, ns, lambda s: s.get("step") == 1, "step 1")
        # Status is recorded before the round acts and counts: wait for the metrics to follow.
        scraped = eventually(
            lambda: (
                (got := _scrape(metrics_port))
                and any(
                    n == "tinct_release_step" and v == 1 and ("namespace", ns) in ls
                    for (n, ls), v in got.items()
                )
                and got
            ),
            timeout=WAIT,
            what="the metrics at step 2/4",
        )
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    mine = {k: v for k, v in scraped.items() if ("namespace", ns) in k[1]}
    assert _sample(mine, "tinct_release_step") == 1
    assert _sample(mine, "tinct_release_phase", phase="Progressing") == 1
    assert _sample(mine, "tinct_release_phase", phase="Pending") == 0
    assert _sample(mine, "tinct_release_table_version") == st1["routing"]["version"]
    assert _sample(mine, "tinct_release_transitions_total", reason="StepAdvanced") == 1
    at_kill = release_status(cluster, ns)
    killed_version = int(at_kill["routing"]["version"])
    time.sleep(5)  # the next step falls due while nobody runs the release
    assert release_status(cluster, ns)["step"] == at_kill["step"]
    with operator(ns, root):
        st = wait_release(cluster, ns, lambda s: s.get("phase") == "Promoted", "Promoted after restart")
        wait_history_written(cluster, ns)
    assert st["routing"]["version"] > killed_version
    rows = history(root)
    assert path(rows) == PROMOTED_PATH
    assert len({r["event_id"] for r in rows}) == len(rows)
    assert st["transitions"] == 4


def test_an_hpa_on_a_metric_nobody_serves_is_reported_not_applied(
    cluster: Cluster, namespace: str, tmp_path: Path
) -> None:
    """The example's HPAs scale on a Pods metric, which needs a custom metrics API this cluster
    does not have: the real HPA controller says so, and so does the release."""
    ns = namespace
    backends(cluster, ns, tmp_path)
    with operator(ns, tmp_path / "lineage"):
        apply(cluster, ns, example(analysis=HOLD))
        st = wait_release(
            cluster,
            ns,
            lambda s: any(
                c["type"] == "AutoscalingReady" and c.get("reason") == "MetricUnavailable"
                for c in s.get("conditions", [])
            ),
            "AutoscalingReady MetricUnavailable",
        )
        bounds = _hpa_bounds(cluster, ns, "stable")
    cond = condition(st, "AutoscalingReady")
    assert cond["status"] == "False"
    # One HPA, or both in one sentence, as the controller has looked at them by now.
    assert re.match(
        r"HPAs? tinct-chat-(stable|candidate)(, tinct-chat-candidate)? cannot read (its|their) metric "
        r"\(FailedGetPodsMetric\): .*no custom metrics API",
        cond["message"],
    ), cond["message"]
    assert bounds == (1, 12), "the HPA is written all the same"


def test_foreign_hpa_is_reported_and_left_alone(cluster: Cluster, namespace: str, tmp_path: Path) -> None:
    ns = namespace
    backends(cluster, ns, tmp_path)
    apply(cluster, ns, cpu_hpa("team-hpa", "sched-v2", 3, 5, utilization=80))
    with operator(ns, tmp_path / "lineage"):
        apply(cluster, ns, example(analysis=HOLD))
        st = wait_release(
            cluster,
            ns,
            lambda s: any(c["type"] == "AutoscalingReady" for c in s.get("conditions", [])),
            "autoscaling condition",
        )
        stable = eventually(lambda: _hpa_bounds(cluster, ns, "stable"), timeout=WAIT, what="stable HPA")
    cond = condition(st, "AutoscalingReady")
    assert (cond["status"], cond["reason"]) == ("False", "ForeignHPA")
    assert "HPA team-hpa" in cond["message"]
    assert stable == (1, 12)
    assert _hpa_bounds(cluster, ns, "candidate") is None
    team = get(cluster, ns, "hpa", "team-hpa")
    assert team is not None
    assert (team["spec"]["minReplicas"], team["spec"]["maxReplicas"]) == (3, 5)
    assert [s["managed"] for s in st["autoscaling"]] == [True, False]


def test_deleting_the_release_collects_its_hpas_keeps_its_route_and_the_deployments(
    cluster: Cluster, namespace: str, tmp_path: Path
) -> None:
    ns = namespace
    with started(cluster, ns, tmp_path, example(analysis=HOLD), phase="Progressing"):
        eventually(
            lambda: _hpa_bounds(cluster, ns, "stable") and _hpa_bounds(cluster, ns, "candidate"),
            timeout=WAIT,
            what="the HPAs",
        )
        assert table(cluster, ns) is not None
        cluster.kubectl("delete", "grayrelease", "chat", "-n", ns, "--wait=false")
        # The operator lets go of the release (its finalizer); the garbage collector does the rest.
        eventually(
            lambda: get(cluster, ns, "grayrelease", "chat") is None, timeout=WAIT, what="the release gone"
        )
    standing = table(cluster, ns)
    assert standing is not None, "its model stays served: the table is the standing route now"
    assert standing[1]["standing"] is True
    assert {c["weight"] for c in standing[1]["cells"]} == {0}, "not promoted: stable serves it"
    eventually(
        lambda: _hpa_bounds(cluster, ns, "stable") is None and _hpa_bounds(cluster, ns, "candidate") is None,
        timeout=WAIT,
        what="the HPAs collected",
    )
    for name in ("sched-v1", "sched-v2"):
        dep = get(cluster, ns, "deployment", name)
        assert dep is not None, name
        assert not dep["metadata"].get("ownerReferences"), name


def test_children_deleted_by_hand_are_applied_again(cluster: Cluster, namespace: str, tmp_path: Path) -> None:
    ns = namespace
    with started(cluster, ns, tmp_path, example(analysis=HOLD), phase="Progressing"):
        eventually(lambda: _hpa_bounds(cluster, ns, "candidate"), timeout=WAIT, what="the HPAs")
        before = eventually(lambda: table(cluster, ns), timeout=WAIT, what="the table")
        time.sleep(11)  # past the grace in which the operator trusts its own last write
        cluster.kubectl(
            "delete", f"configmap/{configmap_name(ns, 'chat')}", "hpa/tinct-chat-candidate", "-n", ns
        )
        again = eventually(lambda: table(cluster, ns), timeout=WAIT, what="the table again")
        hpa = eventually(
            lambda: _hpa_bounds(cluster, ns, "candidate"), timeout=WAIT, what="the candidate HPA again"
        )
        st = release_status(cluster, ns)
    assert again[0] == before[0], "the table status recorded, applied again as it was"
    assert [c["weight"] for c in again[1]["cells"]] == [c["weight"] for c in before[1]["cells"]]
    assert hpa == (1, 1)
    assert st["routing"]["version"] == again[0]
