"""Build the test control plane, its tools and the end-to-end node from Go modules.

The control plane is kube-apiserver, kube-controller-manager, kubectl and etcd; the
tools are Prometheus, helm and kwok (fake nodes whose Pods become Running and Ready).
The node (``node.py``, built only when a test asks for one) is kubelet, kube-proxy and
kube-scheduler from the same wrapper module, containerd with ctr and its runc shim,
CoreDNS, metrics-server, and the sandbox's ``pause`` from its own small module.

There is no Docker engine and no download site for prebuilt Kubernetes binaries on the
machines tinct is developed on, so the binaries are built with the ordinary ``go``
command from the published modules:

* ``kube/`` is a wrapper module requiring ``k8s.io/kubernetes``.  Its mains are kubectl's
  (``kube/cmd/kubectl``) and, written at build time from ``COMPONENT_COMMANDS`` into a copy of
  the module, one per component that only runs its cobra command.  That module requires
  every staging module (``k8s.io/api``, ``k8s.io/client-go``, ...) at ``v0.0.0`` and
  points them at ``./staging`` with ``replace`` directives, which only apply inside its
  own repository.  ``generate`` reads the module's own go.mod and writes one ``replace``
  per staging module to the published ``v0.<minor>.<patch>`` release.
* ``etcd/`` is a wrapper module requiring ``go.etcd.io/etcd/server/v3``.
* ``keda/`` is a wrapper module requiring ``github.com/kedacore/keda/v2``, whose go.mod
  has a ``replace`` and an ``exclude`` that only apply inside its own repository, so
  ``go install ...@version`` refuses it.  ``generate-keda`` copies both into the wrapper,
  which names KEDA's operator and metrics API server mains as its ``tool`` packages; they
  are built from there as published (see ``ensure_keda``).  Its Kubernetes modules are KEDA's own
  (v0.36.x), independent of the control plane's.
* Prometheus, helm and kwok are single mains whose modules have no ``replace``
  directives, so they are built with ``go install <module>/cmd/<name>@<version>`` (see
  ``TOOLS``); so are the node's containerd, CoreDNS and metrics-server (``NODE_TOOLS``).
* ``pause/`` is the node's sandbox process, a module of its own without dependencies.

Binaries land in ``$TINCT_CACHE_DIR`` (default ``~/.cache/tinct``) under
``controlplane/<versions>-<key>/bin``, ``node/<version>-<key>/bin``, ``pause/<key>/bin``,
``keda/<version>-<key>/bin`` and, for each tool, ``<tool>/<version>-<key>/bin``. Each
component's key hashes what it is built from (the files of its mains and its wrapper
module's go.mod/go.sum, or its
module version, the build recipe and the Go version), so changing one component does not
rebuild the others, and a second build with the same inputs is a no-op.  A lock per
component makes concurrent test runs wait for one build.

Usage::

    python -m tinct_testing.controlplane.build            # build (or reuse) all, print the bin dirs
    python -m tinct_testing.controlplane.build node       # the same for the end-to-end node's parts
    python -m tinct_testing.controlplane.build key        # print every component's cache key
    python -m tinct_testing.controlplane.build generate --kube v1.37.2 --etcd v3.7.3
    python -m tinct_testing.controlplane.build generate-keda --version v2.21.0

A component's key hashes its module directory's name, the files' paths relative to it and
their contents, never where the directory lies: moving the package keeps every key.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

HERE = Path(__file__).resolve().parent
KUBE_MODULE = HERE / "kube"
ETCD_MODULE = HERE / "etcd"
PAUSE_MODULE = HERE / "pause"
KEDA_MODULE = HERE / "keda"
KEDA = "github.com/kedacore/keda/v2"
#: KEDA's mains (the wrapper's ``tool`` packages) and the names their binaries get.
KEDA_MAINS = {"keda-operator": f"{KEDA}/cmd/operator", "keda-adapter": f"{KEDA}/cmd/adapter"}
# The mains of the kube wrapper module: the control plane's, and the node's.
CONTROLPLANE_MAINS = ("kube-apiserver", "kube-controller-manager", "kubectl")
NODE_MAINS = ("kubelet", "kube-proxy", "kube-scheduler")
#: The mains that only run a Kubernetes component's cobra command, and that command: their
#: main.go files are written from ``_COMPONENT_MAIN`` (see ``component_main``), not kept.
#: kubectl's main is a file of its own (``kube/cmd/kubectl``).
COMPONENT_COMMANDS = {
    "kube-apiserver": "NewAPIServerCommand()",
    "kube-controller-manager": "NewControllerManagerCommand()",
    "kubelet": "NewKubeletCommand(context.Background())",
    "kube-proxy": "NewProxyCommand()",
    "kube-scheduler": "NewSchedulerCommand()",
}
_COMPONENT_MAIN = """\
// {name} built from the published k8s.io/kubernetes module, for tinct's {purpose}.
package main

import (
{context}\t"os"
\t_ "time/tzdata"

\t"k8s.io/component-base/cli"
\t_ "k8s.io/component-base/logs/json/register"
\t_ "k8s.io/component-base/metrics/prometheus/clientgo"
\t_ "k8s.io/component-base/metrics/prometheus/version"
\t"k8s.io/kubernetes/cmd/{name}/app"
)

func main() {{
\tos.Exit(cli.Run(app.{command}))
}}
"""
BINARIES = (*CONTROLPLANE_MAINS, "etcd")
# How the control plane is built (see ensure_built); part of its cache key.
CONTROLPLANE_RECIPE = (
    "kube: go build -trimpath -ldflags '-s -w' + hack/lib/version.sh -X values "
    "./cmd/{kube-apiserver,kube-controller-manager,kubectl}; "
    "etcd: go build -trimpath -ldflags '-s -w' .; CGO_ENABLED=0"
)
# How the node's kube binaries are built (see ensure_node_built); part of their key.
NODE_RECIPE = (
    "kube: go build -trimpath -ldflags '-s -w' + hack/lib/version.sh -X values "
    "./cmd/{kubelet,kube-proxy,kube-scheduler}; CGO_ENABLED=0"
)
PAUSE_RECIPE = "go build -trimpath -ldflags '-s -w' .; CGO_ENABLED=0"

# How KEDA is built (see ensure_keda); part of its cache key. The -X values are the ones
# KEDA's Makefile sets (version without the "v", as its release workflow passes it).
KEDA_RECIPE = "go build -trimpath -ldflags '-s -w -X version.Version=<release> -X version.GitCommit=' <main>; CGO_ENABLED=0"

#: The first words of a go.mod that ``generate``/``generate-keda`` writes.
_GENERATED = "// Generated by tests/support/tinct_testing/controlplane/build.py"

_STAGING_RE = re.compile(r"^\s*(k8s\.io/[A-Za-z0-9._/-]+)\s+v0\.0\.0\s*$", re.M)


def cache_root() -> Path:
    env = os.environ.get("TINCT_CACHE_DIR")
    if env:
        return Path(env)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "tinct"


def _go(
    *args: str, cwd: Path, capture: bool = False, goflags: str = "-mod=mod -buildvcs=false", **env: str
) -> str:
    proc = subprocess.run(
        ["go", *args],
        cwd=cwd,
        env=dict(os.environ, GOFLAGS=goflags, CGO_ENABLED="0", **env),
        check=True,
        text=True,
        stdout=subprocess.PIPE if capture else None,
    )
    return proc.stdout if capture else ""


def _required_version(module_dir: Path, path: str) -> str:
    text = (module_dir / "go.mod").read_text()
    m = re.search(rf"^\s*(?:require\s+)?{re.escape(path)}\s+(v\S+)", text, re.M)
    if not m:
        raise RuntimeError(f"{module_dir}/go.mod does not require {path}")
    return m.group(1)


def kube_version() -> str:
    return _required_version(KUBE_MODULE, "k8s.io/kubernetes")


def etcd_version() -> str:
    return _required_version(ETCD_MODULE, "go.etcd.io/etcd/server/v3")


def generate(kube: str, etcd: str) -> None:
    """Write the wrapper go.mod files for the given releases and tidy them."""
    m = re.fullmatch(r"v1\.(\d+)\.(\d+)", kube)
    if not m:
        raise SystemExit(f"--kube must look like v1.37.2, got {kube!r}")
    staging_version = f"v0.{m.group(1)}.{m.group(2)}"
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "go.mod").write_text("module probe\n")
        info = json.loads(
            _go("mod", "download", "-json", f"k8s.io/kubernetes@{kube}", cwd=Path(tmp), capture=True)
        )
    staging = sorted(set(_STAGING_RE.findall(Path(info["GoMod"]).read_text())))
    if not staging:
        raise RuntimeError(f"k8s.io/kubernetes@{kube} go.mod lists no v0.0.0 staging modules")
    replaces = "\n".join(f"\t{mod} => {mod} {staging_version}" for mod in staging)
    # The committed go.mod files name build.py's first home (tests/controlplane/) in this
    # header: it is hashed into the cache keys, so it stays until a release bump regenerates it.
    (KUBE_MODULE / "go.mod").write_text(
        f"{_GENERATED} generate; do not edit by hand.\n"
        "module tinct.io/testenv/kube\n\n"
        "go 1.26.0\n\n"
        f"require k8s.io/kubernetes {kube}\n\n"
        f"// k8s.io/kubernetes requires its staging modules at v0.0.0; map each to its release.\n"
        f"replace (\n{replaces}\n)\n"
    )
    (ETCD_MODULE / "go.mod").write_text(
        f"{_GENERATED} generate; do not edit by hand.\n"
        "module tinct.io/testenv/etcd\n\n"
        "go 1.26.0\n\n"
        f"require go.etcd.io/etcd/server/v3 {etcd}\n"
    )
    for module in (KUBE_MODULE, ETCD_MODULE):
        (module / "go.sum").unlink(missing_ok=True)
        _go("mod", "tidy", cwd=module)
    print(f"generated: k8s.io/kubernetes {kube} ({len(staging)} staging modules), etcd {etcd}")


def keda_version() -> str:
    return _required_version(KEDA_MODULE, KEDA)


def _directives(gomod: str, verb: str) -> list[str]:
    """The ``replace`` or ``exclude`` lines of a go.mod, single-line and block forms alike."""
    found: list[str] = []
    for block in re.findall(rf"^{verb}\s*\(\n(.*?)^\)", gomod, re.M | re.S):
        found += [line.split("//")[0].strip() for line in block.splitlines()]
    found += [m.split("//")[0].strip() for m in re.findall(rf"^{verb}\s+([^(\s].*)$", gomod, re.M)]
    return [d for d in found if d]


def generate_keda(version: str) -> None:
    """Write the KEDA wrapper go.mod for ``version``, carrying over its replaces and excludes."""
    if not re.fullmatch(r"v2\.\d+\.\d+", version):
        raise SystemExit(f"--version must look like v2.21.0, got {version!r}")
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "go.mod").write_text("module probe\n")
        info = json.loads(_go("mod", "download", "-json", f"{KEDA}@{version}", cwd=Path(tmp), capture=True))
    upstream = Path(info["GoMod"]).read_text()
    replaces, excludes = _directives(upstream, "replace"), _directives(upstream, "exclude")
    tools = "\n".join(f"\t{pkg}" for pkg in sorted(KEDA_MAINS.values()))
    text = (
        f"{_GENERATED} generate-keda; do not edit by hand.\n"
        "module tinct.io/testenv/keda\n\n"
        "go 1.26.0\n\n"
        f"tool (\n{tools}\n)\n\n"
        f"require {KEDA} {version}\n"
    )
    if replaces:
        text += "\n// Carried over from KEDA's go.mod: a dependency's replace applies only in its own repository.\n"
        text += "replace (\n" + "".join(f"\t{r}\n" for r in replaces) + ")\n"
    if excludes:
        text += "\n// Carried over from KEDA's go.mod, likewise.\n"
        text += "exclude (\n" + "".join(f"\t{e}\n" for e in excludes) + ")\n"
    (KEDA_MODULE / "go.mod").write_text(text)
    (KEDA_MODULE / "go.sum").unlink(missing_ok=True)
    _go("mod", "tidy", cwd=KEDA_MODULE)
    print(f"generated: {KEDA} {version} ({len(replaces)} replace, {len(excludes)} exclude)")


def _go_version() -> str:
    return subprocess.run(
        ["go", "env", "GOVERSION"], check=True, text=True, capture_output=True
    ).stdout.strip()


def component_main(name: str) -> str:
    """The main.go of ``name``, one of ``COMPONENT_COMMANDS``."""
    return _COMPONENT_MAIN.format(
        name=name,
        purpose="tests" if name in CONTROLPLANE_MAINS else "end-to-end node",
        context='\t"context"\n' if "context." in COMPONENT_COMMANDS[name] else "",
        command=COMPONENT_COMMANDS[name],
    )


def _module_sources(module: Path, mains: tuple[str, ...] | None = None) -> list[tuple[PurePosixPath, bytes]]:
    """The files a build of ``module``'s ``mains`` reads (all of them for ``None``), by their
    path relative to it: those on disk, and the mains written from ``COMPONENT_COMMANDS``."""
    files = {
        PurePosixPath(p.relative_to(module).as_posix()): p.read_bytes()
        for p in module.rglob("*")
        if p.is_file()
    }
    if mains is not None:
        dirs = [PurePosixPath("cmd", m) for m in mains]
        files = {
            f: b for f, b in files.items() if len(f.parts) == 1 or any(f.is_relative_to(d) for d in dirs)
        }
        files.update(
            (PurePosixPath("cmd", m, "main.go"), component_main(m).encode())
            for m in mains
            if m in COMPONENT_COMMANDS
        )
    return sorted(files.items())


def _hash_files(h: Any, module: Path, files: list[tuple[PurePosixPath, bytes]]) -> None:
    for rel, data in files:
        h.update(f"{module.name}/{rel}".encode())
        h.update(data)


def build_key() -> str:
    """Hash of everything the control-plane binaries are built from."""
    return _module_key((KUBE_MODULE, CONTROLPLANE_MAINS), (ETCD_MODULE, None), recipe=CONTROLPLANE_RECIPE)


def _module_key(*modules: tuple[Path, tuple[str, ...] | None], recipe: str) -> str:
    """Hash of the Go version, ``recipe`` and each module's files that build its ``mains``."""
    h = hashlib.sha256()
    h.update(_go_version().encode())
    h.update(recipe.encode())
    for module, mains in modules:
        _hash_files(h, module, _module_sources(module, mains))
    return h.hexdigest()[:16]


def node_key() -> str:
    """Hash of everything the node's kubelet, kube-proxy and kube-scheduler are built from."""
    return _module_key((KUBE_MODULE, NODE_MAINS), recipe=NODE_RECIPE)


def pause_key() -> str:
    return _module_key((PAUSE_MODULE, None), recipe=PAUSE_RECIPE)


def keda_key() -> str:
    """Hash of everything the KEDA binaries are built from."""
    return _module_key((KEDA_MODULE, None), recipe=KEDA_RECIPE)


def keda_bin_dir() -> Path:
    return cache_root() / "keda" / f"{keda_version()}-{keda_key()}" / "bin"


def bin_dir() -> Path:
    return cache_root() / "controlplane" / f"{kube_version()}-{etcd_version()}-{build_key()}" / "bin"


def node_bin_dir() -> Path:
    return cache_root() / "node" / f"{kube_version()}-{node_key()}" / "bin"


def pause_bin_dir() -> Path:
    return cache_root() / "pause" / pause_key() / "bin"


def _release_time(module: str, version: str) -> str:
    """The release time the module proxy records, so the same inputs give the same binary."""
    info = json.loads(_go("mod", "download", "-json", f"{module}@{version}", cwd=KUBE_MODULE, capture=True))
    stamp = json.loads(Path(info["Info"]).read_text())["Time"]
    return str(stamp)


def _ldflags(kube: str) -> str:
    """The -X flags hack/lib/version.sh sets, so /version reports the real release."""
    major, minor = re.fullmatch(r"v(\d+)\.(\d+)\.\d+", kube).groups()  # type: ignore[union-attr]
    values = {
        "gitVersion": kube,
        "gitMajor": major,
        "gitMinor": minor,
        # The module zip carries no git metadata; the proxy does not record the commit.
        "gitCommit": "",
        "gitTreeState": "clean",
        "buildDate": _release_time("k8s.io/kubernetes", kube),
    }
    flags = ["-s", "-w"]
    for pkg in ("k8s.io/client-go/pkg/version", "k8s.io/component-base/version"):
        flags += [f"-X '{pkg}.{k}={v}'" for k, v in values.items()]
    return " ".join(flags)


def _prune(keep: Path, newest: int = 3) -> None:
    """Drop all but the ``newest`` cached builds (other checkouts may use a few)."""
    builds = sorted(
        (d for d in keep.parent.iterdir() if d.is_dir() and d != keep),
        key=lambda d: d.stat().st_mtime,
        reverse=True,
    )
    for stale in builds[newest - 1 :]:
        shutil.rmtree(stale, ignore_errors=True)


@contextlib.contextmanager
def _locked(target: Path) -> Iterator[None]:
    """Hold an exclusive lock for building ``target`` (other checkouts share the cache)."""
    target.parent.parent.mkdir(parents=True, exist_ok=True)
    with (target.parent.parent / f".{target.parent.name}.lock").open("w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _build_into(
    target: Path, names: tuple[str, ...], what: str, verbose: bool, build: dict[str, str], needs: str = "go"
) -> Path:
    """Run ``build[...]`` steps into a staging dir and move it to ``target`` when all succeed.

    ``needs`` is the command the build runs, checked first so that its absence says so.
    """
    if all((target / b).is_file() for b in names):
        return target
    if shutil.which(needs) is None:
        raise RuntimeError(f"building {what} for the tests needs the {needs} command on PATH")
    with _locked(target):
        if all((target / b).is_file() for b in names):  # built meanwhile by another process
            return target
        staging = target.parent / f"bin.partial-{os.getpid()}"
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir(parents=True)
        started = time.monotonic()
        if verbose:
            print(f"building {what} into {target}", file=sys.stderr)
        _BUILDERS[build["kind"]](staging, build)
        seconds = round(time.monotonic() - started, 1)
        (staging / "BUILD.json").write_text(
            json.dumps(
                {
                    **{k: v for k, v in build.items() if k != "kind"},
                    **({"go": _go_version()} if needs == "go" else {}),
                    "seconds": seconds,
                }
            )
        )
        shutil.rmtree(target, ignore_errors=True)
        staging.rename(target)
        _prune(keep=target.parent)
        if verbose:
            print(f"built {what} in {seconds:.0f}s", file=sys.stderr)
    return target


def _build_kube_mains(staging: Path, kube: str, mains: tuple[str, ...]) -> None:
    """Build ``mains`` from a copy of the kube wrapper module holding exactly the files their
    key hashes (the component mains written out)."""
    with tempfile.TemporaryDirectory(prefix="tinct-kube-") as tmp:
        module = Path(tmp) / KUBE_MODULE.name
        for rel, data in _module_sources(KUBE_MODULE, mains):
            (module / rel).parent.mkdir(parents=True, exist_ok=True)
            (module / rel).write_bytes(data)
        _go(
            "build",
            "-trimpath",
            "-ldflags",
            _ldflags(kube),
            "-o",
            str(staging) + "/",
            *(f"./cmd/{m}" for m in mains),
            cwd=module,
        )


def _build_controlplane(staging: Path, build: dict[str, str]) -> None:
    _build_kube_mains(staging, build["kube"], CONTROLPLANE_MAINS)
    _go("build", "-trimpath", "-ldflags", "-s -w", "-o", str(staging / "etcd"), ".", cwd=ETCD_MODULE)


def _build_node(staging: Path, build: dict[str, str]) -> None:
    _build_kube_mains(staging, build["kube"], NODE_MAINS)


def _build_pause(staging: Path, build: dict[str, str]) -> None:
    _go("build", "-trimpath", "-ldflags", "-s -w", "-o", str(staging / "pause"), ".", cwd=PAUSE_MODULE)


def ensure_built(verbose: bool = True) -> Path:
    """Return the directory holding the control-plane binaries, building them when needed."""
    override = os.environ.get("KUBEBUILDER_ASSETS")
    if override:
        d = Path(override)
        missing = [b for b in ("kube-apiserver", "etcd") if not (d / b).is_file()]
        if missing:
            raise RuntimeError(f"KUBEBUILDER_ASSETS={d} lacks {', '.join(missing)}")
        return d
    kube, etcd = kube_version(), etcd_version()
    return _build_into(
        bin_dir(),
        BINARIES,
        f"kube-apiserver, kube-controller-manager, kubectl {kube} and etcd {etcd}",
        verbose,
        {"kind": "controlplane", "kube": kube, "etcd": etcd},
    )


def ensure_node_built(verbose: bool = True) -> Path:
    """The directory holding kubelet, kube-proxy and kube-scheduler, built when needed."""
    kube = kube_version()
    return _build_into(
        node_bin_dir(),
        NODE_MAINS,
        f"kubelet, kube-proxy and kube-scheduler {kube}",
        verbose,
        {"kind": "node", "kube": kube},
    )


def ensure_pause(verbose: bool = True) -> Path:
    """The node's sandbox process (``pause/``), built when needed."""
    target = _build_into(pause_bin_dir(), ("pause",), "pause", verbose, {"kind": "pause"})
    return target / "pause"


def _build_keda(staging: Path, build: dict[str, str]) -> None:
    pkg = f"{KEDA}/version"
    ldflags = f"-s -w -X {pkg}.Version={build['version'].removeprefix('v')} -X {pkg}.GitCommit="
    for name, main in KEDA_MAINS.items():
        _go("build", "-trimpath", "-ldflags", ldflags, "-o", str(staging / name), main, cwd=KEDA_MODULE)


def ensure_keda(verbose: bool = True) -> Path:
    """Return the directory holding ``keda-operator`` and ``keda-adapter``, building them when needed."""
    version = keda_version()
    return _build_into(
        keda_bin_dir(),
        tuple(KEDA_MAINS),
        f"KEDA {version} (operator and metrics API server)",
        verbose,
        {"kind": "keda", "version": version},
    )


def keda_source() -> Path:
    """KEDA's module source in the Go module cache (downloaded if missing), e.g. for its CRDs."""
    info = json.loads(
        _go("mod", "download", "-json", f"{KEDA}@{keda_version()}", cwd=KEDA_MODULE, capture=True)
    )
    return Path(info["Dir"])


@dataclass(frozen=True)
class GoTool:
    """A main package installed with ``go install <package>@<version>``."""

    name: str
    package: str
    version: str
    tags: tuple[str, ...] = ()
    ldflags: tuple[str, ...] = ("-s", "-w")

    @property
    def packages(self) -> tuple[str, ...]:
        return (self.package,)

    @property
    def binaries(self) -> tuple[str, ...]:
        """The names ``go install`` gives the binaries (the last element of each package)."""
        return tuple(p.rsplit("/", 1)[-1] for p in self.packages)

    def key(self) -> str:
        h = hashlib.sha256()
        h.update(_go_version().encode())
        h.update(repr(self).encode())
        return h.hexdigest()[:16]

    def bin_dir(self) -> Path:
        return cache_root() / self.name / f"{self.version}-{self.key()}" / "bin"


@dataclass(frozen=True)
class GoToolSet(GoTool):
    """Several mains of one module at one version, installed together (``more``: the others)."""

    more: tuple[str, ...] = ()

    @property
    def packages(self) -> tuple[str, ...]:
        return (self.package, *self.more)


def _prometheus_release(module_version: str) -> str:
    """Prometheus 3.x is published as Go module v0.3MM.P for release 3.MM.P."""
    m = re.fullmatch(r"v0\.(\d)(\d\d)\.(\d+)", module_version)
    if not m:
        raise ValueError(f"not a Prometheus 3.x module version: {module_version}")
    return f"{m.group(1)}.{int(m.group(2))}.{m.group(3)}"


PROMETHEUS_VERSION = "v0.316.0"
HELM_VERSION = "v4.3.1"
KWOK_VERSION = "v0.8.0"
TOOLS = {
    "prometheus": GoTool(
        name="prometheus",
        package="github.com/prometheus/prometheus/cmd/prometheus",
        version=PROMETHEUS_VERSION,
        # Only file and HTTP service discovery: the tests write file_sd targets, and the
        # cloud discoverers (AWS, Azure, GCE, Kubernetes, ...) are most of the build. The
        # web UI assets are not embedded (no builtinassets tag); the HTTP API is complete.
        tags=("remove_all_sd",),
        ldflags=(
            "-s",
            "-w",
            f"-X github.com/prometheus/common/version.Version={_prometheus_release(PROMETHEUS_VERSION)}",
        ),
    ),
    "helm": GoTool(
        name="helm",
        package="helm.sh/helm/v4/cmd/helm",
        version=HELM_VERSION,
        # What helm's Makefile sets; without it `helm version` says only "v4.3".
        ldflags=("-s", "-w", f"-X helm.sh/helm/v4/internal/version.version={HELM_VERSION}"),
    ),
    "kwok": GoTool(
        name="kwok",
        package="sigs.k8s.io/kwok/cmd/kwok",
        version=KWOK_VERSION,
        # The release's source already names its version (pkg/consts.Version), which the
        # fake nodes report as their kubelet version: no -X needed.
    ),
}


CONTAINERD_VERSION = "v2.4.2"
COREDNS_VERSION = "v1.15.0"
METRICS_SERVER_VERSION = "v0.8.0"
# The end-to-end node's parts with modules of their own; built only when a node is asked for.
NODE_TOOLS = {
    "containerd": GoToolSet(
        name="containerd",
        package="github.com/containerd/containerd/v2/cmd/containerd",
        more=(
            "github.com/containerd/containerd/v2/cmd/ctr",
            "github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2",
        ),
        version=CONTAINERD_VERSION,
        # The snapshotters the node does not use and that need cgo or extra libraries.
        tags=("no_btrfs", "no_devmapper", "no_zfs"),
        # What containerd's Makefile sets; the CRI reports it as the runtime version.
        ldflags=(
            "-s",
            "-w",
            f"-X github.com/containerd/containerd/v2/version.Version={CONTAINERD_VERSION}",
        ),
    ),
    # The module's root package is CoreDNS's main, with its default plugin set.
    "coredns": GoTool(name="coredns", package="github.com/coredns/coredns", version=COREDNS_VERSION),
    "metrics-server": GoTool(
        name="metrics-server",
        package="sigs.k8s.io/metrics-server/cmd/metrics-server",
        version=METRICS_SERVER_VERSION,
    ),
}


def _any_tool(name: str) -> GoTool:
    return TOOLS.get(name) or NODE_TOOLS[name]


def _build_tool(staging: Path, build: dict[str, str]) -> None:
    tool = _any_tool(build["tool"])
    args = ["install", "-trimpath", "-ldflags", " ".join(tool.ldflags)]
    if tool.tags:
        args += ["-tags", ",".join(tool.tags)]
    with tempfile.TemporaryDirectory() as outside_any_module:
        _go(
            *args,
            *(f"{p}@{tool.version}" for p in tool.packages),
            cwd=Path(outside_any_module),
            goflags="-buildvcs=false",
            GOBIN=str(staging),
            GOWORK="off",
        )


_BUILDERS: dict[str, Callable[[Path, dict[str, str]], None]] = {
    "controlplane": _build_controlplane,
    "keda": _build_keda,
    "node": _build_node,
    "pause": _build_pause,
    "tool": _build_tool,
}


def ensure_tool(name: str, verbose: bool = True) -> Path:
    """Return the path of tool ``name`` (a key of ``TOOLS`` or ``NODE_TOOLS``), building it when needed.

    A tool of several binaries (``GoToolSet``) puts them all beside the one returned.
    """
    tool = _any_tool(name)
    target = _build_into(
        tool.bin_dir(),
        tool.binaries,
        f"{tool.name} {tool.version}",
        verbose,
        {"kind": "tool", "tool": tool.name, "package": " ".join(tool.packages), "version": tool.version},
    )
    return target / tool.name


def ensure_prometheus(verbose: bool = True) -> Path:
    return ensure_tool("prometheus", verbose)


def ensure_helm(verbose: bool = True) -> Path:
    return ensure_tool("helm", verbose)


def ensure_kwok(verbose: bool = True) -> Path:
    return ensure_tool("kwok", verbose)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="cmd")
    gen = sub.add_parser("generate", help="rewrite the wrapper go.mod files for new releases")
    gen.add_argument("--kube", default=None, help="k8s.io/kubernetes release, e.g. v1.37.2")
    gen.add_argument("--etcd", default=None, help="go.etcd.io/etcd/server/v3 release, e.g. v3.7.3")
    gen_keda = sub.add_parser("generate-keda", help="rewrite the KEDA wrapper go.mod for a new release")
    gen_keda.add_argument("--version", default=None, help="github.com/kedacore/keda/v2 release, e.g. v2.21.0")
    sub.add_parser("key", help="print the cache keys")
    sub.add_parser("node", help="build (or reuse) the end-to-end node's parts, print their bin dirs")
    parser.add_argument(
        "--only",
        default=None,
        help="without a command: build (or reuse) just these, comma-separated, of "
        f"{', '.join(PARTS)} (default: all)",
    )
    args = parser.parse_args(argv)
    if args.cmd == "generate":
        generate(args.kube or kube_version(), args.etcd or etcd_version())
    elif args.cmd == "generate-keda":
        generate_keda(args.version or keda_version())
    elif args.cmd == "key":
        print(f"controlplane {build_key()}")
        print(f"node {node_key()}")
        print(f"pause {pause_key()}")
        print(f"keda {keda_key()}")
        for tool in (*TOOLS.values(), *NODE_TOOLS.values()):
            print(f"{tool.name} {tool.key()}")
    elif args.cmd == "node":
        print(ensure_node_built())
        print(ensure_pause().parent)
        for name in NODE_TOOLS:
            print(ensure_tool(name).parent)
    else:
        wanted = PARTS if args.only is None else tuple(p.strip() for p in args.only.split(",") if p.strip())
        unknown = sorted(set(wanted) - set(PARTS))
        if unknown:
            parser.error(f"--only: no part named {', '.join(unknown)} (parts: {', '.join(PARTS)})")
        for part in PARTS:
            if part in wanted:
                print(_ensure_part(part))
    return 0


#: What ``build`` makes without a command, in this order; ``--only`` picks among them.
PARTS = ("controlplane", *TOOLS, "keda")


def _ensure_part(part: str) -> Path:
    """The bin dir of one of :data:`PARTS`, built when missing."""
    if part == "controlplane":
        return ensure_built()
    if part == "keda":
        return ensure_keda()
    return ensure_tool(part).parent


if __name__ == "__main__":
    sys.exit(main())
