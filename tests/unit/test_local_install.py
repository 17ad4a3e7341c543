"""`make dev` and `make demo` run on the lean install (tinct with its `local` and `fast` extras and
tinct_testing, no test tooling): every module they can import is installed by it.

The imports are read from the source (every ``import`` statement of ``scripts/dev.py``,
``scripts/demo.py`` and of each module of tinct and tinct_testing they reach, wherever it stands),
and each third-party one is matched to its distribution; that distribution must be in the
dependency closure of the lean install, read from the installed packages' metadata.
"""

from __future__ import annotations

import ast
import importlib.metadata as md
import importlib.util
import re
import sys
from pathlib import Path

from packaging.markers import Marker
from packaging.requirements import Requirement

from tinct_testing.paths import ROOT

ENTRIES = [ROOT / "scripts" / "dev.py", ROOT / "scripts" / "demo.py"]
#: What scripts/bootstrap.sh installs for make dev and make demo.
LEAN = [("tinct", {"local", "fast"}), ("tinct-testing", set())]
OURS = ("tinct", "tinct_testing")


def _name(dist: str) -> str:
    return re.sub(r"[-_.]+", "-", dist).lower()


def _closure(roots: list[tuple[str, set[str]]] = LEAN) -> set[str]:
    """Distributions installed by ``roots`` (name, extras): they and what they require, recursively."""
    visited: set[tuple[str, frozenset[str]]] = set()
    todo = [(dist, frozenset(extras)) for dist, extras in roots]
    while todo:
        dist, extras = todo.pop()
        if (_name(dist), extras) in visited:
            continue
        visited.add((_name(dist), extras))
        for text in md.requires(dist) or []:
            req = Requirement(text)
            marker: Marker | None = req.marker
            if marker is None or any(marker.evaluate({"extra": e}) for e in (extras or {""})):
                todo.append((req.name, frozenset(req.extras)))
    return {name for name, _ in visited}


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), str(path))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.add(node.module)
            found.update(f"{node.module}.{a.name}" for a in node.names)
    return found


def _reached() -> set[str]:
    """Top-level third-party modules imported by the entries and every own module they reach."""
    third: set[str] = set()
    done: set[Path] = set()
    todo = list(ENTRIES)
    while todo:
        path = todo.pop()
        if path in done:
            continue
        done.add(path)
        for mod in _imports(path):
            top = mod.split(".")[0]
            if top in OURS:
                spec = importlib.util.find_spec(mod) if _importable(mod) else None
                if spec is not None and spec.origin and spec.origin.endswith(".py"):
                    todo.append(Path(spec.origin))
            elif top not in sys.stdlib_module_names and top != "__future__":
                third.add(top)
    return third


def _importable(mod: str) -> bool:
    try:
        return importlib.util.find_spec(mod) is not None
    except (ImportError, ValueError):
        return False  # ``from package import name`` where name is not a module


def _outside(closure: set[str]) -> dict[str, list[str]]:
    """The third-party modules make dev and make demo import whose distribution is not in ``closure``."""
    owners = md.packages_distributions()
    outside = {}
    for top in sorted(_reached()):
        dists = {_name(d) for d in owners.get(top, [])}
        assert dists, f"{top} is imported by make dev or make demo but no installed distribution provides it"
        if not dists & closure:
            outside[top] = sorted(dists)
    return outside


def test_make_dev_and_demo_import_only_what_the_lean_install_installs() -> None:
    outside = _outside(_closure())
    assert not outside, (
        f"make dev / make demo import {outside}, which the lean install (tinct[local,fast] and "
        "tinct-testing) does not bring: add them to tinct's `local` extra or to tests/support's "
        "dependencies"
    )


def test_the_lean_install_leaves_the_test_tooling_out() -> None:
    closure = _closure()
    assert {"pyspark", "mypy", "ruff"}.isdisjoint(closure)
    assert {"moto", "boto3", "openai"} <= closure


def test_the_check_sees_a_missing_extra() -> None:
    """Without the local extra, what make dev imports for the object store is found missing."""
    outside = _outside(_closure([("tinct", {"fast"}), ("tinct-testing", set())]))
    assert {"boto3", "openai"} <= set(outside), outside
