"""Names tinct derives from a release's name, fitted to the limits of their kinds.

A GrayRelease may be named with up to 253 characters; the objects named after it are not
all that roomy: a label value holds 63, a KEDA ScaledObject's name too (KEDA makes a label of
it), an HPA's name 253. Cutting a long name is not enough: two names cut alike would name one
object for two purposes (both sides of a release scaled by one HPA whose target flips between
them). :func:`shortened` keeps a name that fits and otherwise cuts it *and* appends a digest
of the whole, so names that differ stay apart.
"""

from __future__ import annotations

import hashlib

__all__ = ["LABEL_VALUE", "label_value", "shortened"]

#: Characters of a label value (and of a DNS label).
LABEL_VALUE = 63


def shortened(prefix: str, body: str, suffix: str, limit: int) -> str:
    """``prefix + body + suffix`` when it fits ``limit`` characters; else ``body`` cut and
    followed by ``-`` and 8 hex digits of its digest, so that it fits.

    ``prefix`` and ``suffix`` are kept whole (e.g. ``tinct-`` and the side, ``-stable``); the
    digest is of ``body`` alone, so the suffix still tells the names of one body apart.
    """
    whole = f"{prefix}{body}{suffix}"
    if len(whole) <= limit:
        return whole
    digest = hashlib.sha256(body.encode()).hexdigest()[:8]
    keep = max(0, limit - len(f"{prefix}-{digest}{suffix}"))
    return f"{prefix}{body[:keep].rstrip('-._')}-{digest}{suffix}"


def label_value(text: str) -> str:
    """``text`` as a label value: itself up to 63 characters, else cut with a digest of it."""
    return shortened("", text, "", LABEL_VALUE)
