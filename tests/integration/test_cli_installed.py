"""The installed commands (`tinct`, `kubectl-tinct`, `kubectl_complete-tinct`) and the shell
completion scripts, run in child processes as a shell runs them."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tinct import __version__
from tinct.completion import SCRIPTS

BIN = Path(sys.executable).parent


@pytest.mark.skipif(shutil.which("bash") is None, reason="bash is the shell under test")
def test_the_bash_script_completes_through_tinct() -> None:
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}", "KUBECONFIG": "/nonexistent"}
    script = (
        "source <(tinct completion bash)\n"
        'COMP_WORDS=(tinct release st); COMP_CWORD=2; _tinct_complete; echo "${COMPREPLY[*]}"\n'
        'COMP_WORDS=(tinct release status chat -o y); COMP_CWORD=5; _tinct_complete; echo "${COMPREPLY[*]}"\n'
        "COMP_WORDS=(tinct ''); COMP_CWORD=1; _tinct_complete; echo \"${COMPREPLY[*]}\"\n"
    )
    out = subprocess.run(["bash", "-c", script], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == [
        "status",
        "yaml",
        "crds router operator lineage release comparer emulator version completion",
    ]


def test_every_shell_has_a_script_calling_the_engine() -> None:
    assert set(SCRIPTS) == {"bash", "zsh", "fish"}
    for shell, text in SCRIPTS.items():
        assert "tinct __complete" in text, shell
        out = subprocess.run(
            [str(BIN / "tinct"), "completion", shell], capture_output=True, text=True, check=True, timeout=60
        )
        assert out.stdout == text


def test_installed_entry_points_run() -> None:
    out = subprocess.run(
        [str(BIN / "kubectl-tinct"), "version", "-o", "json"], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["tinct"] == __version__
    plain = subprocess.run([str(BIN / "tinct"), "version"], capture_output=True, text=True, timeout=60)
    assert plain.stdout.startswith(f"tinct {__version__} (python ")
    help_ = subprocess.run([str(BIN / "kubectl-tinct"), "--help"], capture_output=True, text=True, timeout=60)
    assert help_.stdout.startswith("usage: kubectl tinct ")
    assert "kubectl tinct status chat --watch runs tinct release status chat --watch" in " ".join(
        help_.stdout.split()
    )
    done = subprocess.run(
        [str(BIN / "kubectl_complete-tinct"), "status", "-o", "y"], capture_output=True, text=True, timeout=60
    )
    assert done.stdout.splitlines() == ["yaml"]
    first = subprocess.run(
        [str(BIN / "kubectl_complete-tinct"), "st"], capture_output=True, text=True, timeout=60
    )
    assert first.stdout.splitlines() == ["status"]
