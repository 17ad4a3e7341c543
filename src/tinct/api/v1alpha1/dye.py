"""The dye of a GrayRelease: how requests are classified into cells, and the cells themselves.

Shared by the GrayRelease (its spec) and the routing table routers read: :data:`CELL_RULES`
are the cross-field rules over ``dye`` and ``cells[].match`` both refuse alike.
"""

from __future__ import annotations

from collections.abc import Callable
from itertools import pairwise
from typing import Annotated, Any

from pydantic import Field
from pydantic.alias_generators import to_snake

from tinct.api.v1alpha1.common import Model, defaulted
from tinct.api.v1alpha1.rules import Rule, cel, cel_format, cel_list, strictly_increasing

__all__ = [
    "CELL_RULES",
    "Bucket",
    "Cell",
    "CellMatch",
    "Dye",
    "DyeMatch",
    "DyeValue",
    "HeaderName",
    "LatencyDye",
    "PromptLength",
    "RoleDye",
    "StickyKey",
    "Weight",
    "cell_key",
    "first_cell",
    "first_failing",
]

#: A dye value: a bucket, role or latency class name. ``*`` is reserved for wildcards.
DyeValue = Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$", max_length=63)]
DyeMatch = Annotated[str, Field(pattern=r"^(\*|[A-Za-z0-9][A-Za-z0-9_.-]{0,62})$", max_length=63)]
HeaderName = Annotated[str, Field(pattern=r"^[A-Za-z0-9-]+$", min_length=1, max_length=128)]
Weight = Annotated[float, Field(ge=0, le=100)]


class Bucket(Model):
    """A prompt-length bucket: requests of up to maxTokens estimated tokens."""

    name: DyeValue
    """The bucket's name, as cells match it, e.g. short."""
    max_tokens: int | None = Field(default=None, ge=1)
    """Upper bound in estimated prompt tokens (inclusive); omit it on the last, catch-all bucket."""


_BOUNDED = "self.buckets.filter(b, has(b.maxTokens))"


class PromptLength(Model):
    """Buckets of the request's estimated prompt length (characters of the messages or prompt
    divided by charsPerToken), from the shortest to the catch-all."""

    model_config = cel(
        Rule(
            cel="self.buckets.all(b, self.buckets.exists_one(o, o.name == b.name))",
            holds=lambda s: len({b.name for b in s.buckets}) == len(s.buckets),
            message="bucket names must be unique",
            field_path=".buckets",
        ),
        Rule(
            cel="!has(self.buckets[size(self.buckets) - 1].maxTokens)",
            holds=lambda s: s.buckets[-1].max_tokens is None,
            message="the last bucket is the catch-all: leave its maxTokens out",
            field_path=".buckets",
        ),
        Rule(
            cel="self.buckets.filter(b, !has(b.maxTokens)).size() <= 1",
            holds=lambda s: sum(b.max_tokens is None for b in s.buckets) <= 1,
            message="only the last bucket may leave maxTokens out",
            field_path=".buckets",
        ),
        Rule(
            # Sorted, and no bound twice: strictly increasing.
            cel=f"{_BOUNDED}.map(b, b.maxTokens).isSorted() && "
            f"{_BOUNDED}.all(x, {_BOUNDED}.exists_one(o, o.maxTokens == x.maxTokens))",
            holds=lambda s: strictly_increasing(b.max_tokens for b in s.buckets if b.max_tokens is not None),
            message="bucket maxTokens must strictly increase from one bucket to the next",
            field_path=".buckets",
        ),
    )

    buckets: list[Bucket] = Field(min_length=1, max_length=16)
    """1 to 16 buckets with strictly increasing maxTokens; the last has none and takes the rest."""
    chars_per_token: float = Field(default=4.0, gt=0, le=64)
    """Characters counted as one token when estimating a prompt's length (default 4)."""


_DEFAULT_LISTED = Rule(
    cel="self.default in self.values",
    holds=lambda s: s.default in s.values,
    message="default must be one of values",
)


class RoleDye(Model):
    """The caller's role, from a header a trusted gateway sets."""

    model_config = cel(_DEFAULT_LISTED)

    header: HeaderName = "X-User-Role"
    """Header carrying the caller's role, set by a gateway (default X-User-Role); the router believes it only
    from peers it is told to trust (tinct router --trust-role-from)."""
    values: list[DyeValue] = Field(default_factory=lambda: ["user"], min_length=1, max_length=32)
    """The roles cells may match (default [user]); any other value counts as the default."""
    default: DyeValue = "user"
    """Role of a request without the header, or from an untrusted peer (default user)."""


class LatencyDye(Model):
    """The request's latency class, from a header, or derived from stream: true."""

    model_config = cel(
        _DEFAULT_LISTED,
        Rule(
            cel="!has(self.streamClass) || self.streamClass in self.values",
            holds=lambda s: s.stream_class is None or s.stream_class in s.values,
            message="streamClass must be one of values",
        ),
    )

    header: HeaderName = "X-Latency-Class"
    """Header carrying the latency class (default X-Latency-Class)."""
    values: list[DyeValue] = Field(default_factory=lambda: ["low", "high"], min_length=1, max_length=16)
    """The classes cells may match (default [low, high]); any other value counts as the default."""
    default: DyeValue = "low"
    """Class of a request without the header (default low)."""
    stream_class: DyeValue | None = None
    """Class given to requests with stream: true and no header."""


class StickyKey(Model):
    """What keeps a caller on one side: requests with the same key land on the same side."""

    header: HeaderName = "X-Session-Id"
    """Header whose value is hashed with the release's name (default X-Session-Id); requests without it are
    assigned at random."""


class Dye(Model):
    """How the router classifies each request into a dye tag: prompt-length bucket x caller
    role x latency class."""

    prompt_length: PromptLength
    """Prompt-length buckets."""
    role: RoleDye = defaulted(RoleDye)
    latency: LatencyDye = defaulted(LatencyDye)
    sticky_key: StickyKey = defaulted(StickyKey)


class CellMatch(Model):
    """Which requests a cell takes; an omitted field or * matches anything, and the most
    specific matching cell wins."""

    prompt_length: DyeMatch | None = None
    """A bucket name of dye.promptLength, or *."""
    role: DyeMatch | None = None
    """One of dye.role.values, or *."""
    latency: DyeMatch | None = None
    """One of dye.latency.values, or *."""


class Cell(Model):
    """A dye cell, its candidate weight at each step, and the share of its stable requests
    mirrored to the candidate at each step."""

    model_config = cel(
        # Only for weights in range: a weight over 100 is refused once, by the schema's maximum.
        Rule(
            cel="self.weights.exists(w, w < 0.0 || w > 100.0) || self.weights.isSorted()",
            holds=lambda s: (
                any(not 0 <= w <= 100 for w in s.weights) or all(a <= b for a, b in pairwise(s.weights))
            ),
            message="weights must never decrease from one step to the next",
            field_path=".weights",
        ),
        Rule(
            cel="!has(self.shadow) || size(self.shadow) == size(self.weights)",
            holds=lambda s: s.shadow is None or len(s.shadow) == len(s.weights),
            message="shadow needs one share per step, as many as weights",
            field_path=".shadow",
        ),
    )

    match: CellMatch = defaulted(CellMatch)
    weights: list[Weight] = Field(min_length=1, max_length=64)
    """Percent of this cell's traffic sent to the candidate at each step."""
    shadow: list[Weight] | None = Field(default=None, max_length=64)
    """Percent of the requests of this cell that stable answers which are also sent to the candidate
    (mirrored) at each step, one per step like weights; may go up or down. The client gets stable's answer;
    the comparer compares both (spec.shadow, the shadow-agreement metric). A step with weight 0 and shadow
    above 0 is dark: the candidate answers no one. Omitted: 0 at every step."""


def _wild(value: str | None) -> bool:
    return value is None or value == "*"


def _is_default(match: CellMatch) -> bool:
    return _wild(match.prompt_length) and _wild(match.role) and _wild(match.latency)


_IS_DEFAULT_CELL = (
    "(!has(c.match.promptLength) || c.match.promptLength == '*') && "
    "(!has(c.match.role) || c.match.role == '*') && "
    "(!has(c.match.latency) || c.match.latency == '*')"
)


def cell_key(match: CellMatch) -> str:
    """A cell's name in status and history: its dye tag with ``*`` for what it does not fix."""

    def v(x: str | None) -> str:
        return x if x else "*"

    return f"len:{v(match.prompt_length)}+role:{v(match.role)}+latency:{v(match.latency)}"


def _cel_dye(c: str, field: str) -> str:
    """CEL: the cell ``c``'s match of ``field``, ``*`` when omitted."""
    return f"(has({c}.match.{field}) ? {c}.match.{field} : '*')"


def _cel_same(a: str, b: str) -> str:
    """CEL: cells ``a`` and ``b`` match alike (an omitted field is ``*``)."""
    return " && ".join(f"{_cel_dye(a, f)} == {_cel_dye(b, f)}" for f in ("promptLength", "role", "latency"))


def first_failing(pred: str) -> str:
    """CEL: the index of the first cell ``c`` for which ``pred`` is false."""
    return f"self.cells.map(c, {pred}).indexOf(false)"


def first_cell(cells: list[Any], ok: Callable[[Any], bool]) -> int:
    return next(i for i, c in enumerate(cells) if not ok(c))


def _dye_rule(
    field: str, allowed: Callable[[Any], list[str]], allowed_cel: str, what: str, pred: str | None = None
) -> Rule:
    """A cell's ``match.<field>`` must be one of the dye's values (``*`` and omitted match any)."""
    attr = to_snake(field)
    pred = pred or f"!has(c.match.{field}) || c.match.{field} == '*' || c.match.{field} in {allowed_cel}"

    def ok(s: Any) -> Callable[[Any], bool]:
        return lambda c: _wild(getattr(c.match, attr)) or getattr(c.match, attr) in allowed(s)

    def describe(s: Any) -> str:
        i = first_cell(s.cells, ok(s))
        value = getattr(s.cells[i].match, attr)
        return f'cells[{i}].match.{field} "{value}" is not {what} {cel_list(allowed(s))}'

    index = first_failing(pred)
    return Rule(
        cel=f"self.cells.all(c, {pred})",
        holds=lambda s: all(ok(s)(c) for c in s.cells),
        message=f"a cell's match.{field} must be {what}",
        field_path=".cells",
        message_expression=cel_format(
            f'cells[%d].match.{field} "%s" is not {what} %s',
            index,
            f"self.cells[{index}].match.{field}",
            allowed_cel,
        ),
        describe=describe,
    )


def _same_match(s: Any) -> int | None:
    """The last cell whose match an earlier cell has too."""
    keys = [cell_key(c.match) for c in s.cells]
    return next((i for i in range(len(keys) - 1, -1, -1) if keys.count(keys[i]) > 1), None)


def _describe_same_match(s: Any) -> str:
    i = _same_match(s)
    assert i is not None
    return (
        f"cells[{i}] has the same match as an earlier cell ({cell_key(s.cells[i].match)}): "
        "the router would follow one of them only; give each cell its own match"
    )


_UNIQUE_MATCH = f"self.cells.exists_one(o, {_cel_same('o', 'c')})"
_LAST_REPEATED = f"self.cells.map(c, {_UNIQUE_MATCH}).lastIndexOf(false)"

#: Rules over ``dye`` and ``cells[].match`` only, shared by GrayReleaseSpec and the routing table.
CELL_RULES = (
    Rule(
        cel=f"self.cells.filter(c, {_IS_DEFAULT_CELL}).size() == 1",
        holds=lambda s: sum(_is_default(c.match) for c in s.cells) == 1,
        message="exactly one default cell (match: {}) is required",
        field_path=".cells",
    ),
    Rule(
        cel=f"self.cells.all(c, {_UNIQUE_MATCH})",
        holds=lambda s: _same_match(s) is None,
        message="each cell needs its own match",
        field_path=".cells",
        # The last repeated cell. (Naming the cell it repeats too costs more than the API server
        # allows a message; cel.bind would name the index once, but a variable it binds is not
        # seen inside has() nor after a nested map.)
        message_expression=cel_format(
            "cells[%d] has the same match as an earlier cell (len:%s+role:%s+latency:%s): the router "
            "would follow one of them only; give each cell its own match",
            _LAST_REPEATED,
            *(
                f"self.cells.map(c, {_cel_dye('c', f)})[{_LAST_REPEATED}]"
                for f in ("promptLength", "role", "latency")
            ),
        ),
        describe=_describe_same_match,
    ),
    _dye_rule(
        "promptLength",
        lambda s: [b.name for b in s.dye.prompt_length.buckets],
        "self.dye.promptLength.buckets.map(b, b.name)",
        "a bucket of dye.promptLength",
        pred="!has(c.match.promptLength) || c.match.promptLength == '*' || "
        "self.dye.promptLength.buckets.exists(b, b.name == c.match.promptLength)",
    ),
    _dye_rule("role", lambda s: list(s.dye.role.values), "self.dye.role.values", "one of dye.role.values"),
    _dye_rule(
        "latency",
        lambda s: list(s.dye.latency.values),
        "self.dye.latency.values",
        "one of dye.latency.values",
    ),
)
