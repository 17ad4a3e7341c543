"""The docs site builds in strict mode, and every page is in its navigation.

``mkdocs build --strict`` fails on a link to a page or an anchor that does not exist, on a page
left out of ``nav`` and on a snippet (the README's walk-through) that is not found; it takes a
few seconds, so it runs with the unit tests.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

from tinct_testing.paths import ROOT

DOCS = ROOT / "docs"


def _nav_pages(node: Any) -> Iterator[str]:
    if isinstance(node, str):
        yield node
    elif isinstance(node, list):
        for item in node:
            yield from _nav_pages(item)
    elif isinstance(node, dict):
        for value in node.values():
            yield from _nav_pages(value)


def test_every_page_is_in_the_nav_once() -> None:
    nav = list(_nav_pages(yaml.safe_load((ROOT / "mkdocs.yml").read_text())["nav"]))
    pages = sorted(str(p.relative_to(DOCS)) for p in DOCS.rglob("*.md"))
    assert sorted(nav) == pages
    assert len(nav) == len(set(nav)), "a page listed twice"


def test_the_site_builds_in_strict_mode(tmp_path: Path) -> None:
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert "WARNING" not in done.stderr, done.stderr
    walkthrough = (tmp_path / "site" / "getting-started" / "index.html").read_text()
    assert "<code>tests/k8s/test_walkthrough.py</code>" in walkthrough, (
        "the README's walk-through is included"
    )
    assert (tmp_path / "site" / "reference" / "crds" / "index.html").is_file()
