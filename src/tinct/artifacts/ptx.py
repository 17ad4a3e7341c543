"""The ``ptx`` format: NVIDIA's PTX assembly text.

The head of the file (64 KiB) must be text and carry the ``.version``, ``.target`` and
``.address_size`` directives; the rest is scanned line by line, in bounded chunks, for the
``.entry`` names (at most :data:`~tinct.artifacts.limits.PTX_MAX_ENTRIES` of them and
:data:`~tinct.artifacts.limits.PTX_MAX_ENTRY_BYTES` together; a line at most
:data:`~tinct.artifacts.limits.PTX_MAX_LINE`).
"""

from __future__ import annotations

import re

from tinct.artifacts.limits import PTX_MAX_ENTRIES, PTX_MAX_ENTRY_BYTES, PTX_MAX_LINE, LimitExceededError
from tinct.artifacts.reading import Facts, Window

__all__ = ["read_ptx"]

_HEAD = 64 * 1024
_CHUNK = 1024 * 1024
_DIRECTIVES = {
    ".version": re.compile(r"^\s*\.version\s+(\d+\.\d+)\b", re.MULTILINE),
    ".target": re.compile(r"^\s*\.target\s+([\w ,]+)", re.MULTILINE),
    ".address_size": re.compile(r"^\s*\.address_size\s+(32|64)\b", re.MULTILINE),
}
_ENTRY = re.compile(
    rb"^[ \t]*(?:\.visible[ \t]+|\.weak[ \t]+)?\.entry[ \t]+([A-Za-z_$%][\w$]*)", re.MULTILINE
)


def _strip_comments(text: str) -> str:
    return re.sub(r"//[^\n]*", "", re.sub(r"/\*.*?\*/", "", text, flags=re.DOTALL))


def _directives(head: bytes) -> Facts:
    if b"\x00" in head:
        raise ValueError("binary content (NUL bytes); PTX is text")
    try:
        text = head.decode("utf-8")
    except UnicodeDecodeError:
        text = head[: head.rfind(b"\n") + 1].decode("utf-8", errors="strict")
    text = _strip_comments(text)
    found = {d: rx.search(text) for d, rx in _DIRECTIVES.items()}
    missing = [d for d, m in found.items() if m is None]
    if missing:
        raise ValueError(f"missing directive(s) {', '.join(missing)} in the first {_HEAD // 1024} KiB")
    targets = [t.strip() for t in found[".target"].group(1).split(",") if t.strip()]  # type: ignore[union-attr]
    sm = next((t for t in targets if re.fullmatch(r"sm_\d+[a-z]?", t)), targets[0])
    return {
        "version": found[".version"].group(1),  # type: ignore[union-attr]
        "target": sm,
        "target_options": sorted(t for t in targets if t != sm),
        "address_size": int(found[".address_size"].group(1)),  # type: ignore[union-attr]
    }


def _entries(win: Window) -> list[str]:
    """Names of the ``.entry`` kernels, scanning the file in 1 MiB chunks split at newlines."""
    entries: set[str] = set()
    kept = 0
    pos = 0
    carry = b""
    while pos < win.size:
        n = min(_CHUNK, win.size - pos)
        chunk = carry + win.read(pos, n, _CHUNK)
        pos += n
        if b"\x00" in chunk:
            raise ValueError("binary content (NUL bytes); PTX is text")
        cut = chunk.rfind(b"\n") + 1 if pos < win.size else len(chunk)
        if cut == 0 and len(chunk) > PTX_MAX_LINE:
            raise LimitExceededError("a line", "PTX_MAX_LINE", PTX_MAX_LINE, "bytes")
        body, carry = chunk[:cut], chunk[cut:]
        body = re.sub(rb"//[^\n]*", b"", body)
        for m in _ENTRY.finditer(body):
            name = m.group(1).decode("ascii", errors="replace")
            if name not in entries:
                entries.add(name)
                kept += len(name)
        if len(entries) > PTX_MAX_ENTRIES:
            raise LimitExceededError("more .entry kernels", "PTX_MAX_ENTRIES", PTX_MAX_ENTRIES, "kernels")
        if kept > PTX_MAX_ENTRY_BYTES:
            raise LimitExceededError(
                ".entry names together", "PTX_MAX_ENTRY_BYTES", PTX_MAX_ENTRY_BYTES, "bytes"
            )
    return sorted(entries)


def read_ptx(win: Window) -> Facts:
    """The facts of a PTX file: its directives and ``entries``."""
    facts = _directives(win.read(0, min(win.size, _HEAD)))
    facts["entries"] = _entries(win)
    return facts
