"""`make dev` one at a time: a second one on the same state directory, or on a router port
something listens on, stops at once with one line and touches nothing of the first."""

from __future__ import annotations

import fcntl
import os
import socket
import subprocess
import sys
from pathlib import Path

from tinct_testing.paths import ROOT
from tinct_testing.router_fakes import free_port

DEV = ROOT / "scripts" / "dev.py"


def _dev(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(DEV), *args], capture_output=True, text=True, timeout=120, check=False
    )


def test_a_second_dev_on_the_same_directory_stops_at_once_leaving_the_first_alone(tmp_path: Path) -> None:
    work = tmp_path / "tinct-dev"
    work.mkdir()
    (work / "kubeconfig").write_text("the running one's")
    lock = os.open(tmp_path / "tinct-dev.lock", os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)  # as the running one holds it
        os.write(lock, b"4242\n")
        out = _dev("--dir", str(work), "--router-port", str(free_port()))
    finally:
        os.close(lock)
    assert out.returncode == 1, out
    assert out.stdout == ""
    lines = out.stderr.splitlines()
    assert len(lines) == 1, out.stderr
    assert "(pid 4242) is already up on" in lines[0]
    assert str(work) in lines[0]
    assert "--router-port" in lines[0]
    assert (work / "kubeconfig").read_text() == "the running one's", "its state is not wiped"


def test_a_taken_router_port_is_named_before_anything_starts(tmp_path: Path) -> None:
    work = tmp_path / "tinct-dev"
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        out = _dev("--dir", str(work), "--router-port", str(port))
    assert out.returncode == 1, out
    lines = out.stderr.splitlines()
    assert len(lines) == 1, out.stderr
    assert f"port {port} on 127.0.0.1 is taken" in lines[0]
    assert 'DEV_ARGS="--router-port PORT"' in lines[0]
    assert not work.exists(), "nothing was started nor written"
