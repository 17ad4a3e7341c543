"""Request targets, checked before routing, and the paths passed through to stable.

A backend may read a path differently from the router: resolve ``..``, decode ``%2f`` into a
separator, collapse ``//``, treat ``\\`` as ``/``. A path whose reading is in any such doubt
is refused (``400``), never rewritten, so what the router routes is exactly what the backend
gets. Refused, in the path (the query string is not looked at and passes as sent):

- a dot segment: ``.`` or ``..``, also with parameters (``..;x``);
- an empty segment (``//``);
- a backslash, a fragment (``#``: never part of a request target);
- ``%`` not followed by two hex digits; an encoded ``.``, ``/``, ``\\``, ``%`` or control
  character (``%2e``, ``%2f``, ``%5c``, ``%25``, ``%00``-``%1f``, ``%7f``). Other encoded
  characters pass as sent, and the path is routed decoded, as the backend reads it.

A target in absolute form (``http://host/path``) is sent on in origin form (``/path``); ``*``
is no path of the API.

Paths other than the classified ones (:data:`~tinct.router.classify.CLASSIFIED_PATHS`) reach
stable only under a pass-through prefix (:class:`PassThrough`; ``--pass-through-prefix``,
default :data:`DEFAULT_PASS_THROUGH`); any other gets ``404``, and so does a path under a
classified one (``/v1/chat/completions/``): a backend that reads it as the chat path would
answer a chat request the router never classified.

The checks cost a few substring scans per request; the byte-by-byte work runs only for a
path that contains ``%``, ``/.``, ``//`` or ``\\``.
"""

from __future__ import annotations

from collections.abc import Iterable
from urllib.parse import unquote

import httptools

from tinct.router.classify import CLASSIFIED_PATHS

#: Paths passed through to stable when no ``--pass-through-prefix`` is given: the OpenAI API.
DEFAULT_PASS_THROUGH: tuple[str, ...] = ("/v1/",)
_HEX = "0123456789abcdefABCDEF"
#: Paths under a classified path: never passed through, whatever the prefixes.
_UNDER_CLASSIFIED = tuple(p + "/" for p in sorted(CLASSIFIED_PATHS))
#: Characters a path must not carry percent-encoded: ``%``, ``.``, ``/``, ``\\`` and controls.
_NO_ENCODED = frozenset({0x25, 0x2E, 0x2F, 0x5C, 0x7F, *range(0x20)})


class PathError(Exception):
    """A request target the router refuses to route (``400``)."""


def _check_path(raw: str) -> None:
    """Refuse a path with dot or empty segments, backslashes or dangerous encodings."""
    if "\\" in raw:
        raise PathError("a backslash in the path")
    if "//" in raw:
        raise PathError("an empty segment (//) in the path")
    i = raw.find("%")
    while i >= 0:
        h = raw[i + 1 : i + 3]
        if len(h) != 2 or h[0] not in _HEX or h[1] not in _HEX:
            raise PathError("a '%' not followed by two hex digits in the path")
        if int(h, 16) in _NO_ENCODED:
            raise PathError(f"an encoded %{h.upper()} in the path")
        i = raw.find("%", i + 3)
    if "/." in raw:
        for segment in raw.split("/"):
            name = segment.split(";", 1)[0]
            if name == "." or name == "..":
                raise PathError("a dot segment in the path")


def check_target(target: bytes) -> tuple[bytes, str]:
    """(the target as sent upstream: origin-form path and query, undecoded; the path to route
    by: percent-decoded) of a request target, or :class:`PathError`."""
    # llhttp admits no byte above 0x7f in a target; str operations are the cheap ones here.
    text = target.decode("latin-1")
    if "#" in text:
        raise PathError("a fragment in the request target")
    if text[:1] == "/":
        path = text.partition("?")[0]
    elif text == "*":
        return target, text
    else:  # absolute-form: send origin-form upstream
        try:
            url = httptools.parse_url(target)
        except httptools.HttpParserInvalidURLError:
            raise PathError("the request target is not a path") from None
        if not url.schema:
            raise PathError("the request target is not a path")
        raw = url.path or b"/"
        target = raw + (b"?" + url.query if url.query else b"")
        path = raw.decode("latin-1")
    if "%" in path or "/." in path or "//" in path or "\\" in path:
        _check_path(path)
        if "%" in path:
            return target, unquote(path, "utf-8", "replace")
    return target, path


def check_prefix(prefix: str) -> str:
    """``prefix`` if it is a path the router could route (``ValueError`` saying why not)."""
    if not prefix.startswith("/") or not prefix.isascii() or any(c in prefix for c in "?#%"):
        raise ValueError(
            f"pass-through prefix {prefix!r}: give an absolute path such as /v1/, without ?, # or %"
        )
    try:
        _check_path(prefix)
    except PathError as e:
        raise ValueError(f"pass-through prefix {prefix!r}: {e}") from None
    return prefix


class PassThrough:
    """The paths passed through to stable: a prefix ending in ``/`` takes every path under it
    (``/v1/``); one without takes that path and those under it (``/health`` takes ``/health``
    and ``/health/live``, not ``/healthz``). ``/`` takes every path but those under a
    classified path."""

    __slots__ = ("_exact", "_under", "prefixes")

    def __init__(self, prefixes: Iterable[str] = DEFAULT_PASS_THROUGH) -> None:
        self.prefixes = tuple(check_prefix(p) for p in prefixes)
        self._exact = frozenset(p for p in self.prefixes if not p.endswith("/"))
        self._under = tuple(p if p.endswith("/") else p + "/" for p in self.prefixes)

    def allows(self, path: str) -> bool:
        """``path`` (decoded, as :func:`check_target` gives it) may go to stable."""
        if path.startswith(_UNDER_CLASSIFIED):
            return False
        return path.startswith(self._under) or path in self._exact


__all__ = ["DEFAULT_PASS_THROUGH", "PassThrough", "PathError", "check_prefix", "check_target"]
