"""Text for people, bounded: what goes into a status, a condition or an Event.

Whatever an artifact or a spec contains, a message built from it must fit the field it is
written to (a condition message has 32,768 characters, an Event note 1,024), or the write
fails and the object shows nothing at all. :func:`listing` names a few items of a long list
and counts the rest; :func:`clip` cuts what is still too long in the middle, where a reader
loses the least (the start says what, the end says what to do). :func:`prompt_text` is
the prompt of an OpenAI-style request as one text, for whoever reads or hashes it.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

__all__ = ["ELLIPSIS", "clip", "listed", "listing", "prompt_text", "quote"]

ELLIPSIS = " … "


def clip(text: str, limit: int) -> str:
    """``text`` if it has at most ``limit`` characters, else its start and end around `` … ``."""
    if len(text) <= limit:
        return text
    if limit <= len(ELLIPSIS):
        return text[:limit]
    keep = limit - len(ELLIPSIS)
    head = keep - keep // 3
    return text[:head] + ELLIPSIS + text[len(text) - (keep - head) :]


def quote(value: str, limit: int = 200) -> str:
    """``repr(value)`` clipped to about ``limit`` characters: a name quoted from a file."""
    return clip(repr(value), limit)


def listing(items: Iterable[str], most: int = 3, *, sep: str = ", ") -> str:
    """The first ``most`` items, then how many more: ``a, b, c … and 9,997 more``.

    Each item is clipped to 200 characters, so the result is short whatever the items are.
    """
    shown: list[str] = []
    total = 0
    for item in items:
        if total < most:
            shown.append(clip(item, 200))
        total += 1
    text = sep.join(shown)
    return f"{text}{sep}… and {total - most:,} more" if total > most else text


def prompt_text(doc: dict[str, Any], *, roles: bool = False) -> str:
    """The text of a request's messages (chat) or prompt (completions), a line each.

    With ``roles`` each message is one line starting with its role (``user: …``), its parts'
    texts joined by spaces, as a judge reads it; without, each part is a line of its own.
    """
    parts: list[str] = []
    for m in doc.get("messages") or []:
        if not isinstance(m, dict):
            continue
        content = m.get("content")
        if isinstance(content, list):
            texts = [str(p.get("text", "")) for p in content if isinstance(p, dict)]
        else:
            texts = [content] if isinstance(content, str) else []
        if roles:
            parts.append(f"{m.get('role', 'user')}: {' '.join(texts)}")
        else:
            parts.extend(texts)
    prompt = doc.get("prompt")
    if isinstance(prompt, str):
        parts.append(prompt)
    elif isinstance(prompt, list):
        parts.extend(p for p in prompt if isinstance(p, str))
    return "\n".join(parts)


def listed(raw: str | Iterable[str]) -> Iterator[str]:
    """The values of a repeatable flag, or of a ``,``-separated variable, stripped; none empty."""
    for item in raw.split(",") if isinstance(raw, str) else raw:
        item = item.strip()
        if item:
            yield item
