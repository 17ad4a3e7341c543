"""Benchmark the test control plane: cold build, cached build, start-to-ready.

    python bench/controlplane.py [--skip-cold] [--starts 5]

The cold build uses an empty Go build cache and an empty tinct cache (the Go module
download cache is kept: fetching sources is the network's speed, not the build's).
Last line: {"build_cold_s": ..., "build_cached_s": ..., "start_to_ready_s": ...}
where start_to_ready_s is the median of ``--starts`` starts.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from controlplane import build
from controlplane.environ import patched_environ
from controlplane.harness import ControlPlane


def _timed_build(env: dict[str, str]) -> tuple[float, Path]:
    with patched_environ(**env):
        t0 = time.monotonic()
        path = build.ensure_built(verbose=False)
        return time.monotonic() - t0, path


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--skip-cold", action="store_true", help="report null for build_cold_s")
    parser.add_argument("--starts", type=int, default=5)
    args = parser.parse_args()
    os.environ.pop("KUBEBUILDER_ASSETS", None)

    cold: float | None = None
    if not args.skip_cold:
        scratch = Path(tempfile.mkdtemp(prefix="tinct-bench-build-"))
        try:
            env = {"GOCACHE": str(scratch / "go-build"), "TINCT_CACHE_DIR": str(scratch / "tinct")}
            cold, _ = _timed_build(env)
            print(f"cold build: {cold:.1f}s", file=sys.stderr)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)

    build.ensure_built(verbose=False)  # the normal cache, built if needed
    cached, bin_dir = _timed_build({})
    print(f"cached build check: {cached:.2f}s ({bin_dir})", file=sys.stderr)

    starts = []
    for i in range(args.starts):
        t0 = time.monotonic()
        with ControlPlane(bin_dir=bin_dir) as cp:
            starts.append(time.monotonic() - t0)
            version = cp.version()["gitVersion"]
        print(f"start {i + 1}: {starts[-1]:.2f}s to /readyz ({version})", file=sys.stderr)

    print(
        json.dumps(
            {
                "build_cold_s": None if cold is None else round(cold, 1),
                "build_cached_s": round(cached, 2),
                "start_to_ready_s": round(statistics.median(starts), 2),
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
