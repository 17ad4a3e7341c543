"""Build the test control plane and its tools from Go modules.

The control plane is kube-apiserver, kube-controller-manager, kubectl and etcd; the
tools are Prometheus, helm and kwok (fake nodes whose Pods become Running and Ready).

There is no Docker engine and no download site for prebuilt Kubernetes binaries on the
machines tinct is developed on, so the binaries are built with the ordinary ``go``
command from the published modules:

* ``kube/`` is a wrapper module requiring ``k8s.io/kubernetes``.  That module requires
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
  ``TOOLS``).

Binaries land in ``$TINCT_CACHE_DIR`` (default ``~/.cache/tinct``) under
``controlplane/<versions>-<key>/bin``, ``keda/<version>-<key>/bin`` and, for each tool,
``<tool>/<version>-<key>/bin``.
Each component's key hashes what it is built from (its wrapper modules' files or its
module version, the build recipe and the Go version), so changing one component does not
rebuild the others, and a second build with the same inputs is a no-op.  A lock per component makes concurrent test runs wait for one build.

Usage::

    python tests/controlplane/build.py            # build (or reuse) all, print the bin dirs
    python tests/controlplane/build.py generate --kube v1.37.2 --etcd v3.7.3
    python tests/controlplane/build.py generate-keda --version v2.21.0
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
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
KUBE_MODULE = HERE / "kube"
ETCD_MODULE = HERE / "etcd"
KEDA_MODULE = HERE / "keda"
KEDA = "github.com/kedacore/keda/v2"
#: KEDA's mains (the wrapper's ``tool`` packages) and the names their binaries get.
KEDA_MAINS = {"keda-operator": f"{KEDA}/cmd/operator", "keda-adapter": f"{KEDA}/cmd/adapter"}
BINARIES = ("kube-apiserver", "kube-controller-manager", "kubectl", "etcd")
# How the control plane is built (see ensure_built); part of its cache key.
CONTROLPLANE_RECIPE = (
    "kube: go build -trimpath -ldflags '-s -w' + hack/lib/version.sh -X values ./cmd/...; "
    "etcd: go build -trimpath -ldflags '-s -w' .; CGO_ENABLED=0"
)

# How KEDA is built (see ensure_keda); part of its cache key. The -X values are the ones
# KEDA's Makefile sets (version without the "v", as its release workflow passes it).
KEDA_RECIPE = "go build -trimpath -ldflags '-s -w -X version.Version=<release> -X version.GitCommit=' <main>; CGO_ENABLED=0"

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
    (KUBE_MODULE / "go.mod").write_text(
        "// Generated by tests/controlplane/build.py generate; do not edit by hand.\n"
        "module tinct.io/testenv/kube\n\n"
        "go 1.26.0\n\n"
        f"require k8s.io/kubernetes {kube}\n\n"
        f"// k8s.io/kubernetes requires its staging modules at v0.0.0; map each to its release.\n"
        f"replace (\n{replaces}\n)\n"
    )
    (ETCD_MODULE / "go.mod").write_text(
        "// Generated by tests/controlplane/build.py generate; do not edit by hand.\n"
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
        "// Generated by tests/controlplane/build.py generate-keda; do not edit by hand.\n"
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


def build_key() -> str:
    """Hash of everything the control-plane binaries are built from."""
    return _module_key(KUBE_MODULE, ETCD_MODULE, recipe=CONTROLPLANE_RECIPE)


def _module_key(*modules: Path, recipe: str) -> str:
    h = hashlib.sha256()
    h.update(_go_version().encode())
    h.update(recipe.encode())
    for module in modules:
        for f in sorted(p for p in module.rglob("*") if p.is_file()):
            h.update(f"{module.name}/{f.relative_to(module)}".encode())
            h.update(f.read_bytes())
    return h.hexdigest()[:16]


def keda_key() -> str:
    """Hash of everything the KEDA binaries are built from."""
    return _module_key(KEDA_MODULE, recipe=KEDA_RECIPE)


def keda_bin_dir() -> Path:
    return cache_root() / "keda" / f"{keda_version()}-{keda_key()}" / "bin"


def bin_dir() -> Path:
    return cache_root() / "controlplane" / f"{kube_version()}-{etcd_version()}-{build_key()}" / "bin"


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
    target: Path, names: tuple[str, ...], what: str, verbose: bool, build: dict[str, str]
) -> Path:
    """Run ``build[...]`` steps into a staging dir and move it to ``target`` when all succeed."""
    if all((target / b).is_file() for b in names):
        return target
    if shutil.which("go") is None:
        raise RuntimeError(f"building {what} for the tests needs the go command on PATH")
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
                {**{k: v for k, v in build.items() if k != "kind"}, "go": _go_version(), "seconds": seconds}
            )
        )
        shutil.rmtree(target, ignore_errors=True)
        staging.rename(target)
        _prune(keep=target.parent)
        if verbose:
            print(f"built {what} in {seconds:.0f}s", file=sys.stderr)
    return target


def _build_controlplane(staging: Path, build: dict[str, str]) -> None:
    _go(
        "build",
        "-trimpath",
        "-ldflags",
        _ldflags(build["kube"]),
        "-o",
        str(staging) + "/",
        "./cmd/...",
        cwd=KUBE_MODULE,
    )
    _go("build", "-trimpath", "-ldflags", "-s -w", "-o", str(staging / "etcd"), ".", cwd=ETCD_MODULE)


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

    def key(self) -> str:
        h = hashlib.sha256()
        h.update(_go_version().encode())
        h.update(repr(self).encode())
        return h.hexdigest()[:16]

    def bin_dir(self) -> Path:
        return cache_root() / self.name / f"{self.version}-{self.key()}" / "bin"


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


def _build_tool(staging: Path, build: dict[str, str]) -> None:
    tool = TOOLS[build["tool"]]
    args = ["install", "-trimpath", "-ldflags", " ".join(tool.ldflags)]
    if tool.tags:
        args += ["-tags", ",".join(tool.tags)]
    with tempfile.TemporaryDirectory() as outside_any_module:
        _go(
            *args,
            f"{tool.package}@{tool.version}",
            cwd=Path(outside_any_module),
            goflags="-buildvcs=false",
            GOBIN=str(staging),
            GOWORK="off",
        )


_BUILDERS = {"controlplane": _build_controlplane, "keda": _build_keda, "tool": _build_tool}


def ensure_tool(name: str, verbose: bool = True) -> Path:
    """Return the path of tool ``name`` (a key of ``TOOLS``), building it when needed."""
    tool = TOOLS[name]
    target = _build_into(
        tool.bin_dir(),
        (tool.name,),
        f"{tool.name} {tool.version}",
        verbose,
        {"kind": "tool", "tool": tool.name, "package": tool.package, "version": tool.version},
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
    args = parser.parse_args(argv)
    if args.cmd == "generate":
        generate(args.kube or kube_version(), args.etcd or etcd_version())
    elif args.cmd == "generate-keda":
        generate_keda(args.version or keda_version())
    elif args.cmd == "key":
        print(f"controlplane {build_key()}")
        print(f"keda {keda_key()}")
        for tool in TOOLS.values():
            print(f"{tool.name} {tool.key()}")
    else:
        print(ensure_built())
        for name in TOOLS:
            print(ensure_tool(name).parent)
        print(ensure_keda())
    return 0


if __name__ == "__main__":
    sys.exit(main())
