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
import statistics
import sys
import time

from tinct_testing.controlplane import build, images
from tinct_testing.controlplane.node import Node, ensure_parts
from tinct_testing.measure import cold_build, cold_figures, recorded_build, status_mb


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cold", action="store_true", help="build every part in a scratch cache first")
    parser.add_argument("--starts", type=int, default=3)
    args = parser.parse_args()

    cold: dict[str, float | None] = dict.fromkeys(
        ("node", "containerd", "coredns", "metrics-server", "images")
    )
    if args.cold:
        cold["node"] = cold_build(
            build.ensure_node_built,
            "kubelet, kube-proxy, kube-scheduler (after the control plane)",
            after=build.ensure_built,
        )
        cold["containerd"] = cold_build(lambda: build.ensure_tool("containerd"), "containerd")
        cold["coredns"] = cold_build(lambda: build.ensure_tool("coredns"), "CoreDNS")
        cold["metrics-server"] = cold_build(lambda: build.ensure_tool("metrics-server"), "metrics-server")
        cold["images"] = cold_build(
            lambda: (images.ensure_pause_image(), images.ensure_image()), "the images"
        )

    parts = ensure_parts()
    image = images.ensure_image()
    recorded = {
        "node": recorded_build(parts.kube),
        "containerd": recorded_build(parts.containerd),
        "coredns": recorded_build(parts.coredns.parent),
        "metrics_server": recorded_build(parts.metrics_server.parent),
        "pause_image": recorded_build(parts.pause.archive.parent),
        "python_base_image": recorded_build(images.ensure_base_image().archive.parent),
        "tinct_image": recorded_build(image.archive.parent),
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
        rss.append(sum(status_mb(pid) for pid in n.pids))
        t0 = time.monotonic()
        n.stop()
        stops.append(time.monotonic() - t0)
        print(f"start {i + 1}: {starts[-1]:.1f}s {n.timings}; stop {stops[-1]:.1f}s", file=sys.stderr)

    print(
        json.dumps(
            {
                **cold_figures(cold),
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
