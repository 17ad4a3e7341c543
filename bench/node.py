"""Benchmark the end-to-end node: builds, bring-up and teardown, memory.

    python bench/node.py [--cold] [--starts 3]

Needs what the e2e tier needs (root, the Debian packages). Last line:

    {"build_node_cold_s", "build_containerd_cold_s", "build_coredns_cold_s",
     "build_metrics_server_cold_s", "build_images_cold_s", "bringup_s", "bringup_controlplane_s", "bringup_node_s",
     "teardown_s", "node_rss_mb", "recorded_build_s"}

``--cold`` builds each part with an empty Go build cache and tinct cache (so buildah's
storage is empty too): kubelet, kube-proxy and kube-scheduler after an untimed build of
the control plane into that cache, as a cold ``make test`` builds them (their packages
shared with the control plane's come from the cache); containerd, CoreDNS, metrics-server,
and the pause, base and tinct images on their own. Without it those figures are null and ``recorded_build_s`` says how long
the cached builds took when they were made (in whatever state Go's cache was then).
``bringup_s`` is the median of ``--starts`` bring-ups of the node with the tinct image
already in containerd's store (control plane included, ``bringup_controlplane_s`` of it;
``bringup_node_s`` from the control plane's readiness to the Node Ready with DNS, kube-proxy
and the scheduler answering), ``teardown_s`` the median of the stops that put the machine
back, ``node_rss_mb`` the resident memory of the node's own processes (kubelet,
containerd, kube-proxy, kube-scheduler, CoreDNS, metrics-server) once up.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from tinct_testing.controlplane import build, images
from tinct_testing.controlplane.environ import patched_environ
from tinct_testing.controlplane.node import Node, ensure_parts


def _cold(make: Callable[[], object], what: str, *, after: Callable[[], object] | None = None) -> float:
    """Seconds ``make`` takes with an empty Go build cache and tinct cache; ``after``, untimed,
    fills them first (the control plane, as a cold ``make test`` builds it before the node)."""
    scratch = Path(tempfile.mkdtemp(prefix="tinct-bench-node-"))
    env = {"TINCT_CACHE_DIR": str(scratch / "tinct"), "GOCACHE": str(scratch / "go-build")}
    try:
        with patched_environ(**env):
            if after is not None:
                after()
            t0 = time.monotonic()
            make()
            seconds = time.monotonic() - t0
        print(f"cold build of {what}: {seconds:.1f}s", file=sys.stderr)
        return seconds
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _recorded(directory: Path) -> float | None:
    try:
        return float(json.loads((directory / "BUILD.json").read_text())["seconds"])
    except (OSError, ValueError, KeyError):
        return None


def _rss_mb(pids: list[int]) -> float:
    total = 0
    for pid in pids:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                total += int(line.split()[1])
    return total / 1024


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cold", action="store_true", help="build every part in a scratch cache first")
    parser.add_argument("--starts", type=int, default=3)
    args = parser.parse_args()

    cold: dict[str, float | None] = dict.fromkeys(
        ("node", "containerd", "coredns", "metrics-server", "images")
    )
    if args.cold:
        cold["node"] = _cold(
            build.ensure_node_built,
            "kubelet, kube-proxy, kube-scheduler (after the control plane)",
            after=build.ensure_built,
        )
        cold["containerd"] = _cold(lambda: build.ensure_tool("containerd"), "containerd")
        cold["coredns"] = _cold(lambda: build.ensure_tool("coredns"), "CoreDNS")
        cold["metrics-server"] = _cold(lambda: build.ensure_tool("metrics-server"), "metrics-server")
        cold["images"] = _cold(lambda: (images.ensure_pause_image(), images.ensure_image()), "the images")

    parts = ensure_parts()
    image = images.ensure_image()
    recorded = {
        "node": _recorded(parts.kube),
        "containerd": _recorded(parts.containerd),
        "coredns": _recorded(parts.coredns.parent),
        "metrics_server": _recorded(parts.metrics_server.parent),
        "pause_image": _recorded(parts.pause.archive.parent),
        "python_base_image": _recorded(images.ensure_base_image().archive.parent),
        "tinct_image": _recorded(image.archive.parent),
    }
    print(f"recorded build seconds: {recorded}", file=sys.stderr)

    # The first start imports the image if containerd's store lacks it; it is not counted.
    Node([image], parts=parts).start().stop()
    starts, controlplane, node_part, stops, rss = [], [], [], [], []
    for i in range(args.starts):
        n = Node([image], parts=parts)
        t0 = time.monotonic()
        n.start()
        starts.append(time.monotonic() - t0)
        controlplane.append(n.timings["controlplane"])
        node_part.append(n.timings["node"])
        rss.append(_rss_mb(n.pids))
        t0 = time.monotonic()
        n.stop()
        stops.append(time.monotonic() - t0)
        print(f"start {i + 1}: {starts[-1]:.1f}s {n.timings}; stop {stops[-1]:.1f}s", file=sys.stderr)

    def rounded(v: float | None) -> float | None:
        return None if v is None else round(v, 1)

    print(
        json.dumps(
            {
                "build_node_cold_s": rounded(cold["node"]),
                "build_containerd_cold_s": rounded(cold["containerd"]),
                "build_coredns_cold_s": rounded(cold["coredns"]),
                "build_metrics_server_cold_s": rounded(cold["metrics-server"]),
                "build_images_cold_s": rounded(cold["images"]),
                "bringup_s": round(statistics.median(starts), 1),
                "bringup_controlplane_s": round(statistics.median(controlplane), 1),
                "bringup_node_s": round(statistics.median(node_part), 1),
                "teardown_s": round(statistics.median(stops), 1),
                "node_rss_mb": round(statistics.median(rss)),
                "recorded_build_s": recorded,
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
