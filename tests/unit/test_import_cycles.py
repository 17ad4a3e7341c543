"""The modules of ``tinct`` import one another as a stack: no import cycle, however hidden.

Every module under ``src/tinct`` is parsed (not imported) and every ``import`` statement in
it counts, wherever it stands: at module level, inside a function (a lazy import that dodges
a cycle at run time still ties the two modules together), or under ``TYPE_CHECKING``. The
graph's strongly connected components with more than one module are the cycles.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Mapping
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src"


def modules(root: Path, package: str = "tinct") -> dict[str, Path]:
    """Dotted name -> file of every module of ``package`` below ``root``."""
    found: dict[str, Path] = {}
    for path in sorted((root / package).rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def _owner(name: str, known: Mapping[str, Path]) -> str | None:
    """The module ``name`` is, or lives in (``a.b.C`` -> ``a.b``); None outside ``known``."""
    while name and name not in known:
        name = name.rpartition(".")[0]
    return name or None


def imports(name: str, path: Path, known: Mapping[str, Path]) -> set[str]:
    """The modules of ``known`` that module ``name`` (at ``path``) imports, anywhere in it."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        targets: Iterable[str]
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*up, base] if base else up)
            # ``from a.b import c`` imports module ``a.b.c`` when there is one, else ``a.b``.
            targets = [
                f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base for alias in node.names
            ]
        else:
            continue
        for target in targets:
            owner = _owner(target, known)
            if owner is not None and owner != name:
                out.add(owner)
    return out


def import_graph(root: Path, package: str = "tinct") -> dict[str, set[str]]:
    known = modules(root, package)
    return {name: imports(name, path, known) for name, path in known.items()}


def cycles(graph: Mapping[str, set[str]]) -> list[frozenset[str]]:
    """Strongly connected components of more than one module (Tarjan's, without recursion)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[frozenset[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work: list[tuple[str, list[str]]] = []
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        work.append((start, sorted(graph[start])))
        while work:
            node, todo = work[-1]
            if todo:
                nxt = todo.pop()
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, sorted(graph.get(nxt, ()))))
                elif nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component: set[str] = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.add(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(frozenset(component))
    return found


def _describe(cycle: frozenset[str], graph: Mapping[str, set[str]]) -> str:
    return "; ".join(f"{m} -> {', '.join(sorted(graph[m] & cycle))}" for m in sorted(cycle))


def test_tinct_modules_import_one_another_without_cycles() -> None:
    graph = import_graph(SRC)
    found = cycles(graph)
    assert not found, "import cycles among tinct modules:\n" + "\n".join(_describe(c, graph) for c in found)


def test_graph_holds_lazy_and_type_checking_imports() -> None:
    graph = import_graph(SRC)
    assert "tinct.router.cli" in graph["tinct.cli"]  # inside a function
    assert "tinct.router.connection" in graph["tinct.router.exchange"]  # under TYPE_CHECKING
    assert "tinct.api.routing" in graph["tinct.router.table"]  # at module level


def test_a_cycle_through_a_function_level_import_is_found(tmp_path: Path) -> None:
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from pkg.sub.b import thing\n")
    (pkg / "sub" / "b.py").write_text("def thing():\n    from ..c import other\n    return other\n")
    (pkg / "c.py").write_text("import pkg.a\nother = 1\n")
    (pkg / "d.py").write_text("from pkg import a, c\n")
    graph = import_graph(tmp_path, "pkg")
    assert graph["pkg.d"] == {"pkg.a", "pkg.c"}
    assert cycles(graph) == [frozenset({"pkg.a", "pkg.sub.b", "pkg.c"})]
