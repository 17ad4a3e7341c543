"""The README walk-through, run exactly as written against `make dev`, prints what the README shows.

The README's section between ``<!-- walkthrough -->`` and ``<!-- /walkthrough -->`` is a
sequence of ``sh`` blocks, each one command, each followed by the ``text`` block of what it
prints (none when it prints nothing). The test starts ``scripts/dev.py`` (what ``make dev``
runs) in a directory of its own and on a free router port, runs each command in one bash
session, and compares its output with the README's, ages, times, request nonces and
measured latencies aside. Then it stops ``make dev`` as a person would (Ctrl-C) and checks
that everything it started is gone.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from tinct_testing.controlplane.harness import free_port
from tinct_testing.paths import ROOT
from tinct_testing.wait import eventually

README = ROOT / "README.md"
DEFAULT_DIR = "/tmp/tinct-dev"
#: The marker bash prints after each command, to split the session's output.
_END = "::tinct-walkthrough-end::"


@dataclass(frozen=True)
class Step:
    command: str
    expected: str


def walkthrough(text: str) -> list[Step]:
    """The commands of the README's walk-through and what each prints."""
    section = text.split("<!-- walkthrough -->", 1)[1].split("<!-- /walkthrough -->", 1)[0]
    blocks = re.findall(r"```(\w+)\n(.*?)```", section, re.S)
    steps: list[Step] = []
    for kind, body in blocks:
        if kind == "sh":
            steps.append(Step(body.strip(), ""))
        else:
            assert steps, f"an output block before any command:\n{body}"
            assert not steps[-1].expected, f"two output blocks after one command:\n{body}"
            steps[-1] = Step(steps[-1].command, body.rstrip("\n"))
    return steps


_VOLATILE = [
    (re.compile(r"\b\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?(Z|[+-]\d\d:\d\d)?"), "<time>"),
    (re.compile(r"(?<=\s)\d+[smhd](\d+[smhd])?(?=\s|$)"), "<age>"),  # AGE columns
    (re.compile(r"@a(\d+)-[0-9a-f]{8}\b"), r"@a\1-<nonce>"),
    # Measured here, not decided: latencies and the engines' queues.
    (re.compile(r"\b(latency-p95|ttft-p95|itl-p95|queue-depth)(=|\s+)[0-9.]+"), r"\1\2<measured>"),
    # A reader who takes longer than one analysis interval between the wait and the promote
    # promotes after the next step: when, not what, is the reader's.
    (re.compile(r"promoted after step \d+/"), "promoted after step <n>/"),
    (re.compile(r"[ \t]+"), " "),  # column widths follow the values
]


def normalized(text: str) -> str:
    for pattern, repl in _VOLATILE:
        text = pattern.sub(repl, text)
    return "\n".join(line.rstrip() for line in text.strip("\n").splitlines())


def test_normalization_keeps_what_is_decided() -> None:
    a = "chat  1.4.0  Ready   5s\n  latency-p95   4.664  <= 800 ms  Pass\nat 2026-12-03T07:59:59Z ttft-p95=41"
    b = "chat 1.4.0 Ready 2m3s\n  latency-p95 12.1  <= 800 ms  Pass\nat 2027-01-01T00:00:00Z ttft-p95=52.5"
    assert normalized(a) == normalized(b)
    assert normalized("success-rate 100 >= 99") != normalized("success-rate 99 >= 99")


def test_the_readme_walkthrough_prints_what_the_readme_shows(tmp_path: Path) -> None:
    steps = walkthrough(README.read_text())
    assert len(steps) >= 10, "the walk-through is in the README"
    work = tmp_path / "dev"
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KUBECONFIG", "TINCT_"))}
    log = (tmp_path / "dev.out").open("w")
    dev = subprocess.Popen(
        [sys.executable, str(ROOT / "scripts" / "dev.py"), "--dir", str(work), "--router-port", str(port)],
        stdout=log,
        stderr=subprocess.STDOUT,
        env=env,
        start_new_session=True,
    )
    try:

        def up() -> bool:
            if dev.poll() is not None:
                raise RuntimeError("make dev exited:\n" + (tmp_path / "dev.out").read_text()[-3000:])
            return "tinct is up" in (tmp_path / "dev.out").read_text()

        # 15 minutes: a cold start builds the control plane first.
        eventually(up, timeout=900, interval=1, what="make dev up")
        banner = (tmp_path / "dev.out").read_text()
        assert f"    export KUBECONFIG={work}/kubeconfig\n" in banner
        script = "set -o pipefail\n" + "".join(
            f"{s.command.replace(DEFAULT_DIR, str(work))}\necho {_END}$?\n" for s in steps
        )
        done = subprocess.run(
            ["bash", "--norc", "--noprofile"],
            input=script,
            capture_output=True,
            text=True,
            cwd=ROOT,
            env=env,
            timeout=1500,
        )
        outputs = re.split(rf"{_END}(\d+)\n", done.stdout)
        printed = list(zip(outputs[0::2], outputs[1::2], strict=False))
        assert len(printed) == len(steps), done.stdout[-3000:] + done.stderr[-3000:]
        for step, (out, status) in zip(steps, printed, strict=True):
            assert status == "0", f"{step.command!r} exited {status}:\n{out}\n{done.stderr[-2000:]}"
            assert normalized(out.replace(str(work), DEFAULT_DIR)) == normalized(step.expected), (
                f"{step.command!r} printed:\n{out}"
            )
    finally:
        if dev.poll() is None:
            dev.send_signal(signal.SIGINT)  # Ctrl-C
        try:
            code = dev.wait(120)
        except subprocess.TimeoutExpired:
            os.killpg(dev.pid, signal.SIGKILL)
            raise
        log.close()
    assert code == 0, (tmp_path / "dev.out").read_text()[-3000:]
    assert (tmp_path / "dev.out").read_text().rstrip().endswith("tinct stopped")
    left = subprocess.run(["pgrep", "-s", str(dev.pid)], capture_output=True, text=True)
    if left.stdout.strip():
        pytest.fail(f"make dev left processes behind: {left.stdout.split()}")
