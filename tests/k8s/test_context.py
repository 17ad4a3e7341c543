"""--context picks the cluster for every command that talks to one: the operator (its kopf
login, status patches and watches alike), the router's watch and tinct release."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import yaml

from tinct_testing.controlplane.harness import Cluster, free_port
from tinct_testing.lineage_artifacts import make_onnx
from tinct_testing.release_cluster import apply, modelversion
from tinct_testing.wait import eventually


def _two_contexts(cluster: Cluster, path: Path) -> Path:
    """The admin kubeconfig plus a context ``elsewhere`` (nothing listens there), made current."""
    doc = yaml.safe_load(cluster.kubeconfig.read_text())
    admin = doc["current-context"]
    doc["clusters"].append({"name": "elsewhere", "cluster": {"server": f"https://127.0.0.1:{free_port()}"}})
    user = doc["contexts"][0]["context"]["user"]
    doc["contexts"].append({"name": "elsewhere", "context": {"cluster": "elsewhere", "user": user}})
    doc["current-context"] = "elsewhere"
    path.write_text(yaml.safe_dump(doc))
    assert admin != "elsewhere"
    return path


def test_context_picks_the_cluster_for_the_operator_and_the_cli(
    cluster: Cluster, namespace: str, tmp_path: Path
) -> None:
    kc = _two_contexts(cluster, tmp_path / "kubeconfig")
    admin = yaml.safe_load(cluster.kubeconfig.read_text())["current-context"]
    env = {k: v for k, v in os.environ.items() if k not in ("KUBECONFIG", "TINCT_CONTEXT")}
    tinct = [sys.executable, "-m", "tinct.cli"]

    # The current context is elsewhere: said in one line, not retried.
    off = subprocess.run(
        [*tinct, "release", "list", "-n", namespace, "--kubeconfig", str(kc)],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert off.returncode == 1
    assert "cannot reach the Kubernetes API server" in off.stderr
    on = subprocess.run(
        [*tinct, "release", "list", "-n", namespace, "--kubeconfig", str(kc), "--context", admin],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert on.returncode == 0, on.stderr
    assert on.stderr == f"no GrayReleases in namespace {namespace}\n"

    # The router's watch checks its access at start: elsewhere it ends at once, saying so.
    router = [*tinct, "router", "--watch", "--namespace", namespace, "--kubeconfig", str(kc)]
    refused = subprocess.run(
        [*router, "--port", str(free_port())], capture_output=True, text=True, env=env, timeout=120
    )
    assert refused.returncode == 1
    assert refused.stderr.startswith("tinct router: cannot reach the Kubernetes API server")

    # The operator on the chosen context: it logs in, watches and writes status there.
    models = tmp_path / "models"
    models.mkdir()
    onnx = make_onnx(models / "model.onnx")
    log = (tmp_path / "operator.log").open("wb")
    op = subprocess.Popen(
        [
            *tinct,
            "operator",
            "--kubeconfig",
            str(kc),
            "--context",
            admin,
            "--namespace",
            namespace,
            "--table-namespace",
            namespace,
            "--lineage-root",
            str(tmp_path / "lineage"),
            "--artifact-root",
            str(models),
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        env=env,
    )
    try:
        apply(cluster, namespace, modelversion("llama3-8b-1-4-0", "1.4.0", onnx))

        def ready() -> bool:
            out = cluster.kubectl(
                "get", "mv", "llama3-8b-1-4-0", "-n", namespace, "-o", "jsonpath={.status.phase}", check=False
            )
            assert op.poll() is None, (tmp_path / "operator.log").read_text()[-3000:]
            return out.stdout == "Ready"

        eventually(
            ready, timeout=120, what="the ModelVersion Ready through the operator on the chosen context"
        )
    finally:
        op.terminate()
        op.wait(30)
        log.close()
    started = (tmp_path / "operator.log").read_text()
    assert f"tinct operator: kubeconfig {kc} (context {admin}): API server v" in started
