"""What the end-to-end node changes on this machine, recorded before and undone after.

A node changes host-wide state no process exit undoes: kubelet sets kernel tunables
(``vm.overcommit_memory``, ``kernel.panic``, ...), the bridge CNI plugin turns on
``ip_forward`` and makes a bridge, NAT chains and veths, kube-proxy fills ``KUBE-*``
chains, kubelet and runc make cgroups in every hierarchy, containerd mounts overlays and
network namespaces, and containerd's shims and the containers outlive the processes that
started them.

:func:`record` writes what must be put back (sysctl values, which well-known paths did
not exist yet, which binaries are the node's) into a JSON file *before* the node starts;
:func:`restore` undoes everything from that file, whether the node was stopped cleanly
or its process was killed. It is idempotent and never touches what the record does not
name or what existed before: another bring-up runs it first when it finds a record left
by a process that died.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from tinct_testing.wait import eventually

# Host-wide sysctls a node may change. kubelet's setupKernelTunables sets the first six;
# the bridge plugin (isGateway) turns on forwarding; the node's kube-proxy config leaves
# the rest alone, but they are kube-proxy's to change, so they are restored too.
SYSCTLS = (
    "vm.overcommit_memory",
    "vm.panic_on_oom",
    "kernel.panic",
    "kernel.panic_on_oops",
    "kernel.keys.root_maxkeys",
    "kernel.keys.root_maxbytes",
    "net.ipv4.ip_forward",
    "net.ipv4.conf.all.forwarding",
    "net.ipv6.conf.all.forwarding",
    "net.ipv4.conf.all.route_localnet",
    "net.bridge.bridge-nf-call-iptables",
    "net.bridge.bridge-nf-call-ip6tables",
    "net.netfilter.nf_conntrack_max",
    "net.netfilter.nf_conntrack_tcp_timeout_established",
    "net.netfilter.nf_conntrack_tcp_timeout_close_wait",
    "net.netfilter.nf_conntrack_udp_timeout",
    "net.netfilter.nf_conntrack_udp_timeout_stream",
)
# Paths outside the node's own directories that kubelet, containerd or the CNI plugins
# create on first use whatever they are configured with; removed only if absent before.
HOST_PATHS = (
    "/var/lib/kubelet",
    "/var/log/containers",
    "/var/log/pods",
    "/var/lib/cni",
    "/etc/cni",
    "/opt/cni",
    "/opt/containerd",
    "/run/containerd",
    "/var/lib/containerd",
    "/etc/kubernetes",
    "/run/nri",
    "/opt/nri",
    "/etc/cdi",
    "/run/cdi",
)
# iptables chains of kube-proxy, kubelet and the CNI plugins.
CHAIN = re.compile(r"^(KUBE-|CNI-)")
TABLES = ("filter", "nat", "mangle", "raw")
CGROUP_FS = Path("/sys/fs/cgroup")


@dataclass
class Record:
    """What :func:`restore` needs, written before the node changes anything."""

    owner: int
    run_dir: str
    sysctls: dict[str, str]
    absent: list[str]
    cgroup: str
    bridge: str
    #: Binaries whose leftover processes are the node's (shims, kubelet, ...).
    binaries: list[str]
    #: Directories whose mounts are the node's (containerd's image root, kept as a cache).
    mount_roots: list[str] = field(default_factory=list)
    kube_proxy: str = ""

    def save(self, path: Path) -> None:
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(asdict(self), indent=1))
        os.replace(tmp, path)

    @classmethod
    def load(cls, path: Path) -> Record:
        return cls(**json.loads(path.read_text()))


def read_sysctl(key: str) -> str | None:
    path = Path("/proc/sys") / key.replace(".", "/")
    try:
        return path.read_text().strip()
    except OSError:
        return None


def write_sysctl(key: str, value: str) -> None:
    (Path("/proc/sys") / key.replace(".", "/")).write_text(value)


def sysctls(keys: Iterable[str] = SYSCTLS) -> dict[str, str]:
    """The current values of ``keys`` that exist here."""
    return {k: v for k in keys if (v := read_sysctl(k)) is not None}


def record(
    path: Path,
    *,
    run_dir: Path,
    cgroup: str,
    bridge: str,
    binaries: Sequence[Path],
    mount_roots: Sequence[Path] = (),
    kube_proxy: Path | None = None,
) -> Record:
    """Write the record of the machine as it is now, before a node starts."""
    rec = Record(
        owner=os.getpid(),
        run_dir=str(run_dir),
        sysctls=sysctls(),
        absent=[p for p in HOST_PATHS if not os.path.lexists(p)],
        cgroup=cgroup,
        bridge=bridge,
        binaries=[str(b) for b in binaries],
        mount_roots=[str(m) for m in mount_roots],
        kube_proxy=str(kube_proxy or ""),
    )
    rec.save(path)
    return rec


# -- undoing ---------------------------------------------------------------------------


def restore(path: Path, log: list[str] | None = None) -> list[str]:
    """Undo everything ``path``'s record names; what was done, one line each.

    Order matters: processes first (they hold mounts and cgroups), then mounts (they hold
    network namespaces), then iptables, links and cgroups, then sysctls (after the last
    process that could set them again), then the directories, the record last.
    """
    done = log if log is not None else []
    rec = Record.load(path)
    run_dir = Path(rec.run_dir)
    killed = kill_binaries(rec.binaries)
    if killed:
        done.append(f"killed {killed} leftover node processes")
    n = kill_cgroup(rec.cgroup)
    if n:
        done.append(f"killed {n} container processes")
    roots = [run_dir, *map(Path, rec.mount_roots), *(Path(p) for p in rec.absent)]
    n = unmount_under(roots)
    if n:
        done.append(f"unmounted {n} mounts")
    if rec.kube_proxy and Path(rec.kube_proxy).is_file():
        subprocess.run(
            [rec.kube_proxy, "--cleanup", "--proxy-mode=iptables"],
            capture_output=True,
            timeout=60,
            check=False,
        )
    n = clean_iptables()
    if n:
        done.append(f"removed {n} iptables rules and chains")
    if delete_link(rec.bridge):
        done.append(f"deleted the bridge {rec.bridge}")
    n = remove_cgroup(rec.cgroup)
    if n:
        done.append(f"removed {n} cgroups")
    changed = restore_sysctls(rec.sysctls)
    if changed:
        done.append("restored " + ", ".join(changed))
    for p in rec.absent:
        if os.path.lexists(p):
            remove_tree(Path(p))
            done.append(f"removed {p}")
    for child in run_dir.iterdir() if run_dir.is_dir() else ():
        if child != path:
            remove_tree(child)
    path.unlink(missing_ok=True)
    with contextlib.suppress(OSError):
        run_dir.rmdir()
    return done


def _exe(pid: int) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/exe")
    except OSError:
        return None


def _pids() -> list[int]:
    return [int(p) for p in os.listdir("/proc") if p.isdigit()]


def kill_binaries(binaries: Sequence[str], grace: float = 5.0) -> int:
    """SIGTERM, then SIGKILL, every process running one of ``binaries``; how many there were."""
    ours = set(binaries)
    found = [p for p in _pids() if p != os.getpid() and _exe(p) in ours]
    for p in found:
        with contextlib.suppress(ProcessLookupError):
            os.kill(p, signal.SIGTERM)
    with contextlib.suppress(AssertionError):  # who is left after the grace gets SIGKILL
        eventually(
            lambda: not any(_exe(p) in ours for p in found),
            timeout=grace,
            interval=0.1,
            what="SIGTERM obeyed",
        )
    for p in found:
        if _exe(p) in ours:
            with contextlib.suppress(ProcessLookupError):
                os.kill(p, signal.SIGKILL)
    return len(found)


def cgroup_roots() -> list[Path]:
    """The root of every cgroup hierarchy: /sys/fs/cgroup itself on a unified (v2) host, else
    each hierarchy mounted below it (v1's, and the unified one of a hybrid host)."""
    if not CGROUP_FS.is_dir():
        return []
    if (CGROUP_FS / "cgroup.procs").exists():
        return [CGROUP_FS]
    return [r for r in sorted(CGROUP_FS.iterdir()) if (r / "cgroup.procs").exists() and not r.is_symlink()]


def cgroup_dirs(name: str) -> list[Path]:
    """``name`` in every cgroup hierarchy."""
    return [r / name for r in cgroup_roots() if (r / name).is_dir() and not (r / name).is_symlink()]


def _subtree(top: Path) -> list[Path]:
    """``top`` and the directories below it, deepest first. Cgroups vanish while they are
    walked (runc removes a container's as it ends): those are skipped, not an error."""
    return [Path(d) for d, _, _ in os.walk(top, topdown=False, onerror=lambda e: None)]


def _cgroup_pids(top: Path) -> set[int]:
    pids: set[int] = set()
    for d in _subtree(top):
        with contextlib.suppress(OSError, ValueError):
            pids |= {int(x) for x in (d / "cgroup.procs").read_text().split()}
    return pids


def kill_cgroup(name: str, timeout: float = 20.0) -> int:
    """SIGKILL every process in cgroup ``name`` and below, in every hierarchy; how many."""
    seen: set[int] = set()

    def emptied() -> bool:
        """Kill whoever is in the cgroup now; whether nobody was."""
        pids = set().union(*(_cgroup_pids(d) for d in cgroup_dirs(name))) - {os.getpid()}
        seen.update(pids)
        for p in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(p, signal.SIGKILL)
        return not pids

    try:
        eventually(emptied, timeout=timeout, interval=0.1, what=f"cgroup {name} empty")
    except AssertionError:
        raise RuntimeError(f"processes in cgroup {name} did not die: {sorted(seen)}") from None
    return len(seen)


def remove_cgroup(name: str) -> int:
    """rmdir cgroup ``name`` and everything below it (deepest first), in every hierarchy."""
    removed = 0
    for top in cgroup_dirs(name):
        for d in _subtree(top):
            removed += _rmdir(d)
    return removed


def _rmdir(d: Path) -> bool:
    """Remove the empty directory ``d``, which may be busy for a moment after its last process
    died; whether it was there to remove."""

    def attempt() -> str:
        try:
            d.rmdir()
        except FileNotFoundError:
            return "gone"
        return "removed"

    done = eventually(attempt, timeout=5, interval=0.1, what=f"{d} removed", ignoring=(OSError,))
    return done == "removed"


def mounts() -> list[str]:
    """Mount points, from /proc/self/mountinfo (escapes decoded)."""
    points = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        point = line.split()[4]
        points.append(re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), point))
    return points


def _under(point: str, roots: Sequence[Path]) -> bool:
    return any(point == str(r) or point.startswith(str(r).rstrip("/") + "/") for r in roots)


_MNT_DETACH = 2


def unmount_under(roots: Sequence[Path]) -> int:
    """Lazily unmount every mount at or below ``roots``, deepest first; how many."""
    libc = ctypes.CDLL(None, use_errno=True)
    n = 0
    for _ in range(10):  # stacked mounts on one point come off one at a time
        points = sorted({p for p in mounts() if _under(p, roots)}, key=len, reverse=True)
        if not points:
            return n
        for p in points:
            if libc.umount2(p.encode(), _MNT_DETACH) == 0:
                n += 1
    left = [p for p in mounts() if _under(p, roots)]
    if left:
        raise RuntimeError(f"could not unmount {left}")
    return n


def remove_tree(path: Path) -> None:
    """``rm -rf path``, refusing while anything is mounted below it (it would be deleted too)."""
    busy = [p for p in mounts() if _under(p, [path])]
    if busy:
        raise RuntimeError(f"not removing {path}: still mounted below it: {busy}")
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink(missing_ok=True)


def _iptables(binary: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([binary, "-w", "5", *args], capture_output=True, text=True, timeout=60, check=False)


def clean_iptables() -> int:
    """Remove every KUBE-* and CNI-* chain, and the jumps to them, in IPv4 and IPv6; how many."""
    n = 0
    for binary in ("iptables", "ip6tables"):
        if shutil.which(binary) is None:
            continue
        for table in TABLES:
            listing = _iptables(binary, "-t", table, "-S")
            if listing.returncode != 0:
                continue
            ours = [
                ln.split()[1]
                for ln in listing.stdout.splitlines()
                if ln.startswith("-N ") and CHAIN.match(ln.split()[1])
            ]
            for ln in listing.stdout.splitlines():
                words = shlex.split(ln)  # -S quotes comments the way a shell would
                if words[:1] == ["-A"] and not CHAIN.match(words[1]) and "-j" in words:
                    target = words[words.index("-j") + 1]
                    if (
                        CHAIN.match(target)
                        and _iptables(binary, "-t", table, "-D", *words[1:]).returncode == 0
                    ):
                        n += 1
            for chain in ours:
                _iptables(binary, "-t", table, "-F", chain)
            for chain in ours:
                if _iptables(binary, "-t", table, "-X", chain).returncode == 0:
                    n += 1
    return n


def delete_link(name: str) -> bool:
    if not Path("/sys/class/net", name).exists():
        return False
    subprocess.run(["ip", "link", "delete", name], capture_output=True, timeout=30, check=False)
    return True


def restore_sysctls(saved: dict[str, str]) -> list[str]:
    """Write back each saved value that differs now; the ``key=value`` pairs written.

    ``ip_forward`` first: writing it resets every interface's forwarding flag, so the
    finer ones come after.
    """
    changed = []
    for key in sorted(saved, key=lambda k: k != "net.ipv4.ip_forward"):
        now = read_sysctl(key)
        if now is not None and now.split() != saved[key].split():
            write_sysctl(key, saved[key])
            changed.append(f"{key}={saved[key]}")
    return changed


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


__all__ = [
    "HOST_PATHS",
    "SYSCTLS",
    "Record",
    "cgroup_dirs",
    "cgroup_roots",
    "clean_iptables",
    "delete_link",
    "kill_binaries",
    "kill_cgroup",
    "mounts",
    "pid_alive",
    "read_sysctl",
    "record",
    "remove_cgroup",
    "remove_tree",
    "restore",
    "restore_sysctls",
    "sysctls",
    "unmount_under",
]
