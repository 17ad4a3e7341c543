"""Container images for the end-to-end node, built here without a registry or a daemon.

Three images, each an OCI archive that the node imports into containerd:

* ``pause``: the sandbox process (``pause/``, built by ``build.ensure_pause``) alone in an
  image made ``FROM scratch``.
* the Python base: ``debootstrap`` of the Debian release this machine's apt serves, with
  ``python3`` and ``python3-venv``. It carries this machine's apt sources and the extra CA
  certificates the machine trusts (an egress proxy's, typically), so that ``pip`` in the
  Dockerfile's build stage reaches PyPI from here; none of that is in the Dockerfile,
  which keeps its pinned public base for users and takes this one as ``PYTHON_IMAGE``.
* tinct: the project's ``Dockerfile`` built with ``buildah`` on that base.

Images are cached like the binaries (``build._build_into``): under
``$TINCT_CACHE_DIR/image-<name>/<key>/oci/image.tar``, where the key hashes what the
image is made of -- the pause binary; the release, mirror, packages, apt sources and CA
certificates of the base; the Dockerfile, the files it copies (the sources of the wheel
it builds) and the base's key for tinct. buildah keeps its own storage under
``$TINCT_CACHE_DIR/buildah``.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from tinct_testing.controlplane import build
from tinct_testing.paths import ROOT

DOCKERFILE = ROOT / "Dockerfile"
BASE_PACKAGES = ("python3", "python3-venv", "ca-certificates")
# How each image is made; part of its key.
PAUSE_RECIPE = "buildah from scratch; copy /pause; entrypoint [/pause]; push oci-archive"
BASE_RECIPE = (
    "debootstrap --variant=minbase --components=main; machine apt sources + Acquire settings; "
    "extra CAs + update-ca-certificates; /etc/pip.conf cert; apt lists dropped; buildah add; "
    "push oci-archive"
)
IMAGE_RECIPE = "buildah bud --isolation chroot --pull=never --build-arg PYTHON_IMAGE; push oci-archive"
EXTRA_CAS = Path("/usr/local/share/ca-certificates")
APT_SOURCES = (Path("/etc/apt/sources.list"), Path("/etc/apt/sources.list.d"))
APT_CONF = Path("/etc/apt/apt.conf.d")
# Acquire:: settings of the machine's apt worth keeping in the base (proxies, snapshot mirrors).
_APT_SETTING = re.compile(r"^\s*Acquire::(?:https?::Proxy|Check-Valid-Until|Check-Date)\b.*$", re.M)


@dataclass(frozen=True)
class Image:
    """An image as an OCI archive, and the reference it is imported under."""

    ref: str
    archive: Path

    @property
    def repository(self) -> str:
        return self.ref.rsplit(":", 1)[0]

    @property
    def tag(self) -> str:
        return self.ref.rsplit(":", 1)[1]


#: buildah's commands that set up a container's network: each creates the CNI configuration
#: directory (``/etc/cni/net.d`` and a lock in it) unless told another, even with chroot
#: isolation; kept in the cache, so a build never changes the machine a node test compares.
_NETWORK_COMMANDS = frozenset({"from", "bud", "build", "run"})


def buildah(*args: str, input: bytes | None = None) -> str:
    """Run ``buildah`` on the cache's storage; its output, or an error carrying its stderr."""
    store = build.cache_root() / "buildah"
    if args and args[0] in _NETWORK_COMMANDS:
        args = (args[0], "--cni-config-dir", str(store / "cni"), *args[1:])
    argv = ["buildah", "--root", str(store / "root"), "--runroot", str(store / "run"), *args]
    proc = subprocess.run(argv, input=input, capture_output=True, timeout=1800)
    if proc.returncode != 0:
        out = (proc.stdout + proc.stderr).decode(errors="replace")
        raise RuntimeError(f"{' '.join(argv)} failed ({proc.returncode}):\n{out[-4000:]}")
    return proc.stdout.decode()


def _digest(*parts: bytes | str) -> str:
    h = hashlib.sha256()
    for p in parts:
        h.update(p.encode() if isinstance(p, str) else p)
        h.update(b"\0")
    return h.hexdigest()[:16]


def _push(ref: str, staging: Path) -> None:
    buildah("push", "--quiet", ref, f"oci-archive:{staging / 'image.tar'}:{ref}")


def _ensure(name: str, key: str, what: str, spec: dict[str, str], verbose: bool) -> Image:
    """The image ``localhost/<name>:<key>``, built by the ``image-<name>`` builder when not cached."""
    ref = f"localhost/{name}:{key}"
    target = build.cache_root() / f"image-{name}" / key / "oci"
    build._build_into(
        target, ("image.tar",), what, verbose, {"kind": f"image-{name}", "ref": ref, **spec}, needs="buildah"
    )
    return Image(ref, target / "image.tar")


# -- pause ---------------------------------------------------------------------------


def _build_pause(staging: Path, spec: dict[str, str]) -> None:
    ctr = buildah("from", "--quiet", "scratch").strip()
    try:
        buildah("copy", "--chmod", "0755", ctr, spec["binary"], "/pause")
        buildah("config", "--entrypoint", '["/pause"]', "--cmd", "", ctr)
        buildah("commit", "--quiet", ctr, spec["ref"])
    finally:
        buildah("rm", ctr)
    _push(spec["ref"], staging)
    buildah("rmi", spec["ref"])


def ensure_pause_image(verbose: bool = True) -> Image:
    binary = build.ensure_pause(verbose)
    key = _digest(PAUSE_RECIPE, binary.read_bytes())
    return _ensure("pause", key, "the pause image", {"binary": str(binary)}, verbose)


# -- the Python base -------------------------------------------------------------------


def codename() -> str:
    """The Debian release this machine runs (and its apt serves)."""
    text = Path("/etc/os-release").read_text()
    m = re.search(r"^VERSION_CODENAME=\"?([a-z]+)\"?$", text, re.M)
    if not m:
        raise RuntimeError("/etc/os-release names no VERSION_CODENAME: the base image needs a Debian machine")
    return m.group(1)


def _source_files() -> list[Path]:
    files: list[Path] = []
    for p in APT_SOURCES:
        if p.is_file():
            files.append(p)
        elif p.is_dir():
            files += sorted(f for f in p.iterdir() if f.suffix in (".list", ".sources") and f.is_file())
    return files


def _serves(text: str, suite: str) -> str | None:
    """The first URI of a ``deb`` entry of ``text`` (one-line or deb822) serving ``suite``'s main."""
    for line in text.splitlines():
        words = re.sub(r"\[[^]]*\]", "", line.split("#", 1)[0]).split()
        if len(words) >= 4 and words[0] == "deb" and words[2] == suite and "main" in words[3:]:
            return words[1]
    for para in re.split(r"\n\s*\n", text):
        fields: dict[str, str] = dict(re.findall(r"(?m)^([A-Za-z-]+):\s*(.*)$", para))
        if (
            "deb" in fields.get("Types", "").split()
            and suite in fields.get("Suites", "").split()
            and "main" in fields.get("Components", "").split()
            and fields.get("Enabled", "yes") != "no"
        ):
            return fields.get("URIs", "").split()[0]
    return None


def mirror(suite: str) -> tuple[str, list[Path]]:
    """The machine's Debian mirror for ``suite`` and the apt source files that name it."""
    found: str | None = None
    files: list[Path] = []
    for f in _source_files():
        uri = _serves(f.read_text(errors="replace"), suite)
        if uri:
            found = found or uri
            files.append(f)
    if found is None:
        raise RuntimeError(f"no apt source of this machine serves {suite} main: the base image needs one")
    return found, files


def _apt_settings() -> str:
    if not APT_CONF.is_dir():
        return ""
    lines = [
        m.group(0).strip()
        for f in sorted(APT_CONF.iterdir())
        if f.is_file()
        for m in _APT_SETTING.finditer(f.read_text(errors="replace"))
    ]
    return "".join(f"{line}\n" for line in lines)


def _extra_cas() -> list[Path]:
    return sorted(EXTRA_CAS.rglob("*.crt")) if EXTRA_CAS.is_dir() else []


def base_key() -> str:
    suite = codename()
    uri, sources = mirror(suite)
    parts: list[bytes | str] = [BASE_RECIPE, suite, uri, " ".join(BASE_PACKAGES), _apt_settings()]
    for f in (*sources, *_extra_cas()):
        parts += [str(f), f.read_bytes()]
    return _digest(*parts)


def _build_base(staging: Path, spec: dict[str, str]) -> None:
    work = Path(tempfile.mkdtemp(prefix="tinct-base-", dir=staging.parent))
    try:
        rootfs = work / "rootfs"
        _run(
            "debootstrap",
            "--variant=minbase",
            "--components=main",
            f"--include={','.join(BASE_PACKAGES)}",
            spec["suite"],
            str(rootfs),
            spec["mirror"],
        )
        _configure_base(rootfs, spec["suite"])
        layer = work / "rootfs.tar"
        _run("tar", "--numeric-owner", "--xattrs", "-C", str(rootfs), "-cf", str(layer), ".")
        ctr = buildah("from", "--quiet", "scratch").strip()
        try:
            buildah("add", ctr, str(layer), "/")
            buildah(
                "config",
                "--env",
                "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                "--env",
                "LANG=C.UTF-8",
                "--cmd",
                '["python3"]',
                "--os",
                "linux",
                ctr,
            )
            buildah("commit", "--quiet", ctr, spec["ref"])
        finally:
            buildah("rm", ctr)
        _push(spec["ref"], staging)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _configure_base(rootfs: Path, suite: str) -> None:
    """Give the debootstrapped tree this machine's apt sources, Acquire settings and CAs."""
    _, sources = mirror(suite)
    (rootfs / "etc/apt/sources.list").unlink(missing_ok=True)
    for f in sources:
        shutil.copy2(f, rootfs / "etc/apt/sources.list.d" / f.name)
    settings = _apt_settings()
    if settings:
        (rootfs / "etc/apt/apt.conf.d/99machine").write_text(settings)
    cas = _extra_cas()
    for ca in cas:
        dest = rootfs / "usr/local/share/ca-certificates" / ca.relative_to(EXTRA_CAS)
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ca, dest)
    if cas:
        _run("chroot", str(rootfs), "update-ca-certificates", "--fresh")
    # pip in a virtualenv trusts its own bundle unless told: point it at the system's.
    (rootfs / "etc/pip.conf").write_text("[global]\ncert = /etc/ssl/certs/ca-certificates.crt\n")
    for junk in ("var/lib/apt/lists", "var/cache/apt", "var/log"):
        for p in (rootfs / junk).glob("*"):
            if p.is_file() or p.is_symlink():
                p.unlink()
            elif p.is_dir() and p.name != "partial":
                shutil.rmtree(p)


def ensure_base_image(verbose: bool = True) -> Image:
    suite = codename()
    uri, _ = mirror(suite)
    key = base_key()
    return _ensure(
        "python-base",
        key,
        f"the Python base image (debootstrap {suite})",
        {"suite": suite, "mirror": uri},
        verbose,
    )


# -- tinct -----------------------------------------------------------------------------


def copied_sources(dockerfile: Path = DOCKERFILE) -> list[str]:
    """What the Dockerfile copies from the build context (``COPY`` without ``--from``)."""
    found: list[str] = []
    for line in dockerfile.read_text().splitlines():
        words = line.split()
        if words[:1] == ["COPY"] and not any(w.startswith("--from") for w in words):
            found += [w for w in words[1:-1] if not w.startswith("--")]
    return found


def context_files() -> list[Path]:
    """The files of the build context the image is made of (``.dockerignore`` drops caches)."""
    files: list[Path] = []
    for src in copied_sources():
        p = ROOT / src
        candidates = sorted(p.rglob("*")) if p.is_dir() else [p]
        files += [
            f for f in candidates if f.is_file() and "__pycache__" not in f.parts and f.suffix != ".pyc"
        ]
    return files


def image_key(base: Image) -> str:
    parts: list[bytes | str] = [IMAGE_RECIPE, base.ref, DOCKERFILE.read_bytes()]
    ignore = ROOT / ".dockerignore"
    if ignore.is_file():
        parts.append(ignore.read_bytes())
    for f in context_files():
        parts += [str(f.relative_to(ROOT)), f.read_bytes()]
    return _digest(*parts)


def _build_tinct(staging: Path, spec: dict[str, str]) -> None:
    base = Image(spec["base"], Path(spec["base_archive"]))
    if not _present(base.ref):
        buildah("pull", "--quiet", f"oci-archive:{base.archive}")
    buildah(
        "bud",
        "--quiet",
        "--isolation",
        "chroot",
        "--pull=never",
        "--layers=false",
        "--build-arg",
        f"PYTHON_IMAGE={base.ref}",
        "-f",
        str(DOCKERFILE),
        "-t",
        spec["ref"],
        str(ROOT),
    )
    _push(spec["ref"], staging)
    buildah("rmi", spec["ref"])
    # The build stage's image is no use once the final one is in the archive.
    buildah("rmi", "--prune")


def _present(ref: str) -> bool:
    names = buildah("images", "--format", "{{.Name}}:{{.Tag}}").split()
    return ref in names


def ensure_image(verbose: bool = True) -> Image:
    """The tinct image built from the Dockerfile on the local Python base."""
    base = ensure_base_image(verbose)
    key = image_key(base)
    return _ensure(
        "tinct",
        key,
        "the tinct image (Dockerfile, buildah)",
        {"base": base.ref, "base_archive": str(base.archive)},
        verbose,
    )


def _run(*argv: str) -> None:
    proc = subprocess.run(argv, capture_output=True, timeout=1800, env={**os.environ, "LC_ALL": "C"})
    if proc.returncode != 0:
        out = (proc.stdout + proc.stderr).decode(errors="replace")
        raise RuntimeError(f"{' '.join(argv)} failed ({proc.returncode}):\n{out[-4000:]}")


build._BUILDERS.update(
    {"image-pause": _build_pause, "image-python-base": _build_base, "image-tinct": _build_tinct}
)


def main() -> int:
    """``python -m tinct_testing.controlplane.images``: build (or reuse) the images, print them."""
    for image in (ensure_pause_image(), ensure_image()):
        print(image.ref, image.archive)
    return 0


if __name__ == "__main__":
    sys.exit(main())
