"""A JSON document read as a stream, in bounded memory, whatever it contains.

:class:`JsonStream` pulls the events of ``ijson`` (its C backend, yajl) and lets a reader
walk the document: :meth:`~JsonStream.object_keys` of an object, :meth:`~JsonStream.array_items` of an
array, :meth:`~JsonStream.value` of a part small enough to build (within a budget),
:meth:`~JsonStream.skip` of the rest. Nothing is built that the reader did not ask for, so a
64 MiB ``tokenizer.json`` costs what its reader keeps, not eleven times the file.

Two things would still cost memory in proportion to the file, and are capped
(:mod:`~tinct.artifacts.limits`): one string or number, which the parser holds whole
(:data:`~tinct.artifacts.limits.JSON_MAX_TOKEN`: a run of the file without a string boundary
is at most that long), and the nesting (:data:`~tinct.artifacts.limits.JSON_MAX_DEPTH`).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Protocol

import ijson

from tinct.artifacts.limits import JSON_MAX_DEPTH, JSON_MAX_TOKEN, LimitExceededError

__all__ = ["JsonStream", "Readable"]

_CHUNK = 64 * 1024
_OPEN = frozenset(("start_map", "start_array"))
_CLOSE = frozenset(("end_map", "end_array"))
_KIND = {
    "start_map": "object",
    "start_array": "array",
    "string": "string",
    "number": "number",
    "boolean": "boolean",
    "null": "null",
}


class Readable(Protocol):
    def read(self, n: int = -1) -> bytes: ...


class _TokenGuard:
    """Passes reads through, failing once a run without an unescaped ``"`` is too long.

    Every string of the document lies between two such quotes, and so does every number,
    so no token the parser has to hold whole is longer than the longest run.
    """

    def __init__(self, raw: Readable, limit: int) -> None:
        self._raw = raw
        self._limit = limit
        self._run = 0
        self._pending = b""  # trailing backslashes, whose meaning the next chunk decides

    def read(self, n: int = -1) -> bytes:
        if n == 0:  # how ijson tells bytes from text
            return b""
        data = self._raw.read(min(n, _CHUNK) if n > 0 else _CHUNK)
        buf = self._pending + data
        body = buf.rstrip(b"\\") if data else buf
        self._pending = buf[len(body) :]
        body = body.replace(b"\\\\", b"..").replace(b'\\"', b"..")
        first = body.find(b'"')
        if first < 0:
            self._run += len(body)
        else:
            self._check(self._run + first)
            self._run = len(body) - body.rfind(b'"') - 1
        self._check(self._run)
        return data

    def _check(self, run: int) -> None:
        if run > self._limit:
            raise LimitExceededError("a JSON string or number", "JSON_MAX_TOKEN", self._limit, "bytes")


def _reason(exc: Exception) -> str:
    """The parser's complaint without the excerpt of the file it quotes after it."""
    text = str(exc).strip()
    if text[:2] in ("b'", 'b"'):
        text = text[2:]
    first = text.replace("\\n", "\n").split("\n")[0].strip()
    return first or type(exc).__name__


class JsonStream:
    """The events of one JSON document from ``raw``, walked by a reader.

    Every method raises ValueError when the document is not JSON (or does not have the
    shape asked for) and :class:`~tinct.artifacts.limits.LimitExceededError` past a cap.
    """

    def __init__(self, raw: Readable, what: str = "") -> None:
        self._events = ijson.basic_parse(_TokenGuard(raw, JSON_MAX_TOKEN), buf_size=_CHUNK)
        self._peeked: tuple[str, Any] | None = None
        self._depth = 0
        self.what = what

    def _pull(self) -> tuple[str, Any]:
        try:
            event: tuple[str, Any] = next(self._events)
        except StopIteration:
            raise ValueError(f"{self.what}not JSON: it ends early") from None
        except ijson.JSONError as exc:
            raise ValueError(f"{self.what}not JSON: {_reason(exc)}") from None
        return event

    def _next(self) -> tuple[str, Any]:
        if self._peeked is not None:
            event, self._peeked = self._peeked, None
        else:
            event = self._pull()
        kind = event[0]
        if kind in _OPEN:
            self._depth += 1
            if self._depth > JSON_MAX_DEPTH:
                raise LimitExceededError("nested too deeply", "JSON_MAX_DEPTH", JSON_MAX_DEPTH, "levels")
        elif kind in _CLOSE:
            self._depth -= 1
        return event

    def kind(self) -> str:
        """What the next value is: object, array, string, number, boolean or null."""
        if self._peeked is None:
            self._peeked = self._pull()
        return _KIND.get(self._peeked[0], self._peeked[0])

    def object_keys(self) -> Iterator[str]:
        """The keys of the object that comes next; read or skip each one's value in turn."""
        if self.kind() != "object":
            raise ValueError(f"{self.what}not a JSON object")
        self._next()
        while True:
            event, key = self._next()
            if event == "end_map":
                return
            yield key

    def array_items(self) -> Iterator[int]:
        """The positions of the array that comes next; read or skip each item in turn."""
        if self.kind() != "array":
            raise ValueError(f"{self.what}not a JSON array")
        self._next()
        i = 0
        while self.kind() != "end_array":
            yield i
            i += 1
        self._next()

    def value(self, limit: int, what: str, cap: str | None = None) -> Any:
        """The next value, built, if it has at most ``limit`` units (a character of a string
        or key, or a value); else a LimitExceededError for ``cap``, or a ValueError."""
        units = 0
        stack: list[Any] = []
        keys: list[str] = []
        while True:
            event, val = self._next()
            units += 1 + (len(val) if isinstance(val, str) else 0)
            if units > limit:
                if cap is not None:
                    raise LimitExceededError(what, cap, limit, "characters")
                raise ValueError(f"{what} is larger than {limit:,} characters")
            if event == "map_key":
                keys[-1] = val
                continue
            if event in _OPEN:
                stack.append({} if event == "start_map" else [])
                keys.append("")
                continue
            if event in _CLOSE:
                val = stack.pop()
                keys.pop()
            if not stack:
                return val
            parent = stack[-1]
            if isinstance(parent, list):
                parent.append(val)
            else:
                parent[keys[-1]] = val

    def skip(self) -> None:
        """Read past the next value without keeping any of it."""
        event, _ = self._next()
        depth = 1 if event in _OPEN else 0
        while depth:
            event, _ = self._next()
            if event in _OPEN:
                depth += 1
            elif event in _CLOSE:
                depth -= 1

    def end(self) -> None:
        """Check that nothing but white space follows the document."""
        if self._peeked is not None:
            raise ValueError(f"{self.what}not JSON: more than one document")
        try:
            next(self._events)
        except StopIteration:
            return
        except ijson.JSONError as exc:
            raise ValueError(f"{self.what}not JSON: {_reason(exc)}") from None
        raise ValueError(f"{self.what}not JSON: more than one document")
