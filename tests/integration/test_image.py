"""The container image's install, performed here without a container engine.

The Dockerfile builds a wheel of tinct with pip from a throwaway virtualenv and installs
it into a virtualenv created without pip; the final stage is that virtualenv on the slim
Python base. This test does the same in a
fresh virtualenv outside the source tree (without extras: the base dependencies must be
enough) and runs both entry points the chart uses. ``tests/unit/test_dockerfile.py`` checks
the Dockerfile's promises.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from tinct_testing.paths import ROOT


def _run(*args: str, cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(args, cwd=cwd, env=env, text=True, capture_output=True, timeout=600)
    assert proc.returncode == 0, f"{' '.join(args)} failed:\n{proc.stdout}\n{proc.stderr}"
    return proc


def test_wheel_installs_into_a_bare_virtualenv_and_both_commands_run(tmp_path: Path) -> None:
    wheels = tmp_path / "wheels"
    _run(
        sys.executable,
        "-m",
        "pip",
        "wheel",
        "--quiet",
        "--no-deps",
        "--wheel-dir",
        str(wheels),
        str(ROOT),
        cwd=tmp_path,
    )
    (wheel,) = wheels.glob("tinct-*.whl")

    venv = tmp_path / "venv"
    _run(sys.executable, "-m", "venv", "--without-pip", str(venv), cwd=tmp_path)
    # The Dockerfile installs with pip --python; uv does the same install from its warm cache.
    uv = shutil.which("uv", path=str(Path(sys.executable).parent)) or "uv"
    _run(uv, "pip", "install", "--quiet", "--python", str(venv / "bin" / "python"), str(wheel), cwd=tmp_path)

    site = next((venv / "lib").glob("python3*/site-packages"))
    installed = {p.name.split("-")[0].lower() for p in site.glob("*.dist-info")}
    assert "tinct" in installed
    assert not installed & {"pip", "setuptools", "wheel", "hatchling"}, "no build tools in the runtime"
    assert not installed & {"pytest", "moto", "uvloop"}, "no test dependencies or extras"

    env = {"PATH": f"{venv / 'bin'}:/usr/bin:/bin", "HOME": str(tmp_path)}
    tinct = str(venv / "bin" / "tinct")
    where = _run(
        str(venv / "bin" / "python"), "-c", "import tinct; print(tinct.__file__)", cwd=tmp_path, env=env
    ).stdout
    assert where.startswith(str(site)), "imported from the install, not the source tree"
    assert _run(tinct, "--version", cwd=tmp_path, env=env).stdout.strip() == "tinct 0.1.0"
    op = _run(tinct, "operator", "--help", cwd=tmp_path, env=env).stdout
    assert "--peering" in op
    assert "--liveness" in op
    assert "--lineage-root" in op
    router = _run(tinct, "router", "--help", cwd=tmp_path, env=env).stdout
    assert "--watch" in router
    assert "--selector" in router
    emulator = _run(tinct, "emulator", "--help", cwd=tmp_path, env=env).stdout
    assert "no model runs" in emulator
