"""``kubectl tinct`` through the real kubectl: list, -o yaml, and status --watch redrawing the
dye matrix as the release changes, until it is deleted."""

from __future__ import annotations

import os
import queue
import subprocess
import sys
import threading
from pathlib import Path

import yaml

from tinct_testing.controlplane.harness import Cluster
from tinct_testing.release_cluster import (
    apply,
    backends,
    example,
    operator,
    release_status,
    wait_release,
)
from tinct_testing.wait import eventually

BIN = Path(sys.executable).parent


def _kubectl_env(cluster: Cluster) -> dict[str, str]:
    """kubectl finds its plugins on PATH: the venv's kubectl-tinct and kubectl_complete-tinct."""
    return {
        **os.environ,
        "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
        "KUBECONFIG": str(cluster.kubeconfig),
    }


def _kubectl(cluster: Cluster, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [cluster.kubectl_path, *args], capture_output=True, text=True, env=_kubectl_env(cluster), timeout=120
    )


class _Lines:
    """The lines a process prints, read in a thread, waited for with a deadline."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.proc = proc
        self.seen: list[str] = []
        self._q: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self._q.put(line.rstrip("\n"))
        self._q.put(None)

    def until(self, what: str, timeout: float = 120) -> str:
        def matching() -> str | None:
            try:
                line = self._q.get(timeout=0.5)  # the pause between asks
            except queue.Empty:
                return None
            if line is None:
                raise EOFError("the process ended; it printed:\n" + "\n".join(self.seen))
            self.seen.append(line)
            return line if what in line else None

        line: str = eventually(
            matching,
            timeout=timeout,
            interval=0,
            what=f"a line with {what!r}",
            explain=lambda: "printed so far:\n" + "\n".join(self.seen),
        )
        return line


def test_kubectl_tinct_lists_and_watches_a_release(cluster: Cluster, namespace: str, tmp_path: Path) -> None:
    ns, root = namespace, tmp_path / "lineage"
    backends(cluster, ns, tmp_path)
    with operator(ns, root):
        apply(cluster, ns, example(analysis={"interval": "1h"}))
        wait_release(cluster, ns, lambda s: s.get("phase") == "Progressing", "Progressing")

        listed = _kubectl(cluster, "tinct", "list", "-n", ns)
        assert listed.returncode == 0, listed.stderr
        header, row = listed.stdout.splitlines()
        assert header.split()[:5] == ["NAME", "PHASE", "STEP", "WEIGHT", "ANALYSIS"]
        assert row.split()[:5] == ["chat", "Progressing", "1/4", "5", "-"]
        as_yaml = _kubectl(cluster, "tinct", "release", "status", "chat", "-n", ns, "-o", "yaml")
        assert as_yaml.returncode == 0, as_yaml.stderr
        doc = yaml.safe_load(as_yaml.stdout)
        assert (doc["phase"], doc["step"], doc["cells"][0]["inForce"]) == ("Progressing", "1/4", 5.0)

        watch = subprocess.Popen(
            [cluster.kubectl_path, "tinct", "status", "chat", "-n", ns, "--watch"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=_kubectl_env(cluster),
        )
        try:
            lines = _Lines(watch)
            lines.until(f"GrayRelease {ns}/chat  phase Progressing  step 1/4")
            lines.until("len:long+role:admin+latency:high")
            paused = _kubectl(cluster, "tinct", "pause", "chat", "-n", ns)
            assert paused.returncode == 0, paused.stderr
            # The matrix is drawn again, now paused at the same step.
            lines.until(f"GrayRelease {ns}/chat  phase Paused  step 1/4")
            lines.until("paused at step 1/4: spec.paused is true")
            cluster.kubectl("delete", "gr", "chat", "-n", ns, "--wait=true")
            lines.until(f"grayrelease {ns}/chat deleted")
            assert watch.wait(60) == 0
        finally:
            if watch.poll() is None:
                watch.kill()
                watch.wait()
        frames = [line for line in lines.seen if line.startswith(f"GrayRelease {ns}/chat")]
        assert len(frames) >= 2, lines.seen


def test_an_action_on_a_promoted_release_is_refused_and_leaves_its_message(
    cluster: Cluster, namespace: str, tmp_path: Path
) -> None:
    ns, root = namespace, tmp_path / "lineage"
    backends(cluster, ns, tmp_path)
    with operator(ns, root):
        apply(cluster, ns, example(analysis={"interval": "1h"}))
        wait_release(cluster, ns, lambda s: s.get("phase") == "Progressing", "Progressing")
        promoted = _kubectl(cluster, "tinct", "promote", "chat", "-n", ns)
        assert promoted.returncode == 0, promoted.stderr
        done = wait_release(cluster, ns, lambda s: s.get("phase") == "Promoted", "Promoted")
        said = done["message"]
        assert said.startswith("promoted after step 1/4")

        for verb in ("pause", "resume", "abort", "promote"):
            refused = _kubectl(cluster, "tinct", verb, "chat", "-n", ns)
            assert refused.returncode == 1, (verb, refused.stdout, refused.stderr)
            assert refused.stdout == ""
            assert refused.stderr == (
                f"tinct release: grayrelease {ns}/chat: {verb} refused: the release is Promoted, which is "
                f"final: there is nothing to {verb}; release stable again as a new candidate to go back\n"
            )
        obj = yaml.safe_load(cluster.kubectl("get", "gr", "chat", "-n", ns, "-o", "yaml").stdout)
        assert obj["spec"].get("paused") in (None, False), "a refused pause writes nothing"
        assert obj["metadata"]["annotations"]["tinct.io/action"] == done["acknowledgedAction"]

        # Written some other way, the operator refuses it, and the message stays the release's.
        cluster.kubectl("annotate", "gr", "chat", "-n", ns, "tinct.io/action=abort@by-hand", "--overwrite")
        st = wait_release(
            cluster,
            ns,
            lambda s: (s.get("lastAction") or {}).get("value") == "abort@by-hand",
            "the annotated abort handled",
        )
        assert st["lastAction"]["result"] == "Refused"
        assert "the release is Promoted, which is final" in st["lastAction"]["message"]
        assert (st["phase"], st["message"]) == ("Promoted", said)
        assert release_status(cluster, ns)["message"] == said
