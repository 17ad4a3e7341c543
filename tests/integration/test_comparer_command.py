"""`tinct comparer` as a command, in a child process: it refuses to start without a token, and
judges the backends of the tables it follows as the routers do."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tinct.shadow.service import ComparerConfig
from tinct_testing.shadow_helpers import example_table as table


def test_the_command_refuses_to_start_without_a_token(tmp_path: Path) -> None:
    path = tmp_path / "table.json"
    path.write_text(table().to_json())
    run = subprocess.run(
        [sys.executable, "-m", "tinct.cli", "comparer", "--table", str(path), "--port", "0"],
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": "/usr/bin:/bin"},
    )
    assert run.returncode == 2
    assert "no token: give --comparer-token-file" in run.stderr
    empty = tmp_path / "token"
    empty.write_text("\n")
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "tinct.cli",
            "comparer",
            "--table",
            str(path),
            "--comparer-token-file",
            str(empty),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert (run.returncode, run.stderr.strip()) == (2, f"tinct comparer: the token file {empty} is empty")
    assert json.loads(path.read_text())["shadow"]["noiseShare"] == 10


def test_the_comparer_follows_the_tables_the_routers_follow() -> None:
    from tinct.cli import build_parser
    from tinct.shadow.cli import config_from_args

    argv = ["comparer", "--watch", "--allow-backend", "127.0.0.1", "--cluster-domain", "corp.internal"]
    config = config_from_args(build_parser().parse_args(argv))
    assert isinstance(config, ComparerConfig)
    assert config.backends.refusal("http://127.0.0.1:8000", "llm") is None
    assert config.backends.refusal("http://sched-v1.llm.svc.corp.internal:8000", "llm") is None
    assert config.backends.refusal("http://sched-v1.other.svc.corp.internal:8000", "llm") is not None
    assert ComparerConfig().backends.refusal("http://127.0.0.1:8000", "llm") is not None, "as a router's"
    run = subprocess.run(
        [sys.executable, "-m", "tinct.cli", "comparer", "--watch", "--allow-backend", "http://x"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 2
    assert run.stderr.startswith("tinct comparer: 'http://x' is neither a host name")
