"""The Dockerfile's promises: multi-stage, pinned, non-root, and a .dockerignore that sends only
what the build copies. ``tests/integration/test_image.py`` performs its install."""

from __future__ import annotations

import os
import re

from tinct_testing.paths import ROOT


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
