"""Benchmark of the GrayRelease controller on a local control plane with a real Prometheus.

Starts kube-apiserver + etcd + kube-controller-manager (the test harness's), Prometheus,
`tinct operator` and `tinct router --watch` as processes, the v1/v2 emulated engines (tinct emulator),
and measures:

- ``operator_cpu_cores`` / ``operator_rss_mb``: the operator process (from /proc) while it
  keeps ``--releases`` GrayReleases of ``--cells`` dye cells each analysed every 10 s
  against Prometheus (four PromQL queries per analysis: success-rate and latency-p95 need no more), over ``--window`` seconds;
- ``table_propagation_p50_ms`` / ``_p99_ms``: from the answer to a routing-table ConfigMap
  write to the router serving that table version (its ``tinct_router_table_version``);
- ``rollback_reaction_s``: a release whose candidate answers 5xx under steady traffic, with
  ``failureLimit: 1`` (and a cooldown shorter than its interval): from the time of the analysis that fails (``status.lastAnalysis.time``)
  to the router serving the rollback table.
- ``adapter_ready_s``, ``adapter_plain_p99_ms``, ``adapter_fallback_p99_ms``: a LoRA adapter
  released on ``--adapter-pods`` emulated vLLM pods (:mod:`tinct_testing.adapter_bench`);
- ``operator_rss_growth_mb_noisy_cluster`` / ``router_rss_growth_mb_noisy_cluster``: how much
  the operator's and the router's RSS grow when ``--noise`` unrelated ConfigMaps of 50 KB are
  created in the namespace of the releases and their tables (targets: under 30 MB each).

Everything listens on 127.0.0.1; everything started here is stopped at the end. The last
line printed is the JSON summary; progress goes to stderr.

Usage: python bench/release.py [--releases N] [--cells N] [--window SECONDS] [--writes N] [--noise N]
                               [--adapter-pods N] [--adapter-only]
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import yaml

from tinct.api.routing import routing_configmap
from tinct_testing.adapter_bench import measure_adapter
from tinct_testing.controlplane import build
from tinct_testing.controlplane.harness import ControlPlane
from tinct_testing.controlplane.process import spawned
from tinct_testing.controlplane.prometheus import Prometheus
from tinct_testing.engines import Engines
from tinct_testing.lineage_artifacts import make_onnx
from tinct_testing.measure import cpu_seconds, status_mb
from tinct_testing.paths import ROOT
from tinct_testing.release_traffic import Background, CellTraffic, Router, router
from tinct_testing.repeat import Repeating
from tinct_testing.router_fakes import free_port, table
from tinct_testing.wait import eventually

NS = "bench"
BUCKETS = [{"name": "short", "maxTokens": 512}, {"name": "medium", "maxTokens": 4096}, {"name": "long"}]
ROLES = ["user", "admin", "audit"]
LATENCIES = ["low", "high", "batch"]


def log(msg: str) -> None:
    print(f"[release-bench] {msg}", file=sys.stderr, flush=True)


def cells(n: int) -> list[dict[str, Any]]:
    """``n - 1`` specific cells (bucket x role x latency) and the default cell."""
    specific = itertools.product([b["name"] for b in BUCKETS], ROLES, LATENCIES)
    out: list[dict[str, Any]] = [
        {"match": {"promptLength": b, "role": r, "latency": lat}, "weights": [1, 2, 5, 10, 20, 50, 100]}
        for b, r, lat in itertools.islice(specific, max(0, n - 1))
    ]
    out.append({"match": {}, "weights": [1, 2, 5, 10, 20, 50, 100]})
    return out


def release(name: str, n_cells: int, v1: str, v2: str, **analysis: Any) -> dict[str, Any]:
    """A release serving the model ``name``, judged by the operator's default Prometheus."""
    return {
        "apiVersion": "tinct.io/v1alpha1",
        "kind": "GrayRelease",
        "metadata": {"name": name, "namespace": NS},
        "spec": {
            "stable": {
                "modelVersion": "m-1-0-0",
                "service": "sched-v1",
                "port": 8000,
                "schedulerVersion": "v1",
                "url": v1,
            },
            "candidate": {
                "modelVersion": "m-1-1-0",
                "service": "sched-v2",
                "port": 8000,
                "schedulerVersion": "v2",
                "url": v2,
            },
            "models": [name],
            "dye": {
                "promptLength": {"buckets": BUCKETS},
                "role": {"values": ROLES, "default": "user"},
                "latency": {"values": LATENCIES, "default": "low"},
            },
            "cells": cells(n_cells),
            "analysis": {
                "interval": "10s",
                "failureLimit": 2,
                "minRequests": 10,
                "inconclusiveLimit": 10000,
                "metrics": [{"name": "success-rate", "min": 99}, {"name": "latency-p95", "maxMs": 800}],
                **analysis,
            },
        },
    }


def releases_status(cp: ControlPlane) -> list[dict[str, Any]]:
    out = cp.kubectl("get", "grayreleases", "-n", NS, "-o", "json").stdout
    items: list[dict[str, Any]] = json.loads(out)["items"]
    return items


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--releases", type=int, default=100)
    ap.add_argument("--cells", type=int, default=27)
    ap.add_argument("--window", type=float, default=60.0, help="seconds the operator's CPU is measured over")
    ap.add_argument("--writes", type=int, default=200, help="routing-table writes timed for propagation")
    ap.add_argument(
        "--noise", type=int, default=5000, help="unrelated 50 KB ConfigMaps for the noisy-cluster RSS"
    )
    ap.add_argument(
        "--adapter-pods", type=int, default=10, help="emulated pods of the adapter release (0: none)"
    )
    ap.add_argument("--adapter-only", action="store_true", help="measure only the adapter release")
    args = ap.parse_args()

    work = Path(tempfile.mkdtemp(prefix="tinct-release-bench-"))
    schedulers = Engines()
    log("starting the control plane and Prometheus")
    with ControlPlane() as cp, Prometheus(build.ensure_prometheus(), work / "prometheus") as prom:
        env = dict(os.environ, KUBECONFIG=str(cp.kubeconfig))
        os.environ["KUBECONFIG"] = str(cp.kubeconfig)
        cp.kubectl("apply", "--server-side", "-f", str(ROOT / "crds"))
        cp.wait_established("crd/grayreleases.tinct.io", "crd/modelversions.tinct.io")
        adapter = measure_adapter(cp, work, log, args.adapter_pods) if args.adapter_pods else {}
        if args.adapter_only:
            print(json.dumps(adapter))
            return 0
        cp.kubectl("create", "namespace", NS)
        onnx = make_onnx(work / "m.onnx")
        objs: list[dict[str, Any]] = [
            {
                "apiVersion": "v1",
                "kind": "Service",
                "metadata": {"name": s},
                "spec": {"ports": [{"port": 8000}]},
            }
            for s in ("sched-v1", "sched-v2")
        ]
        objs += [
            {
                "apiVersion": "tinct.io/v1alpha1",
                "kind": "ModelVersion",
                "metadata": {"name": name},
                "spec": {
                    "model": "llama3-8b",  # what the bench traffic asks for
                    "version": version,
                    "artifacts": [{"format": "onnx", "uri": onnx.as_uri()}],
                },
            }
            for name, version in (("m-1-0-0", "1.0.0"), ("m-1-1-0", "1.1.0"))
        ]
        cp.kubectl("apply", "-n", NS, "-f", "-", input=yaml.safe_dump_all(objs))

        with (
            router(NS, work / "router-prop.log", release="prop") as prop,
            router(NS, work / "router.log") as rt,
        ):
            prom.set_targets([f"127.0.0.1:{rt.port}"], wait=True)
            propagation = measure_propagation(cp, prop, args.writes)

            metrics_port = free_port()
            op_env = {
                **env,
                "TINCT_LINEAGE_ROOT": str(work / "lineage"),
                "TINCT_RELEASE_TICK": "5",
                "TINCT_ARTIFACT_ROOTS": str(work),
                "TINCT_TABLE_NAMESPACE": NS,
                "TINCT_PROMETHEUS_URL": prom.url,
                # The emulated engines listen on loopback: tables may name it by the allow-list.
                "TINCT_ALLOW_BACKENDS": "127.0.0.1",
                # 100 releases' analyses on a busy two-core machine can take Prometheus past
                # the 5 s default; the bench measures the operator and routers, not that.
                "TINCT_PROMETHEUS_TIMEOUT": os.environ.get("TINCT_PROMETHEUS_TIMEOUT", "20"),
            }
            argv = [sys.executable, "-m", "tinct.cli", "operator", "--namespace", NS]
            argv += ["--metrics-port", str(metrics_port)]
            with spawned(argv, work / "operator.log", op_env, grace=20) as op:
                result = run_releases(cp, prom, rt, schedulers, op, args)
    schedulers.stop()
    summary = {**result, **propagation, **adapter, "releases": args.releases, "cells_per_release": args.cells}
    print(json.dumps(summary))
    return 0


def measure_propagation(cp: ControlPlane, rt: Any, writes: int) -> dict[str, float]:
    """ConfigMap write answered -> the router serving that version, ``writes`` times."""
    log(f"timing {writes} routing-table writes to the router")
    delays: list[float] = []
    for version in range(1, writes + 1):
        cm = routing_configmap(
            table("http://127.0.0.1:1", "http://127.0.0.1:2", version=version, release="prop")
        )
        cm["metadata"]["namespace"] = NS
        from kubernetes import client, config

        if version == 1:
            config.load_kube_config(config_file=str(cp.kubeconfig))  # type: ignore[no-untyped-call]
        api = client.CoreV1Api()
        api.patch_namespaced_config_map(
            cm["metadata"]["name"],
            NS,
            cm,
            field_manager="bench",
            force=True,
            _content_type="application/apply-patch+yaml",
        )
        written = time.perf_counter()
        eventually(
            lambda v=version: rt.table_version("prop") == v,
            timeout=10,
            interval=0.002,
            what=f"the router on table version {version}",
        )
        delays.append((time.perf_counter() - written) * 1000)
    delays.sort()
    return {
        "table_propagation_p50_ms": round(statistics.median(delays), 1),
        "table_propagation_p99_ms": round(delays[min(len(delays) - 1, int(0.99 * len(delays)))], 1),
    }


def run_releases(
    cp: ControlPlane,
    prom: Prometheus,
    rt: Any,
    schedulers: Engines,
    op: subprocess.Popen[bytes],
    args: Any,
) -> dict[str, float]:
    log(f"applying {args.releases} GrayReleases of {args.cells} cells")
    docs = [
        release(f"r{i:03d}", args.cells, schedulers.v1.url, schedulers.v2.url) for i in range(args.releases)
    ]
    for chunk in range(0, len(docs), 20):
        cp.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(docs[chunk : chunk + 20]))

    def progressing() -> bool:
        items = releases_status(cp)
        n = sum(1 for i in items if (i.get("status") or {}).get("phase") == "Progressing")
        log(f"{n}/{args.releases} Progressing")
        return n >= args.releases

    eventually(progressing, timeout=600, interval=5, what="every release Progressing")
    eventually(
        lambda: all((i.get("status") or {}).get("lastAnalysis") for i in releases_status(cp)),
        timeout=120,
        interval=5,
        what="a first round of analyses",
    )
    log(f"measuring the operator for {args.window:.0f} s")
    cpu0, t0 = cpu_seconds(op.pid), time.monotonic()
    rss = _steady_rss(op.pid, args.window)
    cores = (cpu_seconds(op.pid) - cpu0) / (time.monotonic() - t0)
    analysed = releases_status(cp)
    fresh = sum(
        1
        for i in analysed
        if (la := (i.get("status") or {}).get("lastAnalysis"))
        and time.time() - datetime.fromisoformat(la["time"].replace("Z", "+00:00")).timestamp() < 25
    )
    log(f"operator: {cores:.3f} cores, {rss:.0f} MB RSS; {fresh}/{len(analysed)} analysed in the last 25 s")

    log("rollback reaction: a candidate answering 5xx")
    schedulers.set(schedulers.v2, error_rate=1)
    rb = release(
        "rollback",
        3,
        schedulers.v1.url,
        schedulers.v2.url,
        failureLimit=1,
        interval="5s",
        minRequests=5,
    )
    # A cooldown shorter than the interval (the rule of docs/concepts/analysis.md): a 30 s ejection would leave
    # 5 s windows that saw the candidate untried, and say nothing.
    rb["spec"]["fallback"] = {"cooldownSeconds": 2}
    cp.kubectl("apply", "-f", "-", input=yaml.safe_dump(rb))
    # The candidate's first step is 1% of the traffic: four clients at once, so that on a
    # loaded machine a 5 s window still holds minRequests of its tries.
    with _Follower(rt, "rollback") as follower, contextlib.ExitStack() as clients:
        seen = follower.seen
        for _ in range(4):
            clients.enter_context(Background(rt.port, [CellTraffic("user", "low", 5, model="rollback")]))

        def rolled_back() -> dict[str, Any] | None:
            obj = json.loads(cp.kubectl("get", "grayrelease", "rollback", "-n", NS, "-o", "json").stdout)
            st: dict[str, Any] = obj.get("status") or {}
            return st if st.get("phase") == "RolledBack" and st["routing"]["version"] in seen else None

        try:
            st = eventually(rolled_back, timeout=180, interval=0.5, what="the rollback")
        except AssertionError:
            obj = json.loads(cp.kubectl("get", "grayrelease", "rollback", "-n", NS, "-o", "json").stdout)
            got = obj.get("status") or {}
            log(
                f"rollback release: phase {got.get('phase')}, message {got.get('message')!r}, "
                f"last analysis {json.dumps(got.get('lastAnalysis'))[:1500]}, routing {got.get('routing')}, "
                f"router versions seen {sorted(seen)}"
            )
            raise
    failed_at = datetime.fromisoformat(st["lastAnalysis"]["time"].replace("Z", "+00:00")).timestamp()
    reaction = seen[st["routing"]["version"]] - failed_at
    log(f"rollback: analysis at {failed_at:.3f}, router on the 0% table {reaction:.3f} s later")
    noisy = measure_noise(cp, op.pid, rt.proc.pid, args.noise)
    return {
        "rollback_reaction_s": round(reaction, 3),
        "operator_cpu_cores": round(cores, 3),
        "operator_rss_mb": round(rss, 1),
        "releases_analysed_in_window": fresh,
        **noisy,
    }


class _Follower(Repeating):
    """The router's version of ``release``'s table, every 2 ms: when each version came."""

    pause = 0.002
    join_timeout = 5.0

    def __init__(self, rt: Router, release: str) -> None:
        self.rt, self.release = rt, release
        self.seen: dict[int, float] = {}

    def step(self, worker: int, i: int) -> None:
        try:
            version = self.rt.table_version(self.release)
        except OSError:  # a refused or reset scrape on a loaded machine: ask again
            return
        if version is not None and version not in self.seen:
            self.seen[version] = time.time()


def _steady_rss(pid: int, seconds: float = 10.0) -> float:
    """The largest RSS of ``pid`` over ``seconds``."""
    top, end = 0.0, time.monotonic() + seconds
    while time.monotonic() < end:
        top = max(top, status_mb(pid))
        time.sleep(0.5)
    return top


def measure_noise(cp: ControlPlane, operator_pid: int, router_pid: int, n: int) -> dict[str, float]:
    """RSS growth of the operator and the router when ``n`` unrelated 50 KB ConfigMaps appear
    beside the releases and their tables."""
    from kubernetes import client

    log(f"noisy cluster: creating {n} unrelated ConfigMaps of 50 KB in {NS}")
    before = {"operator": _steady_rss(operator_pid), "router": _steady_rss(router_pid)}
    api = client.CoreV1Api()
    blob = "x" * 50_000
    for i in range(n):
        api.create_namespaced_config_map(
            NS, {"metadata": {"name": f"noise-{i:05d}", "labels": {"app": "noise"}}, "data": {"blob": blob}}
        )
        if i % 1000 == 999:
            log(f"{i + 1}/{n} created")
    time.sleep(10)  # let any watch that would receive them do so
    after = {"operator": _steady_rss(operator_pid), "router": _steady_rss(router_pid)}
    log(f"RSS before {before}, after {after}")
    return {
        "operator_rss_growth_mb_noisy_cluster": round(after["operator"] - before["operator"], 1),
        "router_rss_growth_mb_noisy_cluster": round(after["router"] - before["router"], 1),
    }


if __name__ == "__main__":
    sys.exit(main())
