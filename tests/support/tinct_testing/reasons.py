"""Every condition or Event reason the operator can set, found in its source.

The reasons are string literals in a handful of shapes — a :class:`Problem`'s or a
``Transition``'s reason, ``reason=`` of a Condition or an Event, a condition set through a
helper, a compatibility rule, a (status, reason, message) or (type, reason, message) tuple —
so reading the syntax trees finds them without a list kept by hand beside the code.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

#: A reason: one CamelCase word, as Kubernetes writes them (an acronym may lead: KEDANotInstalled).
_CAMEL = re.compile(r"^[A-Z][A-Za-z0-9]*[a-z][A-Za-z0-9]*$")
#: Calls whose positional argument at this index is a reason.
_POSITIONAL = {
    "Problem": 1,
    "Transition": 0,
    "_fail": 0,
    "Failure": 1,
    "wait": 0,
    "rollback": 0,
    "condition": 2,
    "cond": 2,
    "Rule": 0,  # the compatibility rules of tinct.artifacts.compat (the CEL Rule takes keywords)
    "_report_transient": 2,
    "_report_waiting": 2,
    "BaseMismatch": 0,  # why a LoRA adapter does not fit its base (tinct.artifacts.lora)
}
_STATUSES = ("True", "False", "Unknown")


def _strings(node: ast.AST | None) -> Iterator[str]:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        yield node.value
    elif isinstance(node, ast.IfExp):
        yield from _strings(node.body)
        yield from _strings(node.orelse)


def _message(node: ast.AST) -> bool:
    """A sentence: a string with a space, or an f-string."""
    return isinstance(node, ast.JoinedStr) or " " in next(_strings(node), "")


def _name(call: ast.Call) -> str | None:
    f = call.func
    return f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else None


def _candidates(tree: ast.AST, types: set[str]) -> Iterator[str]:
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            i = _POSITIONAL.get(_name(node) or "")
            if i is not None and len(node.args) > i:
                yield from _strings(node.args[i])
            for kw in node.keywords:
                if kw.arg == "reason":
                    yield from _strings(kw.value)
        elif isinstance(node, ast.Assign | ast.AnnAssign) and node.value is not None:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names = [t.attr if isinstance(t, ast.Attribute) else getattr(t, "id", "") for t in targets]
            if any(n.endswith("reason") for n in names):
                yield from _strings(node.value)  # foreign_reason = "ForeignScaledObject"
        elif isinstance(node, ast.Tuple) and node.elts:
            first = next(_strings(node.elts[0]), None)
            if len(node.elts) == 3 and (first in _STATUSES or first in types):
                yield from _strings(node.elts[1])
            elif len(node.elts) == 2 and first and _message(node.elts[1]):
                yield first  # (reason, message)


def _types(tree: ast.AST) -> Iterator[str]:
    """Condition types: a Problem's, ``type=`` of a Condition, the first argument of a helper."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            name = _name(node)
            if name in ("Problem", "condition", "cond") and node.args:
                yield from _strings(node.args[0])
            for kw in node.keywords:
                if kw.arg == "type":
                    yield from _strings(kw.value)


def reasons(src: Path) -> set[str]:
    trees = [ast.parse(p.read_text()) for p in sorted(src.rglob("*.py"))]
    types = {t for tree in trees for t in _types(tree)} | {"ModelVersionsReady", "BackendsAvailable"}
    found = {r for tree in trees for r in _candidates(tree, types)}
    return {r for r in found if _CAMEL.match(r) and r not in _STATUSES}
