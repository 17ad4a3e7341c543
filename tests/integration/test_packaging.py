"""``pip install tinct`` without extras runs every command: the runtime dependencies cover ``src/``.

The package is installed (not editable) into a fresh virtual environment with ``uv`` (its
cache makes a repeat install take seconds), then each command's ``--help`` runs, every
module of the package is imported, and so is every third-party module any of them imports,
including those imported lazily inside functions (``onnx``, ``datafusion``, ...).
"""

from __future__ import annotations

import ast
import subprocess
import sys
import venv
from pathlib import Path

import pytest
import uv

from tinct_testing.paths import ROOT

SRC = ROOT / "src" / "tinct"
#: Imported only when installed, each from an extra: ``tinct[fast]`` brings uvloop.
OPTIONAL = {"uvloop"}


def third_party_imports(src: Path = SRC) -> set[str]:
    """Top-level names of the modules ``src`` imports that are neither stdlib nor tinct."""
    names: set[str] = set()
    for path in src.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names.update(alias.name.split(".")[0] for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names.add(node.module.split(".")[0])
    return {n for n in names if n not in sys.stdlib_module_names and n not in {"tinct", "__future__"}}


def test_scan_finds_lazy_imports() -> None:
    found = third_party_imports()
    # numpy and yarl at module level, onnx and datafusion only inside functions or late modules.
    assert {"numpy", "yarl", "onnx", "deltalake", "datafusion", "kopf"} <= found
    assert not found & {"os", "json", "typing", "tinct"}


@pytest.fixture(scope="module")
def bare_env(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh virtual environment with tinct installed from this tree, without extras."""
    env = tmp_path_factory.mktemp("bare") / "venv"
    venv.EnvBuilder(with_pip=False).create(env)
    python = env / "bin" / "python"
    subprocess.run(
        [
            uv.find_uv_bin(),
            "pip",
            "install",
            "--quiet",
            "--refresh-package",
            "tinct",
            "--python",
            str(python),
            str(ROOT),
        ],
        check=True,
        timeout=900,
    )
    return env


@pytest.mark.parametrize(
    "command", [[], ["operator"], ["router"], ["lineage"], ["lineage", "sql"], ["emulator"]]
)
def test_every_command_helps_without_extras(bare_env: Path, command: list[str]) -> None:
    proc = subprocess.run(
        [bare_env / "bin" / "tinct", *command, "--help"], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith(f"usage: tinct {' '.join(command)}".rstrip())


def test_every_module_imports_without_extras(bare_env: Path) -> None:
    wanted = sorted(third_party_imports() - OPTIONAL)
    script = (
        "import importlib, importlib.util, pkgutil, sys, tinct\n"
        "mods = [m.name for m in pkgutil.walk_packages(tinct.__path__, 'tinct.')]\n"
        f"mods += {wanted!r}\n"
        "failed = []\n"
        "for m in mods:\n"
        "    try:\n"
        "        importlib.import_module(m)\n"
        "    except ImportError as e:\n"
        "        failed.append(f'{m}: {e}')\n"
        # The test support package (tests/support) is never part of tinct's wheel.
        "if importlib.util.find_spec('tinct_testing') is not None:\n"
        "    failed.append('tinct_testing: installed with tinct')\n"
        "print(len(mods))\n"
        "sys.exit('\\n'.join(failed) or None)\n"
    )
    proc = subprocess.run(
        [bare_env / "bin" / "python", "-c", script], capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, f"not importable without extras:\n{proc.stderr}"
    assert int(proc.stdout) > 40  # every module of the package, plus the third-party ones


def test_lineage_query_runs_without_extras(bare_env: Path, tmp_path: Path) -> None:
    proc = subprocess.run(
        [bare_env / "bin" / "tinct", "lineage", "sql", "SELECT 41 + 1 AS answer", "--root", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["answer", "42", "(1", "row)"]
