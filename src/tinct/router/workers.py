"""``tinct router --workers N``: N worker processes serving one port, and their parent.

Each worker is a fresh ``tinct router`` process (``subprocess`` re-exec, never ``fork``: no
event loop, thread or open socket of the parent leaks into a worker) that listens on the
proxy port with ``SO_REUSEPORT``, so the kernel spreads new connections over the workers.
Before starting any, the parent binds the port itself (bound, not listening, so it takes no
connections): a port in use fails at once with a clear message, and port 0 becomes one
real port every worker then shares.

Tables: each worker follows the routing tables itself (its own ``--table`` polling or its
own ConfigMap watch). That keeps the workers independent — no table ever crosses a process
boundary, a restarted worker lists the tables afresh — at the cost of N watches of a few
ConfigMaps, which the API server does not notice. Only worker 0 posts Kubernetes Events,
so each is posted once.

Metrics and health: the workers serve ``/metrics``, ``/healthz`` and ``/readyz`` on private
Unix sockets in an owner-only directory; the parent alone listens on ``--metrics-port``.
Its ``/metrics`` reads every worker's and sums them (:mod:`tinct.router.summing`), adding
``tinct_router_worker_requests_total{worker}`` per worker and
``tinct_router_worker_restarts_total``; its ``/readyz`` is 200 only when every worker's
is, and lists the workers' pids.

Lifecycle:

- A worker that dies is restarted at once; one that keeps dying within
  :data:`QUICK_EXIT` seconds of its start waits 0.5 s, then twice as long each time, up to
  10 s. The router is not ready until it is back.
- SIGTERM/SIGINT: the parent's ``/readyz`` turns 503, every worker gets SIGTERM and drains
  as a single router does (``--shutdown-timeout``); a worker still running
  :data:`KILL_AFTER` seconds after that is killed. The parent exits 0 when every worker
  drained cleanly, 1 otherwise. SIGHUP is passed on to every worker.
- Each worker asks the kernel for SIGKILL when its parent dies (``PR_SET_PDEATHSIG``),
  then checks that the parent did not die before it asked: a parent killed outright leaves
  no worker behind. Workers are started from the parent's main thread, as the death signal
  follows the thread that started them.
- Workers inherit the parent's stdout and stderr (one log stream, as in a container) and
  nothing else: stdin is ``/dev/null`` and other descriptors are closed. Each runs in a
  session of its own, so a terminal's Ctrl-C reaches the parent only, which then drains
  them. A worker whose ``/readyz`` does not answer within 1.5 s counts as not ready.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import dataclasses
import json
import logging
import math
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST

from tinct.router.config import RouterConfig
from tinct.router.connection import ServerConnection
from tinct.router.errors import NOT_LOCAL, with_request_id
from tinct.router.request import Request
from tinct.router.server import HttpServer
from tinct.router.summing import Family, MetricsSum, parse, render, sample_sum
from tinct.router.wire import simple_response, text_response

_log = logging.getLogger(__name__)

#: Seconds: a worker dying sooner after its start is restarted after a growing delay.
QUICK_EXIT = 10.0
#: Seconds past the shutdown timeout a worker gets before it is killed.
KILL_AFTER = 5.0
_PR_SET_PDEATHSIG = 1
#: The families the parent adds to the workers' summed metrics: (name as exported, type,
#: help, labels). The docs' metrics reference lists them from here.
WORKER_REQUESTS = (
    "tinct_router_worker_requests_total",
    "counter",
    "Requests answered, by worker process.",
    ("worker",),
)
WORKER_RESTARTS = ("tinct_router_worker_restarts_total", "counter", "Workers started again after dying.", ())
WORKER_FAMILIES = (WORKER_REQUESTS, WORKER_RESTARTS)
_CGROUP = Path("/sys/fs/cgroup")


# --- how many ------------------------------------------------------------------------------


def _cgroup_v2_quota(proc_cgroup: str) -> float | None:
    """Smallest ``cpu.max`` quota (in CPUs) on the path of this process's cgroup v2."""
    rel = next((line[3:] for line in proc_cgroup.splitlines() if line.startswith("0::")), None)
    if rel is None:
        return None
    best: float | None = None
    d = _CGROUP / rel.strip().lstrip("/")
    while True:
        with contextlib.suppress(OSError, ValueError):
            quota, period = (d / "cpu.max").read_text().split()
            if quota != "max":
                cpus = int(quota) / int(period)
                best = cpus if best is None else min(best, cpus)
        if d == _CGROUP or _CGROUP not in d.parents:
            return best
        d = d.parent


def _cgroup_v1_quota() -> float | None:
    with contextlib.suppress(OSError, ValueError):
        quota = int((_CGROUP / "cpu" / "cpu.cfs_quota_us").read_text())
        period = int((_CGROUP / "cpu" / "cpu.cfs_period_us").read_text())
        if quota > 0 and period > 0:
            return quota / period
    return None


def cpu_limit() -> int:
    """CPUs this process may use: the cgroup CPU quota rounded up (a container's CPU limit),
    else the CPUs it may run on (``sched_getaffinity``), else the machine's CPU count."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = os.cpu_count() or 1
    try:
        quota = _cgroup_v2_quota(Path("/proc/self/cgroup").read_text())
    except OSError:
        quota = None
    if quota is None:
        quota = _cgroup_v1_quota()
    if quota is not None:
        cpus = min(cpus, math.ceil(quota))
    return max(1, cpus)


# --- the worker's side ---------------------------------------------------------------------


def config_to_json(config: RouterConfig) -> str:
    """``config`` as JSON, for a worker's command line."""

    def plain(v: Any) -> Any:
        if isinstance(v, Path):
            return str(v)
        if isinstance(v, tuple):
            return [plain(x) for x in v]
        return v

    return json.dumps({f.name: plain(getattr(config, f.name)) for f in dataclasses.fields(config)})


def config_from_json(text: str) -> RouterConfig:
    """The :class:`RouterConfig` :func:`config_to_json` wrote."""
    d: dict[str, Any] = {k: tuple(v) if isinstance(v, list) else v for k, v in json.loads(text).items()}
    d["table_files"] = tuple(Path(p) for p in d["table_files"])
    d["resolve"] = tuple(d.get("resolve") or ())
    for key in ("kubeconfig", "metrics_socket", "comparer_token_file"):
        if d[key] is not None:
            d[key] = Path(d[key])
    return RouterConfig(**d)


def die_with_parent(parent: int) -> bool:
    """Ask for SIGKILL when the parent dies; False if it died already (or is not ``parent``)."""
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
    return os.getppid() == parent


# --- the parent's side ---------------------------------------------------------------------


def _reserve(host: str, port: int) -> socket.socket:
    """Bind (without listening) ``host:port`` with ``SO_REUSEPORT``: the workers' port."""
    family, kind, proto, _, addr = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    s = socket.socket(family, kind, proto)
    try:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        s.bind(addr)
    except OSError:
        s.close()
        raise
    return s


async def _get(path: Path, target: str, timeout: float) -> tuple[int, bytes]:
    """``GET target`` over the Unix socket ``path``: status and body."""

    async def go() -> tuple[int, bytes]:
        reader, writer = await asyncio.open_unix_connection(str(path))
        try:
            writer.write(f"GET {target} HTTP/1.0\r\nHost: worker\r\n\r\n".encode())
            data = await reader.read()
        finally:
            writer.close()
        head, _, body = data.partition(b"\r\n\r\n")
        return int(head.split(b" ", 2)[1]), body

    return await asyncio.wait_for(go(), timeout)


class _Worker:
    def __init__(self, index: int, sock: Path) -> None:
        self.index = index
        self.sock = sock
        self.proc: subprocess.Popen[bytes] | None = None
        self.started = 0.0
        self.quick_exits = 0
        #: Metrics as last read, summed in while a read fails and retired when it dies.
        self.last: dict[str, Family] | None = None


class Supervisor:
    """Starts, watches, restarts and drains the workers; serves the metrics port."""

    def __init__(self, config: RouterConfig, port: int, rundir: Path, log_level: str) -> None:
        self.config = config
        self.port = port
        self.rundir = rundir
        self.log_level = log_level
        self.workers = [_Worker(i, rundir / f"worker-{i}.sock") for i in range(config.workers)]
        self.sums = MetricsSum()
        self.restarts = 0
        self.draining = False
        self._stop = asyncio.Event()

    def _spawn(self, w: _Worker) -> None:
        cfg = dataclasses.replace(
            self.config,
            port=self.port,
            reuse_port=True,
            workers=1,
            metrics_port=None,
            metrics_socket=w.sock,
            post_events=w.index == 0,
        )
        w.sock.unlink(missing_ok=True)
        argv = [sys.executable, "-m", "tinct.cli", "router", "--log-level", self.log_level]
        argv += ["--worker-of", str(os.getpid()), "--worker-config", config_to_json(cfg)]
        # Its own session: a terminal's Ctrl-C reaches the parent alone, which drains the
        # workers in order.
        w.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, close_fds=True, start_new_session=True)
        w.started = asyncio.get_running_loop().time()
        w.last = None
        _log.info("worker %d started: pid %d", w.index, w.proc.pid)

    async def _watch(self) -> None:
        loop = asyncio.get_running_loop()
        due: dict[int, float] = {}
        while not self._stop.is_set():
            now = loop.time()
            for w in self.workers:
                if w.proc is not None and (code := w.proc.poll()) is not None:
                    quick = now - w.started < QUICK_EXIT
                    w.quick_exits = w.quick_exits + 1 if quick else 0
                    delay = 0.0 if not w.quick_exits else min(0.5 * 2 ** (w.quick_exits - 1), 10.0)
                    _log.warning(
                        "worker %d (pid %d) exited with %s; restarting in %.1fs",
                        w.index,
                        w.proc.pid,
                        code,
                        delay,
                    )
                    self.sums.retire(w.last)
                    w.last, w.proc = None, None
                    due[w.index] = now + delay
                elif w.proc is None and now >= due.get(w.index, 0.0):
                    try:
                        self._spawn(w)
                    except OSError as e:  # out of processes or memory: try again later
                        _log.error("worker %d could not be started: %s; retrying in 10s", w.index, e)
                        due[w.index] = now + 10.0
                    else:
                        self.restarts += 1
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), 0.2)

    def _signal(self, sig: int) -> None:
        for w in self.workers:
            if w.proc is not None and w.proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    w.proc.send_signal(sig)

    async def _drain(self) -> int:
        self.draining = True
        self._signal(signal.SIGTERM)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.config.shutdown_timeout + KILL_AFTER
        ok = True
        for w in self.workers:
            if w.proc is None:
                continue
            while w.proc.poll() is None and loop.time() < deadline:
                await asyncio.sleep(0.05)
            if w.proc.poll() is None:
                _log.warning("worker %d (pid %d) did not drain in time; killing it", w.index, w.proc.pid)
                w.proc.kill()
                w.proc.wait()
            ok = ok and w.proc.returncode == 0
        return 0 if ok else 1

    # --- the metrics port ------------------------------------------------------------------

    async def _ask(self, w: _Worker, target: str, timeout: float) -> tuple[int, bytes] | None:
        if w.proc is None or w.proc.poll() is not None:
            return None
        try:
            return await _get(w.sock, target, timeout)
        except (OSError, TimeoutError, ValueError, IndexError):
            return None

    async def _readyz(self) -> tuple[int, Any, bytes]:
        if self.draining:
            return text_response(503, "draining\n")
        answers = await asyncio.gather(*(self._ask(w, "/readyz", 1.5) for w in self.workers))
        lines = []
        for w, a in zip(self.workers, answers, strict=True):
            pid = w.proc.pid if w.proc is not None else "-"
            state = "not running" if a is None else a[1].decode(errors="replace").strip()
            lines.append(f"worker {w.index} pid {pid}: {state}")
        ready = all(a is not None and a[0] == 200 for a in answers)
        head = f"ready: {len(self.workers)} workers" if ready else "not ready"
        return text_response(200 if ready else 503, "\n".join([head, *lines]) + "\n")

    async def _metrics(self) -> tuple[int, Any, bytes]:
        procs = [w.proc for w in self.workers]
        answers = await asyncio.gather(*(self._ask(w, "/metrics", 5.0) for w in self.workers))
        live: list[dict[str, Family]] = []
        per_worker = Family(WORKER_REQUESTS[0].removesuffix("_total"), WORKER_REQUESTS[1], WORKER_REQUESTS[2])
        for w, proc, a in zip(self.workers, procs, answers, strict=True):
            # Only the process asked: one that died meanwhile is retired already.
            if a is not None and a[0] == 200 and w.proc is proc:
                with contextlib.suppress(ValueError):
                    w.last = parse(a[1].decode())
            if w.last is not None:
                live.append(w.last)
                n = sample_sum(w.last, "tinct_router_requests")
                per_worker.samples[(WORKER_REQUESTS[0], (("worker", str(w.index)),))] = n
            elif w.proc is not None and w.proc.poll() is None:
                live.append({})  # running but not read yet: it serves no table we know of
        families = self.sums.total(live)
        families[per_worker.name] = per_worker
        restarts = Family(WORKER_RESTARTS[0].removesuffix("_total"), WORKER_RESTARTS[1], WORKER_RESTARTS[2])
        restarts.samples[(WORKER_RESTARTS[0], ())] = float(self.restarts)
        families[restarts.name] = restarts
        return simple_response(200, render(families.values()), CONTENT_TYPE_LATEST.encode())

    async def handle(self, request: Request, conn: ServerConnection) -> None:
        if request.method not in ("GET", "HEAD"):
            conn.respond(with_request_id(NOT_LOCAL, request.rid))
        elif request.path == "/healthz":
            conn.respond(text_response(200, "ok\n"))
        elif request.path == "/readyz":
            conn.respond(await self._readyz())
        elif request.path == "/metrics":
            conn.respond(await self._metrics())
        else:
            conn.respond(with_request_id(NOT_LOCAL, request.rid))

    async def run(self) -> int:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._stop.set)
        loop.add_signal_handler(signal.SIGHUP, self._signal, signal.SIGHUP)
        assert self.config.metrics_port is not None
        local = HttpServer(self.handle)
        try:
            await local.start(self.config.host, self.config.metrics_port)
        except OSError as e:
            print(
                f"tinct router: cannot listen on {self.config.host}:{self.config.metrics_port} "
                f"(--metrics-port): {e.strerror or e}",
                file=sys.stderr,
            )
            return 1
        for w in self.workers:
            self._spawn(w)
        _log.info(
            "tinct router listening on %s:%d with %d workers, metrics on port %d",
            self.config.host,
            self.port,
            len(self.workers),
            self.config.metrics_port,
        )
        watcher = asyncio.create_task(self._watch(), name="tinct-router-workers")
        try:
            await self._stop.wait()
        finally:
            await watcher
            _log.info("shutting down: draining %d workers", len(self.workers))
            code = await self._drain()
            await local.shutdown(1.0)
        _log.info("router stopped")
        return code


def supervise(config: RouterConfig, log_level: str) -> int:
    """Blocking entry point of ``tinct router --workers N`` (N > 1): the parent process."""
    try:
        reserved = _reserve(config.host, config.port)
    except OSError as e:
        print(
            f"tinct router: cannot listen on {config.host}:{config.port}: {e.strerror or e}", file=sys.stderr
        )
        return 1
    rundir = Path(tempfile.mkdtemp(prefix="tinct-router-"))
    try:
        sup = Supervisor(config, int(reserved.getsockname()[1]), rundir, log_level)
        try:
            import uvloop
        except ImportError:
            return asyncio.run(sup.run())
        return uvloop.run(sup.run())
    finally:
        reserved.close()
        shutil.rmtree(rundir, ignore_errors=True)


__all__ = ["Supervisor", "config_from_json", "config_to_json", "cpu_limit", "die_with_parent", "supervise"]
