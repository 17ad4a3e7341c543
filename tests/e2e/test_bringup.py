"""A node killed hard leaves the machine as it found it, or the next bring-up makes it so.

A bring-up runs in a process of its own (``python -m tinct_testing.controlplane.node up --pod``: a
control plane, the node, one Pod on the bridge) that this test kills with SIGKILL, the
way a CI job's timeout or an OOM kill ends a test run. What the machine looked like
before -- the sysctls a node changes, every iptables rule, the cgroups at the top of each
hierarchy, the network links, the mounts, the well-known paths, the node's processes --
must look the same once its watchdog is done. With the watchdog killed too, the session's
node (the next bring-up) must find the leftovers and undo them before it starts; the
clean stop of that node is the session's last act. This module runs before any other test
of the tier: the machine has one node at a time.
"""

from __future__ import annotations

import functools
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tinct_testing.controlplane import hoststate, node
from tinct_testing.wait import eventually

WAIT = 300.0


@functools.cache
def node_binaries() -> set[str]:
    """The node's own binaries (the control plane's are shared with other test runs)."""
    return {str(b) for b in node.ensure_parts().binaries}


def snapshot() -> dict[str, Any]:
    """What a node may change on this machine, as comparable data."""
    rules = {}
    for binary in ("iptables", "ip6tables"):
        for table in hoststate.TABLES:
            proc = subprocess.run([binary, "-w", "5", "-t", table, "-S"], capture_output=True, text=True)
            rules[f"{binary} {table}"] = sorted(proc.stdout.splitlines())
    cgroups = {
        str(root): sorted(d.name for d in root.iterdir() if d.is_dir()) for root in hoststate.cgroup_roots()
    }
    return {
        "sysctls": hoststate.sysctls(),
        "iptables": rules,
        "cgroups": cgroups,
        "links": sorted(os.listdir("/sys/class/net")),
        "mounts": sorted(hoststate.mounts()),
        "paths": {p: os.path.lexists(p) for p in (*hoststate.HOST_PATHS, str(node.RUN_DIR))},
        "processes": sorted(
            p for p in os.listdir("/proc") if p.isdigit() and _exe(int(p)) in node_binaries()
        ),
    }


def _exe(pid: int) -> str:
    try:
        return os.readlink(f"/proc/{pid}/exe")
    except OSError:
        return ""


def differences(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    return {k: (before[k], after[k]) for k in before if before[k] != after[k]}


def bring_up(log: Path) -> tuple[subprocess.Popen[str], dict[str, Any]]:
    """A node in a process of its own, with a Pod running; its JSON line once up."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "tinct_testing.controlplane.node", "up", "--pod", "--lock-timeout", "60"],
        stdout=subprocess.PIPE,
        stderr=log.open("w"),
        text=True,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line:
        proc.wait(60)
        raise AssertionError(f"the node did not come up ({proc.returncode}):\n{log.read_text()[-4000:]}")
    ready: dict[str, Any] = json.loads(line)
    return proc, ready


def wait_restored(before: dict[str, Any], what: str) -> None:
    def restored() -> bool:
        diff = differences(before, snapshot())
        assert not diff, f"the machine differs from before: {json.dumps(diff, indent=1)[:6000]}"
        assert not (node.RUN_DIR / node.RECORD).exists(), "the node's record is still there"
        return True

    eventually(restored, timeout=WAIT, interval=1, what=f"the machine as before, {what}")


def test_killed_node_is_undone_by_its_watchdog_or_by_the_next_bring_up(
    tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    node.preflight()
    # A node an earlier run lost (its process and watchdog killed) left the machine changed:
    # undone first, as a bring-up would, so that "before" is the machine's own state.
    with node.machine_lock():
        leftover = node.recover()
    if leftover:
        print(f"\nan earlier run's node undone first: {leftover}")
    before = snapshot()

    # SIGKILL the process: its watchdog, in a session of its own, puts the machine back.
    a, ready = bring_up(tmp_path / "a.log")
    print(f"\nbring-up timings: {ready['timings']}")
    up = snapshot()
    assert up["links"] != before["links"], "the Pod's bridge and veth are there"
    assert (node.RUN_DIR / node.RECORD).exists()
    a.send_signal(signal.SIGKILL)
    a.wait(30)
    wait_restored(before, "after the watchdog")

    # SIGKILL the watchdog and then the process: the leftovers stay until the next bring-up.
    b, ready = bring_up(tmp_path / "b.log")
    os.kill(ready["watchdog"], signal.SIGKILL)
    b.send_signal(signal.SIGKILL)
    b.wait(30)
    time.sleep(2)  # time a cleanup would need: nothing may do it now
    left = differences(before, snapshot())
    assert "links" in left, "the bridge outlived the killed node"
    assert (node.RUN_DIR / node.RECORD).exists()

    # The next bring-up -- the session's node, which the other tests use -- undoes them first.
    session: node.Node = request.getfixturevalue("node")
    print(f"recovered: {session.recovered}")
    assert session.recovered[0].startswith("cleaned up after a node of process"), session.recovered
    assert any(line.startswith("deleted the bridge") for line in session.recovered), session.recovered
    assert any(line.startswith("restored ") for line in session.recovered), "sysctls written back"
