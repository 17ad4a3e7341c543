"""Two `tinct operator --peering` processes: one acts, the other stands by, and takes over
when the active one is SIGKILLed, continuing the release from the recorded step.

Both replicas run with the same arguments, as the chart's Deployment starts them, and share
one lineage root: the history of a release is one ``release_events`` table whoever writes
it, and only the active replica writes (a write repeated after a takeover keeps one row).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from tinct.lineage.sql import query
from tinct_testing.controlplane.harness import Cluster
from tinct_testing.paths import ROOT
from tinct_testing.release_cluster import PROMOTED_PATH, apply, backends, example, history, path, wait_release
from tinct_testing.wait import WAIT, eventually

PEERING_CRDS = ROOT / "charts" / "tinct" / "crds" / "kopf.dev_peerings.yaml"
PEERING = "tinct"
#: Seconds a silent peer counts as alive: how long the standby waits after the kill. kopf
#: touches its peering entry every ``lifetime - 5..10`` s (every second below 11 s), so 15
#: leaves 5-10 s of slack: a replica starved of CPU on a loaded machine for 4 s is not taken
#: for dead, as it was with 5.
LIFETIME = 15
INTERVAL = "4s"
TRANSITIONS = ["Started", "StepAdvanced", "StepAdvanced", "Promoted"]


@dataclass
class Replica:
    name: str
    proc: subprocess.Popen[bytes]
    log: Path

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def transitions(self, ns: str, upto: int | None = None) -> list[str]:
        """The transitions this replica logged for ``ns``/chat (in the first ``upto`` chars)."""
        text = self.text()[:upto]
        found = []
        for line in text.splitlines():
            if f"[{ns}/chat]" in line:
                reason = line.split(f"[{ns}/chat]", 1)[1].strip().split(":", 1)[0]
                if reason in TRANSITIONS:
                    found.append(reason)
        return found


@pytest.fixture
def peering_crds(cluster: Cluster) -> None:
    """kopf's peering CRDs as the chart ships them, Established."""
    cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(PEERING_CRDS))
    cluster.wait_established("crd/kopfpeerings.kopf.dev")


@contextmanager
def replicas() -> Iterator[dict[str, Replica]]:
    """A dict for the replicas the test starts; all of them stopped at the end."""
    started: dict[str, Replica] = {}
    try:
        yield started
    finally:
        for r in started.values():
            if r.proc.poll() is None:
                r.proc.send_signal(signal.SIGTERM)
        for r in started.values():
            try:
                r.proc.wait(20)
            except subprocess.TimeoutExpired:
                r.proc.kill()
                r.proc.wait()


def start(ns: str, root: Path, log: Path, name: str, **env: str) -> Replica:
    """`tinct operator --peering` as replica ``name`` (its kopf identity), lineage under ``root``."""
    argv = [sys.executable, "-m", "tinct.cli", "operator", "--peering", PEERING, "--namespace", ns]
    environ = {
        **os.environ,
        "POD_ID": name,
        "PYTHONUNBUFFERED": "1",
        "TINCT_LINEAGE_ROOT": str(root),
        "TINCT_ARTIFACT_ROOTS": str(root.parent),
        "TINCT_RELEASE_TICK": "0.5",
        "TINCT_PEERING_LIFETIME": str(LIFETIME),
        **env,
    }
    with log.open("wb") as fh:
        proc = subprocess.Popen(argv, stdout=fh, stderr=subprocess.STDOUT, env=environ)
    return Replica(name, proc, log)


def peers(cluster: Cluster, ns: str) -> dict[str, dict[str, int]]:
    proc = cluster.kubectl("get", "kopfpeering", PEERING, "-n", ns, "-o", "json", check=False)
    if proc.returncode != 0:
        return {}
    status: dict[str, dict[str, int]] = json.loads(proc.stdout).get("status") or {}
    return status


def test_two_operators_one_acts_and_the_standby_takes_over(
    cluster: Cluster, namespace: str, tmp_path: Path, peering_crds: None
) -> None:
    ns, root = namespace, tmp_path / "lineage"
    with replicas() as running:
        a = running["a"] = start(ns, root, tmp_path / "a.log", "op-a")
        eventually(lambda: "op-a" in peers(cluster, ns), timeout=WAIT, what="op-a in the peering object")
        b = running["b"] = start(ns, root, tmp_path / "b.log", "op-b")
        eventually(lambda: "op-b" in peers(cluster, ns), timeout=WAIT, what="op-b in the peering object")
        # A replica starts paused and resumes once the peering object shows no peer above it.
        eventually(lambda: "Resuming operations" in a.text(), timeout=WAIT, what="op-a to act")
        priorities = {k: v["priority"] for k, v in peers(cluster, ns).items()}

        backends(cluster, ns, tmp_path)
        apply(
            cluster,
            ns,
            example(
                analysis={"interval": INTERVAL, "prometheus": {"url": "http://127.0.0.1:9"}, "metrics": []}
            ),
        )
        wait_release(cluster, ns, lambda s: s.get("step") == 1, "step 1")
        eventually(lambda: a.transitions(ns) == TRANSITIONS[:2], timeout=WAIT, what="op-a to log step 1")
        standby_before = b.text()
        a.proc.send_signal(signal.SIGKILL)
        a.proc.wait(10)
        killed_at = time.monotonic()

        st = wait_release(cluster, ns, lambda s: s.get("phase") == "Promoted", "Promoted", timeout=90)
        took = time.monotonic() - killed_at
        eventually(lambda: "Promoted" in b.transitions(ns), timeout=WAIT, what="op-b to log the promotion")
        rows = history(root)
        mv_rows = query(
            "SELECT name, event, count(*) AS n FROM model_versions GROUP BY name, event ORDER BY name, event",
            str(root),
        ).to_pylist()
    print(f"priorities {priorities}; promoted {took:.1f} s after the kill")

    # Only op-a acted while it lived; op-b only after it took over.
    assert priorities["op-a"] > priorities["op-b"]
    assert f"[{ns}/" not in standby_before
    assert "Resuming operations" not in standby_before
    assert a.transitions(ns) == TRANSITIONS[:2]
    assert "Resuming operations" in b.text()
    assert b.transitions(ns) == TRANSITIONS[2:]
    # The release went on from step 1: every step once, in order, recorded once.
    assert path(rows) == PROMOTED_PATH
    assert [r["reason"].split(":")[0] for r in rows] == TRANSITIONS
    assert st["transitions"] == 4
    assert [(r["name"], r["event"], r["n"]) for r in mv_rows] == [
        ("llama3-8b-1-4-0", "registered", 1),
        ("llama3-8b-2-0-0", "registered", 1),
    ]
