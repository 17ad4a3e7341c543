"""The release promise on the real API server, controller-manager and simulated nodes:
traffic moves toward the candidate only on evidence, and away from it at once and for good.

Each test injects what goes wrong in production — a rejected status write, a lineage
outage, a status written by someone else, a release recreated under the same name, a
candidate that fails or loses its pods, a precondition lost after the end, a missing
capacity, an old action re-applied, two actions at once, an abort while a step-up is due —
and checks the routing table the routers would follow, not only the status.

These releases have no analysis metrics (a step advances every interval while the candidate
has its replicas); the analysis against a real Prometheus and routers is in
``test_grayrelease_analysis.py``.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client as kube_client
from kubernetes import config as kube_config

from tinct.api.routing import DATA_KEY, configmap_name
from tinct.api.v1alpha1.grayrelease import GrayReleaseStatus
from tinct.operator.grayrelease.seal import sealed
from tinct_testing.commands import tinct, tinct_ok
from tinct_testing.controlplane.harness import Cluster
from tinct_testing.lineage_artifacts import make_onnx
from tinct_testing.release_cluster import (
    HOLD,
    NO_METRICS,
    PROMOTED_PATH,
    STATUS_KEY,
    Versions,
    apply,
    backends,
    condition,
    deployment,
    events,
    example,
    get,
    history,
    modelversion,
    operator,
    path,
    release_status,
    service,
    started,
    table,
    wait_available,
    wait_history_written,
    wait_release,
    weights,
)
from tinct_testing.repeat import Repeating
from tinct_testing.wait import WAIT, eventually


class Sampler(Repeating):
    """Reads the table and the status together, every 0.1 s, in a thread: what a router
    would have followed at each moment, next to what status recorded then."""

    pause = 0.1
    join_timeout = 10.0

    def __init__(self, cluster: Cluster, ns: str) -> None:
        self.cluster, self.ns = cluster, ns
        self.seen: list[tuple[int, list[float], dict[str, Any]]] = []

    def step(self, worker: int, i: int) -> None:
        got = table(self.cluster, self.ns)
        st = release_status(self.cluster, self.ns)
        if got is not None:
            entry = (got[0], [c["weight"] for c in got[1]["cells"]], st)
            if not self.seen or self.seen[-1][:2] != entry[:2]:
                self.seen.append(entry)


def _deny_status_writes(cluster: Cluster, ns: str) -> str:
    """A ValidatingAdmissionPolicy refusing every GrayRelease status write in ``ns``."""
    name = f"deny-status-{ns}"[:63]
    docs = [
        {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingAdmissionPolicy",
            "metadata": {"name": name},
            "spec": {
                "failurePolicy": "Fail",
                "matchConstraints": {
                    "resourceRules": [
                        {
                            "apiGroups": ["tinct.io"],
                            "apiVersions": ["v1alpha1"],
                            "operations": ["UPDATE"],
                            "resources": ["grayreleases/status"],
                        }
                    ]
                },
                "validations": [{"expression": "false", "message": "status writes are refused here for now"}],
            },
        },
        {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingAdmissionPolicyBinding",
            "metadata": {"name": name},
            "spec": {
                "policyName": name,
                "validationActions": ["Deny"],
                "matchResources": {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": ns}}},
            },
        },
    ]
    cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(docs))

    def refused() -> bool:
        probe = cluster.kubectl(
            "patch", "grayrelease", "chat", "-n", ns, "--subresource=status", "--type=merge",
            "--dry-run=server", "-p", '{"status":{"message":"probe"}}', check=False,
        )  # fmt: skip
        return probe.returncode != 0 and "status writes are refused" in probe.stderr

    eventually(refused, timeout=30, what="status writes refused")
    return name


def test_a_rejected_status_write_never_lets_the_table_run_ahead_of_status(
    cluster: Cluster, namespace: str, tmp_path: Path
) -> None:
    ns, root = namespace, tmp_path / "lineage"
    backends(cluster, ns, tmp_path)
    with operator(ns, root), Sampler(cluster, ns) as sampler:
        apply(cluster, ns, example(analysis={**NO_METRICS, "interval": "3s"}))
        wait_release(cluster, ns, lambda s: s.get("step") == 1, "step 2/4")
        policy = _deny_status_writes(cluster, ns)
        frozen = release_status(cluster, ns)
        held = table(cluster, ns)
        time.sleep(8)  # more than two intervals: every round decides to step up, and cannot record it
        during = table(cluster, ns)
        assert release_status(cluster, ns)["step"] == frozen["step"]
        cluster.kubectl("delete", "validatingadmissionpolicybinding,validatingadmissionpolicy", policy)
        wait_release(cluster, ns, lambda s: s.get("phase") == "Promoted", "Promoted after the writes work")
        wait_history_written(cluster, ns)
    assert held is not None
    assert during == held, "nothing was acted on while the decision could not be recorded"
    # Every table the routers could see was one that status had recorded first.
    for version, _weights, status in sampler.seen:
        recorded = (status.get("routing") or {}).get("version", 0)
        assert version <= recorded or recorded == 0, (version, status.get("routing"))
    versions = [v for v, _, _ in sampler.seen]
    assert versions == sorted(versions)
    steps = [w for _, w, _ in sampler.seen]
    assert steps == sorted(steps, key=lambda w: w[0]), "the table only ever moved toward the candidate"
    rows = history(root)
    assert path(rows) == PROMOTED_PATH


def test_a_newer_status_on_the_server_wins_over_the_operators_memory(
    cluster: Cluster, namespace: str, tmp_path: Path
) -> None:
    ns = namespace
    with started(cluster, ns, tmp_path, example(analysis={**NO_METRICS, "interval": "3s"}), step=1):

        def replica_rolls_back() -> bool:
            """Another replica of the operator (the same key) records a rollback, keeping the
            transition count this one last wrote: its memory is no newer than this."""
            obj = get(cluster, ns, "grayrelease", "chat")
            assert obj is not None
            st = GrayReleaseStatus.model_validate(obj["status"])
            rolled = st.model_copy(
                update={
                    "phase": "RolledBack",
                    "weights": dict.fromkeys(st.weights, 0.0),
                    "candidate_weight": 0.0,
                    "message": "rolled back elsewhere",
                }
            )
            sealed(STATUS_KEY.encode(), obj["metadata"]["uid"], rolled, st.sequence + 1)
            body = json.dumps({**obj, "status": rolled.wire()})
            done = cluster.kubectl("replace", "--subresource=status", "-f", "-", input=body, check=False)
            return done.returncode == 0  # else the operator wrote meanwhile: again

        eventually(replica_rolls_back, timeout=WAIT, what="a replica's rollback recorded")
        eventually(lambda: weights(cluster, ns) == [0, 0, 0], timeout=WAIT, what="the table at 0")
        time.sleep(7)  # two intervals: a stale memory would step it on
        after = release_status(cluster, ns)
        w = weights(cluster, ns)
    assert after["phase"] == "RolledBack"
    assert w == [0, 0, 0]


def test_rollback_and_promotion_are_final_through_transient_problems(
    cluster: Cluster, namespace: str, tmp_path: Path
) -> None:
    ns = namespace
    with started(cluster, ns, tmp_path, example(analysis=NO_METRICS), phase="Promoted") as run:
        onnx = run.onnx
        assert weights(cluster, ns) == [100, 100, 100]
        seen: list[list[float] | None] = []

        def watch(what: str, until: Any) -> None:
            def check() -> Any:
                seen.append(weights(cluster, ns))
                return until()

            eventually(check, timeout=WAIT, what=what)

        # The candidate's ModelVersion is briefly of another model, then back; its Service recreated.
        apply(cluster, ns, modelversion("llama3-8b-2-0-0", "1.5.0", onnx, model="mistral-7b"))
        watch(
            "the other model noticed",
            lambda: (
                condition(release_status(cluster, ns), "ModelVersionsReady")["reason"] == "DifferentModels"
            ),
        )
        apply(cluster, ns, modelversion("llama3-8b-2-0-0", "1.5.0", onnx))
        cluster.kubectl("delete", "service", "sched-v2", "-n", ns)
        watch(
            "the missing Service noticed",
            lambda: condition(release_status(cluster, ns), "BackendsAvailable")["status"] == "False",
        )
        apply(cluster, ns, service("sched-v2"))
        watch(
            "both back",
            lambda: condition(release_status(cluster, ns), "BackendsAvailable")["status"] == "True",
        )
        promoted = release_status(cluster, ns)

        # A rolled-back release stays rolled back through the same.
        apply(cluster, ns, example(analysis=HOLD) | {"metadata": {"name": "chat-2"}})
        wait_release(
            cluster, ns, lambda s: s.get("phase") == "Progressing", "chat-2 Progressing", name="chat-2"
        )
        tinct_ok("release", "abort", "chat-2", "-n", ns)
        apply(cluster, ns, modelversion("llama3-8b-2-0-0", "1.5.0", onnx, model="mistral-7b"))
        eventually(
            lambda: (
                condition(release_status(cluster, ns, "chat-2"), "ModelVersionsReady")["reason"]
                == "DifferentModels"
            ),
            timeout=WAIT,
            what="chat-2 sees the other model",
        )
        apply(cluster, ns, modelversion("llama3-8b-2-0-0", "1.5.0", onnx))
        time.sleep(3)  # rounds that would bring it back if the rollback were not final
        rolled = release_status(cluster, ns, "chat-2")
        rolled_weights = weights(cluster, ns, "chat-2")
    assert all(w == [100, 100, 100] for w in seen), seen
    assert (promoted["phase"], promoted["step"]) == ("Promoted", 3)
    assert (rolled["phase"], rolled_weights) == ("RolledBack", [0, 0, 0])
    assert condition(rolled, "Degraded")["reason"] == "Aborted"


def test_a_failing_candidate_loses_its_traffic_within_a_tick(
    cluster: Cluster, namespace: str, tmp_path: Path
) -> None:
    ns = namespace
    with started(cluster, ns, tmp_path, example(analysis=HOLD), phase="Progressing") as run:
        onnx = run.onnx
        assert weights(cluster, ns) == [5, 0.1, 1]
        # Its ModelVersion becomes Failed (a wrong digest).
        apply(cluster, ns, modelversion("llama3-8b-2-0-0", "1.5.0", onnx, wrong_digest=True))
        t0 = time.monotonic()
        eventually(lambda: weights(cluster, ns) == [0, 0, 0], timeout=WAIT, what="weights at 0")
        lost_after = time.monotonic() - t0
        st = release_status(cluster, ns)
        assert condition(st, "Degraded")["reason"] == "CandidateUnavailable"
        assert "candidate ModelVersion llama3-8b-2-0-0 is Failed" in st["message"]
        warned = [e for e in events(cluster, ns) if e["reason"] == "CandidateUnavailable"]
        assert warned
        assert warned[0]["type"] == "Warning"
        # Fixed: the same step's weights again, no step skipped.
        apply(cluster, ns, modelversion("llama3-8b-2-0-0", "1.5.0", onnx))
        eventually(lambda: weights(cluster, ns) == [5, 0.1, 1], timeout=WAIT, what="weights back")
        assert release_status(cluster, ns)["step"] == 0
        # Its pods gone (scaled to 0): the same.
        cluster.kubectl("scale", "deployment", "sched-v2", "-n", ns, "--replicas=0")
        eventually(lambda: weights(cluster, ns) == [0, 0, 0], timeout=WAIT, what="weights at 0 again")
        cluster.kubectl("scale", "deployment", "sched-v2", "-n", ns, "--replicas=1")
        eventually(lambda: weights(cluster, ns) == [5, 0.1, 1], timeout=WAIT, what="weights back again")
        # Its Deployment deleted.
        cluster.kubectl("delete", "deployment", "sched-v2", "-n", ns)
        eventually(lambda: weights(cluster, ns) == [0, 0, 0], timeout=WAIT, what="weights at 0 a third time")
        # The Event of each loss follows its table; the third may still be on its way.
        eventually(
            lambda: [e["reason"] for e in events(cluster, ns)].count("CandidateUnavailable") >= 3,
            timeout=WAIT,
            what="a CandidateUnavailable Event for each of the three losses",
        )
    # A tick is 0.5 s here; the bound is the tick plus the ModelVersion's re-verification.
    assert lost_after < 30, lost_after


def test_the_progress_deadline_pauses_or_rolls_back_a_stuck_release(
    cluster: Cluster, namespace: str, tmp_path: Path
) -> None:
    ns = namespace
    onnx = make_onnx(tmp_path / "model.onnx")
    apply(
        cluster,
        ns,
        service("sched-v1"),
        deployment("sched-v1"),
        deployment("sched-v2"),
        modelversion("llama3-8b-1-4-0", "1.4.0", onnx),
        modelversion("llama3-8b-2-0-0", "1.5.0", onnx),
    )  # no candidate Service: the release cannot start
    with operator(ns, tmp_path / "lineage"):
        apply(cluster, ns, example(analysis=HOLD, progressDeadlineSeconds=10))
        paused = wait_release(cluster, ns, lambda s: s.get("phase") == "Paused", "paused at the deadline")
        apply(
            cluster,
            ns,
            example(analysis=HOLD, progressDeadlineSeconds=10, progressDeadlineAbort=True)
            | {"metadata": {"name": "chat-2"}},
        )
        rolled = wait_release(
            cluster, ns, lambda s: s.get("phase") == "RolledBack", "rolled back", name="chat-2"
        )
    assert "no progress for 10s" in paused["pauseReason"]
    assert "candidate Service sched-v2 does not exist" in paused["pauseReason"]
    assert condition(rolled, "Degraded")["reason"] == "ProgressDeadlineExceeded"
    assert weights(cluster, ns, "chat-2") in (None, [0, 0, 0])


def test_steps_wait_for_the_candidate_replicas_and_stable_keeps_its_floor(
    cluster: Cluster, namespace: str, tmp_path: Path
) -> None:
    ns = namespace
    backends(cluster, ns, tmp_path, stable_replicas=3)
    wait_available(cluster, ns, "sched-v1", 3)
    cells = [{"match": {}, "weights": [30, 60, 100]}]
    doc = example(analysis=NO_METRICS, autoscaling={"minReplicas": 1, "maxReplicas": 6})
    doc["spec"]["cells"] = cells
    seen: list[tuple[list[float] | None, Any, Any]] = []

    def sample() -> None:
        hpa = get(cluster, ns, "hpa", "tinct-chat-candidate")
        stable = get(cluster, ns, "hpa", "tinct-chat-stable")
        seen.append(
            (
                weights(cluster, ns),
                hpa and (hpa["spec"]["minReplicas"], hpa["spec"]["maxReplicas"]),
                stable and (stable["spec"]["minReplicas"], stable["spec"]["maxReplicas"]),
            )
        )

    def available(dep: dict[str, Any]) -> int:
        return int((dep.get("status") or {}).get("availableReplicas") or 0)

    def share(cm: dict[str, Any]) -> float:
        return float(json.loads(cm["data"][DATA_KEY])["cells"][0]["weight"])

    with (
        Versions(cluster, ns, "deployment", "sched-v2") as deps,
        Versions(cluster, ns, "configmap", configmap_name(ns, "chat")) as tables,
        operator(ns, tmp_path / "lineage"),
    ):
        apply(cluster, ns, doc)

        def promoted() -> bool:
            sample()
            return release_status(cluster, ns).get("phase") == "Promoted"

        eventually(promoted, timeout=180, what="Promoted")
        st = release_status(cluster, ns)
        for _ in range(20):  # six more seconds of samples: nothing moves once Promoted
            sample()
            time.sleep(0.3)
    assert st["stableFloor"] == 3
    # Each share came into force only once the candidate had the replicas it needs (stable
    # served 100 % with 3): in commit order, those replicas were available before the table
    # that sent the share was written.
    need = {30: 1, 60: 2, 100: 3}
    assert tables.seen, tables.errors
    assert deps.seen, deps.errors
    for w, n in need.items():
        sent = tables.first(lambda cm, w=w: share(cm) == w)
        assert sent is not None, (w, [share(cm) for _, cm in tables.seen])
        ready = deps.first(lambda d, n=n: available(d) >= n)
        history_ = [(rv, available(d)) for rv, d in deps.seen]
        assert ready is not None, (w, n, sent, history_)
        assert ready < sent, (w, n, ready, sent, history_)
    # While the release ran, stable kept its floor of 3; the candidate's minimum rose before its share did.
    running = [s for s in seen if s[0] and 0 < s[0][0] < 100]
    assert running
    assert all(stable is None or stable[0] == 3 for _, _, stable in running)
    waits = [e for e in events(cluster, ns) if e["reason"] == "WaitingForCapacity"]
    assert waits, "the candidate had 1 replica and 60 % needs 2: the step waited for the HPA"
    assert seen[-1][0] == [100]


def test_without_analysis_no_step_advances_over_zero_available_replicas(
    cluster: Cluster, namespace: str, tmp_path: Path
) -> None:
    ns = namespace
    backends(cluster, ns, tmp_path, candidate_ready=False)  # its Pods never become Ready
    with operator(ns, tmp_path / "lineage"):
        apply(cluster, ns, example(analysis=NO_METRICS))
        st = wait_release(
            cluster,
            ns,
            lambda s: (
                "waiting for 1 available replicas of candidate Deployment sched-v2 (0 now)"
                in (s.get("message") or "")
            ),
            "waiting for replicas",
        )
        time.sleep(6)  # three intervals
        later = release_status(cluster, ns)
        w = weights(cluster, ns)
    assert st["phase"] == "Pending"
    assert (later["phase"], later["step"], later.get("stepStartedAt")) == ("Pending", 0, None)
    assert w in (None, [0, 0, 0])


def test_actions_from_old_yaml_or_old_attempts_never_take_effect(
    cluster: Cluster, namespace: str, tmp_path: Path
) -> None:
    ns = namespace
    backends(cluster, ns, tmp_path)
    with operator(ns, tmp_path / "lineage"):
        # Exported YAML applied again, with the promote it carried.
        doc = example(analysis=HOLD)
        doc["metadata"]["annotations"] = {"tinct.io/action": "promote@1"}
        apply(cluster, ns, doc)
        st = wait_release(
            cluster,
            ns,
            lambda s: (
                (s.get("lastAction") or {}).get("value") == "promote@1" and s.get("phase") == "Progressing"
            ),
            "refused, and started as it would anyway",
        )
        assert (st["phase"], st["lastAction"]["result"]) == ("Progressing", "Refused")
        assert "present when the release was created" in st["lastAction"]["message"]
        assert weights(cluster, ns) == [5, 0.1, 1]

        aborted = tinct_ok("release", "abort", "chat", "-n", ns)
        assert "abort done" in aborted.stdout
        # GitOps restores the value it last knew: refused, still rolled back.
        cluster.kubectl("annotate", "gr", "chat", "-n", ns, "tinct.io/action=promote@1", "--overwrite")
        eventually(
            lambda: (release_status(cluster, ns).get("lastAction") or {}).get("value") == "promote@1",
            timeout=WAIT,
            what="the old value refused",
        )
        again = release_status(cluster, ns)
        assert (again["phase"], again["lastAction"]["result"]) == ("RolledBack", "Refused")
        # The CLI says so and exits 1 for a refused request.
        refused = tinct("release", "promote", "chat", "-n", ns)
        retried = tinct("release", "retry", "chat", "-n", ns)
        wait_release(cluster, ns, lambda s: s.get("phase") == "Progressing", "Progressing again")
        # A request addressed to the attempt before the retry is refused.
        cluster.kubectl("annotate", "gr", "chat", "-n", ns, "tinct.io/action=promote@a1-stale", "--overwrite")
        stale = wait_release(
            cluster,
            ns,
            lambda s: (s.get("lastAction") or {}).get("value") == "promote@a1-stale",
            "stale refused",
        )
        w = weights(cluster, ns)
    assert refused.returncode == 1
    assert "promote refused: the release is RolledBack" in refused.stderr
    assert retried.returncode == 0, retried.stderr
    assert (stale["phase"], stale["attempt"], stale["lastAction"]["result"]) == ("Progressing", 2, "Refused")
    assert "meant for attempt 1" in stale["lastAction"]["message"]
    assert w == [5, 0.1, 1]


def test_a_change_of_port_starts_over_and_kubectl_tells_the_story(
    cluster: Cluster, namespace: str, tmp_path: Path
) -> None:
    ns = namespace
    backends(cluster, ns, tmp_path)
    with operator(ns, tmp_path / "lineage"):
        apply(cluster, ns, example(analysis=NO_METRICS))
        done = cluster.kubectl(
            "wait", "--for=condition=Ready", "gr/chat", "-n", ns, "--timeout=90s", check=False
        )
        assert done.returncode == 0, done.stderr
        cols = cluster.kubectl("get", "gr", "chat", "-n", ns).stdout.splitlines()
        # The candidate's Service gets the new port too (a port it lacks is a failed
        # precondition, ServicePortMissing), and the release moves to it.
        ports = [{"name": "a", "port": 8000}, {"name": "b", "port": 8001}]
        apply(cluster, ns, service("sched-v2") | {"spec": {"selector": {"app": "sched-v2"}, "ports": ports}})
        doc = example(analysis=HOLD)
        doc["spec"]["candidate"]["port"] = 8001
        apply(cluster, ns, doc)
        st = wait_release(cluster, ns, lambda s: s.get("attempt") == 2, "a new attempt")
        restarted = weights(cluster, ns)
    assert " ".join(cols[0].split()) == "NAME STABLE CANDIDATE STEP WEIGHT ANALYSIS TABLE PHASE AGE"
    assert cols[1].split()[3:5] == ["4/4", "100"]
    assert (st["phase"], st["step"]) == ("Progressing", 0)
    assert restarted == [5, 0.1, 1]
    assert condition(st, "Ready")["status"] == "False"


def test_the_schema_refuses_a_too_short_interval(cluster: Cluster, namespace: str) -> None:
    doc = example(analysis={"interval": "500ms", "metrics": []})
    out = cluster.kubectl(
        "apply", "-n", namespace, "--dry-run=server", "-f", "-", input=yaml.safe_dump(doc), check=False
    )
    assert out.returncode != 0
    assert "interval must be at least 2s" in out.stderr


def _lineage_down(root: Path) -> Path:
    """Replace the ``release_events`` table with a regular file: every write to it fails,
    even as root (a path through a file is no directory). Returns where the table is kept."""
    live, aside = root / "release_events", root.parent / "release_events.aside"
    eventually(lambda: (live / "_delta_log").is_dir(), timeout=WAIT, what="the release_events table created")
    live.rename(aside)
    live.write_text("the lineage volume is gone\n")
    return aside


def _lineage_up(root: Path, aside: Path) -> None:
    live = root / "release_events"
    live.unlink()
    aside.rename(live)


def _in_force(
    releases: Versions, tables: Versions, uid: str
) -> list[tuple[int, list[float], dict[str, Any]]]:
    """(table version, its weights, the release's status committed just before it) for every
    table of release ``uid`` the API server committed: what the routers followed, next to what
    status had recorded when the table appeared."""
    out = []
    for rv, cm in tables.seen:
        doc = json.loads(cm["data"][DATA_KEY])
        if doc.get("uid") != uid:
            continue
        release = releases.before(rv)
        status = (release or {}).get("status") or {}
        out.append((int(doc["version"]), [c["weight"] for c in doc["cells"]], status))
    return out


@contextmanager
def _recorded(cluster: Cluster, ns: str, root: Path) -> Iterator[tuple[Versions, Versions]]:
    """The operator on ``ns`` (lineage under ``root``) for the block, every version of release
    chat and of its table recorded meanwhile."""
    with (
        Versions(cluster, ns, "grayrelease", "chat") as releases,
        Versions(cluster, ns, "configmap", configmap_name(ns, "chat")) as tables,
        operator(ns, root),
    ):
        yield releases, tables


def test_a_lineage_outage_delays_the_history_never_the_traffic(
    cluster: Cluster, namespace: str, tmp_path: Path
) -> None:
    ns, root = namespace, tmp_path / "lineage"
    backends(cluster, ns, tmp_path)
    with _recorded(cluster, ns, root) as (releases, tables):
        apply(cluster, ns, example(analysis=HOLD))
        wait_release(cluster, ns, lambda s: s.get("phase") == "Progressing", "step 1/4")
        wait_history_written(cluster, ns)
        before = history(root)
        aside = _lineage_down(root)
        # The interval shortens: the release steps on while no history row can be written.
        apply(cluster, ns, example(analysis={**NO_METRICS, "interval": "3s"}))
        held = wait_release(
            cluster,
            ns,
            lambda s: s.get("phase") == "Promoted" and len(s.get("history") or []) == 3,
            "Promoted during the outage, its three transitions kept in status",
        )
        time.sleep(3)  # six ticks, each failing to write the history
        still = release_status(cluster, ns)
        during = table(cluster, ns)
        _lineage_up(root, aside)
        wait_history_written(cluster, ns)
        uid = get(cluster, ns, "grayrelease", "chat")["metadata"]["uid"]
    rows = history(root)
    assert [(r["state"], r["step"]) for r in before] == [("Progressing", 1)]
    assert [(h["seq"], h["reason"], h["step"]) for h in held["history"]] == [
        (1, "StepAdvanced", 1),
        (2, "StepAdvanced", 2),
        (3, "Promoted", 3),
    ]
    assert (still["phase"], still["transitions"]) == ("Promoted", 4)
    assert still["history"] == held["history"], "the unwritten transitions stay until written"
    assert during is not None
    assert [c["weight"] for c in during[1]["cells"]] == [100, 100, 100], "the outage never held traffic"
    # Every row exactly once, in order, each saying where its transition stood.
    assert path(rows) == PROMOTED_PATH
    assert [r["event_id"].split("/")[1] for r in rows] == ["0", "1", "2", "3"]
    # Every table was recorded in status before it was applied, and only ever moved forward.
    seen = _in_force(releases, tables, uid)
    assert [w for _, w, _ in seen][-1] == [100, 100, 100], seen
    for version, w, status in seen:
        routing = status.get("routing") or {}
        assert routing.get("version", 0) >= version, (version, w, routing)
        if routing.get("version") == version:
            assert max(w) == status["candidateWeight"], (version, w, status.get("weights"))
    versions = [v for v, _, _ in seen]
    assert versions == sorted(versions), versions
    shares = [w[0] for _, w, _ in seen]
    assert shares == sorted(shares), f"the table moved backwards: {shares}"


def test_a_release_recreated_under_the_same_name_starts_from_its_own_status(
    cluster: Cluster, namespace: str, tmp_path: Path
) -> None:
    ns, root = namespace, tmp_path / "lineage"
    backends(cluster, ns, tmp_path)
    with _recorded(cluster, ns, root) as (releases, tables):
        apply(cluster, ns, example(analysis={**NO_METRICS, "interval": "3s"}))
        wait_release(cluster, ns, lambda s: s.get("step") == 1, "step 2/4")
        old = get(cluster, ns, "grayrelease", "chat")
        cluster.kubectl("delete", "grayrelease", "chat", "-n", ns, "--timeout=120s")
        apply(cluster, ns, example(analysis=HOLD))

        def started() -> dict[str, Any] | None:
            gr = get(cluster, ns, "grayrelease", "chat")
            fresh = gr is not None and gr["metadata"]["uid"] != old["metadata"]["uid"]
            return gr if fresh and (gr.get("status") or {}).get("phase") == "Progressing" else None

        new = eventually(started, timeout=WAIT, what="the new release Progressing")
        uid = new["metadata"]["uid"]
        eventually(
            lambda: (got := table(cluster, ns)) is not None and got[1].get("uid") == uid,
            timeout=WAIT,
            what="the table of the new release",
        )
        time.sleep(4)  # eight ticks: memory of the old release would show by now
        wait_history_written(cluster, ns)
        later = get(cluster, ns, "grayrelease", "chat")
        final = table(cluster, ns)

    def statuses(of: str) -> list[dict[str, Any]]:
        return [
            obj["status"] for _, obj in releases.seen if obj["metadata"]["uid"] == of and obj.get("status")
        ]

    mine, gone = statuses(uid), statuses(old["metadata"]["uid"])
    rows = [r for r in history(root) if r["event_id"].startswith(f"{uid}/")]
    assert later["metadata"]["uid"] == uid
    assert max(s.get("step", 0) for s in gone) >= 1, "the old release was deleted past step 1/4"
    # Every status the new release ever had is its own: step 1/4, attempt 1, its own transitions.
    assert mine
    assert {(s.get("phase"), s.get("step"), s.get("attempt")) for s in mine} <= {
        ("Pending", 0, 1),
        ("Progressing", 0, 1),
    }, [(s.get("phase"), s.get("step"), s.get("attempt"), s.get("transitions")) for s in mine]
    assert max(s.get("candidateWeight", 0) for s in mine) == 5
    st = later["status"]
    assert (st["phase"], st["step"], st["attempt"], st["transitions"]) == ("Progressing", 0, 1, 1)
    assert [(r["state"], r["step"]) for r in rows] == [("Progressing", 1)]
    # The table follows the new release, never with weights the old one had reached.
    ours = _in_force(releases, tables, uid)
    assert ours
    assert all(w == [5, 0.1, 1] for _, w, _ in ours), ours
    assert final is not None
    assert (final[1]["uid"], final[1].get("standing", False)) == (uid, False)
    assert [c["weight"] for c in final[1]["cells"]] == [5, 0.1, 1]


def _annotate_at_once(cluster: Cluster, ns: str, *values: str) -> None:
    """Set ``tinct.io/action`` to each of ``values`` in turn, one API call right after another."""
    api = kube_config.new_client_from_config(config_file=str(cluster.kubeconfig))
    try:
        objects = kube_client.CustomObjectsApi(api)
        for value in values:
            objects.patch_namespaced_custom_object(
                "tinct.io", "v1alpha1", ns, "grayreleases", "chat",
                {"metadata": {"annotations": {"tinct.io/action": value}}},
                _content_type="application/merge-patch+json",
            )  # fmt: skip
    finally:
        api.close()


def test_two_actions_given_between_two_rounds_both_take_effect_in_order(
    cluster: Cluster, namespace: str, tmp_path: Path
) -> None:
    ns, root = namespace, tmp_path / "lineage"
    backends(cluster, ns, tmp_path)
    with (
        Versions(cluster, ns, "grayrelease", "chat") as releases,
        operator(ns, root),
    ):
        apply(cluster, ns, example(analysis=HOLD))
        wait_release(cluster, ns, lambda s: s.get("phase") == "Progressing", "step 1/4")
        # No round of its own steps in between (interval 1h): only the two requests act.
        _annotate_at_once(cluster, ns, "abort@n1", "retry@n2")
        st = wait_release(
            cluster,
            ns,
            lambda s: (s.get("lastAction") or {}).get("value") == "retry@n2",
            "the second request handled",
        )
        wait_history_written(cluster, ns)
        w = weights(cluster, ns)
        said = [e["reason"] for e in sorted(events(cluster, ns), key=lambda e: e["eventTime"])]
    rows = history(root)
    acked = [
        obj["status"].get("acknowledgedAction")
        for _, obj in releases.seen
        if (obj.get("status") or {}).get("acknowledgedAction")
    ]
    # Both carried out, abort first: the release rolled back, then started over as attempt 2.
    assert (st["lastAction"]["result"], st["phase"], st["step"], st["attempt"]) == (
        "Done",
        "Progressing",
        0,
        2,
    ), st["lastAction"]
    assert st["seenActions"][-2:] == ["abort@n1", "retry@n2"]
    assert "ActionRefused" not in said, said
    assert [r for r in said if r in ("Aborted", "Retried")] == ["Aborted", "Retried"], said
    assert [(r["state"], r["reason"].split(":")[0]) for r in rows] == [
        ("Progressing", "Started"),
        ("RolledBack", "Aborted"),
        ("Pending", "Retried"),
        ("Progressing", "Started"),
    ]
    assert list(dict.fromkeys(acked)) in (["retry@n2"], ["abort@n1", "retry@n2"]), acked
    assert w == [5, 0.1, 1]


def test_an_abort_given_while_a_step_up_is_due_wins_for_good(
    cluster: Cluster, namespace: str, tmp_path: Path
) -> None:
    ns = namespace
    backends(cluster, ns, tmp_path, stable_replicas=3)
    wait_available(cluster, ns, "sched-v1", 3)
    doc = example(analysis=NO_METRICS)
    doc["spec"]["cells"] = [{"match": {}, "weights": [30, 60, 100]}]
    del doc["spec"]["autoscaling"]  # nothing scales the candidate: the step-up stays due

    def share(cm: dict[str, Any]) -> float:
        return float(json.loads(cm["data"][DATA_KEY])["cells"][0]["weight"])

    with (
        Versions(cluster, ns, "configmap", configmap_name(ns, "chat")) as tables,
        operator(ns, tmp_path / "lineage"),
    ):
        apply(cluster, ns, doc)
        # Stable served everything with 3: 60 % needs 2 available candidate replicas, it has 1.
        due = wait_release(
            cluster,
            ns,
            lambda s: (
                s.get("nextStep") == 1 and "waiting for 2 available replicas" in (s.get("message") or "")
            ),
            "the step-up to 2/3 decided and due, waiting for capacity",
        )
        aborted = tinct_ok("release", "abort", "chat", "-n", ns)
        rolled = wait_release(cluster, ns, lambda s: s.get("phase") == "RolledBack", "RolledBack")
        # The capacity the step-up waited for arrives: it must not be carried out.
        cluster.kubectl("scale", "deployment", "sched-v2", "-n", ns, "--replicas=2")
        wait_available(cluster, ns, "sched-v2", 2)
        time.sleep(6)  # three intervals, twelve ticks
        later = release_status(cluster, ns)
        w = weights(cluster, ns)
    assert (due["phase"], due["step"], due["candidateWeight"]) == ("Progressing", 0, 30)
    assert "abort done" in aborted.stdout
    assert (rolled["step"], rolled.get("nextStep"), rolled["candidateWeight"]) == (0, None, 0)
    assert (later["phase"], later.get("nextStep"), later["candidateWeight"]) == ("RolledBack", None, 0)
    assert condition(later, "Degraded")["reason"] == "Aborted"
    assert w == [0]
    shares = [share(cm) for _, cm in tables.seen]
    assert max(shares) == 30, f"the due step-up was carried out after the abort: {shares}"
    assert shares[-1] == 0, shares
