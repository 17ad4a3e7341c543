"""The helm built from its Go module: the release built, templates, and installs into the test cluster."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from tinct_testing.controlplane import build
from tinct_testing.controlplane.harness import Cluster
from tinct_testing.controlplane.helm import Helm


def _chart(tmp_path: Path) -> Path:
    chart = tmp_path / "hello"
    (chart / "templates").mkdir(parents=True)
    (chart / "Chart.yaml").write_text(
        yaml.safe_dump({"apiVersion": "v2", "name": "hello", "version": "0.1.0", "appVersion": "1.0"})
    )
    (chart / "values.yaml").write_text(yaml.safe_dump({"greeting": "hi"}))
    (chart / "templates" / "configmap.yaml").write_text(
        "apiVersion: v1\n"
        "kind: ConfigMap\n"
        "metadata:\n"
        "  name: {{ .Release.Name }}-hello\n"
        "data:\n"
        "  greeting: {{ .Values.greeting | quote }}\n"
    )
    return chart


def test_helm_is_the_release_built(helm: Helm) -> None:
    out = helm("version", "--template", "{{ .Version }}").stdout.strip()
    assert out == build.HELM_VERSION == "v4.3.1"


def test_template_renders_a_chart_with_values(helm: Helm, tmp_path: Path) -> None:
    chart = _chart(tmp_path)
    rendered = helm("template", "demo", str(chart), "--set", "greeting=hello there").stdout
    [doc] = [d for d in yaml.safe_load_all(rendered) if d]
    assert doc["metadata"]["name"] == "demo-hello"
    assert doc["data"] == {"greeting": "hello there"}
    assert "[ERROR]" not in helm("lint", str(chart)).stdout


def test_install_upgrade_uninstall_against_the_test_cluster(
    helm: Helm, cluster: Cluster, namespace: str, tmp_path: Path
) -> None:
    chart = _chart(tmp_path)
    helm("install", "demo", str(chart), "-n", namespace)
    cm = json.loads(cluster.kubectl("get", "configmap", "demo-hello", "-n", namespace, "-o", "json").stdout)
    assert cm["data"] == {"greeting": "hi"}
    assert cm["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "Helm"

    helm("upgrade", "demo", str(chart), "-n", namespace, "--set", "greeting=bye")
    cm = json.loads(cluster.kubectl("get", "configmap", "demo-hello", "-n", namespace, "-o", "json").stdout)
    assert cm["data"] == {"greeting": "bye"}
    [release] = json.loads(helm("list", "-n", namespace, "-o", "json").stdout)
    assert (release["name"], release["revision"]) == ("demo", "2")

    helm("uninstall", "demo", "-n", namespace)
    gone = cluster.kubectl("get", "configmap", "demo-hello", "-n", namespace, check=False)
    assert gone.returncode != 0
    assert "NotFound" in gone.stderr


def test_a_failing_command_reports_helms_message(helm: Helm, tmp_path: Path) -> None:
    failed = helm("template", "x", str(tmp_path / "no-such-chart"), check=False)
    assert failed.returncode != 0
    assert "no-such-chart" in failed.stderr
