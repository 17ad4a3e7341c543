"""`make dev`'s own parts: one at a time (a second one on the same state directory, or on a
router port something listens on, stops at once with one line and touches nothing of the
first), and the webhook receiver that prints the notifications of the real operator's
``json`` notifier."""

from __future__ import annotations

import fcntl
import importlib.util
import json
import os
import socket
import subprocess
import sys
import urllib.request
from pathlib import Path
from types import ModuleType

import pytest

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


def _script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("tinct_dev_script", DEV)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_local_notifier_prints_a_line_per_notification_the_operator_sends() -> None:
    from datetime import UTC, datetime

    from tinct.api.v1alpha1.grayrelease import GrayRelease
    from tinct.api.v1alpha1.releasestatus import HistoryEntry
    from tinct.operator.grayrelease.notify import payload, render
    from tinct_testing.release_cluster import example

    dev = _script()
    doc = example()
    doc["metadata"].update(namespace="default", uid="u-1")
    release = GrayRelease.model_validate(doc)
    entry = HistoryEntry(
        seq=3,
        time=datetime(2026, 1, 1, tzinfo=UTC),
        phase="Progressing",
        step=1,
        reason="StepAdvanced",
        message="analysis passed:\n  success-rate 100",
        weights={"len:*+role:*+latency:*": 10.0},
    )
    headers, body = render("json", payload(release, entry))
    printed: list[str] = []
    with dev.notifications(printed.append) as url:
        sent = urllib.request.Request(url, data=body, headers=headers, method="POST")
        with urllib.request.urlopen(sent, timeout=10) as answer:
            assert answer.status == 200
        junk = urllib.request.Request(url, data=b"\x00not json", method="POST")
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(junk, timeout=10)
        assert refused.value.code == 400
    assert printed == [
        "==> notification: default/chat StepAdvanced (step 2/4, candidate 10%): analysis passed: success-rate 100",
        "==> notification that is no JSON object (9 bytes)",
    ]
    assert json.loads(body)["reason"] == "StepAdvanced"
