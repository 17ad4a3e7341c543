from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tinct.cli import main

COMMANDS = {
    "crds": "write the CustomResourceDefinitions generated from the API models",
    "router": "run the dye router",
    "operator": "run the operator",
    "lineage": "query the lineage tables",
    "emulator": "serve an emulated LLM engine (OpenAI API, engine metrics; no model runs)",
}


def test_help_lists_every_command_with_its_summary() -> None:
    env = {**os.environ, "COLUMNS": "200"}  # one line per command, whatever the terminal
    out = subprocess.run(
        [sys.executable, "-m", "tinct.cli", "--help"], check=True, capture_output=True, text=True, env=env
    ).stdout
    assert out.startswith("usage: tinct ")
    for name, summary in COMMANDS.items():
        assert re.search(rf"^\s+{name}\s+{re.escape(summary)}", out, re.MULTILINE), (name, out)


@pytest.mark.parametrize(
    ("command", "flags"),
    [
        (["crds"], ["--out", "--stdout"]),
        (["router"], ["--table", "--watch", "--trust-role-from", "--max-body-bytes", "--shutdown-timeout"]),
        (
            ["operator"],
            [
                "--namespace",
                "--lineage-root",
                "--lineage-single-writer",
                "--hash-workers",
                "--s3-endpoint",
                "--peering",
            ],
        ),
        (
            ["lineage", "sql"],
            ["--root", "--format", "--memory-limit", "--timeout", "--as-of-version", "--as-of"],
        ),
        (["lineage", "show"], ["--root", "--format", "--memory-limit", "--timeout"]),
        (
            ["emulator"],
            ["--engine", "--ttft-ms", "--itl-ms", "--throttle-rate", "--contract", "--slots", "--control"],
        ),
    ],
    ids=lambda v: " ".join(v) if isinstance(v, list) and v[0][0] != "-" else None,
)
def test_each_command_documents_its_flags(
    command: list[str], flags: list[str], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "200")
    with pytest.raises(SystemExit) as done:
        main([*command, "--help"])
    assert done.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith(f"usage: tinct {' '.join(command)}")
    for flag in flags:
        assert re.search(rf"^\s+(-\w \w+, )?{flag}(?=[ ,]|$)", out, re.MULTILINE), (flag, out)


def test_no_command_prints_help_and_fails(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([]) == 2
    out = capsys.readouterr().out
    assert out.startswith("usage: tinct ")
    assert all(name in out for name in COMMANDS)


def test_crds_stdout_is_one_yaml_stream(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "tinct.cli", "crds", "--stdout"], check=True, capture_output=True, text=True
    )
    docs = list(yaml.safe_load_all(proc.stdout))
    assert [d["metadata"]["name"] for d in docs] == ["modelversions.tinct.io", "grayreleases.tinct.io"]


def test_ctrl_c_while_the_commands_load_is_one_line_and_130(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import tinct.cli

    def interrupted(prog: str) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(tinct.cli, "build_parser", interrupted)
    assert main(["lineage", "sql", "SELECT 1"]) == 130
    assert capsys.readouterr() == ("", "tinct: interrupted\n")
