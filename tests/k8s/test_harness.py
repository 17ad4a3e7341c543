"""The control-plane harness itself: versions, RBAC, ServiceAccount identities, teardown."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest

from tinct_testing.controlplane import build
from tinct_testing.controlplane.harness import Cluster, ControlPlane, ControlPlaneError, cluster_from_env
from tinct_testing.controlplane.process import killed_hard, running
from tinct_testing.wait import eventually


def test_version_is_the_release_built(cluster: Cluster) -> None:
    if not isinstance(cluster, ControlPlane):
        pytest.fail("this test checks the harness-built control plane; unset TINCT_TEST_KUBECONFIG")
    version = cluster.version()
    assert version["gitVersion"] == build.kube_version()
    assert (version["major"], version["minor"]) == tuple(build.kube_version()[1:].split(".")[:2])
    client = json.loads(cluster.kubectl("version", "-o", "json").stdout)["clientVersion"]
    assert client["gitVersion"] == build.kube_version()


def test_rbac_is_enforced_for_service_accounts(cluster: Cluster, namespace: str) -> None:
    sa = cluster.service_account_kubeconfig(namespace, "reader")
    assert stat.S_IMODE(sa.stat().st_mode) == 0o600
    denied = cluster.kubectl("get", "configmaps", "-n", namespace, kubeconfig=sa, check=False)
    assert denied.returncode != 0
    assert f"system:serviceaccount:{namespace}:reader" in denied.stderr
    assert "forbidden" in denied.stderr.lower()

    cluster.kubectl(
        "create", "role", "cm-reader", "-n", namespace, "--verb=get,list", "--resource=configmaps"
    )
    cluster.kubectl(
        "create",
        "rolebinding",
        "cm-reader",
        "-n",
        namespace,
        "--role=cm-reader",
        f"--serviceaccount={namespace}:reader",
    )
    allowed = cluster.kubectl("get", "configmaps", "-n", namespace, kubeconfig=sa, check=False)
    assert allowed.returncode == 0, allowed.stderr
    # Granted list, not create.
    create = cluster.kubectl("create", "configmap", "x", "-n", namespace, kubeconfig=sa, check=False)
    assert create.returncode != 0
    can = cluster.kubectl(
        "auth", "can-i", "delete", "configmaps", "-n", namespace, kubeconfig=sa, check=False
    )
    assert can.stdout.strip() == "no"


@pytest.mark.usefixtures("own_control_plane")
def test_teardown_leaves_no_process_or_directory_even_when_the_body_fails() -> None:
    cp = ControlPlane()
    seen: list[int] = []

    def body() -> None:
        with cp:
            seen.extend(cp.pids)
            assert len(seen) == 4  # etcd, kube-apiserver, kube-controller-manager, kwok
            assert cp.kwok_pid in seen
            assert cp.kwok_node == "kwok-node-0"
            assert all(running(p) for p in seen)
            assert (cp.workdir / "kwok.log").is_file()
            raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        body()
    assert len(seen) == 4
    assert not any(running(p) for p in seen)
    assert not cp.workdir.exists()
    assert cp.kwok_node is None


def test_failed_start_reports_the_log_and_cleans_up(tmp_path: Path) -> None:
    bins = tmp_path / "bin"
    bins.mkdir()
    for name in ("etcd", "kube-apiserver", "kubectl"):
        script = bins / name
        script.write_text("#!/bin/sh\necho 'cannot start: disk on fire' >&2\nexit 3\n")
        script.chmod(0o755)
    cp = ControlPlane(bin_dir=bins)
    with pytest.raises(ControlPlaneError, match="disk on fire") as err:
        cp.start(timeout=20)
    assert "etcd exited with code 3" in str(err.value)
    assert not cp.workdir.exists()


def test_existing_cluster_is_used_when_named(cluster: Cluster, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TINCT_TEST_KUBECONFIG", str(cluster.kubeconfig))
    with cluster_from_env() as ext:
        assert not isinstance(ext, ControlPlane)
        assert ext.server == cluster.server
        assert "kube-system" in ext.kubectl("get", "namespaces").stdout


@pytest.mark.usefixtures("own_control_plane")
def test_processes_die_with_a_test_process_killed_hard(tmp_path: Path) -> None:
    """SIGKILL skips atexit and finally; no control-plane process may outlive it."""
    setup = (
        "from tinct_testing.controlplane.harness import ControlPlane\n"
        f"cp = ControlPlane(workdir=Path({str(tmp_path / 'cp')!r})).start()"
    )
    with killed_hard(setup, "cp.pids", tmp_path, timeout=60) as pids:
        assert len(pids) == 4  # kwok too
        assert all(running(p) for p in pids)
    eventually(
        lambda: not any(running(p) for p in pids),
        timeout=30,
        what="no control-plane process outliving its owner",
    )
