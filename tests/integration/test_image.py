"""The container image's install, performed here without a container engine.

The Dockerfile builds a wheel of tinct with pip from a throwaway virtualenv and installs
it into a virtualenv created without pip; the final stage is that virtualenv on the slim
Python base. This test does the same in a
fresh virtualenv outside the source tree (without extras: the base dependencies must be
enough) and runs both entry points the chart uses, then checks the Dockerfile's promises.
"""

from __future__ import annotations

import os
import re
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


def _stages(dockerfile: str) -> list[str]:
    return re.split(r"(?m)^FROM ", dockerfile)[1:]


def test_dockerfile_is_multistage_pinned_and_non_root() -> None:
    text = (ROOT / "Dockerfile").read_text()
    base = re.search(r"(?m)^ARG PYTHON_IMAGE=(\S+)$", text)
    assert base, "the base image is one ARG"
    assert re.fullmatch(r"python:3\.\d+\.\d+-slim-\w+", base.group(1)), (
        f"not pinned by version: {base.group(1)}"
    )
    stages = _stages(text)
    assert len(stages) == 2
    assert stages[0].startswith("${PYTHON_IMAGE} AS build")
    final = stages[1]
    assert final.startswith("${PYTHON_IMAGE}\n")
    assert "COPY --from=build /opt/tinct /opt/tinct" in final
    assert re.search(r"(?m)^USER 10001:10001$", final), "runs as a numeric non-root user"
    assert 'ENTRYPOINT ["tinct"]' in final
    for tool in ("gcc", "build-essential", "apt-get install", "pip install", "pip wheel"):
        assert tool not in final, f"{tool} in the final stage"
    assert "pip uninstall" in final, "the base image's pip is removed from the runtime"


def test_dockerignore_sends_only_what_the_build_copies() -> None:
    lines = [x for x in (ROOT / ".dockerignore").read_text().splitlines() if x and not x.startswith("#")]
    assert lines[0] == "*"
    assert {"!pyproject.toml", "!README.md", "!src/"} <= set(lines)
    copied = re.findall(r"(?m)^COPY (?!--from)(.+) \S+$", (ROOT / "Dockerfile").read_text())
    sources = {s for line in copied for s in line.split()}
    assert sources == {"pyproject.toml", "README.md", "src"}
    assert os.path.exists(ROOT / "README.md")
