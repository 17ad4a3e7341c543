"""Cross-field rules, each defined once: the CEL the API server runs and the Python check.

A :class:`Rule` pairs a CEL expression with the same condition in Python (``holds``) and
one message. A rule whose message must name what was given (the cell, the value, the
allowed values) carries that message twice too: as a CEL ``messageExpression`` the API
server evaluates, and as ``describe``, the same words from the pydantic model. A model lists its rules with ``model_config = cel(rule, ...)``; from that one
list come

- the CRD's ``x-kubernetes-validations`` (:func:`cel` sets the model's JSON-schema extra,
  which :mod:`tinct.api.crd` keeps), so ``kubectl apply`` refuses a broken object, and
- a check run whenever pydantic validates the model (:class:`~.common.Model` calls
  :func:`broken`), so the operator, the routing table and anything else built from the
  models refuse the same objects with the same message, outside the API server too.

Rules that only mention fields two models share (say ``dye`` and ``cells[].match``) can be
listed by both: the routing table reuses the GrayRelease's cell rules this way.

``tests/k8s/test_rules_parity.py`` runs every rule of the GrayRelease through the real API
server and through the models on the same inputs, so the two halves of a rule cannot drift.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from itertools import pairwise
from typing import Any

from pydantic import BaseModel, ConfigDict, JsonValue

__all__ = [
    "Rule",
    "Rules",
    "broken",
    "cel",
    "cel_format",
    "cel_list",
    "rules_of",
    "strictly_increasing",
    "walk_rules",
]


@dataclass(frozen=True)
class Rule:
    """One cross-field rule of a model.

    Attributes:
        cel: the CEL expression over ``self`` (camelCase field names), as the API server runs it.
        message: what is wrong, shown by the API server and by the Python check alike; with
            a message expression, the API server's fallback and the rule's name in tests.
        holds: the same condition over the pydantic model (snake_case attributes).
        field_path: the field the API server names in its error, e.g. ``.buckets``.
        message_expression: CEL building the message from ``self`` (naming the offending
            value, its index, what is allowed), evaluated only when the rule fails.
        describe: the same message built from the pydantic model that breaks the rule.
    """

    cel: str
    message: str
    holds: Callable[[Any], bool]
    field_path: str | None = None
    message_expression: str | None = None
    describe: Callable[[Any], str] | None = None

    def __post_init__(self) -> None:
        if (self.message_expression is None) != (self.describe is None):
            raise ValueError(f"rule {self.message!r}: give message_expression and describe together")

    def wire(self) -> dict[str, JsonValue]:
        """The ``x-kubernetes-validations`` entry."""
        out: dict[str, JsonValue] = {"rule": self.cel, "message": self.message}
        if self.message_expression:
            out["messageExpression"] = self.message_expression
        if self.field_path:
            out["fieldPath"] = self.field_path
        return out

    def explain(self, model: Any = None) -> str:
        """The message (about ``model``, when the rule describes it) prefixed by the field it
        concerns, relative to the model."""
        message = self.describe(model) if self.describe is not None and model is not None else self.message
        return f"{self.field_path.lstrip('.')}: {message}" if self.field_path else message


class Rules:
    """The rules of one model; pydantic calls it to add them to the model's JSON schema."""

    def __init__(self, rules: Iterable[Rule]) -> None:
        self.rules = tuple(rules)

    def __call__(self, schema: dict[str, JsonValue]) -> None:
        schema["x-kubernetes-validations"] = [r.wire() for r in self.rules]


def cel_format(template: str, *args: str) -> str:
    """A CEL message expression: ``template`` (``%s``/``%d``) formatted with the CEL ``args``.

    The API server estimates the cost of ``'a' + string(x)`` as if the string could be
    unbounded, and refuses it; ``'a %d'.format([x])`` it bounds.
    """
    quoted = template.replace("\\", "\\\\").replace('"', '\\"')
    return f'"{quoted}".format([{", ".join(args)}])'


def cel_list(values: Iterable[str]) -> str:
    """A list of strings as CEL's ``%s`` shows one: ``["a", "b"]``."""
    return "[" + ", ".join(f'"{v}"' for v in values) + "]"


def cel(*rules: Rule) -> ConfigDict:
    """Model config carrying ``rules``: CEL in the CRD schema, checked in Python on validation."""
    return ConfigDict(json_schema_extra=Rules(rules))


def rules_of(cls: type[BaseModel]) -> tuple[Rule, ...]:
    """The rules ``cls`` declares with :func:`cel` (none for other models)."""
    extra = cls.model_config.get("json_schema_extra")
    return extra.rules if isinstance(extra, Rules) else ()


def broken(model: BaseModel) -> list[Rule]:
    """The rules of ``model``'s own class that ``model`` breaks (nested models check themselves)."""
    return [r for r in rules_of(type(model)) if not r.holds(model)]


def walk_rules(cls: type[BaseModel]) -> Iterator[tuple[type[BaseModel], Rule]]:
    """Every rule of ``cls`` and of the models its fields hold, each model once."""
    seen: set[type[BaseModel]] = set()
    todo = [cls]
    while todo:
        current = todo.pop()
        if current in seen:
            continue
        seen.add(current)
        yield from ((current, r) for r in rules_of(current))
        for field in current.model_fields.values():
            todo.extend(_models_in(field.annotation))


def _models_in(annotation: Any) -> Iterator[type[BaseModel]]:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        yield annotation
    for arg in getattr(annotation, "__args__", ()):
        yield from _models_in(arg)


def strictly_increasing(values: Iterable[float]) -> bool:
    return all(a < b for a, b in pairwise(values))
