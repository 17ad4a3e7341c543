"""A local tinct that stays up until stopped: `make dev`.

Starts, on this machine and all on loopback:

- the control plane the tests use (kube-apiserver, etcd, kube-controller-manager, and kwok
  playing the kubelet of one Node), with tinct's CRDs;
- an S3-compatible object store (moto) holding the artifacts of the two ModelVersions of
  ``examples/``, under the very URIs the examples name (``s3://models/llama3-8b/...``);
- two engine emulators (``tinct emulator``: vLLM's API and metric names, no model runs),
  behind the Services ``sched-v1``/``sched-v2`` (port 8000) and Deployments in the ``default``
  namespace, as ``examples/grayrelease.yaml`` names them;
- Prometheus, scraping the router, the operator and both engines every second (each engine's
  series labelled with the ``namespace`` and ``service`` the example selects them by);
- KEDA (its operator and metrics API server), so the example's ``autoscaling.keda`` scales
  each scheduler's Deployment on its engine's queue depth, read from that Prometheus;
- ``tinct operator`` (routing tables in ``tinct-system``, the lineage under ``--dir``);
- ``tinct router --watch``, reaching the Services' DNS names at the engines through
  ``--resolve``, with OpenAI clients sending it a steady mix of dye cells, so analyses have
  requests to judge;
- ``tinct comparer --watch`` (shadow traffic: the pairs routers mirror, compared; the
  ``shadow_pairs`` table beside the others), with a token in ``TINCT_COMPARER_TOKEN`` that
  the env file exports too, scraped by Prometheus;
- a webhook receiver the operator knows as the notifier ``local``: a release whose
  ``spec.notify`` names it has each of its notifications printed here, one line each.

It prints the lines to paste into another shell (``KUBECONFIG`` first), then stays up until
Ctrl-C or SIGTERM, and stops everything it started. ``make demo`` stays the scripted tour.

One at a time per ``--dir``: it holds a lock (``<dir>.lock``, beside the state it would wipe)
while up, and a second one on the same directory, or on a router port something already
listens on, stops at once with one line, touching nothing. ``make dev DEV_ARGS="--dir
/tmp/tinct-dev2 --router-port 8081"`` runs another beside it.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import fcntl
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import yaml

from tinct_testing.controlplane import build
from tinct_testing.controlplane.harness import ControlPlane, free_port
from tinct_testing.controlplane.keda import Keda
from tinct_testing.controlplane.process import http_ok, spawned, wait_ready
from tinct_testing.controlplane.prometheus import Prometheus
from tinct_testing.interface_artifacts import make_version
from tinct_testing.lineage_artifacts import make_checkpoint, moto_process
from tinct_testing.paths import ROOT
from tinct_testing.release_cluster import deployment, service
from tinct_testing.release_traffic import CellTraffic, ask
from tinct_testing.repeat import Repeating

BIN = Path(sys.executable).parent
TINCT = str(BIN / "tinct")
TABLES = "tinct-system"
#: The dye cells the clients send, weighted toward the cell with the largest candidate share,
#: so a window of the example's analysis holds its minRequests candidate requests.
#: The long cell streams (SSE), so every window has tokens for time to first token and between.
MIX = [
    CellTraffic("admin", "high", 1200, stream=True),  # long, admin, high: 5 % to the candidate at 1/4
    CellTraffic("admin", "high", 1200, stream=True),
    CellTraffic("admin", "high", 1200, stream=True),
    CellTraffic("user", "low", 5),  # short, user, low: 0.1 %
    CellTraffic("audit", "low", 300),  # medium, audit, low: the default cell, 1 %
]
S3_ENV = {
    "AWS_ACCESS_KEY_ID": "tinct-dev",
    "AWS_SECRET_ACCESS_KEY": "tinct-dev",
    "AWS_REGION": "us-east-1",
}


#: The token the local comparer takes pairs with (a local stack only: not a secret).
COMPARER_TOKEN = "dev-comparer-token"


def say(msg: str) -> None:
    print(f"==> {msg}", flush=True)


def process(
    argv: list[str], log: Path, env: dict[str, str]
) -> AbstractContextManager[subprocess.Popen[bytes]]:
    return spawned(argv, log, env, append=True, grace=20)


def _watching(command: str, port: int) -> list[str]:
    """``tinct COMMAND`` taking the routing tables of the tables namespace, serving on
    127.0.0.1:``port``."""
    return [TINCT, command, "--watch", "--namespace", TABLES, "--host", "127.0.0.1", "--port", str(port)]


def wait_http(url: str, what: str, proc: subprocess.Popen[bytes], log: Path, timeout: float = 120) -> None:
    wait_ready(what, lambda: http_ok(url), proc, time.monotonic() + timeout, interval=0.3, log=log)


def upload_artifacts(endpoint: str, work: Path) -> None:
    """The files of ``examples/modelversion*.yaml``, at the keys their URIs name."""
    import boto3

    s3 = boto3.client("s3", endpoint_url=endpoint, **_boto_keys())
    for bucket in ("models", "ckpt"):
        s3.create_bucket(Bucket=bucket)
    # 2.0.0 has one more layer than 1.4.0: a breaking change, released as a MAJOR version.
    for version, layers, step in (("1.4.0", 2, 60000), ("2.0.0", 3, 90000)):
        d = work / "artifacts" / version
        for _, path in make_version(d, layers=layers):
            s3.upload_file(str(path), "models", f"llama3-8b/{version}/{path.name}")
        ckpt = make_checkpoint(d / f"step-{step}.pt")
        s3.upload_file(str(ckpt), "ckpt", f"llama3-8b/{ckpt.name}")


def _boto_keys() -> dict[str, str]:
    return {
        "aws_access_key_id": S3_ENV["AWS_ACCESS_KEY_ID"],
        "aws_secret_access_key": S3_ENV["AWS_SECRET_ACCESS_KEY"],
        "region_name": S3_ENV["AWS_REGION"],
    }


class Clients(Repeating):
    """OpenAI-style requests through the router from a few threads, ``rps`` per second in all
    (each thread paced to its share: a slow answer does not lower the rate)."""

    pause = 0.0  # each step paces itself
    join_timeout = 10.0

    def __init__(self, port: int, rps: float, threads: int = 8) -> None:
        self.port, self.rps = port, rps
        self.workers = threads if rps > 0 else 0
        self._due: dict[int, float] = {}

    def step(self, worker: int, i: int) -> None:
        period = self.workers / self.rps
        due = self._due.setdefault(worker, time.monotonic())
        with contextlib.suppress(OSError, Exception):
            ask(self.port, MIX[(i + worker) % len(MIX)], f"dev-{worker}-{i}")
        self._due[worker] = due = max(due + period, time.monotonic() - period)
        self.idle(max(0.0, due - time.monotonic()))


#: The most of a notification the receiver reads.
NOTIFICATION_BYTES = 1 << 20


def notification_line(doc: Mapping[str, Any]) -> str:
    """One printed line of a notification's generic JSON (``tinct operator``'s ``json`` notifier)."""
    where = f"{doc.get('namespace')}/{doc.get('release')}"
    weight = doc.get("candidateWeight")
    at = f"step {doc.get('step')}, candidate {weight:g}%" if isinstance(weight, (int, float)) else "?"
    message = " ".join(str(doc.get("message") or "").split())[:300]
    return f"==> notification: {where} {doc.get('reason')} ({at}): {message}"


@contextlib.contextmanager
def notifications(say_line: Callable[[str], None]) -> Iterator[str]:
    """A webhook receiver on loopback for the block, saying each notification it gets; its URL."""

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(min(max(length, 0), NOTIFICATION_BYTES))
            try:
                doc = json.loads(body)
                line = notification_line(doc) if isinstance(doc, dict) else None
            except ValueError:
                line = None
            say_line(line or f"==> notification that is no JSON object ({len(body)} bytes)")
            self.send_response(200 if line else 400)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, name="notifications", daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/notify"
    finally:
        server.shutdown()
        server.server_close()


def env_file(work: Path, kubeconfig: Path, lineage: Path, router_port: int, kubectl: Path) -> Path:
    path = work / "env"
    path.write_text(
        "# source this file: the local tinct's cluster, lineage and router; kubectl and tinct on PATH\n"
        f"export KUBECONFIG={kubeconfig}\n"
        f"export TINCT_LINEAGE_ROOT={lineage}\n"
        f"export OPENAI_BASE_URL=http://127.0.0.1:{router_port}/v1\n"
        f"export TINCT_COMPARER_TOKEN={COMPARER_TOKEN}\n"
        f"export PATH={kubectl.parent}:{BIN}:$PATH\n"
    )
    return path


def claim(work: Path, router_port: int) -> int | None:
    """The lock of ``work`` (an open descriptor, held while this process lives), or None after
    saying in one line why another local tinct stands in the way (its lock, or the port)."""
    lock = work.parent / f"{work.name}.lock"
    work.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        if exc.errno not in (errno.EWOULDBLOCK, errno.EACCES):
            raise
        holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
        os.close(fd)
        print(
            f"make dev: a local tinct (pid {holder}) is already up on {work}; stop it with Ctrl-C, "
            f'or run another with DEV_ARGS="--dir OTHER_DIR --router-port OTHER_PORT"',
            file=sys.stderr,
        )
        return None
    with socket.socket() as probe:
        # Only a listener stands in the way, not the connections a stopped one left in TIME_WAIT.
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("127.0.0.1", router_port))
        except OSError as exc:
            os.close(fd)
            print(
                f"make dev: port {router_port} on 127.0.0.1 is taken ({exc.strerror}); "
                f'pick another with DEV_ARGS="--router-port PORT"',
                file=sys.stderr,
            )
            return None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return fd


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="make dev", description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--dir", type=Path, default=Path("/tmp/tinct-dev"), help="state and logs (default: %(default)s)"
    )
    p.add_argument("--router-port", type=int, default=8080, help="the router's port (default: %(default)s)")
    p.add_argument(
        "--rps", type=float, default=40.0, help="client requests per second (default: %(default)s)"
    )
    args = p.parse_args(argv)

    work: Path = args.dir.resolve()
    if claim(work, args.router_port) is None:
        return 1
    if work.exists():
        import shutil

        shutil.rmtree(work)
    work.mkdir(parents=True)
    lineage = work / "lineage"
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())

    say("starting the control plane (kube-apiserver, etcd, kube-controller-manager, kwok), with tinct's CRDs")
    with contextlib.ExitStack() as stack:
        cp = stack.enter_context(ControlPlane(workdir=work / "controlplane", preapply=[ROOT / "crds"]))
        kubeconfig = work / "kubeconfig"
        kubeconfig.write_text(cp.kubeconfig.read_text())
        cp.kubectl("create", "namespace", TABLES)

        say("object storage (moto) with the examples' artifacts at s3://models/llama3-8b/ and s3://ckpt/")
        endpoint = stack.enter_context(moto_process(free_port()))
        upload_artifacts(endpoint, work)

        env = dict(os.environ, KUBECONFIG=str(kubeconfig), **S3_ENV)
        env.pop("TINCT_CONTEXT", None)
        say(
            "two engine emulators (tinct emulator, vLLM), Services sched-v1, sched-v2 (port 8000), Deployments"
        )
        engines: dict[str, int] = {}
        for name, model in (("sched-v1", "v1"), ("sched-v2", "v2")):
            port = engines[name] = free_port()
            log = work / f"{name}.log"
            proc = stack.enter_context(
                process(
                    [TINCT, "emulator", "--host", "127.0.0.1", "--port", str(port), "--model", model],
                    log,
                    env,
                )
            )
            wait_http(f"http://127.0.0.1:{port}/healthz", f"the {name} emulator", proc, log)
        objs: list[dict[str, Any]] = [service("sched-v1"), service("sched-v2")]
        objs += [deployment("sched-v1"), deployment("sched-v2")]
        cp.kubectl("apply", "-n", "default", "-f", "-", input=yaml.safe_dump_all(objs))

        router_metrics, operator_metrics, comparer_port = free_port(), free_port(), free_port()
        prom = stack.enter_context(Prometheus(build.ensure_prometheus(), work / "prometheus"))
        prom.set_target_groups(
            [
                ([f"127.0.0.1:{p}" for p in (router_metrics, operator_metrics, comparer_port)], {}),
                *(
                    ([f"127.0.0.1:{port}"], {"namespace": "default", "service": name})
                    for name, port in engines.items()
                ),
            ]
        )

        say("KEDA (operator and metrics API server), scaling on the engines' queues in Prometheus")
        stack.enter_context(Keda(cp, workdir=work / "keda"))

        say("tinct operator, with the notifier local: a webhook receiver printing here")
        receiver = stack.enter_context(notifications(lambda line: print(line, flush=True)))
        op_log = work / "operator.log"
        op = stack.enter_context(
            process(
                [
                    TINCT,
                    "operator",
                    "--table-namespace",
                    TABLES,
                    "--prometheus-url",
                    prom.url,
                    "--lineage-root",
                    str(lineage),
                    "--s3-endpoint",
                    endpoint,
                    "--metrics-port",
                    str(operator_metrics),
                    "--release-tick",
                    "1",
                    "--notifier",
                    f"local=json:{receiver}",
                ],
                op_log,
                env,
            )
        )
        wait_http(f"http://127.0.0.1:{operator_metrics}/metrics", "the operator", op, op_log)

        say(f"tinct comparer on 127.0.0.1:{comparer_port}")
        comparer_log = work / "comparer.log"
        comparer = stack.enter_context(
            process(
                [*_watching("comparer", comparer_port), "--lineage-root", str(lineage)],
                comparer_log,
                {**env, "TINCT_COMPARER_TOKEN": COMPARER_TOKEN},
            )
        )
        wait_http(f"http://127.0.0.1:{comparer_port}/readyz", "the comparer", comparer, comparer_log)

        say(f"tinct router on 127.0.0.1:{args.router_port}")
        resolve: list[str] = []
        for name, port in engines.items():
            resolve += ["--resolve", f"{name}.default.svc.cluster.local:8000=127.0.0.1:{port}"]
        router_log = work / "router.log"
        router = stack.enter_context(
            process(
                [
                    *_watching("router", args.router_port),
                    *("--metrics-port", str(router_metrics), "--workers", "1"),
                    *("--trust-role-from", "127.0.0.1/32", *resolve),
                ],
                router_log,
                env,
            )
        )
        wait_http(f"http://127.0.0.1:{router_metrics}/healthz", "the router", router, router_log)
        stack.enter_context(Clients(args.router_port, args.rps))

        env_path = env_file(work, kubeconfig, lineage, args.router_port, Path(cp.kubectl_path))
        print(
            f"\ntinct is up. In another shell:\n\n"
            f"    export KUBECONFIG={kubeconfig}\n"
            f"    source {env_path}    # also TINCT_LINEAGE_ROOT, OPENAI_BASE_URL, and kubectl and tinct on PATH\n\n"
            f"Prometheus (the Grafana dashboard's queries run there): {prom.url}\n"
            f"Notifications print here: name the notifier in a release, spec.notify: [{{name: local}}].\n"
            f"Logs and state in {work}. Ctrl-C stops everything.",
            flush=True,
        )
        while not stop.wait(1.0):
            for what, proc, log in (
                ("the operator", op, op_log),
                ("the router", router, router_log),
                ("the comparer", comparer, comparer_log),
            ):
                if proc.poll() is not None:
                    print(f"{what} exited with {proc.returncode}; its log: {log}", file=sys.stderr)
                    return 1
        say("stopping")
    print("tinct stopped", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
