"""The control-plane build: staging replaces, per-component cache keys, overrides, one build at a time."""

from __future__ import annotations

import dataclasses
import json
import re
import subprocess
import threading
import time
from pathlib import Path

import pytest

from tinct_testing.controlplane import build


def test_every_staging_module_is_replaced_with_its_release() -> None:
    kube = build.kube_version()
    gomodcache = subprocess.run(["go", "env", "GOMODCACHE"], check=True, capture_output=True, text=True)
    upstream = Path(gomodcache.stdout.strip()) / "cache/download/k8s.io/kubernetes/@v" / f"{kube}.mod"
    if not upstream.exists():
        subprocess.run(
            ["go", "mod", "download", f"k8s.io/kubernetes@{kube}"], cwd=build.KUBE_MODULE, check=True
        )
    staging = set(build._STAGING_RE.findall(upstream.read_text()))
    assert len(staging) > 20
    ours = (build.KUBE_MODULE / "go.mod").read_text()
    release = "v0." + ".".join(kube.split(".")[1:])
    replaced = dict(re.findall(r"^\t(k8s\.io/\S+) => k8s\.io/\S+ (v\S+)$", ours, re.M))
    assert set(replaced) == staging
    assert set(replaced.values()) == {release}


def test_cache_key_changes_with_inputs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    key = build.build_key()
    assert key == build.build_key()
    module = _copy_kube_module(tmp_path, monkeypatch)
    same_files = build.build_key()
    (module / "cmd" / "kubectl" / "main.go").write_text("package main\n")
    assert build.build_key() != same_files


def test_kubebuilder_assets_override(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KUBEBUILDER_ASSETS", str(tmp_path))
    with pytest.raises(RuntimeError, match="lacks kube-apiserver, etcd"):
        build.ensure_built()
    for name in ("kube-apiserver", "etcd"):
        (tmp_path / name).write_text("")
    assert build.ensure_built() == tmp_path


def test_cache_dir_follows_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TINCT_CACHE_DIR", str(tmp_path))
    assert build.bin_dir().is_relative_to(tmp_path / "controlplane")
    assert build.kube_version() in build.bin_dir().parent.name


def test_each_component_has_its_own_cache_key(monkeypatch: pytest.MonkeyPatch) -> None:
    controlplane, helm = build.build_key(), build.TOOLS["helm"].key()
    prometheus = build.TOOLS["prometheus"]
    monkeypatch.setitem(build.TOOLS, "prometheus", dataclasses.replace(prometheus, version="v0.316.1"))
    assert build.TOOLS["prometheus"].key() != prometheus.key()
    assert build.TOOLS["prometheus"].bin_dir().parent.name.startswith("v0.316.1-")
    assert build.build_key() == controlplane
    assert build.TOOLS["helm"].key() == helm
    # Build tags are an input too.
    assert dataclasses.replace(prometheus, tags=()).key() != prometheus.key()


def test_prometheus_release_from_its_module_version() -> None:
    assert build._prometheus_release("v0.316.0") == "3.16.0"
    assert build._prometheus_release("v0.305.2") == "3.5.2"
    with pytest.raises(ValueError, match=r"not a Prometheus 3\.x module version"):
        build._prometheus_release("v2.53.0")


def test_concurrent_builds_of_one_component_build_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[str] = []

    def slow_build(staging: Path, spec: dict[str, str]) -> None:
        calls.append(spec["tool"])
        time.sleep(0.5)  # a build long enough for the other thread to ask meanwhile
        (staging / "fake").write_text("binary")

    monkeypatch.setitem(build._BUILDERS, "fake", slow_build)
    target = tmp_path / "fake" / "v1-key" / "bin"
    spec = {"kind": "fake", "tool": "fake"}
    results: list[Path] = []
    threads = [
        threading.Thread(
            target=lambda: results.append(build._build_into(target, ("fake",), "fake", False, spec))
        )
        for _ in range(2)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert calls == ["fake"]
    assert results == [target, target]
    assert (target / "fake").read_text() == "binary"
    assert json.loads((target / "BUILD.json").read_text())["tool"] == "fake"


def _copy_kube_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    module = tmp_path / "kube"
    for f in build.KUBE_MODULE.rglob("*"):
        if f.is_file():
            target = module / f.relative_to(build.KUBE_MODULE)
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(f.read_bytes())
    monkeypatch.setattr(build, "KUBE_MODULE", module)
    return module


def test_node_and_control_plane_keys_hash_only_their_own_mains(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    module = _copy_kube_module(tmp_path, monkeypatch)
    controlplane, node = build.build_key(), build.node_key()
    assert controlplane != node
    commands = dict(build.COMPONENT_COMMANDS)
    monkeypatch.setattr(build, "COMPONENT_COMMANDS", commands)
    commands["kubelet"] = "NewKubeletCommand(context.TODO())"
    assert build.node_key() != node
    assert build.build_key() == controlplane, "a node main does not rebuild the control plane"
    commands["kube-apiserver"] = "NewAPIServerCommand(nil)"
    assert build.build_key() != controlplane
    # kubectl's main is a file of the module's.
    controlplane = build.build_key()
    (module / "cmd" / "kubectl" / "main.go").write_text("package main\n")
    assert build.build_key() != controlplane
    # Both are built from the module's go.mod and go.sum.
    node, controlplane = build.node_key(), build.build_key()
    (module / "go.sum").write_text((module / "go.sum").read_text() + "\n")
    assert build.node_key() != node
    assert build.build_key() != controlplane


def test_every_main_of_the_kube_module_is_built_by_one_component() -> None:
    files = {d.name for d in (build.KUBE_MODULE / "cmd").iterdir() if d.is_dir()}
    assert not files & set(build.COMPONENT_COMMANDS), "a main is a file or written, not both"
    assert files | set(build.COMPONENT_COMMANDS) == set(build.CONTROLPLANE_MAINS) | set(build.NODE_MAINS)
    assert not set(build.CONTROLPLANE_MAINS) & set(build.NODE_MAINS)


def test_a_component_main_runs_its_own_command() -> None:
    kubelet = build.component_main("kubelet")
    assert kubelet.startswith(
        "// kubelet built from the published k8s.io/kubernetes module, for tinct's end-to-end node.\n"
    )
    assert '"k8s.io/kubernetes/cmd/kubelet/app"' in kubelet
    assert "\tos.Exit(cli.Run(app.NewKubeletCommand(context.Background())))\n" in kubelet
    assert '\t"context"\n' in kubelet
    apiserver = build.component_main("kube-apiserver")
    assert "for tinct's tests." in apiserver
    assert '"context"' not in apiserver


def test_a_tool_set_installs_several_mains_of_one_module_under_one_key() -> None:
    containerd = build.NODE_TOOLS["containerd"]
    assert containerd.binaries == ("containerd", "ctr", "containerd-shim-runc-v2")
    assert {p.rsplit("/cmd/", 1)[0] for p in containerd.packages} == {"github.com/containerd/containerd/v2"}
    assert dataclasses.replace(containerd, more=containerd.more[:1]).key() != containerd.key()
    # The node's tools never join the ones every bootstrap builds.
    assert not set(build.NODE_TOOLS) & set(build.TOOLS)
    assert build.TOOLS["helm"].binaries == ("helm",)


def test_keda_wrapper_carries_every_replace_and_exclude_of_its_module() -> None:
    version = build.keda_version()
    info = subprocess.run(
        ["go", "mod", "download", "-json", f"{build.KEDA}@{version}"],
        cwd=build.KEDA_MODULE,
        check=True,
        capture_output=True,
        text=True,
    )
    upstream = Path(json.loads(info.stdout)["GoMod"]).read_text()
    ours = (build.KEDA_MODULE / "go.mod").read_text()
    for verb in ("replace", "exclude"):
        theirs = build._directives(upstream, verb)
        assert theirs, f"KEDA {version} has no {verb} any more: drop it from generate_keda's notes"
        assert build._directives(ours, verb) == theirs
    assert set(re.findall(r"^\t(github\.com/kedacore/keda/v2/cmd/\S+)$", ours, re.M)) == set(
        build.KEDA_MAINS.values()
    )


def test_directives_read_single_lines_and_blocks() -> None:
    gomod = (
        "module m\n\nreplace a v1 => b v2 // why\n\nreplace (\n\tc v1 => d v2\n\te => ../e\n)\n"
        "exclude x v1.0.0\n"
    )
    assert build._directives(gomod, "replace") == ["c v1 => d v2", "e => ../e", "a v1 => b v2"]
    assert build._directives(gomod, "exclude") == ["x v1.0.0"]


def test_keda_has_its_own_cache_key(monkeypatch: pytest.MonkeyPatch) -> None:
    keda, controlplane = build.keda_key(), build.build_key()
    monkeypatch.setattr(build, "KEDA_RECIPE", build.KEDA_RECIPE + " -tags x")
    assert build.keda_key() != keda
    assert build.build_key() == controlplane
    assert build.keda_bin_dir().parent.name.startswith(f"{build.keda_version()}-")
