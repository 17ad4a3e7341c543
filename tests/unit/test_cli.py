from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import yaml

from tinct.cli import main


def test_help_lists_commands() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "tinct.cli", "--help"], check=True, capture_output=True, text=True
    ).stdout
    assert "crds" in out
    assert "COMMAND" in out


def test_no_command_prints_help_and_fails(capsys: object) -> None:
    assert main([]) == 2


def test_crds_stdout_is_one_yaml_stream(capsys: object, tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "tinct.cli", "crds", "--stdout"], check=True, capture_output=True, text=True
    )
    docs = list(yaml.safe_load_all(proc.stdout))
    assert [d["metadata"]["name"] for d in docs] == ["modelversions.tinct.io", "grayreleases.tinct.io"]
