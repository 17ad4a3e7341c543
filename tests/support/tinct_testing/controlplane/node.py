"""A real Kubernetes node on this machine, against a control plane of the harness.

``Node(images=[...]).start()`` brings up, in one call: a control plane configured for
Pods (``harness.PodNetwork``), containerd with Debian's runc and CNI plugins, the images
imported into containerd's ``k8s.io`` namespace, a kubelet, kube-proxy (iptables mode),
kube-scheduler, CoreDNS serving ``cluster.local`` behind the ``kube-dns`` Service,
metrics-server behind ``metrics.k8s.io`` (CPU for HorizontalPodAutoscalers), and static
hostPath PersistentVolumes of no StorageClass for PVCs to bind to. ``node.stop()`` tears
it all down and puts the machine back as it was (``hoststate.restore``).

What the machine must give: Linux, root, the Debian packages ``runc``,
``containernetworking-plugins``, ``iptables``, ``buildah`` and ``debootstrap`` (for the
images), and the ``br_netfilter`` module (``scripts/bootstrap.sh`` installs the packages).
:func:`preflight` says what is missing.

One node per machine: its iptables chains, bridge and cgroup have fixed names, so a lock
(:data:`LOCK`) makes a second bring-up wait for the first to end. Its ports are free
ones. When a bring-up finds the record of a node whose process died (``hoststate``), it
undoes that node first. A watchdog process started with the node does the same as soon
as the process that brought the node up dies, however it died.

The binaries and images are built (and cached) by ``build`` and ``images``.
"""

from __future__ import annotations

import argparse
import atexit
import base64
import contextlib
import fcntl
import functools
import json
import os
import shutil
import signal
import ssl
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import yaml

from tinct_testing.controlplane import build, hoststate, images
from tinct_testing.controlplane import nodeconfig as cfg
from tinct_testing.controlplane.harness import ControlPlane, PodNetwork, free_port
from tinct_testing.controlplane.pki import client_cert
from tinct_testing.controlplane.process import ControlPlaneError, Process, Processes, http_ok, wait_ready
from tinct_testing.wait import eventually

RUN_DIR = Path("/run/tinct-node")
LOCK = Path("/run/tinct-node.lock")
RECORD = "host.json"
CNI_PLUGINS = ("bridge", "host-local", "loopback", "portmap")
DEBIAN_PACKAGES = ("runc", "containernetworking-plugins", "iptables", "buildah", "debootstrap")
PV_COUNT = 6
UID = 10001  # the chart's user; see _make_pvs


class NodeError(RuntimeError):
    """The node cannot start here; the message says what to do."""


@dataclass(frozen=True)
class NodeParts:
    """The binaries and the sandbox image a node runs, built from their modules (cached)."""

    kube: Path
    containerd: Path
    coredns: Path
    metrics_server: Path
    pause: images.Image

    @property
    def binaries(self) -> list[Path]:
        return [
            *(self.kube / b for b in build.NODE_MAINS),
            *(self.containerd / b for b in build.NODE_TOOLS["containerd"].binaries),
            self.coredns,
            self.metrics_server,
        ]


def ensure_parts(verbose: bool = True) -> NodeParts:
    return NodeParts(
        kube=build.ensure_node_built(verbose),
        containerd=build.ensure_tool("containerd", verbose).parent,
        coredns=build.ensure_tool("coredns", verbose),
        metrics_server=build.ensure_tool("metrics-server", verbose),
        pause=images.ensure_pause_image(verbose),
    )


def preflight() -> None:
    """Raise :class:`NodeError` naming everything this machine lacks for a node."""
    problems = []
    if sys.platform != "linux":
        problems.append("a node runs on Linux only")
    elif os.geteuid() != 0:
        problems.append("a node needs root (containerd, kubelet, iptables, cgroups, mounts)")
    missing = [c for c in ("runc", "iptables", "ip", "buildah", "debootstrap") if shutil.which(c) is None]
    missing += [f"/usr/lib/cni/{p}" for p in CNI_PLUGINS if not Path("/usr/lib/cni", p).is_file()]
    if missing:
        problems.append(
            f"missing {', '.join(missing)}: run scripts/bootstrap.sh as root, or "
            f"apt-get install {' '.join(DEBIAN_PACKAGES)}"
        )
    if sys.platform == "linux" and not Path("/proc/sys/net/bridge").is_dir():
        problems.append("the br_netfilter kernel module is not loaded (modprobe br_netfilter)")
    if problems:
        raise NodeError("no node on this machine: " + "; ".join(problems))


def node_ip() -> str:
    """This machine's primary IPv4 address: the source of its default route."""
    out = subprocess.run(["ip", "-4", "-j", "route", "get", "1.1.1.1"], capture_output=True, text=True)
    routes = json.loads(out.stdout or "[]") if out.returncode == 0 else []
    if routes and routes[0].get("prefsrc"):
        return str(routes[0]["prefsrc"])
    addrs = json.loads(subprocess.run(["ip", "-4", "-j", "addr"], capture_output=True, text=True).stdout)
    for link in addrs:
        for a in link.get("addr_info", []):
            if a.get("scope") == "global":
                return str(a["local"])
    raise NodeError("this machine has no global IPv4 address for the node")


@contextlib.contextmanager
def machine_lock(timeout: float = 1800.0) -> Iterator[IO[str]]:
    """Hold the one-node-per-machine lock; wait for another node to end, saying so."""
    LOCK.parent.mkdir(parents=True, exist_ok=True)
    fh = LOCK.open("a+")
    said = False

    def acquired() -> bool:
        nonlocal said
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            if not said:
                print(f"another node runs on this machine; waiting for it (lock {LOCK})", file=sys.stderr)
                said = True
            return False
        return True

    try:
        eventually(acquired, timeout=timeout, interval=1, what=f"the lock {LOCK}")
    except AssertionError:
        fh.close()
        raise NodeError(f"another node held {LOCK} for {timeout:.0f}s") from None
    try:
        yield fh
    finally:
        fcntl.flock(fh, fcntl.LOCK_UN)
        fh.close()


def recover(run_dir: Path = RUN_DIR) -> list[str]:
    """Undo a node that did not stop (its record is still there); what was done.

    Call it holding :func:`machine_lock`: a node that runs holds the lock, so a record
    found then is one whose process died without tearing down.
    """
    record = run_dir / RECORD
    if not record.is_file():
        return []
    owner = hoststate.Record.load(record).owner
    done = hoststate.restore(record)
    return [f"cleaned up after a node of process {owner} that did not stop", *done]


class Node(Processes):
    """A control plane for Pods and one real node on this machine; :meth:`start`, :meth:`stop`.

    ``images``: OCI archives to import into containerd (``images.Image``); Pods use them
    by reference (``imagePullPolicy: IfNotPresent`` or ``Never``), as nothing is pulled.
    :attr:`cluster` is the control plane (a ``harness.ControlPlane``).
    """

    name = cfg.NODE_NAME
    start_timeout = 180.0

    def __init__(
        self,
        images: Sequence[images.Image] = (),
        *,
        parts: NodeParts | None = None,
        run_dir: Path = RUN_DIR,
        preapply: Sequence[Path] = (),
        lock_timeout: float = 1800.0,
    ) -> None:
        preflight()
        self.parts = parts or ensure_parts()
        self.images = (self.parts.pause, *images)
        self.run_dir = run_dir
        super().__init__(run_dir, prefix="tinct-node-")
        self.ip = node_ip()
        self.cluster = ControlPlane(
            preapply=preapply,
            with_kwok=False,
            pods=PodNetwork(node_ip=self.ip),
            workdir=run_dir / "controlplane",
        )
        self.ports = cfg.Ports(*(free_port() for _ in range(8)))
        self.containerd_root = build.cache_root() / "node-containerd"
        self.recovered: list[str] = []
        #: Seconds each stage of the last start took.
        self.timings: dict[str, float] = {}
        self._lock: contextlib.ExitStack | None = None
        self._procs: dict[str, Process] = {}
        self._watchdog: subprocess.Popen[bytes] | None = None
        self._started = False
        self._lock_timeout = lock_timeout

    @property
    def watchdog_pid(self) -> int | None:
        return self._watchdog.pid if self._watchdog is not None else None

    # -- lifecycle -------------------------------------------------------------------

    def _processes(self) -> list[Process]:
        return list(self._procs.values())

    def _start(self, deadline: float) -> None:
        t0 = time.monotonic()
        self._lock = contextlib.ExitStack()
        self._lock.enter_context(machine_lock(self._lock_timeout))
        self.recovered = recover(self.run_dir)
        self._started = True
        self.run_dir.mkdir(parents=True, exist_ok=True)
        hoststate.record(
            self.run_dir / RECORD,
            run_dir=self.run_dir,
            cgroup=cfg.CGROUP_ROOT,
            bridge=cfg.BRIDGE,
            binaries=self.parts.binaries,
            mount_roots=[self.containerd_root],
            kube_proxy=self.parts.kube / "kube-proxy",
        )
        self._start_watchdog()
        self._make_cgroups()
        self.timings["prepare"] = round(time.monotonic() - t0, 2)
        # Every process starts from this thread: PR_SET_PDEATHSIG fires when the *thread*
        # that forked a child ends. Waiting on containerd and importing images overlap with
        # the control plane's start in another thread.
        conf = self._containerd_files()
        containerd = self._spawn_containerd(conf)
        runtime = _Background(lambda d: self._prepare_runtime(containerd, d), deadline)
        t = time.monotonic()
        self.cluster.start(timeout=max(10.0, deadline - time.monotonic()))
        self.timings["controlplane"] = round(time.monotonic() - t, 2)
        runtime.join()
        if runtime.result:
            # Containers a dead node left in the (cached) root: the CRI plugin loaded them at
            # start; started again after their removal, it gives the kubelet a clean runtime.
            self._stop_proc("containerd")
            containerd = self._spawn_containerd(conf)
            self._wait_containerd(containerd, deadline)
        self.timings["containerd"] = runtime.seconds
        t = time.monotonic()
        self._start_kube(deadline)
        self.timings["node"] = round(time.monotonic() - t, 2)
        self.timings["total"] = round(time.monotonic() - t0, 2)

    def stop(self) -> None:
        """Stop every process and put the machine back; safe to call twice (the host's
        teardown is the node's own, not :class:`Processes`').

        Each step runs even when one before it failed; the first failure is raised at the
        end. Whatever is left, the watchdog or the next bring-up undoes.
        """
        if self._lock is None:
            return
        errors: list[BaseException] = []

        def attempt(step: Callable[[], object]) -> None:
            try:
                step()
            except Exception as e:
                errors.append(e)

        try:
            if self._started:
                for name in ("metrics-server", "coredns", "kube-scheduler", "kube-proxy", "kubelet"):
                    attempt(functools.partial(self._stop_proc, name))
                if "containerd" in self._procs and self._procs["containerd"].alive():
                    attempt(lambda: hoststate.kill_cgroup(cfg.CGROUP_ROOT))
                    attempt(self._remove_containers)
                attempt(lambda: self._stop_proc("containerd"))
                attempt(self.cluster.stop)
                record = self.run_dir / RECORD
                if record.is_file():
                    attempt(lambda: hoststate.restore(record))
        finally:
            if self._watchdog is not None and self._watchdog.stdin is not None:
                self._watchdog.stdin.close()  # EOF: the watchdog finds nothing left and exits
                with contextlib.suppress(subprocess.TimeoutExpired):
                    self._watchdog.wait(10)
            lock, self._lock = self._lock, None
            lock.close()
            atexit.unregister(self.stop)
        if errors:
            raise errors[0]

    # -- parts -----------------------------------------------------------------------

    def _start_watchdog(self) -> None:
        """A process outside this one's session that undoes the node if this process dies."""
        self._watchdog = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tinct_testing.controlplane.node",
                "watchdog",
                str(self.run_dir),
                str(os.getpid()),
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=(self.run_dir / "watchdog.log").open("ab"),
            start_new_session=True,
        )

    def _make_cgroups(self) -> None:
        """The kubelet's cgroupRoot, in every hierarchy (it must exist before the kubelet starts)."""
        for root in hoststate.cgroup_roots():
            mine = root / cfg.CGROUP_ROOT
            mine.mkdir(exist_ok=True)
            for f in ("cpuset.cpus", "cpuset.mems"):  # v1: an empty cpuset admits no process
                if (root / f).exists() and not (mine / f).read_text().strip():
                    (mine / f).write_text((root / f).read_text())

    def _spawn(self, name: str, argv: list[str]) -> Process:
        proc = Process(argv, self.run_dir / "logs" / f"{name}.log")
        self._procs[name] = proc
        return proc

    def _stop_proc(self, name: str) -> None:
        proc = self._procs.pop(name, None)
        if proc is not None:
            with contextlib.suppress(OSError, subprocess.SubprocessError):
                proc.stop(grace=10)

    @property
    def containerd_socket(self) -> Path:
        return self.run_dir / "containerd" / "containerd.sock"

    def ctr(self, *args: str, check: bool = True, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        """``ctr`` in containerd's ``k8s.io`` namespace (the kubelet's)."""
        argv = [
            str(self.parts.containerd / "ctr"),
            "--address",
            str(self.containerd_socket),
            "-n",
            "k8s.io",
            *args,
        ]
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
        if check and proc.returncode != 0:
            raise NodeError(f"{' '.join(argv)}: {proc.stderr.strip() or proc.stdout.strip()}")
        return proc

    def _containerd_files(self) -> Path:
        """containerd's config and the CNI network; the config's path."""
        (self.run_dir / "logs").mkdir(parents=True, exist_ok=True)
        net = self.run_dir / "cni" / "net.d"
        net.mkdir(parents=True, exist_ok=True)
        (net / "10-tinct.conflist").write_text(cfg.cni_config(self.run_dir))
        self.containerd_root.mkdir(parents=True, exist_ok=True)
        conf = self.run_dir / "containerd.toml"
        conf.write_text(cfg.containerd_config(self.run_dir, self.containerd_root, self.parts.pause.ref))
        return conf

    def _spawn_containerd(self, conf: Path) -> Process:
        return self._spawn("containerd", [str(self.parts.containerd / "containerd"), "--config", str(conf)])

    def _wait_containerd(self, proc: Process, deadline: float) -> None:
        self._wait(
            "containerd", lambda: self.ctr("version", check=False, timeout=10).returncode == 0, proc, deadline
        )

    def _prepare_runtime(self, proc: Process, deadline: float) -> bool:
        """Wait for containerd, clear what a dead node left, import the images; whether
        containerd must start again (it had containers to forget)."""
        self._wait_containerd(proc, deadline)
        stale = self._remove_containers()
        self._import_images()
        return stale

    def _remove_containers(self) -> bool:
        """Remove every container (tasks first) in the k8s.io namespace; whether there were any."""
        ids = self.ctr("containers", "list", "-q").stdout.split()
        if not ids:
            return False
        tasks = self.ctr("tasks", "list", "-q", check=False).stdout.split()
        if tasks:
            self.ctr("tasks", "delete", "--force", *tasks, check=False)
        self.ctr("containers", "delete", *ids, check=False)
        return True

    def _import_images(self) -> None:
        have = set(self.ctr("images", "list", "-q").stdout.split())
        want = {i.ref for i in self.images}
        for image in self.images:
            if image.ref not in have:
                self.ctr("images", "import", "--snapshotter", "overlayfs", str(image.archive), timeout=600)
        # Older builds of the same images: their content goes with them (containerd's GC).
        stale = [r for r in have - want if any(r.startswith(i.repository + ":") for i in self.images)]
        if stale:
            self.ctr("images", "delete", *stale, check=False)
        have = set(self.ctr("images", "list", "-q").stdout.split())
        if not want <= have:
            raise NodeError(f"images not in containerd after the import: {sorted(want - have)}")

    def _kubeconfig(self, name: str, cn: str, org: str | None = None) -> Path:
        pki = self.cluster.pki
        assert pki is not None
        cert, key = client_cert(pki, self.run_dir / "pki", name, cn, org)
        path = self.run_dir / f"{name}.kubeconfig"
        path.write_text(
            yaml.safe_dump(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "clusters": [
                        {
                            "name": "tinct",
                            "cluster": {
                                "server": self.cluster.server,
                                "certificate-authority-data": base64.b64encode(
                                    pki.ca_cert.read_bytes()
                                ).decode(),
                            },
                        }
                    ],
                    "users": [
                        {"name": cn, "user": {"client-certificate": str(cert), "client-key": str(key)}}
                    ],
                    "contexts": [{"name": cn, "context": {"cluster": "tinct", "user": cn}}],
                    "current-context": cn,
                }
            )
        )
        path.chmod(0o600)
        return path

    def _start_kube(self, deadline: float) -> None:
        pki = self.cluster.pki
        assert pki is not None
        run, ports, kube = self.run_dir, self.ports, self.parts.kube
        admin = self.cluster.kubeconfig
        kubelet_conf = run / "kubelet.yaml"
        kubelet_conf.write_text(cfg.dump(cfg.kubelet_config(run, self.ip, ports, pki.ca_cert)))
        proxy_conf = run / "kube-proxy.yaml"
        proxy_conf.write_text(
            cfg.dump(cfg.kube_proxy_config(self._kubeconfig("kube-proxy", "system:kube-proxy"), ports))
        )
        corefile = run / "Corefile"
        corefile.write_text(cfg.corefile(self.ip, ports, admin))
        scheduler_kc = self._kubeconfig("kube-scheduler", "system:kube-scheduler")
        kubelet = self._spawn(
            "kubelet",
            [
                str(kube / "kubelet"),
                f"--config={kubelet_conf}",
                f"--kubeconfig={self._kubeconfig('kubelet', f'system:node:{self.name}', 'system:nodes')}",
                f"--hostname-override={self.name}",
                f"--node-ip={self.ip}",
                f"--root-dir={run / 'kubelet' / 'root'}",
                f"--cert-dir={run / 'kubelet' / 'pki'}",
                "--v=1",
            ],
        )
        proxy = self._spawn("kube-proxy", [str(kube / "kube-proxy"), f"--config={proxy_conf}", "--v=1"])
        scheduler = self._spawn(
            "kube-scheduler",
            [
                str(kube / "kube-scheduler"),
                f"--kubeconfig={scheduler_kc}",
                f"--authentication-kubeconfig={scheduler_kc}",
                f"--authorization-kubeconfig={scheduler_kc}",
                "--bind-address=127.0.0.1",
                f"--secure-port={ports.scheduler}",
                "--leader-elect=false",
                "--v=1",
            ],
        )
        dns = self._spawn("coredns", [str(self.parts.coredns), "-conf", str(corefile)])
        metrics = self._spawn(
            "metrics-server",
            [
                str(self.parts.metrics_server),
                f"--kubeconfig={admin}",
                f"--authentication-kubeconfig={admin}",
                f"--authorization-kubeconfig={admin}",
                f"--bind-address={self.ip}",
                f"--secure-port={ports.metrics_server}",
                f"--cert-dir={run / 'metrics-server'}",
                # The kubelet serves a self-signed certificate on the port its Node reports.
                "--kubelet-insecure-tls",
                "--kubelet-use-node-status-port",
                "--kubelet-preferred-address-types=InternalIP",
                "--metric-resolution=15s",
            ],
        )
        objects = [*cfg.dns_objects(self.ip, ports), *cfg.metrics_objects(self.ip, ports), *self._make_pvs()]
        self.cluster.kubectl(
            "apply", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List", "items": objects})
        )
        self._wait("kubelet", self._node_ready, kubelet, deadline)
        self._wait(
            "kube-proxy", lambda: http_ok(f"http://127.0.0.1:{ports.proxy_healthz}/healthz"), proxy, deadline
        )
        self._wait("coredns", lambda: http_ok(f"http://127.0.0.1:{ports.dns_ready}/ready"), dns, deadline)
        # Its serving certificate is self-signed.
        insecure = ssl._create_unverified_context()
        self._wait(
            "kube-scheduler",
            lambda: http_ok(f"https://127.0.0.1:{ports.scheduler}/healthz", insecure),
            scheduler,
            deadline,
        )
        if not metrics.alive():
            raise ControlPlaneError("metrics-server exited", metrics.log)

    def _make_pvs(self) -> list[dict[str, Any]]:
        """Static PVs for PVCs without a provisioner (the chart's lineage PVC).

        A hostPath volume gets no fsGroup: like a share exported to any user, the
        directories are writable by all (the chart's Pods run as user 10001).
        """
        pvs = []
        for i in range(PV_COUNT):
            path = self.run_dir / "pv" / f"pv-{i}"
            path.mkdir(parents=True, exist_ok=True)
            path.chmod(0o777)
            pvs.append(cfg.persistent_volume(f"tinct-e2e-pv-{i}", path))
        return pvs

    def _node_ready(self) -> bool:
        """Ready, and schedulable: the not-ready taint the Node registers with is lifted."""
        proc = self.cluster.kubectl("get", "node", self.name, "-o", "json", check=False)
        if proc.returncode != 0:
            return False
        node = json.loads(proc.stdout)
        conditions = node.get("status", {}).get("conditions") or []
        taints = node.get("spec", {}).get("taints") or []
        return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions) and not any(
            t.get("key") == "node.kubernetes.io/not-ready" for t in taints
        )

    def _wait(self, what: str, check: Callable[[], bool], proc: Process, deadline: float) -> None:
        self.timings[f"{what}_ready"] = wait_ready(what, check, proc, deadline)

    def log(self, name: str) -> Path:
        """The log file of one of the node's processes (kubelet, containerd, ...)."""
        return self.run_dir / "logs" / f"{name}.log"


class _Background:
    """Run ``fn(deadline)`` in a thread; :meth:`join` re-raises what it raised, :attr:`result`
    is what it returned. It must not start processes (see ``Node._start``)."""

    def __init__(self, fn: Callable[[float], bool], deadline: float) -> None:
        self.seconds = 0.0
        self.result = False
        self._error: BaseException | None = None
        self._started = time.monotonic()

        def run() -> None:
            try:
                self.result = fn(deadline)
            except BaseException as e:
                self._error = e
            self.seconds = round(time.monotonic() - self._started, 2)

        self._thread = threading.Thread(target=run, daemon=True)
        self._thread.start()

    def join(self) -> None:
        self._thread.join()
        if self._error is not None:
            raise self._error


def _watchdog(run_dir: Path, owner: int) -> int:
    """Wait for EOF on stdin (the owner ended), then undo the owner's node if it is still there."""
    with contextlib.suppress(OSError):
        while sys.stdin.buffer.read(4096):
            pass
    record = run_dir / RECORD
    if not record.is_file() or hoststate.Record.load(record).owner != owner:
        return 0
    while hoststate.pid_alive(owner):
        time.sleep(0.2)
    with machine_lock():
        if record.is_file() and hoststate.Record.load(record).owner == owner:
            for line in hoststate.restore(record):
                print(line, file=sys.stderr)
    return 0


PAUSE_POD = "pause"


def run_pause_pod(node: Node, timeout: float = 120.0) -> None:
    """A Pod of the pause image in ``default``: a sandbox, a container, a veth on the bridge."""
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": PAUSE_POD, "namespace": "default"},
        "spec": {
            "containers": [{"name": "pause", "image": node.parts.pause.ref, "imagePullPolicy": "Never"}],
            "terminationGracePeriodSeconds": 1,
        },
    }
    node.cluster.kubectl("apply", "-f", "-", input=json.dumps(pod))
    node.cluster.kubectl("wait", "--for=condition=Ready", f"pod/{PAUSE_POD}", f"--timeout={timeout:.0f}s")


def main(argv: list[str] | None = None) -> int:
    """``python -m tinct_testing.controlplane.node up|clean``: a node by hand, or the cleanup of one."""
    parser = argparse.ArgumentParser(description="the end-to-end node: bring up, hold, tear down")
    sub = parser.add_subparsers(dest="cmd", required=True)
    up = sub.add_parser("up", help="bring a node up and hold it until SIGTERM/SIGINT, printing one JSON line")
    up.add_argument("--image", action="store_true", help="import the tinct image too")
    up.add_argument("--pod", action="store_true", help="run a Pod of the pause image once up")
    up.add_argument("--lock-timeout", type=float, default=1800.0, help="seconds to wait for another node")
    sub.add_parser("clean", help="undo a node left by a process that died")
    wd = sub.add_parser("watchdog")
    wd.add_argument("run_dir", type=Path)
    wd.add_argument("owner", type=int)
    args = parser.parse_args(argv)
    if args.cmd == "watchdog":
        return _watchdog(args.run_dir, args.owner)
    if args.cmd == "clean":
        with machine_lock(timeout=60):
            for line in recover() or ["nothing to clean"]:
                print(line)
        return 0
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    node = Node((images.ensure_image(),) if args.image else (), lock_timeout=args.lock_timeout)
    with node:
        if args.pod:
            run_pause_pod(node)
        ready = {
            "kubeconfig": str(node.cluster.kubeconfig),
            "timings": node.timings,
            "recovered": node.recovered,
            "watchdog": node.watchdog_pid,
        }
        print(json.dumps(ready), flush=True)
        stop.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
