"""What the benchmarks measure with: a process' memory and CPU from /proc, cold builds in a
scratch cache, the seconds a cached build took when it was made."""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from tinct_testing.controlplane.environ import patched_environ


def status_mb(pid: int, field: str = "VmRSS") -> float:
    """A memory figure of process ``pid`` (``VmRSS``: resident now, ``VmHWM``: its peak) in MB;
    NaN when /proc does not give it."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def cpu_times(pid: int) -> tuple[float, float]:
    """CPU seconds process ``pid`` has used in user space and in the kernel."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    tick = os.sysconf("SC_CLK_TCK")
    return int(fields[11]) / tick, int(fields[12]) / tick


def cpu_seconds(pid: int) -> float:
    """CPU seconds (user and system) process ``pid`` has used."""
    return sum(cpu_times(pid))


def children(pid: int) -> list[int]:
    """The processes ``pid`` started that still run (none once it ended)."""
    try:
        return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def cold_build(make: Callable[[], object], what: str, *, after: Callable[[], object] | None = None) -> float:
    """Seconds ``make`` takes with an empty Go build cache and tinct cache (a scratch pair, removed
    after); ``after``, untimed, fills them first (what a cold ``make test`` builds before)."""
    scratch = Path(tempfile.mkdtemp(prefix="tinct-bench-build-"))
    try:
        with patched_environ(GOCACHE=str(scratch / "go-build"), TINCT_CACHE_DIR=str(scratch / "tinct")):
            if after is not None:
                after()
            t0 = time.monotonic()
            make()
            seconds = time.monotonic() - t0
        print(f"cold build of {what}: {seconds:.1f}s", file=sys.stderr)
        return seconds
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def recorded_build(directory: Path) -> float | None:
    """The seconds the build cached in ``directory`` took when it was made (its BUILD.json)."""
    try:
        return float(json.loads((directory / "BUILD.json").read_text())["seconds"])
    except (OSError, ValueError, KeyError):
        return None


def rounded(value: float | None, digits: int = 1) -> float | None:
    return None if value is None else round(value, digits)


def cold_figures(cold: dict[str, float | None]) -> dict[str, float | None]:
    """``build_<name>_cold_s`` of each of :func:`cold_build`'s results (None: not measured)."""
    return {f"build_{name.replace('-', '_')}_cold_s": rounded(seconds) for name, seconds in cold.items()}


__all__ = ["cold_build", "cold_figures", "cpu_seconds", "recorded_build", "rounded", "status_mb"]
