"""Benchmark the test control plane and its tools: cold builds, cached build, start-to-ready.

    python bench/controlplane.py [--skip-cold] [--starts 5]

A cold build uses an empty Go build cache and an empty tinct cache (the Go module
download cache is kept: fetching sources is the network's speed, not the build's); each
component is built cold on its own. Last line:

    {"build_cold_s", "build_prometheus_cold_s", "build_helm_cold_s", "build_kwok_cold_s",
     "build_keda_cold_s", "build_cached_s", "start_to_ready_s", "controller_manager_ready_s",
     "kwok_node_ready_s", "kwok_rss_mb", "kwok_rss_100_pods_mb", "prometheus_start_to_ready_s",
     "keda_start_to_ready_s", "recorded_build_s"}

build_cold_s is the control plane (kube-apiserver, kube-controller-manager, kubectl,
etcd); start_to_ready_s is the median of ``--starts`` starts of etcd + kube-apiserver +
kube-controller-manager + kwok until all are healthy and kwok's Node is Ready (PKI
included), of which controller_manager_ready_s is the controller-manager's share and
kwok_node_ready_s the time from starting kwok to its Node Ready (it overlaps the
controller-manager's start); kwok_rss_mb is kwok's resident memory right after a start
(median), kwok_rss_100_pods_mb once a Deployment of 100 replicas on its Node is
available; prometheus_start_to_ready_s the median until Prometheus is ready;
keda_start_to_ready_s the median from starting KEDA on a running control plane (its
manifests, operator, and metrics API server until its APIService is Available). ``--skip-cold`` reports null for the cold builds;
recorded_build_s then says how long the cached builds took when they were made (Go's
build cache may have been warm).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

from tinct_testing.controlplane import build
from tinct_testing.controlplane.harness import ControlPlane
from tinct_testing.controlplane.keda import Keda
from tinct_testing.controlplane.prometheus import Prometheus
from tinct_testing.measure import cold_build, cold_figures, recorded_build, rounded, status_mb
from tinct_testing.release_cluster import apply, deployment, wait_available


def _kwok_rss(cp: ControlPlane) -> float:
    assert cp.kwok_pid is not None, "kwok is not running"
    return status_mb(cp.kwok_pid)


def _kwok_rss_with_pods(cp: ControlPlane, replicas: int) -> float:
    cp.kubectl("create", "namespace", "bench")
    apply(cp, "bench", deployment("bench", replicas))
    wait_available(cp, "bench", "bench", replicas, timeout=300)
    return _kwok_rss(cp)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--skip-cold", action="store_true", help="report null for the cold builds")
    parser.add_argument("--starts", type=int, default=5)
    args = parser.parse_args()
    os.environ.pop("KUBEBUILDER_ASSETS", None)

    def controlplane() -> Path:
        return build.ensure_built(verbose=False)

    def prometheus() -> Path:
        return build.ensure_prometheus(verbose=False)

    def helm() -> Path:
        return build.ensure_helm(verbose=False)

    def kwok() -> Path:
        return build.ensure_kwok(verbose=False)

    def keda() -> Path:
        return build.ensure_keda(verbose=False)

    cold: dict[str, float | None] = dict.fromkeys(("controlplane", "prometheus", "helm", "kwok", "keda"))
    if not args.skip_cold:
        cold = {"controlplane": cold_build(controlplane, "the control plane")}
        cold["prometheus"] = cold_build(prometheus, "prometheus")
        cold["helm"] = cold_build(helm, "helm")
        cold["kwok"] = cold_build(kwok, "kwok")
        cold["keda"] = cold_build(keda, "KEDA")

    for make in (controlplane, prometheus, helm, kwok, keda):
        make()  # the normal cache, built if needed
    t0 = time.monotonic()
    bin_dir = controlplane()
    cached = time.monotonic() - t0
    print(f"cached build check: {cached:.2f}s ({bin_dir})", file=sys.stderr)
    prometheus_bin, helm_bin, kwok_bin = prometheus(), helm(), kwok()
    recorded = {
        "controlplane": recorded_build(bin_dir),
        "prometheus": recorded_build(prometheus_bin.parent),
        "helm": recorded_build(helm_bin.parent),
        "kwok": recorded_build(kwok_bin.parent),
        "keda": recorded_build(keda()),
    }
    print(f"recorded build seconds: {recorded}", file=sys.stderr)

    starts, controller_manager, kwok_ready, kwok_rss, keda_starts = [], [], [], [], []
    kwok_rss_pods = 0.0
    for i in range(args.starts):
        t0 = time.monotonic()
        with ControlPlane(bin_dir=bin_dir, kwok_bin=kwok_bin) as cp:
            starts.append(time.monotonic() - t0)
            version = cp.version()["gitVersion"]
            assert cp.controllers, "kube-controller-manager did not start"
            controller_manager.append(cp.ready_after["kube-controller-manager"])
            kwok_ready.append(cp.ready_after["kwok"])
            kwok_rss.append(_kwok_rss(cp))
            if i == 0:
                kwok_rss_pods = _kwok_rss_with_pods(cp, 100)
                print(f"kwok with 100 Ready Pods: {kwok_rss_pods:.0f} MB resident", file=sys.stderr)
            t0 = time.monotonic()
            with Keda(cp, bin_dir=keda()) as k:
                keda_starts.append(time.monotonic() - t0)
                print(f"KEDA start {i + 1}: {keda_starts[-1]:.2f}s; each: {k.ready_after}", file=sys.stderr)
        print(
            f"start {i + 1}: {starts[-1]:.2f}s to all healthy ({version}); each: {cp.ready_after}",
            file=sys.stderr,
        )

    prom_starts = []
    for i in range(args.starts):
        t0 = time.monotonic()
        with Prometheus(prometheus_bin):
            prom_starts.append(time.monotonic() - t0)
        print(f"prometheus start {i + 1}: {prom_starts[-1]:.2f}s to ready", file=sys.stderr)

    print(
        json.dumps(
            {
                "build_cold_s": rounded(cold.pop("controlplane")),
                **cold_figures(cold),
                "build_cached_s": round(cached, 2),
                "start_to_ready_s": round(statistics.median(starts), 2),
                "controller_manager_ready_s": round(statistics.median(controller_manager), 2),
                "kwok_node_ready_s": round(statistics.median(kwok_ready), 2),
                "kwok_rss_mb": round(statistics.median(kwok_rss)),
                "kwok_rss_100_pods_mb": round(kwok_rss_pods),
                "prometheus_start_to_ready_s": round(statistics.median(prom_starts), 2),
                "keda_start_to_ready_s": round(statistics.median(keda_starts), 2),
                "recorded_build_s": recorded,
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
