"""What every format reader shares: the file it reads, the facts it returns, the error it raises.

The readers (:mod:`~tinct.artifacts.safetensors_header`, :mod:`~tinct.artifacts.onnx_wire`,
:mod:`~tinct.artifacts.ptx`, :mod:`~tinct.artifacts.tokenizer`) sit on this module and
:mod:`~tinct.artifacts.jsonstream`; :mod:`~tinct.artifacts.formats` picks one per format.
"""

from __future__ import annotations

from typing import Any, Protocol

from tinct.artifacts.limits import LimitExceededError

__all__ = ["WINDOW", "Facts", "FormatError", "RandomAccess", "Window"]

#: What one file says about the interface: JSON-ready (str keys, lists, ints, strings).
Facts = dict[str, Any]

#: Bytes of one buffered read.
WINDOW = 64 * 1024


class FormatError(Exception):
    """The artifact at ``uri`` is not a valid ``fmt`` file; ``limit`` names the cap it is
    over (:mod:`~tinct.artifacts.limits`), if that is why."""

    def __init__(self, uri: str, fmt: str, detail: str, limit: str | None = None) -> None:
        super().__init__(uri, fmt, detail)
        self.uri = uri
        self.fmt = fmt
        self.detail = detail
        self.limit = limit

    @classmethod
    def of(cls, uri: str, fmt: str, exc: ValueError) -> FormatError:
        """The error for ``exc`` raised while reading ``uri``."""
        return cls(uri, fmt, str(exc), exc.cap if isinstance(exc, LimitExceededError) else None)

    def __str__(self) -> str:
        return f"{self.uri} is not valid {self.fmt}: {self.detail}"


class RandomAccess(Protocol):
    def read_at(self, nbytes: int, offset: int) -> bytes: ...


class Window:
    """Buffered random reads over a pyarrow file: one request per :data:`WINDOW` bytes."""

    def __init__(self, f: RandomAccess, size: int) -> None:
        self._f = f
        self.size = size
        self._start = 0
        self._buf = b""

    def read(self, offset: int, n: int, window: int = WINDOW) -> bytes:
        end = offset + n
        if offset < self._start or end > self._start + len(self._buf):
            want = min(max(n, window), max(0, self.size - offset))
            self._buf = bytes(self._f.read_at(want, offset))
            self._start = offset
        lo = offset - self._start
        return self._buf[lo : lo + n]

    def stream(self, start: int, length: int) -> Stream:
        """The ``length`` bytes from ``start`` as a file-like object read front to back."""
        return Stream(self._f, start, length)


class Stream:
    """Sequential ``read(n)`` over a slice of a file, as parsers that pull bytes want it."""

    def __init__(self, f: RandomAccess, start: int, length: int) -> None:
        self._f = f
        self._pos = start
        self._end = start + length

    def read(self, n: int = -1) -> bytes:
        left = self._end - self._pos
        n = left if n < 0 else min(n, left)
        if n <= 0:
            return b""
        data = bytes(self._f.read_at(n, self._pos))
        self._pos += len(data)
        return data
